//! Row norms: RMSNorm `y = x · rsqrt(mean(x²) + eps) · w` (text decoder) and LayerNorm
//! `y = (x - mean) · rsqrt(var + eps) · w + b` (vision tower).
//!
//! # Parameters ([`RmsNormParams`], [`LayerNormParams`])
//! `x`, `y`: `[rows, n]` f32 (may alias); `w` (and `b`): `[n]` f32; `eps` from the model config.
//!
//! # Thread mapping
//! One block of `ROW_THREADS` (256) per row, grid = `rows`. Threads stride over the row
//! (RMSNorm: in 16-byte vectors when the row length is a multiple of 4 and the rows and weight
//! are 16-byte aligned, `UNROLL` loads in flight per thread) accumulating sums (LayerNorm: two
//! passes, mean then centred squares), reduce with warp shuffles and a 32-float shared
//! scratch, then scale.
//!
//! # Safety
//! The launcher validates sizes. All threads reach the barriers inside `block_sum`.

use crate::math::{layer_norm_elem, rms_scale};
use crate::params::{LayerNormParams, RmsNormParams};
use crate::mem::{ld_f32x4, F32x4};
use crate::reduce::block_sum;
use cuda_std::{kernel, shared_array, thread};

/// 16-byte vectors (or single floats) a thread of `rms_norm_f32` loads before it uses any: a
/// short row's loads are then in flight together, not one memory latency each (a 16-row
/// batched decode step has 16 blocks, too few to hide the latency with other blocks).
const UNROLL: usize = 4;

/// Element `j` of `p`: the 16-byte vector `j` when `vec`, else the float `j` (and zeros).
#[inline(always)]
unsafe fn load4(p: *const f32, j: usize, vec: bool) -> [f32; 4] {
    if vec {
        ld_f32x4(p.add(4 * j))
    } else {
        [*p.add(j), 0.0, 0.0, 0.0]
    }
}

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
    // whole 16-byte vectors when every row and the weight start 16-byte aligned
    let vec = n % 4 == 0 && (p.x | p.y | p.w) % 16 == 0;
    let len = if vec { n / 4 } else { n };
    // 1. Σ x² (UNROLL loads in flight per thread)
    let mut ss = 0.0f32;
    let mut i = tid;
    while i < len {
        let mut v = [[0.0f32; 4]; UNROLL];
        for (u, vu) in v.iter_mut().enumerate() {
            if i + u * step < len {
                *vu = load4(x, i + u * step, vec);
            }
        }
        for vu in &v {
            for e in vu {
                ss += e * e;
            }
        }
        i += UNROLL * step;
    }
    let total = block_sum(ss, scratch);
    let scale = rms_scale(total / n as f32, p.eps);
    // 2. y = x · scale · w (x read again: `y` may alias it, so nothing is written before the
    //    sum is complete, which the barriers of `block_sum` ensure)
    let mut i = tid;
    while i < len {
        let (mut v, mut g) = ([[0.0f32; 4]; UNROLL], [[0.0f32; 4]; UNROLL]);
        for u in 0..UNROLL {
            if i + u * step < len {
                v[u] = load4(x, i + u * step, vec);
                g[u] = load4(w, i + u * step, vec);
            }
        }
        for u in 0..UNROLL {
            let j = i + u * step;
            if j < len {
                let o = [v[u][0] * scale * g[u][0], v[u][1] * scale * g[u][1], v[u][2] * scale * g[u][2], v[u][3] * scale * g[u][3]];
                if vec {
                    *(y.add(4 * j) as *mut F32x4) = F32x4(o);
                } else {
                    *y.add(j) = o[0];
                }
            }
        }
        i += UNROLL * step;
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
