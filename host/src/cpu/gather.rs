//! Row gathers and copies on the CPU: embedding lookup and KV-cache writes.

use super::linear::Weights;
use rayon::prelude::*;

/// `out[r, :] = table[ids[r], :]` widened to f32; ids were validated by the caller.
pub fn embedding(table: Weights<'_>, hidden: usize, ids: &[u32], out: &mut [f32]) {
    out.par_chunks_mut(hidden.max(1)).zip(ids.par_iter()).for_each(|(row, &id)| table.widen_rows(id as usize, 1, hidden, row));
}
