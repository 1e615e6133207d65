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
//! update), so nothing of size `kv_len` is materialized. Prefill and the vision tower use the
//! tiled flash kernels (`flash.rs`, `flash_mma.rs`); this one serves the head dims those do not
//! take (not a multiple of 8, or over 128), with a log line saying so.
//!
//! # `attention_split_*`: flash-decoding ([`SplitAttnParams`])
//! For a few query rows (decode). Grid = `(splits, kv_heads, ceil(qvs / MAX_QV))`: block
//! `(s, g, z)` takes chunk `s` of the keys (the `kv_len` keys, read from the cursor on the
//! device, cut into `min(splits, ceil(kv_len / MIN_KEYS))` active chunks; blocks past those
//! exit) for query vectors `z·MAX_QV ..` of KV group `g` (`qvs = t · heads / kv_heads` of them,
//! at most `MAX_GROUP_QV`), so each K/V row is read once per group. The block stages its scaled
//! queries in shared memory; each warp takes 32 keys at a time: QK with one key per lane (the
//! lane reads its key row in 16-byte vectors, the queries are broadcast from shared memory, no
//! shuffle per key), one softmax update per 32 keys (warp max and sum), then PV with `d / 8`
//! lanes per value row, each lane accumulating 8 dims and taking each key's weight from the
//! lane that scored it. The warps merge through shared memory into the chunk's state: written
//! as the output when it is the only active chunk, else as a partial `[d + 2]` (unnormalized
//! output, max, sum), and the last block of the group to arrive (an arrival counter per group,
//! fenced so that every chunk's state is visible first) merges the chunks and resets the
//! counter: one launch per decode attention, and the counters stay zero for the next launch
//! (or graph replay).
//!
//! Paged mode (`table` non-zero; the batched decode of many sequences; with the compute_80
//! module an f16 cache takes `attention_paged_f16` instead, `attention_paged.rs`): every query
//! row is a sequence of its own with keys `0 .. lens[i]` in the KV blocks of its row of
//! `table`, so grid z = `t · ceil(group / MAX_QV)` and a block serves vectors of one row only;
//! a key's cache row is looked up per key (`Paging::row`), everything else is as above.
//!
//! An f16 cache may come with row scales (`kv_scale`, see [`AttentionParams::kv_scale`]): a
//! key's scale multiplies its score, a value's the key's weight in PV (after the softmax sum),
//! both in f32, so rows stored divided by a power of two give the f32 answer.
//!
//! # Safety
//! The launchers validate sizes and shapes (`d` in 32, 64, 128, 256 for the split path).
//! Warps past the last item exit as a whole, so shuffles have all 32 lanes; in the split kernel
//! every thread reaches both block barriers.

use crate::math::{OnlineSoftmax, F16};
use crate::mem::{last_to_arrive, ld_cg_f32x2, ld_f32x4, F32x2, F32x4, KvElem, KvVec8};
use crate::params::attention_tile::{MAX_PER_LANE, WARPS};
use crate::params::attn_split_tile::{MAX_D, MAX_QV, MAX_SPLITS, MIN_KEYS, WARPS as SPLIT_WARPS};
use crate::params::{AttentionParams, SplitAttnParams, CURSOR_FIELDS, CURSOR_ROW};
use crate::reduce::{shfl_idx, shfl_xor, warp_max, warp_sum};
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
    let sc = RowScales::new(p.kv_scale, p.kv_heads as usize, kvh);
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
        let (ks, vs) = sc.at(j);
        let s = warp_sum(part) * ks * p.scale;
        let (next, rescale, w) = norm.push_weighted(s);
        let w = w * vs;
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

/// The scales of one KV head's f16 cache rows (see [`AttentionParams::kv_scale`]): `(key,
/// value)` scale of cache row `row`, `(1, 1)` without a scale tensor.
#[derive(Clone, Copy)]
pub(crate) struct RowScales {
    base: *const f32,
    stride: usize,
}

impl RowScales {
    /// KV head `g` of `kv_heads` in the `[cap, kv_heads, 2]` tensor at `addr` (0: none).
    #[inline(always)]
    pub(crate) unsafe fn new(addr: u64, kv_heads: usize, g: usize) -> RowScales {
        let base = if addr == 0 { core::ptr::null() } else { (addr as *const f32).add(2 * g) };
        RowScales { base, stride: 2 * kv_heads }
    }

    /// The address of row `row`'s `(key, value)` pair (scales present).
    #[inline(always)]
    #[cfg_attr(not(feature = "sm80"), allow(dead_code))]
    pub(crate) unsafe fn ptr(&self, row: usize) -> *const f32 {
        self.base.add(row * self.stride)
    }

    #[inline(always)]
    pub(crate) unsafe fn at(&self, row: usize) -> (f32, f32) {
        if self.base.is_null() {
            return (1.0, 1.0);
        }
        let x = *(self.base.add(row * self.stride) as *const [f32; 2]);
        (x[0], x[1])
    }
}

/// Where logical key `j` of a block's sequence sits in the cache: row `j` (contiguous), or in
/// paged mode row `table[j >> shift] << shift | (j & mask)`.
#[derive(Clone, Copy)]
pub(crate) struct Paging {
    /// The sequence's block ids, or null for a contiguous cache.
    pub(crate) table: *const u32,
    pub(crate) shift: u32,
}

impl Paging {
    #[inline(always)]
    pub(crate) unsafe fn row(&self, j: usize) -> usize {
        if self.table.is_null() {
            j
        } else {
            ((*self.table.add(j >> self.shift) as usize) << self.shift) | (j & ((1usize << self.shift) - 1))
        }
    }
}

/// The running softmax state of one query vector in one warp: max, sum, and this lane's 8
/// output elements (lanes `l < d / 8` hold dims `8l ..`; after `finish_warp`).
#[derive(Clone, Copy)]
struct WarpState {
    max: f32,
    sum: f32,
    acc: [f32; 8],
}

/// One warp's pass over a block of up to 32 keys (`kb ..`, `nk` of them, all inside the chunk):
/// QK with one key per lane (its row read in 16-byte vectors, the query broadcast from shared
/// memory), one softmax update per block of keys, then PV with `d / 8` lanes per value row
/// (`32 / (d / 8)` keys per step, each lane accumulating 8 dims). `qs`: `[QV][d]` scaled
/// queries in shared memory; `vis[v]`: the last key vector `v` sees.
#[inline(always)]
unsafe fn warp_block<C: KvVec8, const QV: usize>(
    (k, v, kv_row): (*const C, *const C, usize),
    sc: RowScales,
    pg: Paging,
    d: usize,
    qs: *const f32,
    (kb, nk): (usize, usize),
    vis: &[usize; QV],
    qvs: usize,
    st: &mut [WarpState; QV],
) {
    let lane = (thread::thread_idx_x() % 32) as usize;
    // 1. QK: lane `l` scores key `kb + l`
    let mut s = [0.0f32; QV];
    let j = kb + lane;
    let (mut ks, mut vs) = (1.0f32, 1.0f32);
    if lane < nk {
        let r = pg.row(j);
        let (a, b) = sc.at(r);
        ks = a;
        vs = b;
        let row = k.add(r * kv_row);
        // QK_VECS vectors of the row in flight at a time (a 128-wide f16 row in two rounds)
        const QK_VECS: usize = 8;
        let mut c = 0;
        while c < d {
            let mut kv = [[0.0f32; 8]; QK_VECS];
            for u in 0..QK_VECS {
                if c + 8 * u < d {
                    kv[u] = C::load8(row.add(c + 8 * u));
                }
            }
            for vi in 0..QV {
                let q = qs.add(vi * MAX_D + c);
                for u in 0..QK_VECS {
                    if c + 8 * u < d {
                        let (a, b) = (ld_f32x4(q.add(8 * u)), ld_f32x4(q.add(8 * u + 4)));
                        s[vi] += (kv[u][0] * a[0] + kv[u][1] * a[1] + kv[u][2] * a[2] + kv[u][3] * a[3]) + (kv[u][4] * b[0] + kv[u][5] * b[1] + kv[u][6] * b[2] + kv[u][7] * b[3]);
                    }
                }
            }
            c += 8 * QK_VECS;
        }
    }
    // 2. one softmax update per vector for the block: p = e^(s - m), rescale the old state;
    //    the key's scale multiplies its scores, the value's its weight (after the sum)
    let mut p = [0.0f32; QV];
    for vi in 0..QV {
        let score = if lane < nk && j <= vis[vi] && vi < qvs { s[vi] * ks } else { f32::NEG_INFINITY };
        let m = st[vi].max.max(warp_max(score));
        if m == f32::NEG_INFINITY {
            continue; // nothing visible yet (uniform: m is the warp's)
        }
        p[vi] = (score - m).exp();
        let rescale = (st[vi].max - m).exp();
        st[vi].sum = st[vi].sum * rescale + warp_sum(p[vi]);
        p[vi] *= vs;
        st[vi].max = m;
        for e in 0..8 {
            st[vi].acc[e] *= rescale;
        }
    }
    // 3. PV: `lanes` lanes per value row, `per_step` keys per step
    let lanes = d / 8;
    let per_step = 32 / lanes;
    let (sub, sl) = (lane / lanes, lane % lanes);
    let mut i0 = 0;
    while i0 < nk {
        const BATCH: usize = 8;
        let mut vv = [[0.0f32; 8]; BATCH];
        let mut idx = [0usize; BATCH];
        for u in 0..BATCH {
            idx[u] = i0 + u * per_step + sub;
            if idx[u] < nk {
                vv[u] = C::load8(v.add(pg.row(kb + idx[u]) * kv_row + 8 * sl));
            }
        }
        for u in 0..BATCH {
            for vi in 0..QV {
                let w = shfl_idx(p[vi], idx[u].min(31) as u32);
                let w = if idx[u] < nk { w } else { 0.0 };
                for e in 0..8 {
                    st[vi].acc[e] += w * vv[u][e];
                }
            }
        }
        i0 += BATCH * per_step;
    }
}

/// Sums each vector's output share over the lane groups that took different keys in PV, so
/// lanes `l < d / 8` hold the warp's dims `8l .. 8l + 8`.
#[inline(always)]
fn finish_warp<const QV: usize>(d: usize, st: &mut [WarpState; QV]) {
    let lanes = d / 8;
    for vi in 0..QV {
        let mut m = lanes;
        while m < 32 {
            for e in 0..8 {
                st[vi].acc[e] += shfl_xor(st[vi].acc[e], m as u32);
            }
            m *= 2;
        }
    }
}

/// The query vectors block z serves: the first (`v0`, counting over rows × group heads), how
/// many (`qvs`, at most `qv`), and where their keys are. Contiguous mode: vectors `z · MAX_QV ..`
/// of all rows. Paged mode: `ceil(group / MAX_QV)` blocks per query row, each inside its row,
/// whose table row the keys follow.
#[inline(always)]
unsafe fn block_vectors(p: &SplitAttnParams, group: usize, qv: usize) -> (usize, usize, Paging) {
    let z = thread::block_idx_z() as usize;
    if p.table == 0 {
        let v0 = z * MAX_QV;
        return (v0, (p.t as usize * group).saturating_sub(v0).min(qv), Paging { table: core::ptr::null(), shift: 0 });
    }
    let per_row = (group + MAX_QV - 1) / MAX_QV;
    let (i, zz) = (z / per_row, z % per_row);
    let table = (p.table as *const u32).add(i * p.table_stride as usize);
    (i * group + zz * MAX_QV, (group - zz * MAX_QV).min(qv), Paging { table, shift: p.block_shift })
}

/// One block's work: its query vectors' scores against the keys of chunk `[c0, c1)`, the warps'
/// states merged into the chunk's (written as the output when it is the only active chunk, else
/// as a partial state), and the hand-over to the last block of the group. Every thread of the
/// block calls it (it has barriers).
#[inline(always)]
unsafe fn split_chunk<C: KvVec8, const QV: usize>(p: &SplitAttnParams, g: usize, (c0, c1, active): (usize, usize, usize)) {
    // 16-byte aligned: the QK loop reads it with vector loads
    let qs = shared_array![F32x4; MAX_QV * MAX_D / 4] as *mut f32;
    let tid = thread::thread_idx_x() as usize;
    let (lane, w) = (tid % 32, tid / 32);
    let (heads, kv_heads, d) = (p.heads as usize, p.kv_heads as usize, p.d as usize);
    let group = heads / kv_heads;
    let (v0, qvs, pg) = block_vectors(p, group, QV);
    // 1. the block's scaled queries into shared memory; each vector's last visible key
    let mut vis = [0usize; QV];
    for vi in 0..QV {
        let (i, h) = ((v0 + vi) / group, g * group + (v0 + vi) % group);
        if vi < qvs {
            vis[vi] = if pg.table.is_null() { *(p.cursor as *const u32).add(i * CURSOR_FIELDS + CURSOR_ROW) as usize } else { (*(p.lens as *const u32).add(i) as usize).saturating_sub(1) };
            let mut e = tid;
            while e < d {
                *qs.add(vi * MAX_D + e) = *(p.q as *const f32).add((i * heads + h) * d + e) * p.scale;
                e += thread::block_dim_x() as usize;
            }
        }
    }
    thread::sync_threads();
    // 2. each warp takes blocks of 32 keys in turn
    let mut st = [WarpState { max: f32::NEG_INFINITY, sum: 0.0, acc: [0.0; 8] }; QV];
    let kv = ((p.k as *const C).add(g * d), (p.v as *const C).add(g * d), kv_heads * d);
    let sc = RowScales::new(p.kv_scale, kv_heads, g);
    let mut kb = c0 + 32 * w;
    while kb < c1 {
        warp_block::<C, QV>(kv, sc, pg, d, qs, (kb, (c1 - kb).min(32)), &vis, qvs, &mut st);
        kb += 32 * SPLIT_WARPS as usize;
    }
    finish_warp::<QV>(d, &mut st);
    // 3. merge the warps through shared memory: [qv][warp][d] outputs, [qv][warp] states
    let outs = shared_array![f32; MAX_QV * SPLIT_WARPS as usize * MAX_D];
    let states = shared_array![f32; MAX_QV * SPLIT_WARPS as usize * 2];
    let warps = SPLIT_WARPS as usize;
    for vi in 0..QV {
        if lane < d / 8 {
            for e in 0..8 {
                *outs.add((vi * warps + w) * MAX_D + 8 * lane + e) = st[vi].acc[e];
            }
        }
        if lane == 0 {
            *states.add((vi * warps + w) * 2) = st[vi].max;
            *states.add((vi * warps + w) * 2 + 1) = st[vi].sum;
        }
    }
    thread::sync_threads();
    let splits = p.splits as usize;
    let split = thread::block_idx_x() as usize;
    let mut x = tid;
    while x < qvs * d {
        let (vi, e) = (x / d, x % d);
        let mut m = f32::NEG_INFINITY;
        for wi in 0..warps {
            m = m.max(*states.add((vi * warps + wi) * 2));
        }
        let (mut o, mut l) = (0.0f32, 0.0f32);
        if m != f32::NEG_INFINITY {
            for wi in 0..warps {
                let mw = *states.add((vi * warps + wi) * 2);
                if mw != f32::NEG_INFINITY {
                    let f = (mw - m).exp();
                    o += *outs.add((vi * warps + wi) * MAX_D + e) * f;
                    l += *states.add((vi * warps + wi) * 2 + 1) * f;
                }
            }
        }
        let (i, h) = ((v0 + vi) / group, g * group + (v0 + vi) % group);
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
    // 4. the last active block of this group to arrive merges every chunk's state into the output
    let counter = (p.counters as *mut u32).add(g * thread::grid_dim_z() as usize + thread::block_idx_z() as usize);
    if last_to_arrive(counter, active) {
        merge_chunks(p, g, v0, qvs, active, tid);
    }
}

/// The final merge of split-KV attention, by the last block of a group: for each of the block's
/// `qvs` query vectors one warp reads every chunk's max and sum at once (lane `s` chunks `s`
/// and `s + 32`) and combines them into per-chunk factors `e^(m_s - M) / L` in shared memory;
/// then every pair of output elements sums its `active` chunk values with those factors,
/// `MERGE_BATCH` 8-byte loads in flight per thread, the threads striding over (vector, pair) so
/// that the loads of one chunk are coalesced (read through L2: other blocks wrote them). So
/// the merge waits on two rounds of L2 reads (the factors', then the values' when `active <=
/// MERGE_BATCH`); it waited on up to eleven when each step was its own round (the maxima, the
/// sums, the factors, then a round per element and batch of 16 chunks). `kernels-bench` on the
/// H200, one row of the tensor-core paged kernel: 10.8 → 7.9 µs after 512 keys, 19.1 → 13.1
/// after 4,096, 50.9 → 44.8 after 32,768.
#[inline(always)]
pub(crate) unsafe fn merge_chunks(p: &SplitAttnParams, g: usize, v0: usize, qvs: usize, active: usize, tid: usize) {
    const _: () = assert!(MAX_SPLITS <= 64, "a lane holds two chunks' states");
    let factors = shared_array![f32; MAX_QV * MAX_SPLITS];
    let (heads, d, splits) = (p.heads as usize, p.d as usize, p.splits as usize);
    let group = heads / p.kv_heads as usize;
    let step = thread::block_dim_x() as usize;
    let part_of = |v: usize| {
        let (i, h) = ((v0 + v) / group, g * group + (v0 + v) % group);
        ((p.partial as *const f32).add((i * heads + h) * splits * (d + 2)), (i * heads + h) * d)
    };
    // 1. per vector (one warp each): M = max m_s, L = Σ l_s e^(m_s - M), factors e^(m_s - M) / L
    let (lane, w) = (tid % 32, tid / 32);
    if w < qvs {
        let (part, _) = part_of(w);
        let state = |s: usize| if s < active { ld_cg_f32x2(part.add(s * (d + 2) + d)) } else { [f32::NEG_INFINITY, 0.0] };
        let (a, b) = (state(lane), state(lane + 32));
        let m = warp_max(a[0].max(b[0]));
        let f = |ms: f32| if ms == f32::NEG_INFINITY { 0.0 } else { (ms - m).exp() };
        let (fa, fb) = (f(a[0]), f(b[0]));
        let l = warp_sum(a[1] * fa + b[1] * fb);
        let inv = if l > 0.0 { 1.0 / l } else { 0.0 };
        if lane < active {
            *factors.add(w * MAX_SPLITS + lane) = fa * inv;
        }
        if lane + 32 < active {
            *factors.add(w * MAX_SPLITS + lane + 32) = fb * inv;
        }
    }
    thread::sync_threads();
    // 2. every pair of output elements: Σ_s o_s[e..e + 2] · factor_s
    const MERGE_BATCH: usize = 32;
    let half = d / 2;
    let mut x = tid;
    while x < qvs * half {
        let (v, e) = (x / half, 2 * (x % half));
        let (part, out) = part_of(v);
        let mut o = [0.0f32; 2];
        let mut s0 = 0;
        while s0 < active {
            let mut vals = [[0.0f32; 2]; MERGE_BATCH];
            for b in 0..MERGE_BATCH {
                if s0 + b < active {
                    vals[b] = ld_cg_f32x2(part.add((s0 + b) * (d + 2) + e));
                }
            }
            for b in 0..MERGE_BATCH {
                if s0 + b < active {
                    let f = *factors.add(v * MAX_SPLITS + s0 + b);
                    o[0] += vals[b][0] * f;
                    o[1] += vals[b][1] * f;
                }
            }
            s0 += MERGE_BATCH;
        }
        *(p.out as *mut F32x2).add((out + e) / 2) = F32x2(o);
        x += step;
    }
}

#[inline(always)]
unsafe fn attention_split<C: KvVec8>(p: SplitAttnParams) {
    // the keys every row sees (the last row sees the most), cut into `active` chunks of at
    // least MIN_KEYS (at most the launched `splits`): short contexts take one chunk and no merge
    // (paged: the keys of the block's own row)
    let mut kv_len = 0usize;
    if p.table == 0 {
        let cur = p.cursor as *const u32;
        for i in 0..p.t as usize {
            let r = *cur.add(i * CURSOR_FIELDS + CURSOR_ROW) as usize + 1;
            if r > kv_len {
                kv_len = r;
            }
        }
        kv_len = kv_len.min(p.cap as usize);
    } else {
        let per_row = ((p.heads / p.kv_heads) as usize + MAX_QV - 1) / MAX_QV;
        kv_len = *(p.lens as *const u32).add(thread::block_idx_z() as usize / per_row) as usize;
    }
    let active = ((kv_len + MIN_KEYS - 1) / MIN_KEYS).clamp(1, p.splits as usize);
    let split = thread::block_idx_x() as usize;
    if split >= active {
        return; // uniform per block: chunks past the active ones have no keys
    }
    let chunk = (kv_len + active - 1) / active;
    let c0 = (split * chunk).min(kv_len);
    let c1 = (c0 + chunk).min(kv_len);
    let g = thread::block_idx_y() as usize;
    let group = (p.heads / p.kv_heads) as usize;
    let qvs = if p.table == 0 { p.t as usize * group } else { group };
    if qvs <= 1 {
        split_chunk::<C, 1>(&p, g, (c0, c1, active))
    } else {
        split_chunk::<C, MAX_QV>(&p, g, (c0, c1, active))
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
