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

use crate::math::{f16_key_scale, f16_value_scale, mrope_axis, rms_scale, rope_pair, F16};
use crate::mem::{f32_to_f16, grid_dep_wait, ld_f32x4, KvElem, U32x2};
use crate::params::qkv_rope_tile::{CAST_PAIRS, MAX_D, WARPS};
use crate::params::{QkvRopeParams, RopeCastParams, RopeParams, CURSOR_FIELDS, CURSOR_ROW};
use crate::reduce::{shfl_xor, warp_max, warp_sum};
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
/// `out = f16(rope(x · s_in) / s)` (rotate-half with the row's `cos`/`sin`, as `rope_f32`; no
/// rotation when `cos` is 0; `s_in` the vector's scale in `scale_in`, else 1), `s` the (row, head)
/// vector's `f16_key_scale` (`f16_value_scale` with `values`) written to `scale_out` (or 1 when
/// `scale_out` is 0): the vision tower's keys rotated and narrowed, its values narrowed, any K/V
/// narrowed for the tensor-core attention, and f16 KV-cache rows written, in one pass each.
/// One warp per (row, head) vector, `WARPS` per block (grid = `ceil(rows · heads / WARPS)`);
/// lane `l` loads pairs `(i, i + d/2)` for `i = l, l + 32, ...` (`d <= 2 · 32 · CAST_PAIRS`) up
/// front, the warp reduces their largest magnitude, then stores. Warps past the last vector
/// exit as a whole; no barriers.
#[kernel]
pub unsafe fn rope_cast_f16(p: RopeCastParams) {
    const PAIRS: usize = CAST_PAIRS;
    let tid = thread::thread_idx_x() as usize;
    let (lane, item) = (tid % 32, thread::block_idx_x() as usize * WARPS as usize + tid / 32);
    let (heads, d) = (p.heads as usize, p.d as usize);
    if item >= p.rows as usize * heads {
        return; // uniform per warp
    }
    let (r, half) = (item / heads, d / 2);
    let x = (p.x as *const f32).add(item * d);
    let f = if p.scale_in != 0 { *(p.scale_in as *const f32).add(2 * item) } else { 1.0 };
    let (mut a, mut b) = ([0.0f32; PAIRS], [0.0f32; PAIRS]);
    let mut mx = 0.0f32;
    for u in 0..PAIRS {
        let i = lane + 32 * u;
        if i < half {
            let (x1, x2) = (*x.add(i) * f, *x.add(i + half) * f);
            let (y1, y2) = if p.cos != 0 { rope_pair(x1, x2, *(p.cos as *const f32).add(r * half + i), *(p.sin as *const f32).add(r * half + i)) } else { (x1, x2) };
            a[u] = y1;
            b[u] = y2;
            mx = mx.max(y1.abs()).max(y2.abs());
        }
    }
    let mut s = 1.0f32;
    if p.scale_out != 0 {
        let m = warp_max(mx);
        s = if p.values != 0 { f16_value_scale(m) } else { f16_key_scale(m) };
        if lane == 0 {
            *(p.scale_out as *mut f32).add(2 * item) = s;
            if s != 1.0 && p.kv_flag != 0 {
                *(p.kv_flag as *mut u32) = 1;
            }
        }
    }
    let inv = 1.0 / s; // exact: a power of two
    let out = (p.out as *mut F16).add(item * d);
    for u in 0..PAIRS {
        let i = lane + 32 * u;
        if i < half {
            F16::store(out.add(i), a[u] * inv);
            F16::store(out.add(i + half), b[u] * inv);
        }
    }
}

/// # `rope_cast_x4_f16` ([`RopeCastParams`])
/// [`rope_cast_f16`] with four rotary pairs per lane, for head dims `d` that are a multiple of 8
/// with `d / 8` dividing 32 (8 to 256; the launcher picks it there when `x`, `cos` and `sin` are
/// 16-byte and `out` 8-byte aligned). `d / 8` lanes per (row, head) vector, `32 / (d / 8)`
/// vectors per warp (4 at 64, 2 at 128), `WARPS` warps per block (grid = `ceil(rows · heads /
/// (WARPS · 32 / (d / 8)))`). Lane `s` of a vector's group loads elements `4s ..
/// 4s + 4` of both halves and of the rotary tables as 16-byte vectors, rotates the four pairs,
/// reduces the vector's largest magnitude over its group (shuffles with masks below the group
/// size stay inside it), and stores 8-byte vectors. The one-warp-per-vector kernel read 8
/// bytes per lane before its reduction: 1.3 TB/s on the tower's 4,096 × 16 × 64 (H200).
/// Lanes of vectors past the last still take part in the shuffles and store nothing; no
/// barriers.
#[kernel]
pub unsafe fn rope_cast_x4_f16(p: RopeCastParams) {
    let tid = thread::thread_idx_x() as usize;
    let lane = tid % 32;
    let (heads, d) = (p.heads as usize, p.d as usize);
    let (lpv, half) = (d / 8, d / 2);
    let item = (thread::block_idx_x() as usize * WARPS as usize + tid / 32) * (32 / lpv) + lane / lpv;
    let j = 4 * (lane % lpv);
    let ok = item < p.rows as usize * heads;
    let r = item / heads;
    let (mut a, mut b) = ([0.0f32; 4], [0.0f32; 4]);
    if ok {
        let x = (p.x as *const f32).add(item * d + j);
        let f = if p.scale_in != 0 { *(p.scale_in as *const f32).add(2 * item) } else { 1.0 };
        let (x1, x2) = (ld_f32x4(x), ld_f32x4(x.add(half)));
        if p.cos != 0 {
            let (c, sn) = (ld_f32x4((p.cos as *const f32).add(r * half + j)), ld_f32x4((p.sin as *const f32).add(r * half + j)));
            unroll!(e < 4, [0, 1, 2, 3], {
                let (y1, y2) = rope_pair(x1[e] * f, x2[e] * f, c[e], sn[e]);
                a[e] = y1;
                b[e] = y2;
            });
        } else {
            unroll!(e < 4, [0, 1, 2, 3], {
                a[e] = x1[e] * f;
                b[e] = x2[e] * f;
            });
        }
    }
    let mut s = 1.0f32;
    if p.scale_out != 0 {
        let mut m = 0.0f32;
        unroll!(e < 4, [0, 1, 2, 3], {
            m = m.max(a[e].abs()).max(b[e].abs());
        });
        let mut k = 1;
        while k < lpv {
            m = m.max(shfl_xor(m, k as u32));
            k <<= 1;
        }
        s = if p.values != 0 { f16_value_scale(m) } else { f16_key_scale(m) };
        if ok && j == 0 {
            *(p.scale_out as *mut f32).add(2 * item) = s;
            if s != 1.0 && p.kv_flag != 0 {
                *(p.kv_flag as *mut u32) = 1;
            }
        }
    }
    if ok {
        let inv = 1.0 / s; // exact: a power of two
        let h = |v: f32| f32_to_f16(v * inv) as u32;
        let out = (p.out as *mut u8).add((item * d + j) * 2);
        *(out as *mut U32x2) = U32x2([h(a[0]) | (h(a[1]) << 16), h(a[2]) | (h(a[3]) << 16)]);
        *(out.add(half * 2) as *mut U32x2) = U32x2([h(b[0]) | (h(b[1]) << 16), h(b[2]) | (h(b[3]) << 16)]);
    }
}

/// # `qkv_rope_append_*` ([`QkvRopeParams`])
/// The decoder's step between the fused QKV projection and attention, for `t` rows:
/// q heads are RMS-normed (`q_norm`), rotated, and written to `q_out [t, heads, d]`; k heads are
/// normed (`k_norm`), rotated and written to the KV cache at the row's cache row; v heads are
/// copied there. With `kv_scale` (f16 caches) each k and v head vector is stored divided by its
/// `f16_key_scale` / `f16_value_scale` (a warp max), written beside it by lane 0, which also
/// sets `kv_flag` for a scale other than 1. The rotation angle of pair `j` is `pos[axis(j)] · inv_freq[j]`, with the
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
    // every input is another kernel's output (the cursor too: the sampler advances it)
    grid_dep_wait();
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
        // v: into the cache as is (divided by its scale in an f16 cache)
        if row < p.cap as usize {
            let g = hv - heads - kvh;
            let mut mx = 0.0f32;
            for u in 0..PER_LANE {
                mx = mx.max(x[u].abs());
            }
            let inv = 1.0 / kv_scale_out(&p, row, g, 1, mx, lane);
            let dst = (p.v_cache as *mut C).add((row * kvh + g) * d);
            for u in 0..PER_LANE {
                if lane + 32 * u < d {
                    C::store(dst.add(lane + 32 * u), x[u] * inv);
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
    // 3. rotate pairs (j, j + d/2) by pos[axis(j)] · inv_freq[j] and write them out (keys
    //    divided by their scale in an f16 cache)
    let half = d / 2;
    let (mut ra, mut rb) = ([0.0f32; PER_LANE / 2], [0.0f32; PER_LANE / 2]);
    let mut mx = 0.0f32;
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
            ra[u] = a;
            rb[u] = b;
            mx = mx.max(a.abs()).max(b.abs());
        }
    }
    if is_q {
        let dst = (p.q_out as *mut f32).add((i * heads + hv) * d);
        for u in 0..PER_LANE / 2 {
            let j = lane + 32 * u;
            if j < half {
                *dst.add(j) = ra[u];
                *dst.add(j + half) = rb[u];
            }
        }
    } else if row < p.cap as usize {
        let g = hv - heads;
        let inv = 1.0 / kv_scale_out(&p, row, g, 0, mx, lane);
        let dst = (p.k_cache as *mut C).add((row * kvh + g) * d);
        for u in 0..PER_LANE / 2 {
            let j = lane + 32 * u;
            if j < half {
                C::store(dst.add(j), ra[u] * inv);
                C::store(dst.add(j + half), rb[u] * inv);
            }
        }
    }
}

/// The scale a cache row of KV head `g` at cache row `row` is stored with (`which` 0: key, 1:
/// value), from this lane's largest magnitude `mx`: with `kv_scale` set, the warp's
/// `f16_key_scale` (`f16_value_scale` for values), written by lane 0; else 1. Every lane of the warp calls it.
#[inline(always)]
unsafe fn kv_scale_out(p: &QkvRopeParams, row: usize, g: usize, which: usize, mx: f32, lane: usize) -> f32 {
    if p.kv_scale == 0 {
        return 1.0;
    }
    let m = warp_max(mx);
    let s = if which == 1 { f16_value_scale(m) } else { f16_key_scale(m) };
    if lane == 0 {
        *(p.kv_scale as *mut f32).add(2 * (row * p.kv_heads as usize + g) + which) = s;
        if s != 1.0 && p.kv_flag != 0 {
            *(p.kv_flag as *mut u32) = 1;
        }
    }
    s
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
