//! Elementwise ops: the SwiGLU gate, the residual add, and the two GELU forms.
//!
//! # Parameters ([`BinaryParams`], [`UnaryParams`])
//! `a`, `b` / `x`, `out`: `len` f32 each (`out` may alias an input).
//!
//! # Thread mapping
//! Grid-stride loop: `ELEMENTWISE_THREADS` (256) threads per block, as many blocks as the
//! launcher picks; element `i` is handled by thread `i mod (grid · block)`.
//!
//! # Safety
//! The launcher validates that all three buffers hold `len` elements.

use crate::math::{gelu_erf, gelu_tanh, silu_mul};
use crate::params::{BinaryParams, CastParams, UnaryParams};
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

#[inline(always)]
unsafe fn unary(p: UnaryParams, f: impl Fn(f32) -> f32) {
    let stride = (thread::block_dim_x() * thread::grid_dim_x()) as u64;
    let mut i = (thread::block_idx_x() * thread::block_dim_x() + thread::thread_idx_x()) as u64;
    let (x, o) = (p.x as *const f32, p.out as *mut f32);
    while i < p.len {
        let j = i as usize;
        *o.add(j) = f(*x.add(j));
        i += stride;
    }
}

/// `out = gelu(x)`, tanh approximation (vision MLP). See the module docs.
#[kernel]
pub unsafe fn gelu_tanh_f32(p: UnaryParams) {
    unary(p, gelu_tanh)
}

/// `out = gelu(x)`, exact erf form (patch mergers). See the module docs.
#[kernel]
pub unsafe fn gelu_erf_f32(p: UnaryParams) {
    unary(p, gelu_erf)
}

/// `out[i] = f16(x[i])` (raw bits, nearest even): f32 rows into an f16 KV cache. Grid-stride.
#[kernel]
pub unsafe fn cast_f16_f32(p: CastParams) {
    let stride = (thread::block_dim_x() * thread::grid_dim_x()) as u64;
    let mut i = (thread::block_idx_x() * thread::block_dim_x() + thread::thread_idx_x()) as u64;
    while i < p.len {
        *(p.out as *mut u16).add(i as usize) = crate::mem::f32_to_f16(*(p.x as *const f32).add(i as usize));
        i += stride;
    }
}
