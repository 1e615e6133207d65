//! # `attention_paged_mma_f16`: decode attention over a paged f16 KV cache on tensor cores,
//! split over the keys when the rows are few (compute_80)
//!
//! Parameters: [`SplitAttnParams`] in paged mode, as for `attention_paged_f16`: query row `i`
//! is a sequence of its own whose keys `0 .. lens[i]` sit in the KV blocks of its table row;
//! `q [t, heads, d]` f32, `k`, `v` `[cap, kv_heads, d]` f16 (optional row scales `kv_scale`),
//! `out [t, heads, d]` f32; `d` = [`D`] (128), `heads / kv_heads` at most [`MAX_GROUP`] (16).
//! With `splits` 1, `partial` and `counters` are not used. With more, they are those of the
//! paged `attention_split_*` (`[t, heads, splits, d + 2]` partial states, `kv_heads · t`
//! arrival counters, zero before the launch and left zero).
//!
//! Tiling: grid = `(kv_heads, t, splits)`; block `(g, i, c)` takes chunk `c` of row `i`'s keys
//! for the query heads of KV head `g` (the group: the m16 rows of the A operand, zero past the
//! group). A row of `n` keys has `min(splits, ceil(n / MIN_KEYS))` active chunks of whole steps
//! of `KEYS` (16) keys (blocks past them exit at once; a chunk can be empty and still reports
//! an empty state), so a recorded step keeps its launch at every context length. The block's
//! `WARPS` warps take the chunk's steps in turn (warp `w`: steps `w, w + WARPS, ...`), each
//! through its own ring of `STAGES` shared-memory slots (`cp.async`, keys past the row
//! zero-filled and masked): a slot is the step's key and value rows (16-byte chunks of row `r`
//! XOR-swizzled by `r % 8`, so `ldmatrix` reads of 8 rows hit 8 bank groups) and their row
//! scales. A warp waits only for its own copies, so no block barrier sits in the loop, and it
//! looks up the cache row of the step it will issue next before it waits, so the table load's
//! latency hides behind the step's math. At the end the warps' softmax states merge through
//! shared memory: into the output when the row has one chunk, else into the chunk's partial
//! state, and the last block of the row and KV head to arrive merges the chunks
//! (`crate::attention::merge_chunks`, as the SIMT kernels do).
//!
//! A batch (rows × KV heads at least half the multiprocessors) takes one chunk per row: rows ×
//! KV heads blocks (128 at batch 16: 103 KiB of shared memory and 226 registers, two blocks
//! per SM) of 4 warps, each keeping 24 KiB of cache reads in flight. On the H100 a batch-16
//! step after 256 tokens (16.4 MB of cache per layer) took 23.6 µs per layer in
//! `attention_paged_f16`, which cuts each row into four chunks of ~65 keys and was bound by
//! issuing its 7.9 M instructions (per-key shuffle sums, the chunk merges: ~120 per query head
//! and key); here 14–17 µs with 1.8 M (ncu), and the step went from 5,530 to 6,020 tok/s. The
//! first version took 30 µs: its fully unrolled prologue (Q loaded twice, a table lookup per
//! key) made 3.1 M instructions, one warp per scheduler waiting on each. Eight warps per block
//! with the Q fragments shared through shared memory measured slower (5,870–5,940). A single
//! row after 32k keys was the SIMT kernel's worst case (82.7 µs per layer, 1.68 TB/s, bound by
//! the same per-key instructions); split into chunks it runs here (BENCHMARKS.md).
//!
//! Thread mapping (m16n8k16 fragments, lane `l`, `g4 = l / 4`, `t4 = l % 4`): the lane holds
//! query heads `g4` and `g4 + 8` of the group (A fragments of `Q`, split into an f16 high part
//! and the f16 rounding of the rest, so `QKᵀ` keeps about f32 precision: two mmas per k step),
//! the step's scores (two n8 tiles of keys, `S = Q Kᵀ` with K fragments by `ldmatrix.x4`), its
//! output `[16 × D]` (`D / 8` n tiles). The scores become probabilities in registers (online
//! softmax per query head: maxima over the lane's four keys then the quad), multiplied by each
//! value row's scale, split high / low again and fed as A fragments to `O += P V` (V fragments
//! by `ldmatrix.x4.trans`). The lane's share of each head's sum stays per lane until the end.
//! Precision: keys and values are exact (an f16 cache); queries and probabilities carry about
//! 22 bits; sums and the softmax state are f32. A query head whose largest magnitude reaches
//! `2^15` (or is below `2^-4`) is narrowed divided by `f16_key_scale`, its scores multiplied
//! back. Scores are kept in log2 units (the query scale times log2 e; `ex2` for the
//! exponentials).
//!
//! Safety: the launcher checks shapes and sizes (`d` = 128, the group at most 16, the table
//! holds every row's keys, `splits` at most `MAX_SPLITS`, the counters and partial states
//! sized for the grid). Blocks past the active chunks exit before the first barrier (the
//! chunk count is uniform over the block); every other thread reaches every barrier (after
//! the table copy, around the warps' merge, in the arrival and the chunks' merge); each warp's
//! loop count is uniform over the warp.

use crate::attention::{merge_chunks, RowScales};
use crate::attention_paged::{cp_async_8, ld_shared_f32x2, merge_parts, StagedTable};
use crate::flash_mma::{ldmatrix_x4, ldmatrix_x4_trans, mma, pack_f16x2};
use crate::math::f16_key_scale;
use crate::flash::LOG2E;
use crate::mem::{ex2, f16x2_to_f32, grid_dep_wait, last_to_arrive, shared_addr, F32x2};
use crate::mma::{cp_async_16, cp_async_commit, cp_async_wait_all};
use crate::params::attn_paged_mma_tile::{D, KEYS, MAX_GROUP, MIN_KEYS, SLOT_BYTES, STAGES, TABLE_BYTES, WARPS};
use crate::params::attn_split_tile::MAX_QV;
use crate::params::SplitAttnParams;
use crate::reduce::shfl_xor;
use cuda_std::shared::dynamic_shared_mem;
use cuda_std::{kernel, thread, GpuFloat};

/// Waits until at most `STAGES - 1` of this thread's copy groups are still in flight (the
/// oldest slot of its warp's ring has landed, for this thread's own copies).
#[inline(always)]
unsafe fn cp_async_wait_slot() {
    // STAGES is 3
    core::arch::asm!("cp.async.wait_group 2;", options(nostack));
}

/// An f32 split into its f16 rounding and the f16 rounding of the rest, packed in pairs:
/// `(hi(a), hi(b))`, `(lo(a), lo(b))`.
#[inline(always)]
fn split2(a: f32, b: f32) -> (u32, u32) {
    let hi = pack_f16x2(a, b);
    let (ha, hb) = f16x2_to_f32(hi);
    (hi, pack_f16x2(a - ha, b - hb))
}

/// Byte offset of 16-byte chunk `c` of key row `r` in a slot's `[KEYS][D]` f16 tile.
#[inline(always)]
fn chunk(r: usize, c: usize) -> u32 {
    (r * D * 2 + ((c ^ (r & 7)) << 4)) as u32
}

/// Decode attention on tensor cores, split over the keys when the rows are few. See the
/// module docs.
#[kernel]
pub unsafe fn attention_paged_mma_f16(p: SplitAttnParams) {
    const NS: usize = STAGES as usize;
    const KS: usize = D / 16; // k steps of QKᵀ
    const NTD: usize = D / 8; // n tiles of the output
    let (heads, kv_heads) = (p.heads as usize, p.kv_heads as usize);
    let group = heads / kv_heads;
    let (g, i, split) = (thread::block_idx_x() as usize, thread::block_idx_y() as usize, thread::block_idx_z() as usize);
    let tid = thread::thread_idx_x() as usize;
    let (warp, lane) = (tid / 32, tid % 32);
    let (g4, t4) = (lane / 4, lane % 4);

    // 0. the queries and this step's keys are the kernels' before (the tables and key counts
    //    may be too); then the row's leading block-table entries into shared memory, beside
    //    the key count
    grid_dep_wait();
    let base = dynamic_shared_mem::<u8>();
    let table = StagedTable::stage(&p, i, base as *mut u32, tid, WARPS * 32);
    let kv_len = *(p.lens as *const u32).add(i) as usize;
    let shift = p.block_shift;
    let row_of = |j: usize| table.row(j);
    let sc = RowScales::new(p.kv_scale, kv_heads, g);
    let scaled = p.kv_scale != 0;

    // 1. the warp's ring: slot s = keys [KEYS][D] f16, values [KEYS][D] f16, scales [KEYS][2]
    let ring = shared_addr(base.add(TABLE_BYTES as usize + warp * NS * SLOT_BYTES as usize));
    let tile_bytes = KEYS * D * 2;
    let (k, v) = (p.k as *const u8, p.v as *const u8);
    let row_bytes = D * 2;
    let kv_row = kv_heads * row_bytes;
    // this block's chunk: steps s0 .. s1 of the row's (uniform over the block)
    let steps = (kv_len + KEYS - 1) / KEYS;
    let active = ((kv_len + MIN_KEYS - 1) / MIN_KEYS).clamp(1, p.splits as usize);
    if split >= active {
        return; // uniform over the block, before any barrier
    }
    let per = (steps + active - 1) / active;
    let s0 = (split * per).min(steps);
    let s1 = (s0 + per).min(steps);
    let mine = if warp < s1 - s0 { (s1 - s0 - warp + WARPS - 1) / WARPS } else { 0 };
    // the first key of the warp's step n
    let key0 = |n: usize| (s0 + warp + n * WARPS) * KEYS;
    thread::sync_threads(); // the staged table entries
    // step `n` of the warp (keys `key0(n) ..`) into slot `s`; a KV block of at least KEYS
    // rows holds a whole step: one table lookup per step, `first` (the cache row of its first
    // key, looked up by the caller), else a lookup per key
    let whole = (1usize << shift) >= KEYS;
    let first_row = |n: usize| if whole { row_of(key0(n)) } else { 0 };
    let (hi16, e16) = (lane >> 4, lane & 15);
    let issue = |n: usize, s: usize, first: usize| {
        let slot = ring + (s * SLOT_BYTES as usize) as u64;
        let j0 = key0(n);
        for x in 0..KEYS * D / 8 / 32 {
            // chunk e16 of key row 2x + hi16
            let r = 2 * x + hi16;
            let j = j0 + r;
            let ok = j < kv_len;
            let row = if whole { first + r } else { row_of(j) };
            let off = if ok { row * kv_row + g * row_bytes + 16 * e16 } else { 0 };
            let n = if ok { 16 } else { 0 };
            let o = chunk(r, e16) as u64;
            cp_async_16(slot + o, k.add(off), n);
            cp_async_16(slot + tile_bytes as u64 + o, v.add(off), n);
        }
        if scaled && lane < KEYS {
            let j = j0 + lane;
            let ok = j < kv_len;
            let src = if ok { sc.ptr(if whole { first + lane } else { row_of(j) }) } else { sc.ptr(0) };
            cp_async_8(slot + (2 * tile_bytes + 8 * lane) as u64, src as *const u8, if ok { 8 } else { 0 });
        }
    };
    for s in 0..NS {
        if s < mine {
            issue(s, s, first_row(s));
        }
        cp_async_commit();
    }
    // 2. the lane's A fragments of the group's queries (heads g4, g4 + 8), made by every warp
    //    while its ring fills: scaled, narrowed by a power of two where a head needs it, split
    //    high / low. First the lane's 32 elements of each head (pairs at 16 ks + 8 half + 2 t4;
    //    8-byte loads), in log2 units; zero past the group
    let mut qhi = [[0u32; 4]; KS];
    let mut qlo = [[0u32; 4]; KS];
    let mut qs = [1.0f32; 2];
    let mut qv = [[[0.0f32; 2]; 2 * KS]; 2];
    let mul = p.scale * LOG2E;
    unroll!(h < 2, [0, 1], {
        if g4 + 8 * h < group {
            let src = (p.q as *const f32).add((i * heads + g * group + g4 + 8 * h) * D + 2 * t4);
            unroll!(x < 2 * KS, [0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15], {
                let v = *(src.add(8 * x) as *const F32x2);
                qv[h][x] = [v.0[0] * mul, v.0[1] * mul];
            });
        }
    });
    // each head's narrowing divisor from its largest magnitude (the lane's, then its quad's)
    unroll!(h < 2, [0, 1], {
        let mut mx = 0.0f32;
        unroll!(x < 2 * KS, [0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15], {
            mx = mx.max(qv[h][x][0].abs()).max(qv[h][x][1].abs());
        });
        mx = mx.max(shfl_xor(mx, 1));
        mx = mx.max(shfl_xor(mx, 2));
        qs[h] = if g4 + 8 * h < group { f16_key_scale(mx) } else { 1.0 };
    });
    // A fragments, high and low: a0 (g4, 2t4..), a1 (g4 + 8, 2t4..), a2 (g4, 2t4 + 8..), a3
    let inv = [1.0 / qs[0], 1.0 / qs[1]];
    unroll!(ks < KS, [0, 1, 2, 3, 4, 5, 6, 7], {
        unroll!(f < 4, [0, 1, 2, 3], {
            let (h, half) = (f % 2, f / 2);
            let x = qv[h][2 * ks + half];
            let (hi, lo) = split2(x[0] * inv[h], x[1] * inv[h]);
            qhi[ks][f] = hi;
            qlo[ks][f] = lo;
        });
    });

    // the softmax state of heads g4, g4 + 8 (m: the quad's; l: this lane's share)
    let mut m = [f32::NEG_INFINITY; 2];
    let mut l = [0.0f32; 2];
    let mut o = [[0.0f32; 4]; NTD];
    for n in 0..mine {
        let s = n % NS;
        // the cache row of the step this iteration issues at its end, loaded before the wait
        let next = if n + NS < mine { first_row(n + NS) } else { 0 };
        cp_async_wait_slot();
        cuda_std::warp::sync_warp(0xffff_ffff); // every lane's copies of slot s have landed
        let slot = ring + (s * SLOT_BYTES as usize) as u64;
        let (ks_base, vs_base) = (slot as u32, slot as u32 + tile_bytes as u32);
        // 3a. S = Q Kᵀ for the step's 16 keys: n tile 0 = keys 0..8, 1 = keys 8..16; ldmatrix
        //     matrices: (keys 0-7, dims lo), (keys 0-7, dims hi), (keys 8-15, lo), (8-15, hi)
        let mut sacc = [[0.0f32; 4]; 2];
        let mut slo = [[0.0f32; 4]; 2]; // the low parts' products: two more independent chains
        let r = (lane & 7) + 8 * (lane >> 4);
        // (written out: a rolled loop would index the Q fragments through local memory)
        unroll!(kk < KS, [0, 1, 2, 3, 4, 5, 6, 7], {
            let b = ldmatrix_x4(ks_base, chunk(r, 2 * kk + ((lane >> 3) & 1)));
            sacc[0] = mma(sacc[0], qhi[kk], b[0], b[1]);
            sacc[1] = mma(sacc[1], qhi[kk], b[2], b[3]);
            slo[0] = mma(slo[0], qlo[kk], b[0], b[1]);
            slo[1] = mma(slo[1], qlo[kk], b[2], b[3]);
        });
        unroll!(nt < 2, [0, 1], {
            unroll!(c < 4, [0, 1, 2, 3], {
                sacc[nt][c] += slo[nt][c];
            });
        });
        // 3b. scores scaled back, masked past the row; one softmax update per head
        let j0 = key0(n);
        let mut vsc = [[1.0f32; 2]; 2]; // [n tile][e]: the value scales of the lane's keys
        for nt in 0..2 {
            for e in 0..2 {
                let key = 8 * nt + 2 * t4 + e;
                let (kscale, vscale) = if scaled { ld_shared_f32x2(slot + (2 * tile_bytes + 8 * key) as u64) } else { (1.0, 1.0) };
                vsc[nt][e] = vscale;
                let ok = j0 + key < kv_len;
                for h in 0..2 {
                    let x = &mut sacc[nt][2 * h + e];
                    *x = if ok { *x * kscale * qs[h] } else { f32::NEG_INFINITY };
                }
            }
        }
        let mut pa = [0.0f32; 8]; // [nt][h][e] probabilities times value scales
        let mut rescale = [1.0f32; 2];
        for h in 0..2 {
            let mut mx = sacc[0][2 * h].max(sacc[0][2 * h + 1]).max(sacc[1][2 * h]).max(sacc[1][2 * h + 1]);
            mx = mx.max(shfl_xor(mx, 1));
            mx = mx.max(shfl_xor(mx, 2));
            let mn = m[h].max(mx);
            // mn is -inf only while every key so far is masked: nothing to add or rescale
            let live = mn != f32::NEG_INFINITY;
            rescale[h] = if live { ex2(m[h] - mn) } else { 1.0 };
            let mut sum = 0.0f32;
            for nt in 0..2 {
                for e in 0..2 {
                    let pr = if live { ex2(sacc[nt][2 * h + e] - mn) } else { 0.0 };
                    sum += pr;
                    pa[4 * nt + 2 * h + e] = pr * vsc[nt][e];
                }
            }
            l[h] = l[h] * rescale[h] + sum;
            m[h] = mn;
        }
        for d8 in 0..NTD {
            o[d8][0] *= rescale[0];
            o[d8][1] *= rescale[0];
            o[d8][2] *= rescale[1];
            o[d8][3] *= rescale[1];
        }
        // 3c. O += P V: P as A fragments (a0 = keys 2t4.. of head g4, a1 = head g4 + 8, a2 / a3
        //     the same at keys 8 + 2t4..), high and low; V fragments transposed, two n tiles each
        let (h0, l0) = split2(pa[0], pa[1]);
        let (h1, l1) = split2(pa[2], pa[3]);
        let (h2, l2) = split2(pa[4], pa[5]);
        let (h3, l3) = split2(pa[6], pa[7]);
        let (phi, plo) = ([h0, h1, h2, h3], [l0, l1, l2, l3]);
        // matrices: (keys 0-7, dims 16dp..+8), (keys 8-15, same), (keys 0-7, +8..), (8-15, +8..)
        let vr = (lane & 7) + 8 * ((lane >> 3) & 1);
        unroll!(dp < NTD / 2, [0, 1, 2, 3, 4, 5, 6, 7], {
            let b = ldmatrix_x4_trans(vs_base, chunk(vr, 2 * dp + (lane >> 4)));
            o[2 * dp] = mma(o[2 * dp], phi, b[0], b[1]);
            o[2 * dp + 1] = mma(o[2 * dp + 1], phi, b[2], b[3]);
            o[2 * dp] = mma(o[2 * dp], plo, b[0], b[1]);
            o[2 * dp + 1] = mma(o[2 * dp + 1], plo, b[2], b[3]);
        });
        // 3d. every lane is done with slot s: the step NS ahead goes into it
        cuda_std::warp::sync_warp(0xffff_ffff);
        if n + NS < mine {
            issue(n + NS, s, next);
        }
        cp_async_commit();
    }
    cp_async_wait_all();
    // 4. the warps' states merged through shared memory (over the rings): outs [WARPS][MAX_GROUP][D]
    //    f32, states [WARPS][MAX_GROUP][2]
    thread::sync_threads();
    let outs = base.add(TABLE_BYTES as usize) as *mut f32;
    let states = outs.add(WARPS * MAX_GROUP * D);
    unroll!(h < 2, [0, 1], {
        let r = g4 + 8 * h;
        let mut lsum = l[h];
        lsum += shfl_xor(lsum, 1);
        lsum += shfl_xor(lsum, 2);
        if r < group {
            let dst = outs.add((warp * MAX_GROUP + r) * D + 2 * t4);
            unroll!(d8 < NTD, [0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15], {
                *dst.add(8 * d8) = o[d8][2 * h];
                *dst.add(8 * d8 + 1) = o[d8][2 * h + 1];
            });
            if t4 == 0 {
                *states.add((warp * MAX_GROUP + r) * 2) = m[h];
                *states.add((warp * MAX_GROUP + r) * 2 + 1) = lsum;
            }
        }
    });
    thread::sync_threads();
    let splits = p.splits as usize;
    let mut x = tid;
    while x < group * D {
        let (r, e) = (x / D, x % D);
        let (mx, acc, sum) = merge_parts(WARPS, |w| states.add((w * MAX_GROUP + r) * 2), |w| outs.add((w * MAX_GROUP + r) * D + e), ex2);
        let h = g * group + r;
        if active == 1 {
            // one chunk holds every key: this block's merge is the answer
            *(p.out as *mut f32).add((i * heads + h) * D + e) = if sum > 0.0 { acc / sum } else { 0.0 };
        } else {
            // the chunk's state, its max in natural-log units as the SIMT kernels write it
            let dst = (p.partial as *mut f32).add(((i * heads + h) * splits + split) * (D + 2));
            *dst.add(e) = acc;
            if e == 0 {
                *dst.add(D) = mx * core::f32::consts::LN_2;
                *dst.add(D + 1) = sum;
            }
        }
        x += WARPS * 32;
    }
    if active == 1 {
        return;
    }
    // 5. the last block of this row and KV head to arrive merges every chunk's state,
    //    MAX_QV query heads at a time
    let counter = (p.counters as *mut u32).add(g * thread::grid_dim_y() as usize + i);
    if last_to_arrive(counter, active) {
        let mut v = 0;
        while v < group {
            if v > 0 {
                thread::sync_threads(); // the previous heads' merge factors are read
            }
            merge_chunks(&p, g, i * group + v, (group - v).min(MAX_QV), active, tid);
            v += MAX_QV;
        }
    }
}
