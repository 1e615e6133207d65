//! Tiled (flash) attention for prefill and the vision tower: a block owns a tile of query
//! vectors of one KV group, streams the key tiles its vectors may see through shared memory and
//! keeps the online softmax in registers, so every K/V row is read once per query tile instead
//! of once per query row. Two kernel families share the planning below: `flash_attention_d*_*`
//! (FP32 SIMT, this file, every GPU) and `flash_attention_mma_d*_*` (tensor cores, compute_80,
//! `flash_mma.rs`).
//!
//! # Parameters ([`FlashParams`])
//! `q [t, heads, d]` f32, `k`, `v` `[cap, kv_heads, d]` of the kernel's dtype (f32 or f16),
//! `out [t, heads, d]` f32; `8 <= d <= D` (the kernel's head-dim class, 64 or 128) and `d` a
//! multiple of 8 (16-byte rows); dims past `d` are zero-padded in registers and shared memory.
//! Query vector `v` of KV head `g` is row `v / group`, head `g · group + v % group` (`group =
//! heads / kv_heads`). Visibility: keys below `kv_len` (`cap` with a cursor); causal rows up to
//! their position (`q_pos0 + row` or `cursor[row].row`); with a block mask
//! ([`crate::params::block_mask`]) only the allowed key blocks. Key tiles no vector of the block
//! may see are skipped — never loaded or scored; tiles every vector sees entirely are scored
//! without per-element checks; the rest are masked per element. With `cos`/`sin` the queries are
//! rotated (rotate-half) as they are loaded (the vision tower's 2-D rotary embedding).
//! The scores are computed as `q · scale · log2(e) · k` and exponentiated with `ex2`. f16 K/V
//! may come with row scales (`kv_scale`, see [`FlashParams::kv_scale`]): the SIMT kernels
//! multiply each row by its scale as they widen it; the tensor-core ones as described there.
//!
//! # Tiling (SIMT, [`flash_tile`])
//! A row group of `TX = D / 8` lanes holds `ROWS` (4) query vectors; lane `x` keeps dims
//! `4x ..+4` and `4x + D/2 ..+4` of each query (pre-scaled) and of each output accumulator in
//! registers (8 dims × 4 vectors), so the queries are never staged. Per key tile (`BN` = 32
//! keys): the block stages K and V as f32 (`[BN][D]`, f16 widened) in dynamic shared memory;
//! each group scores `CHUNK` (8) keys at a time — every lane forms partial dot products of its
//! 8 dims for 4 vectors × 8 keys, then a butterfly transpose-reduction over the group's lanes
//! (`log2 TX` steps, each halving the values a lane keeps) leaves each lane the full scores of
//! one key for `4 / (TX / 8)` vectors; the group reduces the tile's row maxima, rescales its
//! accumulators, writes the probabilities to its slice of shared memory (`[BN][ROWS]`) and
//! accumulates `P · V` with one 16-byte load of 4 probabilities and two of V per key.
//!
//! With a block mask, the block first classifies its key tiles in parallel (a ballot per 32
//! tiles into shared memory), so the tile loop reads one bit per tile.
//!
//! # Thread mapping
//! `THREADS` (128) per block; lane `l` of warp `w` is lane `l % TX` of row group
//! `w · 32 / TX + l / TX`, which holds the block's vectors `4 · group ..+4`. Grid =
//! `(ceil(t · group / vectors), kv_heads)`, query tiles in reverse order (with a causal mask the
//! last tiles see the most keys, so they start first).
//!
//! # Safety
//! The launcher validates sizes, `d`, alignment, the mask's length against its header and the
//! dynamic shared memory. Every block-uniform decision (tile skipped or not) is taken by all
//! threads alike, so both barriers of a tile are reached by every thread; the probability tiles
//! are private to a row group (one warp) and fenced with `sync_warp`. Mask words are read with
//! clamped indices, so a malformed mask cannot read outside its array.

use crate::attention::RowScales;
use crate::math::F16;
use crate::mem::{ex2, ld_f32x4, F32x4, KvVec8};
use crate::params::block_mask::{bits_at, k_bounds_at, CLASSIFIED_TILES as MASK_TILES, HEADER, MAX_TILE_PAIRS};
use crate::params::flash_tile::{BN, CHUNK, P_STRIDE, ROWS, THREADS};
use crate::params::{flash_tile, FlashParams, CURSOR_FIELDS, CURSOR_ROW};
use crate::reduce::shfl_xor;
use cuda_std::shared::dynamic_shared_mem;
use cuda_std::{kernel, thread, warp};

pub(crate) const LOG2E: f32 = core::f32::consts::LOG2_E;

/// `a[i]` for a runtime `i < N` without indexing the array dynamically (which would move it to
/// local memory): a chain of selects over the unrolled indices.
#[inline(always)]
pub(crate) fn pick<T: Copy, const N: usize>(a: &[T; N], i: usize) -> T {
    let mut r = a[0];
    for k in 1..N {
        if k == i {
            r = a[k];
        }
    }
    r
}

/// The packed block mask as the kernels read it.
#[derive(Clone, Copy)]
pub(crate) struct Mask {
    base: *const u32,
    nqb: u32,
    nkb: u32,
}

impl Mask {
    #[inline(always)]
    unsafe fn new(addr: u64) -> Mask {
        let base = addr as *const u32;
        Mask { base, nqb: (*base).max(1), nkb: (*base.add(1)).max(1) }
    }

    /// The last block `i < n` whose bound `b[i] <= x` (block 0 when none is).
    #[inline(always)]
    unsafe fn find(b: *const u32, n: u32, x: u32) -> u32 {
        let (mut lo, mut hi) = (0u32, n);
        while hi - lo > 1 {
            let mid = (lo + hi) / 2;
            if *b.add(mid as usize) <= x {
                lo = mid;
            } else {
                hi = mid;
            }
        }
        lo
    }

    #[inline(always)]
    pub(crate) unsafe fn q_block(&self, row: u32) -> u32 {
        Self::find(self.base.add(HEADER), self.nqb, row)
    }

    #[inline(always)]
    pub(crate) unsafe fn k_block(&self, key: u32) -> u32 {
        Self::find(self.base.add(k_bounds_at(self.nqb as usize)), self.nkb, key)
    }

    /// Whether query block `qb` sees key block `kb` (both in range by construction).
    #[inline(always)]
    pub(crate) unsafe fn allowed(&self, qb: u32, kb: u32) -> bool {
        let n = qb * self.nkb + kb;
        (*self.base.add(bits_at(self.nqb as usize, self.nkb as usize) + (n / 32) as usize) >> (n % 32)) & 1 != 0
    }
}

/// The lanes of the warp for which `x` holds, as a bit mask (`vote.sync.ballot`); every lane
/// calls it.
#[inline(always)]
pub(crate) fn ballot(x: bool) -> u32 {
    let r: u32;
    unsafe {
        core::arch::asm!(
            "{{ .reg .pred p; setp.ne.u32 p, {x}, 0; vote.sync.ballot.b32 {r}, p, 0xffffffff; }}",
            x = in(reg32) x as u32, r = out(reg32) r,
            options(nomem, nostack),
        );
    }
    r
}

/// The keys query row `row` sees before the block mask: `0 .. end`.
#[inline(always)]
unsafe fn row_end(p: &FlashParams, row: u32) -> u32 {
    let kv_end = if p.cursor != 0 { p.cap } else { p.kv_len };
    if p.causal == 0 {
        return kv_end;
    }
    let pos = if p.cursor != 0 { *(p.cursor as *const u32).add(row as usize * CURSOR_FIELDS + CURSOR_ROW) } else { p.q_pos0 + row };
    pos.saturating_add(1).min(kv_end)
}

/// One block's view of its work: its query vectors `v0 .. v0 + bm` of KV head `g`, the key
/// range they may see, and the query blocks of the mask they fall in. Every field is uniform
/// over the block.
#[derive(Clone, Copy)]
pub(crate) struct Plan {
    pub v0: usize,
    pub g: usize,
    group: u32,
    /// Query vectors in all (`t · group`).
    nvec: u32,
    /// The most keys any row of the block sees (`0 .. end_max`), and the fewest a valid row does.
    pub end_max: usize,
    end_min: u32,
    pub mask: Option<Mask>,
    /// The mask's query blocks of the block's first and last rows.
    qb_lo: u32,
    qb_hi: u32,
    /// With a mask: the first `MASK_TILES` tiles classified once by the whole block, two bit
    /// words per 32 tiles in shared memory (seen, checked per element); null without a mask.
    classes: *const u32,
}

impl Plan {
    /// The plan of this block (query tiles in reverse order of `blockIdx.x`).
    #[inline(always)]
    pub(crate) unsafe fn new(p: &FlashParams, bm: usize) -> Plan {
        let bm = bm as u32;
        let group = p.heads / p.kv_heads;
        let nvec = p.t * group;
        let tiles = (nvec + bm - 1) / bm;
        let v0 = (tiles - 1 - thread::block_idx_x()) * bm;
        let (r_lo, r_hi) = (v0 / group, ((v0 + bm).min(nvec) - 1) / group);
        let (mut end_max, mut end_min) = (0u32, u32::MAX);
        let mut r = r_lo;
        while r <= r_hi {
            let e = row_end(p, r);
            end_max = end_max.max(e);
            end_min = end_min.min(e);
            r += 1;
        }
        let mask = if p.mask != 0 { Some(Mask::new(p.mask)) } else { None };
        let (qb_lo, qb_hi) = match mask {
            Some(m) => (m.q_block(r_lo), m.q_block(r_hi)),
            None => (0, 0),
        };
        Plan { v0: v0 as usize, g: thread::block_idx_y() as usize, group, nvec, end_max: end_max as usize, end_min, mask, qb_lo, qb_hi, classes: core::ptr::null() }
    }

    /// With a mask, classifies the first `MASK_TILES` key tiles of `bn` keys once, in parallel,
    /// into `words` (`block_mask::CLASS_WORDS` u32 of shared memory): warp `w` takes tiles
    /// `32 (w + warps · r) + lane`, and a ballot per 32 tiles writes their bits, so the tile loop
    /// reads a bit instead of walking the mask in global memory. Every thread of the block calls
    /// it (it ends with a barrier); a no-op without a mask.
    #[inline(always)]
    pub(crate) unsafe fn classify_tiles(&mut self, bn: usize, words: *mut u32) {
        if self.mask.is_none() {
            return; // uniform over the block
        }
        let (tid, warps) = (thread::thread_idx_x() as usize, thread::block_dim_x() as usize / 32);
        let n = self.tiles(bn).min(MASK_TILES);
        let mut w = tid / 32;
        while 32 * w < n {
            let j = 32 * w + tid % 32;
            let (seen, check) = if j < n { self.classify(j, bn) } else { (false, false) };
            let (a, b) = (ballot(seen), ballot(check));
            if tid % 32 == 0 {
                *words.add(2 * w) = a;
                *words.add(2 * w + 1) = b;
            }
            w += warps;
        }
        thread::sync_threads();
        self.classes = words;
    }

    /// Key tiles of `bn` keys that may hold visible keys.
    #[inline(always)]
    pub(crate) fn tiles(&self, bn: usize) -> usize {
        (self.end_max + bn - 1) / bn
    }

    /// Tile `j` of `bn` keys: whether any vector of the block sees a key of it, and whether
    /// some (vector, key) pair of it needs a per-element check (its causal or length bound
    /// cuts the tile, or the mask does not allow every pair).
    #[inline(always)]
    pub(crate) unsafe fn tile(&self, j: usize, bn: usize) -> (bool, bool) {
        if !self.classes.is_null() && j < MASK_TILES {
            let (a, b) = (*self.classes.add(2 * (j / 32)), *self.classes.add(2 * (j / 32) + 1));
            return ((a >> (j % 32)) & 1 != 0, (b >> (j % 32)) & 1 != 0);
        }
        self.classify(j, bn)
    }

    /// [`Plan::tile`] worked out from the mask in global memory.
    #[inline(always)]
    unsafe fn classify(&self, j: usize, bn: usize) -> (bool, bool) {
        let (k0, k1) = ((j * bn) as u32, (j * bn + bn).min(self.end_max) as u32);
        let cut = j * bn + bn > self.end_min as usize;
        let m = match self.mask {
            None => return (true, cut),
            Some(m) => m,
        };
        let (kb_lo, kb_hi) = (m.k_block(k0), m.k_block(k1 - 1));
        if ((self.qb_hi - self.qb_lo + 1) * (kb_hi - kb_lo + 1)) as usize > MAX_TILE_PAIRS {
            return (true, true);
        }
        let (mut any, mut all) = (false, true);
        let mut qb = self.qb_lo;
        while qb <= self.qb_hi {
            let mut kb = kb_lo;
            while kb <= kb_hi {
                let a = m.allowed(qb, kb);
                any |= a;
                all &= a;
                kb += 1;
            }
            qb += 1;
        }
        (any, cut || !all)
    }

    /// The first tile from `j` on that some vector of the block sees (`tiles(bn)` if none).
    #[inline(always)]
    #[cfg_attr(not(feature = "sm80"), allow(dead_code))]
    pub(crate) unsafe fn next_tile(&self, mut j: usize, bn: usize) -> usize {
        let n = self.tiles(bn);
        while j < n && !self.tile(j, bn).0 {
            j += 1;
        }
        j
    }

    /// Query vector `v` of the block's head group: `(row, head, valid)`.
    #[inline(always)]
    pub(crate) fn vector(&self, v: usize, heads: usize) -> (usize, usize, bool) {
        let (v, group) = (v as u32, self.group);
        let row = v / group;
        (row as usize, (self.g * group as usize + (v % group) as usize).min(heads - 1), v < self.nvec)
    }

    /// `(end, query block)` of a vector's row: it sees keys below `end` in the allowed blocks.
    /// Invalid vectors see nothing.
    #[inline(always)]
    pub(crate) unsafe fn row_state(&self, p: &FlashParams, row: usize, valid: bool) -> (u32, u32) {
        if !valid {
            return (0, 0);
        }
        (row_end(p, row as u32), self.mask.map_or(0, |m| m.q_block(row as u32)))
    }

    /// Whether a row with state `(end, qb)` sees `key`, given the key's mask block `kb`.
    #[inline(always)]
    pub(crate) unsafe fn sees(&self, (end, qb): (u32, u32), key: usize, kb: u32) -> bool {
        (key as u32) < end && self.mask.map_or(true, |m| m.allowed(qb, kb))
    }

    /// The mask block of `key` (0 without a mask).
    #[inline(always)]
    pub(crate) unsafe fn key_block(&self, key: usize) -> u32 {
        self.mask.map_or(0, |m| m.k_block(key as u32))
    }
}

/// Four query elements `e0 .. e0 + 4` (`e0 % 4 == 0`, `e0 < d`) of query vector (`row`, `head`),
/// rotated with the row's tables when `p.cos` is set (the partner elements `e ± d/2` are read
/// too), times `mul`.
#[inline(always)]
pub(crate) unsafe fn load_q4(p: &FlashParams, row: usize, head: usize, e0: usize, mul: f32) -> [f32; 4] {
    let d = p.d as usize;
    let base = (p.q as *const f32).add((row * p.heads as usize + head) * d);
    let x = ld_f32x4(base.add(e0));
    if p.cos == 0 {
        return [x[0] * mul, x[1] * mul, x[2] * mul, x[3] * mul];
    }
    let half = d / 2;
    let (first, f) = if e0 < half { (true, e0) } else { (false, e0 - half) };
    let y = ld_f32x4(base.add(if first { e0 + half } else { e0 - half }));
    let c = ld_f32x4((p.cos as *const f32).add(row * half + f));
    let s = ld_f32x4((p.sin as *const f32).add(row * half + f));
    let mut out = [0.0f32; 4];
    for i in 0..4 {
        // rope_pair(x1, x2): (x1 c - x2 s, x2 c + x1 s); x is x1 in the first half, x2 in the second
        out[i] = if first { x[i] * c[i] - y[i] * s[i] } else { x[i] * c[i] + y[i] * s[i] } * mul;
    }
    out
}

/// Query elements `e, e + 1` (`e` even, `< d`) of query vector (`row`, `head`), rotated like
/// [`load_q4`], times `mul`.
#[inline(always)]
#[cfg_attr(not(feature = "sm80"), allow(dead_code))]
pub(crate) unsafe fn load_q2(p: &FlashParams, row: usize, head: usize, e: usize, mul: f32) -> [f32; 2] {
    let d = p.d as usize;
    let base = (p.q as *const f32).add((row * p.heads as usize + head) * d);
    let x = [*base.add(e), *base.add(e + 1)];
    if p.cos == 0 {
        return [x[0] * mul, x[1] * mul];
    }
    let half = d / 2;
    let (first, f) = if e < half { (true, e) } else { (false, e - half) };
    let y = base.add(if first { e + half } else { e - half });
    let (c, s) = ((p.cos as *const f32).add(row * half + f), (p.sin as *const f32).add(row * half + f));
    let mut out = [0.0f32; 2];
    for i in 0..2 {
        out[i] = if first { x[i] * *c.add(i) - *y.add(i) * *s.add(i) } else { x[i] * *c.add(i) + *y.add(i) * *s.add(i) } * mul;
    }
    out
}

/// Stages keys `k0 .. k0 + BN` (those past `nk` zero) of KV head `g` into `dst [BN][D]` f32,
/// dims past `d` zero, each row times its scale (`which` 0: the key's, 1: the value's): every
/// load of the tile issued before any store.
#[inline(always)]
unsafe fn stage<C: KvVec8, const D: usize>(dst: *mut f32, src: *const C, (sc, which): (RowScales, usize), k0: usize, nk: usize, row: usize, d: usize, tid: usize) {
    let per_row = D / 8;
    const ITEMS: usize = 4; // BN · D / 8 / THREADS for D = 128; half of them for D = 64
    let items = BN * per_row / THREADS as usize;
    let mut vals = [[0.0f32; 8]; ITEMS];
    for u in 0..ITEMS {
        let it = tid + u * THREADS as usize;
        let (kk, c) = (it / per_row, it % per_row);
        if u < items && kk < nk && 8 * c < d {
            vals[u] = C::load8(src.add((k0 + kk) * row + 8 * c));
            let (ks, vs) = sc.at(k0 + kk);
            let f = if which == 0 { ks } else { vs };
            for e in 0..8 {
                vals[u][e] *= f;
            }
        }
    }
    for u in 0..ITEMS {
        let it = tid + u * THREADS as usize;
        let (kk, c) = (it / per_row, it % per_row);
        if u < items {
            let o = dst.add(kk * D + 8 * c) as *mut F32x4;
            *o = F32x4([vals[u][0], vals[u][1], vals[u][2], vals[u][3]]);
            *o.add(1) = F32x4([vals[u][4], vals[u][5], vals[u][6], vals[u][7]]);
        }
    }
}

/// One step of the transpose-reduction of the first `2 H` values: a lane keeps the half whose
/// top index bit equals its lane bit `lm`, plus its partner's copy of that half (`H` shuffles).
#[inline(always)]
fn butterfly<const H: usize>(part: &mut [f32; CHUNK * ROWS], lane: usize, lm: usize) {
    let hi = (lane & lm) as u32;
    for u in 0..H {
        let (keep, send) = swap_if(hi, part[u], part[u + H]);
        part[u] = keep + shfl_xor(send, lm as u32);
    }
}

/// `(b, a)` when `c != 0`, else `(a, b)`, as two `selp` (a select the compiler cannot turn into
/// a select of addresses, which would move the caller's register array to local memory).
#[inline(always)]
fn swap_if(c: u32, a: f32, b: f32) -> (f32, f32) {
    let (x, y): (u32, u32);
    unsafe {
        core::arch::asm!(
            "{{ .reg .pred p; setp.ne.u32 p, {c}, 0; selp.b32 {x}, {b}, {a}, p; selp.b32 {y}, {a}, {b}, p; }}",
            c = in(reg32) c, a = in(reg32) a.to_bits(), b = in(reg32) b.to_bits(), x = out(reg32) x, y = out(reg32) y,
            options(pure, nomem, nostack),
        );
    }
    (f32::from_bits(x), f32::from_bits(y))
}

/// Writes the first `nv` (4 or 2) of a lane's scores to its slot of the probability tile.
#[inline(always)]
unsafe fn store_scores<const N: usize>(dst: *mut f32, v: &[f32; N], nv: usize) {
    if nv == ROWS {
        *(dst as *mut F32x4) = F32x4([v[0], v[1], v[2], v[3]]);
    } else {
        *(dst as *mut [f32; 2]) = [v[0], v[1]];
    }
}

/// Reads back what [`store_scores`] wrote (the rest zero).
#[inline(always)]
unsafe fn load_scores(src: *const f32, nv: usize) -> [f32; ROWS] {
    if nv == ROWS {
        ld_f32x4(src)
    } else {
        let x = *(src as *const [f32; 2]);
        [x[0], x[1], 0.0, 0.0]
    }
}

#[inline(always)]
unsafe fn flash_simt<C: KvVec8, const D: usize>(p: FlashParams) {
    let tx_n = D / 8; // lanes of a row group
    let rs = tx_n / CHUNK; // lanes sharing a key after the reduction (1 or 2)
    let nv = ROWS / rs; // scores of one key a lane keeps (4 or 2 vectors)
    let bm = flash_tile::vectors(D);
    let tid = thread::thread_idx_x() as usize;
    let (lane, w) = (tid % 32, tid / 32);
    let tx = lane % tx_n;
    let rgroup = w * (32 / tx_n) + lane / tx_n;
    let (heads, d) = (p.heads as usize, p.d as usize);
    let kv_row = p.kv_heads as usize * d;
    // dynamic shared memory: K, V tiles, the row groups' probability tiles, the tile classes
    let smem = dynamic_shared_mem::<f32>();
    let (ks, vs) = (smem, smem.add(BN * D));
    let ps = smem.add(2 * BN * D + rgroup * P_STRIDE);
    let classes = smem.add(2 * BN * D + bm / ROWS * P_STRIDE) as *mut u32;
    let mut plan = Plan::new(&p, bm);
    plan.classify_tiles(BN, classes);

    // 1. this group's 4 query vectors: 8 dims per lane, pre-scaled; each vector's bounds
    let mul = p.scale * LOG2E;
    let mut q = [[0.0f32; 8]; ROWS];
    let mut st = [(0u32, 0u32); ROWS];
    for i in 0..ROWS {
        let (row, head, valid) = plan.vector(plan.v0 + rgroup * ROWS + i, heads);
        st[i] = plan.row_state(&p, row, valid);
        for c in 0..2 {
            let e0 = 4 * tx + c * D / 2;
            if valid && e0 < d {
                let x = load_q4(&p, row, head, e0, mul);
                for j in 0..4 {
                    q[i][4 * c + j] = x[j];
                }
            }
        }
    }

    // 2. the visible key tiles
    let mut o = [[0.0f32; 8]; ROWS];
    let mut m = [f32::NEG_INFINITY; ROWS];
    let mut l = [0.0f32; ROWS];
    let (k, v) = ((p.k as *const C).add(plan.g * d), (p.v as *const C).add(plan.g * d));
    let sc = RowScales::new(p.kv_scale, p.kv_heads as usize, plan.g);
    let tiles = plan.tiles(BN);
    let mut j = 0;
    while j < tiles {
        let (visit, check) = plan.tile(j, BN);
        if !visit {
            j += 1;
            continue; // uniform over the block
        }
        let k0 = j * BN;
        let nk = (plan.end_max - k0).min(BN);
        thread::sync_threads(); // the previous tile's readers are done
        stage::<C, D>(ks, k, (sc, 0), k0, nk, kv_row, d, tid);
        stage::<C, D>(vs, v, (sc, 1), k0, nk, kv_row, d, tid);
        thread::sync_threads();

        // 2a. scores, CHUNK keys at a time: partial dots over this lane's dims for 4 vectors ×
        //     8 keys (index key · 4 + vector), then the butterfly: at each step a lane keeps the
        //     half whose top index bit matches its lane bit and adds its partner's copy of it.
        //     The lane is left with key `c · CHUNK + key_l` for vectors `vbase .. vbase + nv`:
        //     masked, written to the group's tile in shared memory, folded into its maxima.
        let (key_l, vbase) = (tx / rs, (tx % rs) * nv);
        let mut own_max = [f32::NEG_INFINITY; ROWS];
        let mut c = 0;
        while c < BN / CHUNK {
            let mut part = [0.0f32; CHUNK * ROWS];
            for kk in 0..CHUNK {
                let kr = ks.add((c * CHUNK + kk) * D + 4 * tx);
                let (a, b) = (ld_f32x4(kr), ld_f32x4(kr.add(D / 2)));
                for i in 0..ROWS {
                    part[kk * ROWS + i] = (q[i][0] * a[0] + q[i][1] * a[1] + q[i][2] * a[2] + q[i][3] * a[3]) + (q[i][4] * b[0] + q[i][5] * b[1] + q[i][6] * b[2] + q[i][7] * b[3]);
                }
            }
            butterfly::<16>(&mut part, lane, tx_n / 2);
            butterfly::<8>(&mut part, lane, tx_n / 4);
            butterfly::<4>(&mut part, lane, tx_n / 8);
            if tx_n == 16 {
                butterfly::<2>(&mut part, lane, 1);
            }
            if check {
                let key = k0 + c * CHUNK + key_l;
                let kb = if plan.mask.is_some() { plan.key_block(key) } else { 0 };
                for u in 0..ROWS {
                    if u < nv && !plan.sees(pick(&st, vbase + u), key, kb) {
                        part[u] = f32::NEG_INFINITY;
                    }
                }
            }
            for u in 0..ROWS {
                own_max[u] = own_max[u].max(part[u]);
            }
            store_scores(ps.add((c * CHUNK + key_l) * ROWS + vbase), &part, nv);
            c += 1;
        }
        // 2b. the tile's row maxima over the group, rescaled state, probabilities in place
        let mut base = [0.0f32; ROWS];
        for i in 0..ROWS {
            let mut tmax = f32::NEG_INFINITY;
            for u in 0..ROWS {
                if u < nv && vbase + u == i {
                    tmax = own_max[u];
                }
            }
            let mut lm = 1;
            while lm < tx_n {
                tmax = tmax.max(shfl_xor(tmax, lm as u32));
                lm *= 2;
            }
            let mn = m[i].max(tmax);
            let alpha = if mn == f32::NEG_INFINITY { 1.0 } else { ex2(m[i] - mn) };
            base[i] = if mn == f32::NEG_INFINITY { 0.0 } else { mn };
            m[i] = mn;
            l[i] *= alpha;
            for e in 0..8 {
                o[i][e] *= alpha;
            }
        }
        let mut own_base = [0.0f32; ROWS];
        for u in 0..ROWS {
            own_base[u] = pick(&base, vbase + u);
        }
        let mut own_sum = [0.0f32; ROWS];
        let mut c = 0;
        while c < BN / CHUNK {
            let at = ps.add((c * CHUNK + key_l) * ROWS + vbase);
            let mut pv = load_scores(at, nv);
            for u in 0..ROWS {
                pv[u] = ex2(pv[u] - own_base[u]);
                own_sum[u] += pv[u];
            }
            store_scores(at, &pv, nv);
            c += 1;
        }
        for i in 0..ROWS {
            for u in 0..ROWS {
                if u < nv && vbase + u == i {
                    l[i] += own_sum[u];
                }
            }
        }
        warp::sync_warp(0xffff_ffff);
        // 2c. O += P · V over the tile's keys
        let mut kk = 0;
        while kk < nk {
            let pr = ld_f32x4(ps.add(kk * ROWS));
            let vr = vs.add(kk * D + 4 * tx);
            let (a, b) = (ld_f32x4(vr), ld_f32x4(vr.add(D / 2)));
            for i in 0..ROWS {
                for e in 0..4 {
                    o[i][e] += pr[i] * a[e];
                    o[i][4 + e] += pr[i] * b[e];
                }
            }
            kk += 1;
        }
        j += 1;
    }

    // 3. row sums over the group, normalized output
    for i in 0..ROWS {
        let mut lm = 1;
        while lm < tx_n {
            l[i] += shfl_xor(l[i], lm as u32);
            lm *= 2;
        }
        let (row, head, valid) = plan.vector(plan.v0 + rgroup * ROWS + i, heads);
        if !valid {
            continue;
        }
        let inv = if l[i] > 0.0 { 1.0 / l[i] } else { 0.0 };
        let out = (p.out as *mut f32).add((row * heads + head) * d);
        for c in 0..2 {
            let e0 = 4 * tx + c * D / 2;
            if e0 < d {
                *(out.add(e0) as *mut F32x4) = F32x4([o[i][4 * c] * inv, o[i][4 * c + 1] * inv, o[i][4 * c + 2] * inv, o[i][4 * c + 3] * inv]);
            }
        }
    }
}

/// Flash attention, FP32 SIMT, head dims up to 64, f32 K/V. See the module docs.
#[kernel]
pub unsafe fn flash_attention_d64_f32(p: FlashParams) {
    flash_simt::<f32, 64>(p)
}

/// Flash attention, FP32 SIMT, head dims up to 64, f16 K/V. See the module docs.
#[kernel]
pub unsafe fn flash_attention_d64_f16(p: FlashParams) {
    flash_simt::<F16, 64>(p)
}

/// Flash attention, FP32 SIMT, head dims up to 128, f32 K/V. See the module docs.
#[kernel]
pub unsafe fn flash_attention_d128_f32(p: FlashParams) {
    flash_simt::<f32, 128>(p)
}

/// Flash attention, FP32 SIMT, head dims up to 128, f16 K/V. See the module docs.
#[kernel]
pub unsafe fn flash_attention_d128_f16(p: FlashParams) {
    flash_simt::<F16, 128>(p)
}
