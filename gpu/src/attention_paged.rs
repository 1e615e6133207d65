//! # `attention_paged_f16`: decode attention over a paged f16 KV cache, keys and values staged
//! in shared memory (compute_80)
//!
//! Parameters: [`SplitAttnParams`] in paged mode (`table` non-zero): query row `i` is a
//! sequence of its own whose keys `0 .. lens[i]` sit in the KV blocks of its table row;
//! `q [t, heads, d]` f32, `k`, `v` `[cap, kv_heads, d]` f16 (optional row scales `kv_scale`,
//! see [`SplitAttnParams::kv_scale`]), `out [t, heads, d]` f32; `d` a power of two from 32 to
//! 256. The partial states, arrival counters and the final merge are those of the paged
//! `attention_split_*` (`crate::attention::merge_chunks`), so the host sizes both alike.
//!
//! Tiling: grid = `(splits, kv_heads, t · ceil(group / MAX_QV))`; block `(s, g, z)` takes
//! chunk `s` of row `i = z / ceil(group / MAX_QV)`'s keys (`min(splits, ceil(lens[i] /
//! MIN_KEYS))` active chunks; blocks past those exit) for at most `MAX_QV` query heads of KV
//! head `g`. It streams its chunk through shared memory in tiles of `TILE_BYTES / (2 d)` keys
//! (32 at d 128), keys, values and an f16 cache's row scales side by side, `STAGES` tiles in
//! flight (`cp.async`, rows past the chunk zero-filled; 55 KiB of shared memory and 118
//! registers: four blocks per SM). The row's first `TABLE_ENTRIES` block-table entries are
//! copied to shared memory at the start, beside the key-count load, so that no cache-row
//! lookup waits on a global load after the key count (on the H100 a batch-1 step went from
//! 466 to 492 tok/s after 64 tokens). Each SM so keeps over 100 KiB of cache reads in flight,
//! where the SIMT split kernel issued one warp's loads per 32 keys, looked up every key's
//! row scales on the way (a dependent load per key) and held 168 registers (three blocks per
//! SM): on the H100 a batch-64 decode step's attention (context about 300) went from 81.6 to
//! 39.4 µs per layer.
//!
//! Thread mapping: `d / 8` consecutive lanes form a key slot (16 at d 128: two slots per warp,
//! eight per block); lane `li` of a slot holds dims `8 li .. 8 li + 8` of the block's scaled
//! queries in registers. A slot scores keys `slot, slot + slots, ...` of each tile
//! (`KEYS_PER_SLOT`): one 16-byte shared load per lane and key (a slot reads a whole row:
//! no bank conflicts), the dot product summed over the slot's lanes with `log2(d / 8)`
//! shuffles; one softmax update per tile (max over its keys, one rescale), then PV with the
//! same 16-byte value loads. Each slot keeps its own running state over every tile; at the end
//! the slots merge through shared memory into the chunk's state: the output when the chunk is
//! the only active one, else a partial state, and the last block of the row and group to
//! arrive merges the chunks.
//!
//! Safety: the launcher checks shapes and sizes (`d` in 32 ..= 256, a power of two; the table
//! holds every row's keys). Every thread reaches every barrier: the chunk bounds are uniform
//! over the block, and blocks past the active chunks exit before the first barrier.

use crate::attention::{merge_chunks, RowScales};
use crate::mem::{f16x2_to_f32, last_to_arrive, ld_shared_f32x4, shared_addr};
use crate::mma::{cp_async_16, cp_async_commit, cp_async_wait_all};
use crate::params::attn_paged_tile::{KEYS_PER_SLOT, MIN_KEYS, STAGE, STAGES, TABLE_ENTRIES, THREADS, TILE_BYTES};
use crate::params::attn_split_tile::MAX_QV;
use crate::params::SplitAttnParams;
use crate::reduce::shfl_xor;
use cuda_std::shared::dynamic_shared_mem;
use cuda_std::{kernel, thread, GpuFloat};

/// Waits until at most `STAGES - 2` committed tile copies are still in flight (the oldest has
/// landed).
#[inline(always)]
unsafe fn cp_async_wait_tile() {
    // STAGES is 3: one tile (the next) may stay in flight
    core::arch::asm!("cp.async.wait_group 1;", options(nostack));
}

/// An asynchronous 8-byte copy from global to shared memory (`bytes` 0 or 8; the rest
/// zero-filled): one cache row's key and value scales.
#[inline(always)]
pub(crate) unsafe fn cp_async_8(dst_shared: u64, src: *const u8, bytes: u32) {
    core::arch::asm!(
        "{{ .reg .u64 g; cvta.to.global.u64 g, {}; cp.async.ca.shared.global [{}], [g], 8, {}; }}",
        in(reg64) src, in(reg64) dst_shared, in(reg32) bytes,
        options(nostack),
    );
}

/// Two f32 at shared-space address `a` (8-byte aligned).
#[inline(always)]
pub(crate) unsafe fn ld_shared_f32x2(a: u64) -> (f32, f32) {
    let (x, y): (f32, f32);
    core::arch::asm!("ld.shared.v2.f32 {{{}, {}}}, [{}];", out(reg32) x, out(reg32) y, in(reg64) a, options(readonly, nostack));
    (x, y)
}

/// Eight f16 at shared-space address `a` (16-byte aligned) as f32.
#[inline(always)]
unsafe fn ld_shared_f16x8(a: u64) -> [f32; 8] {
    let w = ld_shared_f32x4(a);
    let (x0, x1) = f16x2_to_f32(w[0].to_bits());
    let (x2, x3) = f16x2_to_f32(w[1].to_bits());
    let (x4, x5) = f16x2_to_f32(w[2].to_bits());
    let (x6, x7) = f16x2_to_f32(w[3].to_bits());
    [x0, x1, x2, x3, x4, x5, x6, x7]
}

/// The merge, through shared memory, of `parts` softmax states for one output element: part
/// `s`'s (max, sum) pair at `state(s)`, its unnormalized output at `out(s)`; `exp` turns a
/// difference of maxima into a factor (`e^x`, or `2^x` for scores in log2 units). Returns the
/// largest max (-inf when no part saw a key), the output and the sum, both relative to it.
#[inline(always)]
pub(crate) unsafe fn merge_parts(parts: usize, state: impl Fn(usize) -> *const f32, out: impl Fn(usize) -> *const f32, exp: impl Fn(f32) -> f32) -> (f32, f32, f32) {
    let mut mx = f32::NEG_INFINITY;
    for s in 0..parts {
        mx = mx.max(*state(s));
    }
    let (mut o, mut sum) = (0.0f32, 0.0f32);
    if mx != f32::NEG_INFINITY {
        for s in 0..parts {
            let ms = *state(s);
            if ms != f32::NEG_INFINITY {
                let f = exp(ms - mx);
                o += *out(s) * f;
                sum += *state(s).add(1) * f;
            }
        }
    }
    (mx, o, sum)
}

/// A sequence's block table (paged mode of [`SplitAttnParams`]) with its first
/// `TABLE_ENTRIES` entries copied to shared memory, so that a cache row's lookup waits on no
/// global load (on the H100 a batch-1 step went from 466 to 492 tok/s after 64 tokens); later
/// entries are read from the table in global memory.
#[derive(Clone, Copy)]
pub(crate) struct StagedTable {
    table: *const u32,
    shared: *const u32,
    staged: usize,
    shift: u32,
}

impl StagedTable {
    /// Copies row `i`'s leading entries into `shared` (thread `tid` of `threads` takes entries
    /// `tid, tid + threads, ...`). A barrier must follow before any thread calls [`Self::row`].
    #[inline(always)]
    pub(crate) unsafe fn stage(p: &SplitAttnParams, i: usize, shared: *mut u32, tid: usize, threads: usize) -> StagedTable {
        let table = (p.table as *const u32).add(i * p.table_stride as usize);
        let staged = (p.table_stride as usize).min(TABLE_ENTRIES as usize);
        let mut e = tid;
        while e < staged {
            *shared.add(e) = *table.add(e);
            e += threads;
        }
        StagedTable { table, shared, staged, shift: p.block_shift }
    }

    /// The cache row of logical key `j`: `table[j >> shift] << shift | (j & (block - 1))`.
    #[inline(always)]
    pub(crate) unsafe fn row(&self, j: usize) -> usize {
        let b = j >> self.shift;
        let id = if b < self.staged { *self.shared.add(b) } else { *self.table.add(b) };
        ((id as usize) << self.shift) | (j & ((1usize << self.shift) - 1))
    }
}

/// Decode attention over a paged f16 cache through shared-memory tiles. See the module docs.
#[kernel]
pub unsafe fn attention_paged_f16(p: SplitAttnParams) {
    const NS: usize = STAGES as usize;
    const NT: usize = THREADS as usize;
    // a stage: the key tile, the value tile, then up to 128 keys' (key, value) row scales
    const STAGE_BYTES: usize = STAGE as usize;
    let (heads, kv_heads, d) = (p.heads as usize, p.kv_heads as usize, p.d as usize);
    let group = heads / kv_heads;
    let per_row = (group + MAX_QV - 1) / MAX_QV;
    let z = thread::block_idx_z() as usize;
    let (i, zz) = (z / per_row, z % per_row);
    let tid = thread::thread_idx_x() as usize;
    // 0. the row's leading block-table entries into shared memory, loaded beside the key count
    //    (a cache row's lookup then waits on no global load; see `TABLE_ENTRIES`)
    let tab_s = (dynamic_shared_mem::<u8>() as *mut u8).add(STAGES as usize * STAGE_BYTES) as *mut u32;
    let table = StagedTable::stage(&p, i, tab_s, tid, NT);
    // 1. this block's chunk of row i's keys (uniform over the block)
    let kv_len = *(p.lens as *const u32).add(i) as usize;
    let active = ((kv_len + MIN_KEYS - 1) / MIN_KEYS).clamp(1, p.splits as usize);
    let split = thread::block_idx_x() as usize;
    if split >= active {
        return; // uniform over the block, before any barrier
    }
    let chunk = (kv_len + active - 1) / active;
    let c0 = (split * chunk).min(kv_len);
    let c1 = (c0 + chunk).min(kv_len);
    let g = thread::block_idx_y() as usize;
    let v0 = zz * MAX_QV; // the block's first query head within the group
    let qvs = (group - v0).min(MAX_QV);
    // the cache row of key j of the row (the staged entries, else the table in global memory)
    let row_of = |j: usize| table.row(j);
    let sc = RowScales::new(p.kv_scale, kv_heads, g);
    let lanes = d / 8;
    let slots = NT / lanes;
    let (slot, li) = (tid / lanes, tid % lanes);
    let tk = TILE_BYTES as usize / (2 * d); // keys per tile (= KEYS_PER_SLOT · slots)
    let row_bytes = 2 * d;

    // 2. this lane's dims of the block's queries, scaled
    let mut q = [[0.0f32; 8]; MAX_QV];
    for vi in 0..MAX_QV {
        if vi < qvs {
            let h = g * group + v0 + vi;
            let src = (p.q as *const f32).add((i * heads + h) * d + 8 * li);
            for e in 0..8 {
                q[vi][e] = *src.add(e) * p.scale;
            }
        }
    }

    // 3. the tile pipeline: stage `s` holds a key tile then a value tile of TILE_BYTES each
    let smem = shared_addr(dynamic_shared_mem::<u8>());
    let (k, v) = (p.k as *const u8, p.v as *const u8);
    let kv_row = kv_heads * row_bytes;
    let ntiles = (c1 - c0 + tk - 1) / tk;
    let scaled = p.kv_scale != 0;
    let issue = |t: usize| {
        let stage = smem + ((t % NS) * STAGE_BYTES) as u64;
        // the tile's row scales (key, value) beside its rows: no per-key lookups in the math
        if scaled && tid < tk {
            let j = c0 + t * tk + tid;
            let ok = j < c1;
            let src = if ok { sc.ptr(row_of(j)) } else { sc.ptr(0) };
            cp_async_8(stage + (2 * TILE_BYTES as usize + 8 * tid) as u64, src as *const u8, if ok { 8 } else { 0 });
        }
        let mut c = tid;
        while c < TILE_BYTES as usize / 16 {
            let (r, e) = (c / lanes, c % lanes);
            let j = c0 + t * tk + r;
            let ok = j < c1;
            let off = if ok { row_of(j) * kv_row + g * row_bytes + 16 * e } else { 0 };
            let n = if ok { 16 } else { 0 };
            cp_async_16(stage + (16 * c) as u64, k.add(off), n);
            cp_async_16(stage + (TILE_BYTES as usize + 16 * c) as u64, v.add(off), n);
            c += NT;
        }
    };
    thread::sync_threads(); // the staged table entries
    for t in 0..NS - 1 {
        if t < ntiles {
            issue(t);
        }
        cp_async_commit();
    }
    let mut m = [f32::NEG_INFINITY; MAX_QV];
    let mut l = [0.0f32; MAX_QV];
    let mut acc = [[0.0f32; 8]; MAX_QV];
    for t in 0..ntiles {
        cp_async_wait_tile();
        thread::sync_threads();
        // the stage tile t + NS - 1 goes to held tile t - 1, which every slot has finished
        if t + NS - 1 < ntiles {
            issue(t + NS - 1);
        }
        cp_async_commit();
        let stage = smem + ((t % NS) * STAGE_BYTES) as u64;
        // 3a. QK: the slot's keys of this tile
        let mut s = [[f32::NEG_INFINITY; MAX_QV]; KEYS_PER_SLOT];
        let mut vs = [1.0f32; KEYS_PER_SLOT];
        for kk in 0..KEYS_PER_SLOT {
            let r = slot + slots * kk;
            let kv = ld_shared_f16x8(stage + (r * row_bytes + 16 * li) as u64);
            let mut dot = [0.0f32; MAX_QV];
            for vi in 0..MAX_QV {
                dot[vi] = (kv[0] * q[vi][0] + kv[1] * q[vi][1] + kv[2] * q[vi][2] + kv[3] * q[vi][3]) + (kv[4] * q[vi][4] + kv[5] * q[vi][5] + kv[6] * q[vi][6] + kv[7] * q[vi][7]);
            }
            let mut off = lanes / 2;
            while off > 0 {
                for vi in 0..MAX_QV {
                    dot[vi] += shfl_xor(dot[vi], off as u32);
                }
                off /= 2;
            }
            let j = c0 + t * tk + r;
            if j < c1 {
                let (ks, vsc) = if scaled { ld_shared_f32x2(stage + (2 * TILE_BYTES as usize + 8 * r) as u64) } else { (1.0, 1.0) };
                vs[kk] = vsc;
                for vi in 0..MAX_QV {
                    s[kk][vi] = dot[vi] * ks;
                }
            }
        }
        // 3b. one softmax update per query for the tile; p = e^(s - m) · the value's scale
        let mut pw = [[0.0f32; MAX_QV]; KEYS_PER_SLOT];
        for vi in 0..MAX_QV {
            let mut mt = m[vi];
            for kk in 0..KEYS_PER_SLOT {
                mt = mt.max(s[kk][vi]);
            }
            if mt == f32::NEG_INFINITY {
                continue; // no key of the slot's yet
            }
            let rescale = (m[vi] - mt).exp();
            let mut sum = 0.0f32;
            for kk in 0..KEYS_PER_SLOT {
                let e = (s[kk][vi] - mt).exp();
                sum += e;
                pw[kk][vi] = e * vs[kk];
            }
            l[vi] = l[vi] * rescale + sum;
            m[vi] = mt;
            for e in 0..8 {
                acc[vi][e] *= rescale;
            }
        }
        // 3c. PV (rows past the chunk are zero-filled and weigh 0)
        for kk in 0..KEYS_PER_SLOT {
            let r = slot + slots * kk;
            let vv = ld_shared_f16x8(stage + (TILE_BYTES as usize + r * row_bytes + 16 * li) as u64);
            for vi in 0..MAX_QV {
                for e in 0..8 {
                    acc[vi][e] += pw[kk][vi] * vv[e];
                }
            }
        }
    }
    cp_async_wait_all();
    thread::sync_threads();

    // 4. the slots' states merged through shared memory (the stages are free now):
    //    outs [MAX_QV][slots][d] f32 (THREADS · 8 per query), states [MAX_QV][slots][2]
    let base = dynamic_shared_mem::<u8>();
    let outs = base as *mut f32;
    let states = outs.add(MAX_QV * NT * 8);
    for vi in 0..MAX_QV {
        for e in 0..8 {
            *outs.add((vi * slots + slot) * d + 8 * li + e) = acc[vi][e];
        }
        if li == 0 {
            *states.add((vi * slots + slot) * 2) = m[vi];
            *states.add((vi * slots + slot) * 2 + 1) = l[vi];
        }
    }
    thread::sync_threads();
    let splits = p.splits as usize;
    let mut x = tid;
    while x < qvs * d {
        let (vi, e) = (x / d, x % d);
        let (mx, o, sum) = merge_parts(slots, |si| states.add((vi * slots + si) * 2), |si| outs.add((vi * slots + si) * d + e), |x| x.exp());
        let h = g * group + v0 + vi;
        if active == 1 {
            // one chunk holds every key: this block's merge is the answer
            *(p.out as *mut f32).add((i * heads + h) * d + e) = if sum > 0.0 { o / sum } else { 0.0 };
        } else {
            let dst = (p.partial as *mut f32).add(((i * heads + h) * splits + split) * (d + 2));
            *dst.add(e) = o;
            if e == 0 {
                *dst.add(d) = mx;
                *dst.add(d + 1) = sum;
            }
        }
        x += NT;
    }
    if active == 1 {
        return;
    }
    // 5. the last active block of this row and group to arrive merges every chunk's state
    let counter = (p.counters as *mut u32).add(g * thread::grid_dim_z() as usize + z);
    if last_to_arrive(counter, active) {
        merge_chunks(&p, g, i * group + v0, qvs, active, tid);
    }
}
