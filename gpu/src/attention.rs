//! Attention against a KV cache (f32 or f16 elements, f32 arithmetic), with grouped KV heads.
//!
//! # `attention_*`: one warp per (query row, head) ([`AttentionParams`])
//! `q [t, heads, d]` f32, `k`, `v` `[cap, kv_heads, d]` of the kernel's dtype (first `kv_len`
//! rows valid), `out [t, heads, d]` f32. Query row `i` has key position `q_pos0 + i` (or, with a
//! cursor, sees keys `0 ..= cursor[i].row`); when causal it sees keys up to its own position.
//! Query head `h` reads KV head `h / (heads / kv_heads)`. `d <= 32 · MAX_PER_LANE` (256).
//! One warp per (query row, head), `WARPS` (4) per block, grid = `ceil(t · heads / 4)`. Lane `l`
//! holds elements `l, l + 32, ...` of the query and of the output accumulator in registers;
//! for each visible key the warp forms the score with a shuffle reduction and applies the
//! streaming update `gpu::math::OnlineSoftmax::push_weighted` (the CPU backend uses the same
//! update), so nothing of size `kv_len` is materialized. Used for prefill and the vision tower.
//!
//! # `attention_split_*` + `attention_combine_f32`: flash-decoding ([`SplitAttnParams`])
//! For a few query rows (decode). Grid = `(splits, kv_heads, ceil(qvs / MAX_QV))`: block
//! `(s, g, z)` scores the keys of chunk `s` (the `kv_len` keys, read from the cursor on the
//! device, cut into `min(splits, ceil(kv_len / MIN_KEYS))` active chunks; blocks past those
//! exit, and a single active chunk writes the output itself) for query vectors `z·MAX_QV ..` of KV group `g` (the group's
//! `qvs = t · heads / kv_heads` vectors, at most `MAX_GROUP_QV`), so each K/V row is read once
//! per group (Qwen3-VL-2B: 2 query heads per KV head, one block). Inside, `d / 8` lanes serve one key (8 elements each, one 16-byte load of
//! f16), so a warp takes `256 / d` keys at a time; each such slot scores `KEYS` keys before one
//! softmax update, keeping its running max, sum and output share in registers. The slots of a
//! block merge through shared memory into the chunk's partial state `[d + 2]` (unnormalized
//! output, max, sum). The last block of a group to finish (an arrival counter per group,
//! fenced so that every chunk's state is visible first) merges the chunks into the output and
//! resets the counter: one launch per decode attention, and the counters stay zero for the
//! next launch (or graph replay).
//!
//! # Safety
//! The launchers validate sizes and shapes (`d` a power of two in 16..=256 for the split path).
//! Warps past the last item exit as a whole, so shuffles have all 32 lanes; in the split kernel
//! every thread reaches both block barriers.

use crate::math::{OnlineSoftmax, F16};
use crate::mem::{atomic_inc, fence_device, ld_cg, KvElem, KvVec8};
use crate::params::attention_tile::{MAX_PER_LANE, WARPS};
use crate::params::attn_split_tile::{KEYS, MAX_QV, MAX_SPLITS, MIN_KEYS, WARPS as SPLIT_WARPS};
use crate::params::{AttentionParams, SplitAttnParams, CURSOR_FIELDS, CURSOR_ROW};
use crate::reduce::{shfl_xor, warp_max, warp_sum};
use cuda_std::{kernel, shared_array, thread, GpuFloat};

#[inline(always)]
unsafe fn attention<C: KvElem>(p: AttentionParams) {
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
    let visible = if p.causal == 0 {
        p.kv_len as usize
    } else if p.cursor != 0 {
        (*(p.cursor as *const u32).add(i * CURSOR_FIELDS + CURSOR_ROW) as usize + 1).min(p.cap as usize)
    } else {
        (p.q_pos0 as usize + i + 1).min(p.kv_len as usize)
    };

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
    let (k, v) = (p.k as *const C, p.v as *const C);
    let mut j = 0usize;
    while j < visible {
        let kr = k.add(j * kv_stride + kvh * d);
        let mut part = 0.0f32;
        for e in 0..MAX_PER_LANE {
            let x = lane + 32 * e;
            if x < d {
                part += qr[e] * C::load(kr.add(x));
            }
        }
        let s = warp_sum(part) * p.scale;
        let (next, rescale, w) = norm.push_weighted(s);
        norm = next;
        let vr = v.add(j * kv_stride + kvh * d);
        for e in 0..MAX_PER_LANE {
            let x = lane + 32 * e;
            if x < d {
                acc[e] = acc[e] * rescale + w * C::load(vr.add(x));
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

/// Attention over an f32 KV cache, one warp per (query row, head). See the module docs.
#[kernel]
pub unsafe fn attention_f32(p: AttentionParams) {
    attention::<f32>(p)
}

/// Attention over an f16 KV cache, one warp per (query row, head). See the module docs.
#[kernel]
pub unsafe fn attention_f16(p: AttentionParams) {
    attention::<F16>(p)
}

/// Sum over the `lanes` (a power of two ≤ 32) consecutive lanes that serve one key.
#[inline(always)]
fn group_sum(mut v: f32, lanes: usize) -> f32 {
    let mut m = lanes / 2;
    while m > 0 {
        v += shfl_xor(v, m as u32);
        m /= 2;
    }
    v
}

const _: () = assert!(KEYS == 4, "tile_update is written for 4 keys");

/// One softmax update of a query vector's running state with a tile of `KEYS` scores (-inf
/// where not visible) and their value rows (this lane's 8 elements).
#[inline(always)]
fn tile_update(st: &mut OnlineSoftmax, acc: &mut [f32; 8], s: &[f32; KEYS], vr: &[[f32; 8]; KEYS]) {
    let m = st.max.max(s[0]).max(s[1]).max(s[2]).max(s[3]);
    if m == f32::NEG_INFINITY {
        return; // nothing visible yet
    }
    let rescale = (st.max - m).exp();
    let w = [(s[0] - m).exp(), (s[1] - m).exp(), (s[2] - m).exp(), (s[3] - m).exp()];
    st.sum = st.sum * rescale + (w[0] + w[1]) + (w[2] + w[3]);
    st.max = m;
    for e in 0..8 {
        acc[e] = acc[e] * rescale + w[0] * vr[0][e] + w[1] * vr[1][e] + w[2] * vr[2][e] + w[3] * vr[3][e];
    }
}

/// Scores of this slot's keys for the chunk `[c0, c1)` in tiles of `KEYS`, with the running
/// softmax state per query vector, then the block's merge and, with several active chunks, the
/// hand-over to the last block of the group. `QV` query vectors; `vis[v]`: keys `<= vis[v]`
/// are visible. Every thread of the block calls it (it has barriers).
#[inline(always)]
unsafe fn split_chunk<C: KvVec8, const QV: usize>(
    p: &SplitAttnParams,
    g: usize,
    (c0, c1, active): (usize, usize, usize),
    (slot, slots, sl): (usize, usize, usize),
    lanes: usize,
) {
    // the loop runs warp-uniformly (keys past the chunk are masked), so every shuffle has all lanes
    let in_warp = slot % (32 / lanes);
    let (heads, kv_heads, d) = (p.heads as usize, p.kv_heads as usize, p.d as usize);
    let group = heads / kv_heads;
    let kv_row = kv_heads * d;
    let (kb, vb) = ((p.k as *const C).add(g * d + sl * 8), (p.v as *const C).add(g * d + sl * 8));
    let mut base = c0 + slot - in_warp; // the warp's first slot
    // a tile: KEYS keys (and, separately, their values) of this slot, zero past the chunk
    let load = |src: *const C, base: usize| {
        let mut t = [[0.0f32; 8]; KEYS];
        for u in 0..KEYS {
            let j = base + in_warp + u * slots;
            if j < c1 {
                t[u] = C::load8(src.add(j * kv_row));
            }
        }
        t
    };
    // 1. the first tile's loads go out with the queries', then this lane's 8 query elements of
    //    each vector (pre-scaled) and each vector's last visible key
    let (mut kr, mut vr) = (load(kb, base), load(vb, base));
    let v0 = thread::block_idx_z() as usize * MAX_QV;
    let qvs = (p.t as usize * group).saturating_sub(v0).min(QV);
    let mut q = [[0.0f32; 8]; QV];
    let mut vis = [0usize; QV];
    for v in 0..QV {
        if v < qvs {
            let (i, h) = ((v0 + v) / group, g * group + (v0 + v) % group);
            let src = (p.q as *const f32).add((i * heads + h) * d + sl * 8);
            for e in 0..8 {
                q[v][e] = *src.add(e) * p.scale;
            }
            vis[v] = *(p.cursor as *const u32).add(i * CURSOR_FIELDS + CURSOR_ROW) as usize;
        }
    }
    let mut st = [OnlineSoftmax::EMPTY; QV];
    let mut acc = [[0.0f32; 8]; QV];
    while base < c1 {
        let j0 = base + in_warp;
        let next = base + KEYS * slots;
        // 2. scores for every query vector; the next tile's keys go out once these are read
        let mut s = [[f32::NEG_INFINITY; KEYS]; QV];
        for v in 0..QV {
            for u in 0..KEYS {
                let mut part = 0.0f32;
                for e in 0..8 {
                    part += q[v][e] * kr[u][e];
                }
                let total = group_sum(part, lanes);
                let j = j0 + u * slots;
                if j < c1 && j <= vis[v] && v < qvs {
                    s[v][u] = total;
                }
            }
        }
        if next < c1 {
            kr = load(kb, next);
        }
        // 3. one softmax update per vector for the tile; then the next tile's values
        for v in 0..QV {
            tile_update(&mut st[v], &mut acc[v], &s[v], &vr);
        }
        if next < c1 {
            vr = load(vb, next);
        }
        base = next;
    }
    // 4. merge the slots of the block through shared memory: [qv][slot][d] outputs, [qv][slot] states
    let outs = shared_array![f32; MAX_QV * 32 * 8 * SPLIT_WARPS as usize];
    let states = shared_array![f32; MAX_QV * 2 * 32 * SPLIT_WARPS as usize];
    let per_qv = slots * d; // = 32 · 8 · WARPS
    for v in 0..QV {
        for e in 0..8 {
            *outs.add(v * per_qv + slot * d + sl * 8 + e) = acc[v][e];
        }
        if sl == 0 {
            *states.add((v * slots + slot) * 2) = st[v].max;
            *states.add((v * slots + slot) * 2 + 1) = st[v].sum;
        }
    }
    thread::sync_threads();
    let tid = thread::thread_idx_x() as usize;
    let splits = p.splits as usize;
    let split = thread::block_idx_x() as usize;
    let mut x = tid;
    while x < qvs * d {
        let (v, e) = (x / d, x % d);
        let mut m = f32::NEG_INFINITY;
        for sidx in 0..slots {
            let ms = *states.add((v * slots + sidx) * 2);
            if ms > m {
                m = ms;
            }
        }
        let (mut o, mut l) = (0.0f32, 0.0f32);
        if m != f32::NEG_INFINITY {
            for sidx in 0..slots {
                let ms = *states.add((v * slots + sidx) * 2);
                if ms != f32::NEG_INFINITY {
                    let f = (ms - m).exp();
                    o += *outs.add(v * per_qv + sidx * d + e) * f;
                    l += *states.add((v * slots + sidx) * 2 + 1) * f;
                }
            }
        }
        let (i, h) = ((v0 + v) / group, g * group + (v0 + v) % group);
        if active == 1 {
            // one chunk holds every key: this block's merge is the answer
            *(p.out as *mut f32).add((i * heads + h) * d + e) = if l > 0.0 { o / l } else { 0.0 };
        } else {
            let dst = (p.partial as *mut f32).add(((i * heads + h) * splits + split) * (d + 2));
            *dst.add(e) = o;
            if e == 0 {
                *dst.add(d) = m;
                *dst.add(d + 1) = l;
            }
        }
        x += thread::block_dim_x() as usize;
    }
    if active == 1 {
        return;
    }
    // 5. the last active block of this group to arrive merges every chunk's state into the output
    let last = shared_array![u32; 1];
    let counter = (p.counters as *mut u32).add(g * thread::grid_dim_z() as usize + thread::block_idx_z() as usize);
    fence_device();
    thread::sync_threads();
    if tid == 0 {
        *last = (atomic_inc(counter) as usize == active - 1) as u32;
    }
    thread::sync_threads();
    if *last != 0 {
        fence_device();
        merge_chunks(p, g, v0, qvs, active, tid);
        if tid == 0 {
            *counter = 0;
        }
    }
}

/// The final merge of split-KV attention, by the last block of a group: for each of the block's
/// `qvs` query vectors, the chunks' maxima and sums are combined once into per-chunk factors
/// `e^(m_s - M) / L` in shared memory, then every output element sums its `active` chunk
/// values with those factors, the threads striding over (vector, element) so that the loads of
/// one chunk are coalesced and independent (read through L2: other blocks wrote them).
#[inline(always)]
unsafe fn merge_chunks(p: &SplitAttnParams, g: usize, v0: usize, qvs: usize, active: usize, tid: usize) {
    let factors = shared_array![f32; MAX_QV * MAX_SPLITS];
    let (heads, d, splits) = (p.heads as usize, p.d as usize, p.splits as usize);
    let group = heads / p.kv_heads as usize;
    let step = thread::block_dim_x() as usize;
    let part_of = |v: usize| {
        let (i, h) = ((v0 + v) / group, g * group + (v0 + v) % group);
        ((p.partial as *const f32).add((i * heads + h) * splits * (d + 2)), (i * heads + h) * d)
    };
    // 1. per vector: M = max m_s, L = Σ l_s e^(m_s - M), factors e^(m_s - M) / L (one warp each)
    let (lane, w) = (tid % 32, tid / 32);
    if w < qvs {
        let (part, _) = part_of(w);
        let mut m = f32::NEG_INFINITY;
        let mut s = lane;
        while s < active {
            m = m.max(ld_cg(part.add(s * (d + 2) + d)));
            s += 32;
        }
        m = warp_max(m);
        let mut l = 0.0f32;
        let mut s = lane;
        while s < active {
            let ms = ld_cg(part.add(s * (d + 2) + d));
            if ms != f32::NEG_INFINITY {
                l += ld_cg(part.add(s * (d + 2) + d + 1)) * (ms - m).exp();
            }
            s += 32;
        }
        let l = warp_sum(l);
        let mut s = lane;
        while s < active {
            let ms = ld_cg(part.add(s * (d + 2) + d));
            *factors.add(w * MAX_SPLITS + s) = if ms == f32::NEG_INFINITY || l <= 0.0 { 0.0 } else { (ms - m).exp() / l };
            s += 32;
        }
    }
    thread::sync_threads();
    // 2. every output element: Σ_s o_s[e] · factor_s
    let mut x = tid;
    while x < qvs * d {
        let (v, e) = (x / d, x % d);
        let (part, out) = part_of(v);
        let mut o = 0.0f32;
        for s in 0..active {
            o += ld_cg(part.add(s * (d + 2) + e)) * *factors.add(v * MAX_SPLITS + s);
        }
        *(p.out as *mut f32).add(out + e) = o;
        x += step;
    }
}

#[inline(always)]
unsafe fn attention_split<C: KvVec8>(p: SplitAttnParams) {
    let tid = thread::thread_idx_x() as usize;
    let d = p.d as usize;
    let lanes = d / 8; // lanes per key
    let per_warp = 32 / lanes;
    let (lane, w) = (tid % 32, tid / 32);
    let (slot, sl) = (w * per_warp + lane / lanes, lane % lanes);
    let slots = SPLIT_WARPS as usize * per_warp;
    // the keys every row sees (the last row sees the most), cut into `active` chunks of at
    // least MIN_KEYS (at most the launched `splits`): short contexts take one chunk and no merge
    let cur = p.cursor as *const u32;
    let mut kv_len = 0usize;
    for i in 0..p.t as usize {
        let r = *cur.add(i * CURSOR_FIELDS + CURSOR_ROW) as usize + 1;
        if r > kv_len {
            kv_len = r;
        }
    }
    let kv_len = kv_len.min(p.cap as usize);
    let active = ((kv_len + MIN_KEYS - 1) / MIN_KEYS).clamp(1, p.splits as usize);
    let split = thread::block_idx_x() as usize;
    if split >= active {
        return; // uniform per block: chunks past the active ones have no keys
    }
    let chunk = (kv_len + active - 1) / active;
    let c0 = (split * chunk).min(kv_len);
    let c1 = (c0 + chunk).min(kv_len);
    let g = thread::block_idx_y() as usize;
    let qvs = p.t as usize * (p.heads / p.kv_heads) as usize;
    let at = (slot, slots, sl);
    if qvs <= 1 {
        split_chunk::<C, 1>(&p, g, (c0, c1, active), at, lanes)
    } else {
        split_chunk::<C, MAX_QV>(&p, g, (c0, c1, active), at, lanes)
    }
}

/// Split-KV decode attention over an f32 KV cache: one chunk's partial states. See the module docs.
#[kernel]
pub unsafe fn attention_split_f32(p: SplitAttnParams) {
    attention_split::<f32>(p)
}

/// Split-KV decode attention over an f16 KV cache: one chunk's partial states. See the module docs.
#[kernel]
pub unsafe fn attention_split_f16(p: SplitAttnParams) {
    attention_split::<F16>(p)
}
