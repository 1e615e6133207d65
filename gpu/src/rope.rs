//! Rotary position embedding, rotate-half layout (as Qwen3-VL's text and vision towers use).
//!
//! # Parameters ([`RopeParams`])
//! `x`, `out`: `[rows, heads, d]` f32 (may alias); `cos`, `sin`: `[rows, d / 2]` f32, the angle
//! of pair `(i, i + d/2)` for each row. The rotation is `gpu::math::rope_pair`, shared with the
//! CPU backend.
//!
//! # Thread mapping
//! One block of `ROW_THREADS` per row (grid = rows); threads stride over the row's
//! `heads · d/2` pairs.
//!
//! # Safety
//! The launcher validates sizes (`d` even). No barriers.

use crate::math::rope_pair;
use crate::params::RopeParams;
use cuda_std::{kernel, thread};

/// Rotates every head of one row per block. See the module docs.
#[kernel]
pub unsafe fn rope_f32(p: RopeParams) {
    let r = thread::block_idx_x() as usize;
    let (heads, d) = (p.heads as usize, p.d as usize);
    let half = d / 2;
    let x = (p.x as *const f32).add(r * heads * d);
    let out = (p.out as *mut f32).add(r * heads * d);
    let (cos, sin) = ((p.cos as *const f32).add(r * half), (p.sin as *const f32).add(r * half));
    let mut pair = thread::thread_idx_x() as usize;
    while pair < heads * half {
        let (h, i) = (pair / half, pair % half);
        let base = h * d;
        let (a, b) = rope_pair(*x.add(base + i), *x.add(base + i + half), *cos.add(i), *sin.add(i));
        *out.add(base + i) = a;
        *out.add(base + i + half) = b;
        pair += thread::block_dim_x() as usize;
    }
}
