//! Token choice on the device, so a decode step copies back one token id instead of the logits.
//!
//! # Parameters ([`SampleParams`])
//! `logits [rows, ld]` f32, of which the first `n` per row are candidates (padding columns
//! past `n` are never picked); `cand` scratch for `rows · blocks · k` candidates (f32 logits, then
//! as many u32 ids); `ids [rows]` u32 out; `cursor [rows, CURSOR_FIELDS]` u32, advanced by one
//! on every field (rotary position and cache row) once the row's token is chosen. Optional:
//! `row_settings [rows, sample_row::WORDS]` u32 (each row's temperature, top-p, top-k, seed)
//! and `mask [rows, mask_words]` u32 (`mask_words = ceil(n / 32)`; bit `t % 32` of word `t / 32`
//! set when id `t` may be picked: a grammar's allowed next tokens, computed on the host while
//! the device runs the step's forward). Address 0: none.
//!
//! # Tiling
//! - `sample_topk_f32`, grid `(blocks, rows)`: block `b` stages its slice of the row
//!   (`ceil(n / blocks)` logits, at most `MAX_SLICE`) in shared memory (with a mask, the ids
//!   whose bit is clear staged as negative infinity: they rank after every allowed id and get
//!   no weight when sampled) and extracts its `k` best in order (logit descending, id ascending
//!   on ties, as the CPU sampler sorts), one block-wide argmax per place, each over the
//!   elements ranked after the previous pick.
//! - `sample_pick_f32`, one block per row: the same over the `blocks · k` candidates
//!   (at most `MAX_CAND`), giving the row's `k` best in order; thread 0 then picks (greedy: the
//!   first; else `gpu::math::pick_sorted` with the draw `sample_uniform(seed, cursor row)`, both
//!   shared with the CPU sampler, which never takes a candidate without weight), writes the id
//!   and advances the cursor. With `row_settings`, each row picks with its own temperature,
//!   top-p, seed and top-k (a prefix of the `k` ranked: rows of a batch that sample differently
//!   share one launch).
//!
//! # Thread mapping
//! `THREADS` (256) per block. Staging: thread `t` loads elements `t, t + 256, ...` of the slice
//! (and, with a mask, the word holding each one's bit). Each argmax: every thread its strided
//! best, a warp shuffle reduction, then the 8 warps' bests through 64 words of shared scratch.
//! The pick runs on thread 0 alone.
//!
//! # Safety
//! The launcher checks sizes (the mask's `rows · ceil(n / 32)` words included), `k <= MAX_K`,
//! the slice fits the shared stage. All threads reach every barrier (the loops run the same
//! count in every thread; the mask branch is uniform over the launch).

use crate::math::{pick_sorted, sample_uniform};
use crate::params::sample_tile::{MAX_CAND, MAX_K, MAX_SLICE, THREADS};
use crate::params::{sample_row, SampleParams, CURSOR_FIELDS, CURSOR_ROW};
use crate::reduce::shfl_xor;
use cuda_std::{kernel, shared_array, thread};


/// `(logit, id)` ranked: higher logit first, lower id first on ties.
#[inline(always)]
fn better(v: f32, i: u32, bv: f32, bi: u32) -> bool {
    v > bv || (v == bv && i < bi)
}

/// The best of `vals[x]` (ids `ids(x)`) for `x < len` that rank after `(pv, pi)`, over the
/// block; every thread gets it. `scratch`: 2 · 32 words of shared memory.
#[inline(always)]
unsafe fn block_best_after<F: Fn(usize) -> u32>(vals: *const f32, len: usize, id_of: &F, pv: f32, pi: u32, scratch: *mut f32) -> (f32, u32) {
    let tid = thread::thread_idx_x() as usize;
    let (mut bv, mut bi) = (f32::NEG_INFINITY, u32::MAX);
    let mut x = tid;
    while x < len {
        let (v, i) = (*vals.add(x), id_of(x));
        if better(pv, pi, v, i) && better(v, i, bv, bi) {
            bv = v;
            bi = i;
        }
        x += THREADS as usize;
    }
    let mut m = 16;
    while m > 0 {
        let (ov, oi) = (shfl_xor(bv, m), shfl_xor(f32::from_bits(bi), m).to_bits());
        if better(ov, oi, bv, bi) {
            bv = ov;
            bi = oi;
        }
        m >>= 1;
    }
    if tid % 32 == 0 {
        *scratch.add(2 * (tid / 32)) = bv;
        *scratch.add(2 * (tid / 32) + 1) = f32::from_bits(bi);
    }
    thread::sync_threads();
    let (mut rv, mut ri) = (f32::NEG_INFINITY, u32::MAX);
    for w in 0..THREADS as usize / 32 {
        let (v, i) = (*scratch.add(2 * w), (*scratch.add(2 * w + 1)).to_bits());
        if better(v, i, rv, ri) {
            rv = v;
            ri = i;
        }
    }
    thread::sync_threads();
    (rv, ri)
}

/// First stage: the `k` best logits of this block's slice of one row. See the module docs.
#[kernel]
pub unsafe fn sample_topk_f32(p: SampleParams) {
    let stage = shared_array![f32; MAX_SLICE];
    let scratch = shared_array![f32; 64];
    let tid = thread::thread_idx_x() as usize;
    let (b, r) = (thread::block_idx_x() as usize, thread::block_idx_y() as usize);
    let (n, k, blocks) = (p.n as usize, p.k as usize, p.blocks as usize);
    let slice = (n + blocks - 1) / blocks;
    let x0 = (b * slice).min(n);
    let len = (x0 + slice).min(n) - x0;
    let row = (p.logits as *const f32).add(r * p.ld as usize + x0);
    let mut x = tid;
    if p.mask == 0 {
        while x < len {
            *stage.add(x) = *row.add(x);
            x += THREADS as usize;
        }
    } else {
        // ids whose bit is clear rank as negative infinity
        let words = (p.mask as *const u32).add(r * p.mask_words as usize);
        while x < len {
            let id = x0 + x;
            let allowed = (*words.add(id / 32) >> (id % 32)) & 1 != 0;
            *stage.add(x) = if allowed { *row.add(x) } else { f32::NEG_INFINITY };
            x += THREADS as usize;
        }
    }
    thread::sync_threads();
    let (vals, ids) = (p.cand as *mut f32, (p.cand as *mut u32).add(p.rows as usize * blocks * k));
    let out = (r * blocks + b) * k;
    let (mut pv, mut pi) = (f32::INFINITY, 0u32);
    let id_of = |x: usize| (x0 + x) as u32;
    for place in 0..k {
        let (v, i) = block_best_after(stage, len, &id_of, pv, pi, scratch);
        if tid == 0 {
            *vals.add(out + place) = v;
            *ids.add(out + place) = i;
        }
        pv = v;
        pi = i;
    }
}

/// Second stage: merge a row's candidates, pick, write the id, advance the cursor. See the
/// module docs.
#[kernel]
pub unsafe fn sample_pick_f32(p: SampleParams) {
    let cv = shared_array![f32; MAX_CAND];
    let ci = shared_array![u32; MAX_CAND];
    let best = shared_array![f32; MAX_K];
    let best_id = shared_array![u32; MAX_K];
    let scratch = shared_array![f32; 64];
    let tid = thread::thread_idx_x() as usize;
    let r = thread::block_idx_x() as usize;
    let (k, blocks) = (p.k as usize, p.blocks as usize);
    let count = blocks * k;
    let (vals, ids) = (p.cand as *const f32, (p.cand as *const u32).add(p.rows as usize * count));
    let mut x = tid;
    while x < count {
        *cv.add(x) = *vals.add(r * count + x);
        *ci.add(x) = *ids.add(r * count + x);
        x += THREADS as usize;
    }
    thread::sync_threads();
    let (mut pv, mut pi) = (f32::INFINITY, 0u32);
    let id_of = |x: usize| *ci.add(x);
    for place in 0..k {
        let (v, i) = block_best_after(cv, count, &id_of, pv, pi, scratch);
        if tid == 0 {
            *best.add(place) = v;
            *best_id.add(place) = i;
        }
        pv = v;
        pi = i;
    }
    thread::sync_threads();
    if tid == 0 {
        let cur = (p.cursor as *mut u32).add(r * CURSOR_FIELDS);
        // the launch's settings, or this row's own (its top-k a prefix of the k ranked)
        let (temperature, top_p, seed, kr) = if p.row_settings == 0 {
            (p.temperature, p.top_p, p.seed, k)
        } else {
            let w = (p.row_settings as *const u32).add(r * sample_row::WORDS);
            let seed = *w.add(sample_row::SEED_LO) as u64 | (*w.add(sample_row::SEED_HI) as u64) << 32;
            (f32::from_bits(*w.add(sample_row::TEMPERATURE)), f32::from_bits(*w.add(sample_row::TOP_P)), seed, (*w.add(sample_row::TOP_K) as usize).clamp(1, k))
        };
        let place = if temperature <= 0.0 || kr == 1 {
            0
        } else {
            let u = sample_uniform(seed, *cur.add(CURSOR_ROW) as u64);
            pick_sorted(core::slice::from_raw_parts(best, kr), temperature, top_p, u)
        };
        // ids past the vocabulary only come from NaN logits; keep them in range
        let id = *best_id.add(place);
        *(p.ids as *mut u32).add(r) = if id < p.n { id } else { p.n - 1 };
        for f in 0..CURSOR_FIELDS {
            *cur.add(f) += 1;
        }
    }
}
