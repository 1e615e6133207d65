//! Row gathers and copies on the CPU: embedding lookup and KV-cache writes.

use super::linear::Weights;
use rayon::prelude::*;

/// `out[r, :] = table[ids[r], :]` widened to f32; ids were validated by the caller.
pub fn embedding(table: Weights<'_>, hidden: usize, ids: &[u32], out: &mut [f32]) {
    out.par_chunks_mut(hidden.max(1)).zip(ids.par_iter()).for_each(|(row, &id)| {
        let r0 = id as usize * hidden;
        match table {
            Weights::F32(t) => row.copy_from_slice(&t[r0..r0 + hidden]),
            Weights::F16(t) => row.iter_mut().zip(&t[r0..r0 + hidden]).for_each(|(o, &b)| *o = gpu::math::f16_to_f32(b)),
            Weights::Bf16(t) => row.iter_mut().zip(&t[r0..r0 + hidden]).for_each(|(o, &b)| *o = gpu::math::bf16_to_f32(b)),
        }
    });
}
