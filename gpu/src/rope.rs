//! Rotary position embedding, rotate-half layout (as Qwen3-VL's text and vision towers use),
//! and the decoder's fused QKV step.
//!
//! # `rope_f32` ([`RopeParams`])
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

use crate::math::{mrope_axis, rms_scale, rope_pair, F16};
use crate::mem::KvElem;
use crate::params::qkv_rope_tile::{MAX_D, WARPS};
use crate::params::{QkvRopeParams, RopeCastParams, RopeParams, CURSOR_FIELDS, CURSOR_ROW};
use crate::reduce::warp_sum;
use cuda_std::{kernel, shared_array, thread, warp, GpuFloat};

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

/// # `rope_cast_f16` ([`RopeCastParams`])
/// `out = f16(rope(x))` (rotate-half with the row's `cos`/`sin`, as `rope_f32`), or `f16(x)` when
/// `cos` is 0: the vision tower's keys rotated and narrowed, and its values narrowed, for the
/// tensor-core attention, in one pass each. One block of `ROW_THREADS` per row; threads stride
/// over the row's `heads · d/2` pairs. No barriers.
#[kernel]
pub unsafe fn rope_cast_f16(p: RopeCastParams) {
    let r = thread::block_idx_x() as usize;
    let (heads, d) = (p.heads as usize, p.d as usize);
    let half = d / 2;
    let x = (p.x as *const f32).add(r * heads * d);
    let out = (p.out as *mut F16).add(r * heads * d);
    let (cos, sin) = ((p.cos as *const f32).add(r * half), (p.sin as *const f32).add(r * half));
    let mut pair = thread::thread_idx_x() as usize;
    while pair < heads * half {
        let (h, i) = (pair / half, pair % half);
        let base = h * d;
        let (x1, x2) = (*x.add(base + i), *x.add(base + i + half));
        let (a, b) = if p.cos != 0 { rope_pair(x1, x2, *cos.add(i), *sin.add(i)) } else { (x1, x2) };
        F16::store(out.add(base + i), a);
        F16::store(out.add(base + i + half), b);
        pair += thread::block_dim_x() as usize;
    }
}

/// # `qkv_rope_append_*` ([`QkvRopeParams`])
/// The decoder's step between the fused QKV projection and attention, for `t` rows:
/// q heads are RMS-normed (`q_norm`), rotated, and written to `q_out [t, heads, d]`; k heads are
/// normed (`k_norm`), rotated and written to the KV cache at the row's cache row; v heads are
/// copied there. The rotation angle of pair `j` is `pos[axis(j)] · inv_freq[j]`, with the
/// (t, h, w) position from the row's cursor and the axis from interleaved MRoPE
/// (`gpu::math::mrope_axis`); `cos`/`sin` are computed here, so nothing is uploaded per step.
///
/// Thread mapping: one warp per (row, head vector), `WARPS` (4) per block, grid =
/// `ceil(t · (heads + 2 kv_heads) / 4)`. Each lane loads its elements `l, l + 32, ...` of the
/// vector, of the norm weight and of the frequencies, and the cursor row, all before any
/// arithmetic; the warp reduces the sum of squares with shuffles, stages the normed vector in
/// its slice of shared memory (`MAX_D` floats), then each lane rotates pairs `(j, j + d/2)`.
///
/// Safety: the launcher checks sizes, `d` even and `≤ MAX_D`; a cache row `>= cap` is skipped
/// (the host checks capacity before launching). Warps past the last item exit as a whole; the
/// only synchronisation is `sync_warp` within a warp.
#[inline(always)]
unsafe fn qkv_rope_append<C: KvElem>(p: QkvRopeParams) {
    const PER_LANE: usize = MAX_D / 32;
    let stage = shared_array![f32; MAX_D * WARPS as usize];
    let tid = thread::thread_idx_x() as usize;
    let (lane, w) = (tid % 32, tid / 32);
    let (heads, kvh, d) = (p.heads as usize, p.kv_heads as usize, p.d as usize);
    let vectors = heads + 2 * kvh;
    let item = thread::block_idx_x() as usize * WARPS as usize + w;
    if item >= p.t as usize * vectors {
        return; // uniform per warp
    }
    let (i, hv) = (item / vectors, item % vectors);
    let is_q = hv < heads;
    let is_v = hv >= heads + kvh;
    // 1. every load up front (they are independent): the vector, its norm weight, the
    //    frequencies and the cursor row, so the kernel costs about one memory round trip
    let src = (p.qkv as *const f32).add(item * d);
    let norm = (if is_q { p.q_norm } else { p.k_norm }) as *const f32;
    let inv_freq = p.inv_freq as *const f32;
    let cur = (p.cursor as *const u32).add(i * CURSOR_FIELDS);
    let (mut x, mut g, mut f) = ([0.0f32; PER_LANE], [0.0f32; PER_LANE], [0.0f32; PER_LANE / 2]);
    for u in 0..PER_LANE {
        let e = lane + 32 * u;
        if e < d {
            x[u] = *src.add(e);
            if !is_v {
                g[u] = *norm.add(e);
            }
        }
    }
    for u in 0..PER_LANE / 2 {
        let j = lane + 32 * u;
        if j < d / 2 && !is_v {
            f[u] = *inv_freq.add(j);
        }
    }
    let (pt, ph, pw, row) = (*cur, *cur.add(1), *cur.add(2), *cur.add(CURSOR_ROW) as usize);
    if is_v {
        // v: copied into the cache as is
        if row < p.cap as usize {
            let dst = (p.v_cache as *mut C).add((row * kvh + hv - heads - kvh) * d);
            for u in 0..PER_LANE {
                if lane + 32 * u < d {
                    C::store(dst.add(lane + 32 * u), x[u]);
                }
            }
        }
        return;
    }
    // 2. RMSNorm of the head vector, staged in the warp's slice of shared memory
    let mut ss = 0.0f32;
    for u in 0..PER_LANE {
        ss += x[u] * x[u];
    }
    let scale = rms_scale(warp_sum(ss) / d as f32, p.eps);
    let s = stage.add(w * MAX_D);
    for u in 0..PER_LANE {
        if lane + 32 * u < d {
            *s.add(lane + 32 * u) = x[u] * scale * g[u];
        }
    }
    warp::sync_warp(0xffff_ffff);
    // 3. rotate pairs (j, j + d/2) by pos[axis(j)] · inv_freq[j] and write them out
    let half = d / 2;
    for u in 0..PER_LANE / 2 {
        let j = lane + 32 * u;
        if j < half {
            let pos = match mrope_axis(j, p.section) {
                1 => ph,
                2 => pw,
                _ => pt,
            };
            let angle = pos as f32 * f[u];
            let (a, b) = rope_pair(*s.add(j), *s.add(j + half), angle.cos(), angle.sin());
            if is_q {
                let dst = (p.q_out as *mut f32).add((i * heads + hv) * d);
                *dst.add(j) = a;
                *dst.add(j + half) = b;
            } else if row < p.cap as usize {
                let dst = (p.k_cache as *mut C).add((row * kvh + hv - heads) * d);
                C::store(dst.add(j), a);
                C::store(dst.add(j + half), b);
            }
        }
    }
}

/// QKV norm + MRoPE + append to an f32 KV cache. See [`qkv_rope_append`].
#[kernel]
pub unsafe fn qkv_rope_append_f32(p: QkvRopeParams) {
    qkv_rope_append::<f32>(p)
}

/// QKV norm + MRoPE + append to an f16 KV cache. See [`qkv_rope_append`].
#[kernel]
pub unsafe fn qkv_rope_append_f16(p: QkvRopeParams) {
    qkv_rope_append::<F16>(p)
}
