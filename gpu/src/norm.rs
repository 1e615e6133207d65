//! Row norms: RMSNorm `y = x · rsqrt(mean(x²) + eps) · w` (text decoder) and LayerNorm
//! `y = (x - mean) · rsqrt(var + eps) · w + b` (vision tower).
//!
//! # Parameters ([`RmsNormParams`], [`LayerNormParams`])
//! `x`, `y`: `[rows, n]` f32 (may alias); `w` (and `b`): `[n]` f32; `eps` from the model config.
//!
//! # Thread mapping
//! One block of `ROW_THREADS` (256) per row, grid = `rows`. Threads stride over the row
//! accumulating sums (LayerNorm: two passes, mean then centred squares), reduce with warp
//! shuffles and a 32-float shared scratch, then scale.
//!
//! # Safety
//! The launcher validates sizes. All threads reach the barriers inside `block_sum`.

use crate::math::{layer_norm_elem, rms_scale};
use crate::params::{LayerNormParams, RmsNormParams};
use crate::reduce::block_sum;
use cuda_std::{kernel, shared_array, thread};

/// RMSNorm of each row of `x` into `y`. See the module docs.
#[kernel]
pub unsafe fn rms_norm_f32(p: RmsNormParams) {
    let scratch = shared_array![f32; 32];
    let tid = thread::thread_idx_x() as usize;
    let step = thread::block_dim_x() as usize;
    let n = p.n as usize;
    let row = thread::block_idx_x() as usize;
    let x = (p.x as *const f32).add(row * n);
    let y = (p.y as *mut f32).add(row * n);
    let w = p.w as *const f32;
    let mut ss = 0.0f32;
    let mut i = tid;
    while i < n {
        let v = *x.add(i);
        ss += v * v;
        i += step;
    }
    let total = block_sum(ss, scratch);
    let scale = rms_scale(total / n as f32, p.eps);
    let mut i = tid;
    while i < n {
        *y.add(i) = *x.add(i) * scale * *w.add(i);
        i += step;
    }
}

/// LayerNorm of each row of `x` into `y`. See the module docs.
#[kernel]
pub unsafe fn layer_norm_f32(p: LayerNormParams) {
    let scratch = shared_array![f32; 32];
    let tid = thread::thread_idx_x() as usize;
    let step = thread::block_dim_x() as usize;
    let n = p.n as usize;
    let row = thread::block_idx_x() as usize;
    let x = (p.x as *const f32).add(row * n);
    let y = (p.y as *mut f32).add(row * n);
    let (w, b) = (p.w as *const f32, p.b as *const f32);
    let mut s = 0.0f32;
    let mut i = tid;
    while i < n {
        s += *x.add(i);
        i += step;
    }
    let mean = block_sum(s, scratch) / n as f32;
    let mut ss = 0.0f32;
    let mut i = tid;
    while i < n {
        let d = *x.add(i) - mean;
        ss += d * d;
        i += step;
    }
    let inv = rms_scale(block_sum(ss, scratch) / n as f32, p.eps);
    let mut i = tid;
    while i < n {
        *y.add(i) = layer_norm_elem(*x.add(i), mean, inv, *w.add(i), *b.add(i));
        i += step;
    }
}
