//! Flash-style attention: one pass over the keys with an online softmax, causal or full, with
//! grouped KV heads, reading keys and values straight from the KV cache.
//!
//! # Parameters ([`AttentionParams`])
//! `q [t, heads, d]`, `k`, `v` `[cap, kv_heads, d]` (first `kv_len` rows valid), `out [t, heads, d]`,
//! all f32. Query row `i` has key position `q_pos0 + i`; when causal it sees keys `0 ..= q_pos0 + i`.
//! Query head `h` reads KV head `h / (heads / kv_heads)`. `d <= 32 · MAX_PER_LANE` (256).
//!
//! # Tiling / thread mapping
//! One warp per (query row, head), `WARPS` (4) warps per block, grid = `ceil(t · heads / 4)`.
//! Lane `l` holds elements `l, l + 32, ...` of the query and of the output accumulator in
//! registers. For each visible key the warp forms the score with a shuffle reduction and
//! applies the streaming update `gpu::math::OnlineSoftmax::push_weighted` (the CPU backend
//! uses the same update), so nothing of size `kv_len` is ever materialized.
//!
//! # Safety
//! The launcher validates sizes. A warp past the last (row, head) exits as a whole, so every
//! shuffle has all 32 lanes; there are no block barriers.

use crate::math::OnlineSoftmax;
use crate::params::attention_tile::{MAX_PER_LANE, WARPS};
use crate::params::AttentionParams;
use crate::reduce::warp_sum;
use cuda_std::{kernel, thread};

/// Attention for one (query row, head) per warp. See the module docs.
#[kernel]
pub unsafe fn attention_f32(p: AttentionParams) {
    let tid = thread::thread_idx_x() as usize;
    let lane = tid % 32;
    let item = thread::block_idx_x() as usize * WARPS as usize + tid / 32;
    let (heads, d) = (p.heads as usize, p.d as usize);
    if item >= p.t as usize * heads {
        return; // uniform per warp
    }
    let (i, h) = (item / heads, item % heads);
    let kvh = h / (heads / p.kv_heads as usize);
    let kv_stride = p.kv_heads as usize * d;
    let visible = if p.causal != 0 { (p.q_pos0 as usize + i + 1).min(p.kv_len as usize) } else { p.kv_len as usize };

    let q = (p.q as *const f32).add(item * d);
    let mut qr = [0.0f32; MAX_PER_LANE];
    let mut acc = [0.0f32; MAX_PER_LANE];
    for e in 0..MAX_PER_LANE {
        let x = lane + 32 * e;
        if x < d {
            qr[e] = *q.add(x);
        }
    }
    let mut norm = OnlineSoftmax::EMPTY;
    let (k, v) = (p.k as *const f32, p.v as *const f32);
    let mut j = 0usize;
    while j < visible {
        let kr = k.add(j * kv_stride + kvh * d);
        let mut part = 0.0f32;
        for e in 0..MAX_PER_LANE {
            let x = lane + 32 * e;
            if x < d {
                part += qr[e] * *kr.add(x);
            }
        }
        let s = warp_sum(part) * p.scale;
        let (next, rescale, w) = norm.push_weighted(s);
        norm = next;
        let vr = v.add(j * kv_stride + kvh * d);
        for e in 0..MAX_PER_LANE {
            let x = lane + 32 * e;
            if x < d {
                acc[e] = acc[e] * rescale + w * *vr.add(x);
            }
        }
        j += 1;
    }
    let inv = if norm.sum > 0.0 { 1.0 / norm.sum } else { 0.0 };
    let out = (p.out as *mut f32).add(item * d);
    for e in 0..MAX_PER_LANE {
        let x = lane + 32 * e;
        if x < d {
            *out.add(x) = acc[e] * inv;
        }
    }
}
