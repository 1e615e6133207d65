//! The weight operand of the CPU linear kernels as stored (f32, f16 or bf16): a leaf that the
//! portable path (`linear.rs`) and the SIMD kernels (`simd/`) both take.

use gpu::math::{bf16_to_f32, f16_to_f32};

/// The weight operand as stored.
#[derive(Clone, Copy)]
pub enum Weights<'a> {
    F32(&'a [f32]),
    F16(&'a [u16]),
    Bf16(&'a [u16]),
}

impl Weights<'_> {
    /// Writes rows `r0..r0 + rows` (each `k` long) widened to f32 into `dst`.
    pub(crate) fn widen_rows(&self, r0: usize, rows: usize, k: usize, dst: &mut [f32]) {
        let range = r0 * k..(r0 + rows) * k;
        let dst = &mut dst[..rows * k];
        match *self {
            Weights::F32(w) => dst.copy_from_slice(&w[range]),
            Weights::F16(w) => dst.iter_mut().zip(&w[range]).for_each(|(d, &b)| *d = f16_to_f32(b)),
            Weights::Bf16(w) => dst.iter_mut().zip(&w[range]).for_each(|(d, &b)| *d = bf16_to_f32(b)),
        }
    }
}
