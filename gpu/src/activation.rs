//! Elementwise binary ops: the SwiGLU gate and the residual add.
//!
//! # Parameters ([`BinaryParams`])
//! `a`, `b`, `out`: `len` f32 each (`out` may alias either input).
//!
//! # Thread mapping
//! Grid-stride loop: `ELEMENTWISE_THREADS` (256) threads per block, as many blocks as the
//! launcher picks; element `i` is handled by thread `i mod (grid · block)`.
//!
//! # Safety
//! The launcher validates that all three buffers hold `len` elements.

use crate::math::silu_mul;
use crate::params::BinaryParams;
use cuda_std::{kernel, thread};

#[inline(always)]
unsafe fn binary(p: BinaryParams, f: impl Fn(f32, f32) -> f32) {
    let stride = (thread::block_dim_x() * thread::grid_dim_x()) as u64;
    let mut i = (thread::block_idx_x() * thread::block_dim_x() + thread::thread_idx_x()) as u64;
    let (a, b, o) = (p.a as *const f32, p.b as *const f32, p.out as *mut f32);
    while i < p.len {
        let j = i as usize;
        *o.add(j) = f(*a.add(j), *b.add(j));
        i += stride;
    }
}

/// `out = silu(a) * b`, the SwiGLU gate (`a` = gate, `b` = up). See the module docs.
#[kernel]
pub unsafe fn silu_mul_f32(p: BinaryParams) {
    binary(p, silu_mul)
}

/// `out = a + b`, the residual add. See the module docs.
#[kernel]
pub unsafe fn add_f32(p: BinaryParams) {
    binary(p, |x, y| x + y)
}
