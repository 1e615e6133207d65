//! Elementwise activations.
//!
//! # Parameters ([`SiluMulParams`])
//! `gate`, `up`, `out`: `len` f32 each (`out` may alias either input).
//!
//! # Thread mapping
//! Grid-stride loop: `ELEMENTWISE_THREADS` (256) threads per block, as many blocks as the
//! launcher picks; element `i` is handled by thread `i mod (grid · block)`.
//!
//! # Safety
//! The launcher validates that all three buffers hold `len` elements.

use crate::math::silu_mul;
use crate::params::SiluMulParams;
use cuda_std::{kernel, thread};

/// `out = silu(gate) * up`, the SwiGLU gate. See the module docs.
#[kernel]
pub unsafe fn silu_mul_f32(p: SiluMulParams) {
    let stride = (thread::block_dim_x() * thread::grid_dim_x()) as u64;
    let mut i = (thread::block_idx_x() * thread::block_dim_x() + thread::thread_idx_x()) as u64;
    let (g, u, o) = (p.gate as *const f32, p.up as *const f32, p.out as *mut f32);
    while i < p.len {
        let j = i as usize;
        *o.add(j) = silu_mul(*g.add(j), *u.add(j));
        i += stride;
    }
}
