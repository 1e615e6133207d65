//! Matrix-vector products for one-token decode: `c[r] = wᵀ · a[r] (+ bias)` for a few rows.
//!
//! # Parameters ([`LinearParams`])
//! As for `matmul_*`: `a` `[m, k]` f32 (m small, usually 1), `w` `[n, k]` f32/f16/bf16,
//! `bias` `[n]` f32 or 0, `c` `[m, n]` f32.
//!
//! # Tiling / thread mapping
//! One warp per output element: block = `WARPS` (8) warps = 256 threads, grid =
//! `(ceil(n / 8), m)`. The warp reads its weight row with lanes striding by 32 (coalesced),
//! four independent partial sums per lane, then a butterfly shuffle reduction; lane 0 writes.
//! The kernel is bound by weight bandwidth, so weights are read once, in their stored dtype.
//!
//! # Safety
//! The launcher validates pointers and sizes. A warp whose row is past `n` exits as a whole,
//! so every shuffle runs with all 32 lanes; there are no block barriers.

use crate::math::{Bf16, WeightElem, F16};
use crate::params::gemv_tile::WARPS;
use crate::params::LinearParams;
use crate::reduce::warp_sum;
use cuda_std::{kernel, thread};

#[inline(always)]
unsafe fn gemv<W: WeightElem>(p: LinearParams) {
    let tid = thread::thread_idx_x() as usize;
    let lane = tid % 32;
    let col = thread::block_idx_x() as usize * WARPS as usize + tid / 32;
    let row = thread::block_idx_y() as usize;
    let (n, k) = (p.n as usize, p.k as usize);
    if col >= n {
        return; // uniform per warp
    }
    let x = (p.a as *const f32).add(row * p.lda as usize);
    let wr = (p.w as *const W).add(col * k);
    let mut s = [0.0f32; 4];
    let mut i = lane;
    while i + 96 < k {
        for u in 0..4 {
            s[u] += (*wr.add(i + 32 * u)).to_f32() * *x.add(i + 32 * u);
        }
        i += 128;
    }
    while i < k {
        s[0] += (*wr.add(i)).to_f32() * *x.add(i);
        i += 32;
    }
    let total = warp_sum((s[0] + s[1]) + (s[2] + s[3]));
    if lane == 0 {
        let bias = p.bias as *const f32;
        let b = if bias.is_null() { 0.0 } else { *bias.add(col) };
        *(p.c as *mut f32).add(row * p.ldc as usize + col) = total + b;
    }
}

/// `c[r] = wᵀ · a[r] (+ bias)`, f32 weights. See the module docs.
#[kernel]
pub unsafe fn gemv_f32(p: LinearParams) {
    gemv::<f32>(p)
}

/// `c[r] = wᵀ · a[r] (+ bias)`, f16 weights. See the module docs.
#[kernel]
pub unsafe fn gemv_f16(p: LinearParams) {
    gemv::<F16>(p)
}

/// `c[r] = wᵀ · a[r] (+ bias)`, bf16 weights. See the module docs.
#[kernel]
pub unsafe fn gemv_bf16(p: LinearParams) {
    gemv::<Bf16>(p)
}
