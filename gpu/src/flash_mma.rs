//! Flash attention on tensor cores (compute_80: Ampere, Ada, Hopper): `flash_attention_mma_*`.
//! Same parameters, visibility rules, block plan and tile skipping as the SIMT kernels
//! (`flash.rs`, [`FlashParams`]); QKᵀ and PV run as `mma.sync.m16n8k16` with f16 operands and
//! f32 accumulation.
//!
//! # Precision
//! Queries (pre-scaled by `scale · log2 e`), keys, values and probabilities are rounded to f16
//! (11 significant bits, relative error ≤ 2^-11 each; an f16 KV cache is already exact), sums and
//! the softmax state stay f32. f16 rather than bf16 for the 3 extra mantissa bits; f16's range
//! is kept by powers of two, so that any f32 magnitude gives the f32 answer:
//! - a query row whose largest magnitude reaches `2^15` is narrowed divided by its
//!   `f16_key_scale` (also a row below `2^-4`, whose small elements would become f16
//!   subnormals), and its scores are multiplied back (f32) after `Q Kᵀ`;
//! - keys and values are f16 rows stored divided by their scales (`kv_scale`: the KV cache's,
//!   or those `rope_cast_f16` wrote when the host narrowed f32 K/V; the host always narrows
//!   first, so only f16 K/V kernels exist). A key's scale multiplies its score column. A value's
//!   scale `sᵥ` enters through the probabilities: `o` is kept in units of `vmax`, the largest
//!   value scale of the tiles so far (it only grows: `o` is rescaled like the softmax state), and
//!   each probability is multiplied by `sᵥ / vmax ≤ 1` before it is narrowed for `P V`, while
//!   the row sums take the probabilities unscaled; the output is `o · vmax / l`.
//! With head dims up to 64, and in the warpgroup kernels, a row's softmax base (its running
//! maximum) moves only when a tile's maximum passes it by more than `MAX_SLACK` (8, log2
//! units), so probabilities reach at most 2^8 before they are narrowed (f16's range is 2^16;
//! the relative rounding is the same), and a tile that moves no base of the warp's rows skips
//! rescaling the output.
//! All of this is one copy of the tile loop (`tiles::<D, true>`); the block takes it only when
//! a query row of the block needs a scale or the backend's flag (`kv_flag`, a u32 every writer
//! of row scales sets when it writes one other than 1, never reset) is set, decided once with a
//! `bar.red.or`. Otherwise it runs `tiles::<D, false>`, the loop without any scale step, as fast
//! as before the scales existed. In the scaled copy a ballot per tile still skips the multiplies
//! for tiles whose rows all have scale 1.
//!
//! # Tiling ([`flash_mma_tile`])
//! `WARPS` (4) warps, each owning `MT = m_tiles(D)` tiles of 16 query vectors (two for head dims
//! up to 64 — every K/V fragment read from shared memory then feeds two products — else one):
//! 128 or 64 vectors per block. Key tiles of `BN` = 64 keys: K and V are staged as f16 `[BN][D]`
//! in shared memory with the 16-byte chunks of row `r` XOR-swizzled by `r % 8`, so the
//! `ldmatrix` row reads of 8 consecutive keys hit 8 different bank groups; they are copied with
//! `cp.async` (zero-filled past the valid keys), the tile's row scales (`[BN][2]` f32) with the
//! keys. The pipeline overlaps each load with a product: V of tile `j` loads while `S = Q Kⱼᵀ`
//! runs, K of the next visible tile while `O += P Vⱼ` runs (one buffer each, two barriers per
//! tile). The 64-dim warpgroup kernel double-buffers instead (`double_buffered`, in dynamic
//! shared memory): the next visible tile's K, V and scales load while a tile is multiplied, one
//! barrier per tile. With a block mask, the block classifies its key tiles up front
//! (`Plan::classify_tiles`).
//!
//! # Thread mapping
//! Lane `l` of a warp holds, in the m16n8k16 fragment layouts, query rows `l / 4` and `l / 4 + 8`
//! of each of its m-tiles: the Q fragments (`D / 16` k-steps × 4 registers of f16 pairs, loaded
//! once from global memory), the score tile `[16 × BN]` (`BN / 8` n-tiles × 4 f32) and the
//! output `[16 × D]` (`D / 8` × 4 f32). Row maxima and sums reduce as trees over the n-tiles and
//! then over the 4 lanes of a quad; the probabilities are packed into f16 A fragments as they are
//! made. K fragments come from `ldmatrix.x4`, V fragments from `ldmatrix.x4.trans`; the lane
//! keeps one shared-memory base per k-step mod 4 and adds constant offsets inside the asm.
//!
//! # Safety
//! As for the SIMT kernels: the launcher validates everything; block-uniform control flow around
//! the barriers; `cp.async` groups are waited for (`wait_group 0`) before the barrier that
//! publishes a tile.

use crate::attention::RowScales;
use crate::flash::{ballot, load_q2, Plan, LOG2E};
use crate::math::{f16_key_scale, F16};
use crate::mem::{ex2, F32x4};
use crate::params::flash_mma_tile::BN;
use crate::params::flash_mma_tile;
use crate::params::block_mask::CLASS_WORDS;
use crate::params::FlashParams;
use crate::reduce::shfl_xor;
use crate::wgmma::{descriptor, descriptor_mn, fence_proxy_async, wgmma_commit, wgmma_fence, WgAcc};
use cuda_std::shared::dynamic_shared_mem;
use cuda_std::{kernel, shared_array, thread, GpuFloat};

/// The 32-bit shared-memory address of a generic pointer into shared memory.
#[inline(always)]
fn smem_addr<T>(p: *const T) -> u32 {
    let a: u32;
    unsafe {
        core::arch::asm!(
            "{{ .reg .u64 t; cvta.to.shared.u64 t, {p}; cvt.u32.u64 {a}, t; }}",
            p = in(reg64) p, a = out(reg32) a,
            options(pure, nomem, nostack),
        );
    }
    a
}

/// Copies 16 bytes from global `src` to shared `dst` asynchronously; bytes past `src_bytes`
/// (0 or 16) are zero-filled.
#[inline(always)]
unsafe fn cp_async16(dst: u32, src: *const u8, src_bytes: u32) {
    core::arch::asm!("cp.async.cg.shared.global [{}], [{}], 16, {};", in(reg32) dst, in(reg64) src, in(reg32) src_bytes, options(nostack));
}

#[inline(always)]
unsafe fn cp_async_commit() {
    core::arch::asm!("cp.async.commit_group;", options(nostack));
}

/// Waits until every `cp.async` group this thread committed has landed.
#[inline(always)]
unsafe fn cp_async_wait_all() {
    core::arch::asm!("cp.async.wait_group 0;", options(nostack));
}

/// Four 8×8 f16 matrices from shared memory at `base + off` (lanes `8i .. 8i + 8` give the row
/// addresses of matrix `i`); lane `l` gets row `l / 4`, elements `2 (l % 4) ..+2` of each. The
/// sum is formed inside the asm: with `off` a constant, the compiler then keeps one register per
/// `base` rather than hoisting every sum out of the tile loop (64 live registers).
#[inline(always)]
pub(crate) unsafe fn ldmatrix_x4(base: u32, off: u32) -> [u32; 4] {
    let (a, b, c, d): (u32, u32, u32, u32);
    core::arch::asm!(
        "{{ .reg .u32 t; add.u32 t, {}, {}; ldmatrix.sync.aligned.m8n8.x4.shared.b16 {{{}, {}, {}, {}}}, [t]; }}",
        in(reg32) base, in(reg32) off, out(reg32) a, out(reg32) b, out(reg32) c, out(reg32) d,
        options(pure, readonly, nostack),
    );
    [a, b, c, d]
}

/// As [`ldmatrix_x4`], transposed: lane `l` gets column `l / 4`, rows `2 (l % 4) ..+2`.
#[inline(always)]
pub(crate) unsafe fn ldmatrix_x4_trans(base: u32, off: u32) -> [u32; 4] {
    let (a, b, c, d): (u32, u32, u32, u32);
    core::arch::asm!(
        "{{ .reg .u32 t; add.u32 t, {}, {}; ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {{{}, {}, {}, {}}}, [t]; }}",
        in(reg32) base, in(reg32) off, out(reg32) a, out(reg32) b, out(reg32) c, out(reg32) d,
        options(pure, readonly, nostack),
    );
    [a, b, c, d]
}

/// `c += a · b` for one m16n8k16 tile: f16 A (row-major fragment), f16 B (column-major), f32 C.
#[inline(always)]
pub(crate) fn mma(c: [f32; 4], a: [u32; 4], b0: u32, b1: u32) -> [f32; 4] {
    let (mut d0, mut d1, mut d2, mut d3) = (c[0].to_bits(), c[1].to_bits(), c[2].to_bits(), c[3].to_bits());
    unsafe {
        core::arch::asm!(
            "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {{{d0}, {d1}, {d2}, {d3}}}, {{{a0}, {a1}, {a2}, {a3}}}, {{{b0}, {b1}}}, {{{d0}, {d1}, {d2}, {d3}}};",
            d0 = inout(reg32) d0, d1 = inout(reg32) d1, d2 = inout(reg32) d2, d3 = inout(reg32) d3,
            a0 = in(reg32) a[0], a1 = in(reg32) a[1], a2 = in(reg32) a[2], a3 = in(reg32) a[3],
            b0 = in(reg32) b0, b1 = in(reg32) b1,
            options(pure, nomem, nostack),
        );
    }
    [f32::from_bits(d0), f32::from_bits(d1), f32::from_bits(d2), f32::from_bits(d3)]
}

/// Two f32 rounded to f16 (nearest even) and packed, `lo` in the low half.
#[inline(always)]
pub(crate) fn pack_f16x2(lo: f32, hi: f32) -> u32 {
    let r: u32;
    unsafe {
        core::arch::asm!("cvt.rn.f16x2.f32 {}, {}, {};", out(reg32) r, in(reg32) hi.to_bits(), in(reg32) lo.to_bits(), options(pure, nomem, nostack));
    }
    r
}

/// `f` folded over 8 values as a tree (depth 3 instead of a chain of 7).
#[inline(always)]
fn tree8(x: [f32; 8], f: impl Fn(f32, f32) -> f32) -> f32 {
    let (a, b, c, d) = (f(x[0], x[1]), f(x[2], x[3]), f(x[4], x[5]), f(x[6], x[7]));
    f(f(a, b), f(c, d))
}

/// Byte offset of 16-byte chunk `c` of key row `r` in a staged f16 tile: `[D / 64][BN][64]`
/// (slabs of 64 dims, rows of 128 bytes), chunk `c % 8` of a row at `(c % 8) ^ (r % 8)` — on a
/// 1,024-byte-aligned tile, the warpgroup instructions' 128-byte swizzle.
#[inline(always)]
fn tile_offset(r: usize, c: usize) -> u32 {
    ((c / 8) * BN * 128 + r * 128 + (((c % 8) ^ (r & 7)) << 4)) as u32
}

/// Stages keys `k0 .. k0 + BN` (those past `nk` zero) of the f16 rows at `src` (row stride
/// `row` elements) into the tile at shared address `dst`, dims past `d` zero, with `cp.async`.
/// Thread `t` of the block's `T` (`flash_mma_tile::threads`) copies chunk `t % (D / 8)` of rows
/// `t / (D / 8) + R·u` (`R = T / (D / 8)` rows a round, a multiple of 8): every one of its rows
/// has the first one's swizzle, so its copies are the first one's addresses plus `u` row steps,
/// without per-copy index arithmetic (a copy of 0 bytes zero-fills and reads nothing).
#[inline(always)]
unsafe fn stage<const D: usize, const WG: bool>(dst: u32, src: *const F16, k0: usize, nk: usize, row: usize, d: usize, tid: usize) {
    let chunks = D / 8;
    let per = flash_mma_tile::threads(D, WG) as usize / chunks;
    // the most copies a thread makes (128 threads, d 128)
    const MAX_ITEMS: usize = BN * 128 / 8 / 128;
    let items = BN / per;
    let (r0, c) = (tid / chunks, tid % chunks);
    let d_ok = 8 * c < d;
    let (dst0, src0) = (dst + tile_offset(r0, c), src.wrapping_add((k0 + r0) * row + 8 * c));
    for u in 0..MAX_ITEMS {
        if u < items {
            let ok = d_ok && r0 + per * u < nk;
            cp_async16(dst0 + (per * u * 128) as u32, src0.wrapping_add(per * u * row) as *const u8, 16 * ok as u32);
        }
    }
}

// a thread's staged rows share one swizzle (rows a round a multiple of 8, for d 64 and 128);
// every block has at least 128 threads
const _: () = assert!(flash_mma_tile::threads(128, false) == 128 && flash_mma_tile::threads(64, false) == 128 && flash_mma_tile::threads(128, true) == 128);
const _: () = assert!(flash_mma_tile::threads(64, true) / 8 % 8 == 0 && flash_mma_tile::threads(64, true) / 8 <= BN as u32);

// the per-tile scale check reads two keys per lane
const _: () = assert!(BN == 64);

/// Stages the (key, value) scales of keys `k0 .. k0 + BN` (those past `nk` zero) into `dst
/// [BN][2]` f32 in shared memory with 8-byte `cp.async` (threads `0 .. BN`, one key each).
#[inline(always)]
unsafe fn stage_scales(dst: u32, sc: &RowScales, k0: usize, nk: usize, tid: usize) {
    if tid < BN {
        let ok = tid < nk;
        let from = sc.ptr(if ok { k0 + tid } else { 0 });
        core::arch::asm!("cp.async.ca.shared.global [{}], [{}], 8, {};", in(reg32) dst + 8 * tid as u32, in(reg64) from, in(reg32) if ok { 8u32 } else { 0 }, options(nostack));
    }
}

/// m16 row tiles per warp, at most (see `flash_mma_tile::m_tiles`).
const MAX_MT: usize = 2;

/// How far (log2 units) a key tile's score maximum may pass a row's running maximum before the
/// row's softmax base moves to it (head dims up to 64, and by warpgroups): probabilities stay
/// below `2^MAX_SLACK` (256, well inside f16's range), and tiles that move no base of a warp's
/// rows skip rescaling the output.
const MAX_SLACK: f32 = 8.0;

/// Whether `x` holds for any thread of the block (`bar.red.or`: a barrier every thread reaches).
#[inline(always)]
unsafe fn block_any(x: bool) -> bool {
    let r: u32;
    core::arch::asm!(
        "{{ .reg .pred p, q; setp.ne.u32 p, {x}, 0; bar.red.or.pred q, 0, p; selp.u32 {r}, 1, 0, q; }}",
        x = in(reg32) x as u32, r = out(reg32) r,
        options(nostack),
    );
    r != 0
}

/// A lane's query rows as the prologue leaves them for the tile loop: each row slot's bounds
/// (`Plan::row_state`), its scale, and the Q fragments.
struct QRows {
    st: [(u32, u32); 2 * MAX_MT],
    qsc: [f32; 2 * MAX_MT],
    qa: [[[u32; 4]; 8]; MAX_MT],
}

/// The query vector of row slot `(mt, h)` of lane `gq` of warp `w`, counted from the block's
/// first: the m16 row tiles of the warps are 16 rows apart within each m-tile's 64 (the
/// warpgroup instructions' rows, used by the `mma.sync` kernels as well).
#[inline(always)]
fn slot_vector(mt: usize, w: usize, gq: usize, h: usize) -> usize {
    64 * mt + 16 * w + gq + 8 * h
}

/// The kernels' body; `WG`: the products by warpgroup instructions (sm_90a), else `mma.sync`.
#[inline(always)]
unsafe fn flash_mma<const D: usize, const WG: bool>(p: FlashParams) {
    let mt_n = flash_mma_tile::m_tiles(D, WG);
    // K and V tiles from a 1,024-byte boundary (the warpgroup instructions' swizzle repeats every
    // 8 rows of 128 bytes). Single-buffered: static, one K and one V tile sized for the largest
    // head-dim class, the row scales and the mask's tile classes. Double-buffered (64 dims by
    // warpgroups): dynamic (`flash_mma_tile::wg_shared_bytes`, no static shared memory beside
    // it), two K tiles, two V tiles, the queries (`q_shared`), two tiles' row scales, the tile
    // classes.
    let tile = BN * D * 2;
    let (ks, qs, scs, words) = if double_buffered::<D, WG>() {
        let raw = dynamic_shared_mem::<u8>();
        let base = raw.add((((smem_addr(raw) + 1023) & !1023) - smem_addr(raw)) as usize);
        let q_bytes = if q_shared::<D, WG>() { flash_mma_tile::vectors(D, WG) * D * 2 } else { 0 };
        let scales = base.add(4 * tile + q_bytes);
        (smem_addr(base), smem_addr(base) + (4 * tile) as u32, scales as *const [f32; 2], scales.add(2 * BN * 8) as *mut u32)
    } else {
        let ks = (smem_addr(shared_array![F32x4; (2 * BN * 128 * 2 + 1024) / 16]) + 1023) & !1023;
        (ks, ks + (2 * tile) as u32, shared_array![F32x4; BN / 2] as *const [f32; 2], shared_array![u32; CLASS_WORDS])
    };
    // the V tiles after the K tiles (double-buffered: two of each)
    let vs = ks + if double_buffered::<D, WG>() { 2 * tile } else { tile } as u32;
    let tid = thread::thread_idx_x() as usize;
    let (lane, w) = (tid % 32, tid / 32);
    let (gq, tq) = (lane / 4, lane % 4);
    let (heads, d) = (p.heads as usize, p.d as usize);
    let kv_row = p.kv_heads as usize * d;
    let mut plan = Plan::new(&p, flash_mma_tile::vectors(D, WG));
    plan.classify_tiles(BN, words);

    // 1. this lane's rows: vectors `slot_vector(mt, w, l/4, h)` of the block, row slot
    //    `2 mt + h`; their bounds and Q fragments, narrowed divided by the row's
    //    `f16_key_scale` (the row's largest magnitude over the quad), which multiplies the row's
    //    scores
    // (recomputed where needed rather than held in registers through the loop)
    let vector = |mt: usize, h: usize| plan.vector(plan.v0 + slot_vector(mt, w, gq, h), heads);
    let mut st = [(0u32, 0u32); 2 * MAX_MT];
    let mul = p.scale * LOG2E;
    let mut qsc = [1.0f32; 2 * MAX_MT];
    let mut qa = [[[0u32; 4]; 8]; MAX_MT];
    unroll!(mt < mt_n, [0, 1], {
        // the lane's query elements, loaded once: [k-step][2c + h] pairs
        let mut xq = [[[0.0f32; 2]; 4]; 8];
        unroll!(h < 2, [0, 1], {
            let (row, head, ok) = vector(mt, h);
            st[2 * mt + h] = plan.row_state(&p, row, ok);
            let mut mx = 0.0f32;
            unroll!(kk < D / 16, [0, 1, 2, 3, 4, 5, 6, 7], {
                for c in 0..2 {
                    let e = 16 * kk + 8 * c + 2 * tq;
                    let x = if ok && e < d { load_q2(&p, row, head, e, mul) } else { [0.0; 2] };
                    mx = mx.max(x[0].abs()).max(x[1].abs());
                    xq[kk][2 * c + h] = x;
                }
            });
            mx = mx.max(shfl_xor(mx, 1));
            mx = mx.max(shfl_xor(mx, 2));
            qsc[2 * mt + h] = f16_key_scale(mx);
        });
        let inv = [1.0 / qsc[2 * mt], 1.0 / qsc[2 * mt + 1]]; // exact: powers of two
        unroll!(kk < D / 16, [0, 1, 2, 3, 4, 5, 6, 7], {
            for c in 0..2 {
                for h in 0..2 {
                    let x = xq[kk][2 * c + h];
                    qa[mt][kk][2 * c + h] = pack_f16x2(x[0] * inv[h], x[1] * inv[h]);
                }
            }
        });
    });
    if q_shared::<D, WG>() {
        // the warpgroup's 64 rows as the A operand of `S = Q Kᵀ` (K-major, one slab of 64 dims),
        // made visible to the multiplies by the fence and the barrier before the first tile's
        store_q(qs + (w / 4 * 64 * 128) as u32, &qa[0], w % 4, lane);
        fence_proxy_async();
    }
    // whether a row of this lane is scaled
    let mut q_scaled = false;
    for r in 0..2 * MAX_MT {
        q_scaled |= qsc[r] != 1.0;
    }

    // 2. the visible key tiles: through the scaled path (row scales staged and applied) when a
    //    query row of the block is scaled or a writer flagged a K/V scale other than 1, else
    //    through a copy of the loop without any of it (uniform over the block)
    let flagged = p.kv_scale != 0 && (p.kv_flag == 0 || *(p.kv_flag as *const u32) != 0);
    let rows = QRows { st, qsc, qa };
    let smem = (ks, vs, qs, scs);
    if block_any(q_scaled || flagged) {
        tiles::<D, true, WG>(&p, &plan, &rows, smem, q_scaled);
    } else {
        tiles::<D, false, WG>(&p, &plan, &rows, smem, false);
    }
}

/// The tile loop and the output of [`flash_mma`]; `SCALED`: with the row-scale steps (`ks`, `vs`
/// the K and V tiles' shared addresses, `qs` the queries' where `q_shared`, `scs` the tile's
/// scales in shared memory).
#[inline(always)]
unsafe fn tiles<const D: usize, const SCALED: bool, const WG: bool>(p: &FlashParams, plan: &Plan, rows: &QRows, (ks, vs, qs, scs): (u32, u32, u32, *const [f32; 2]), q_scaled: bool) {
    let mt_n = flash_mma_tile::m_tiles(D, WG);
    // the rescale skip (`MAX_SLACK`) where it measured faster: head dims up to 64 (the vision
    // tower's attention, 2% on the H200) and by warpgroups (d128 causal @4096 320 → 293 µs,
    // prefill @32k 58.9k → 61.1-62.1k tok/s); with `mma.sync` at 128 the branch cost 4%
    let skip_rescale = D <= 64 || WG;
    let tid = thread::thread_idx_x() as usize;
    let (lane, w) = (tid % 32, tid / 32);
    let (gq, tq) = (lane / 4, lane % 4);
    let (heads, d) = (p.heads as usize, p.d as usize);
    let kv_row = p.kv_heads as usize * d;
    let vector = |mt: usize, h: usize| plan.vector(plan.v0 + slot_vector(mt, w, gq, h), heads);
    let (st, qsc, qa) = (&rows.st, &rows.qsc, &rows.qa);
    let mut o = [[[0.0f32; 4]; 16]; MAX_MT];
    let mut m = [f32::NEG_INFINITY; 2 * MAX_MT];
    let mut l = [0.0f32; 2 * MAX_MT];
    let (k, v) = ((p.k as *const F16).add(plan.g * d), (p.v as *const F16).add(plan.g * d));
    // row scales: staged per tile with K; `vmax` is the largest value scale so far, the unit of
    // `o` (each key's probability is multiplied by its value scale / `vmax` before PV)
    let sc = RowScales::new(p.kv_scale, p.kv_heads as usize, plan.g);
    let scaled = SCALED && p.kv_scale != 0;
    let mut vmax = 1.0f32;
    let tiles = plan.tiles(BN);
    let (mi, ri) = (lane / 8, lane % 8);
    // ldmatrix row addresses: K rows np·16 + (mi / 2)·8 + ri at chunk 2kk + mi % 2, V rows
    // kc·16 + (mi % 2)·8 + ri at chunk 2dp + mi / 2; the swizzle XORs the chunk's low 3 bits with
    // ri, so a lane needs one base per (k-step mod 4), the rest are constant offsets
    let mut k_lane = [0u32; 4];
    let mut v_lane = [0u32; 4];
    for x in 0..4 {
        k_lane[x] = ks + tile_offset((mi / 2) * 8 + ri, 2 * x + mi % 2);
        v_lane[x] = vs + tile_offset((mi % 2) * 8 + ri, 2 * x + mi / 2);
    }
    let keys = |j: usize| (plan.end_max - j * BN).min(BN);
    // double-buffered (`double_buffered`): visible tile `it` (counted from 0) in buffer `it % 2`,
    // the next one's K, V and scales loading into the other while it is multiplied
    let db = double_buffered::<D, WG>();
    let tile_bytes = (BN * D * 2) as u32;
    let buf = |it: usize| if db { (it & 1) as u32 } else { 0 };
    let mut j = plan.next_tile(0, BN);
    if j < tiles {
        stage::<D, WG>(ks, k, j * BN, keys(j), kv_row, d, tid);
        if scaled {
            stage_scales(smem_addr(scs), &sc, j * BN, keys(j), tid);
        }
        if db {
            stage::<D, WG>(vs, v, j * BN, keys(j), kv_row, d, tid);
        }
        cp_async_commit();
    }
    let mut it = 0usize;
    while j < tiles {
        let (_, check) = plan.tile(j, BN);
        let k0 = j * BN;
        let (kt, vt, sct) = (ks + buf(it) * tile_bytes, vs + buf(it) * tile_bytes, scs.add(BN * buf(it) as usize));
        cp_async_wait_all();
        if WG {
            fence_proxy_async();
        }
        // K_j and its scales (double-buffered: V_j too) landed; every warp is done with V of the
        // last tile (double-buffered: with all of the last tile's buffers)
        thread::sync_threads();
        // the next visible tile (single-buffered: found after the products, below)
        let mut jn = if db { plan.next_tile(j + 1, BN) } else { tiles };
        if jn < tiles {
            let nb = buf(it + 1);
            stage::<D, WG>(ks + nb * tile_bytes, k, jn * BN, keys(jn), kv_row, d, tid);
            if scaled {
                stage_scales(smem_addr(scs.add(BN * nb as usize)), &sc, jn * BN, keys(jn), tid);
            }
            stage::<D, WG>(vs + nb * tile_bytes, v, jn * BN, keys(jn), kv_row, d, tid);
            cp_async_commit();
        }
        // whether the scores need multiplying (a query row of the warp or a key of the tile has
        // a scale other than 1) and whether a value of the tile has one: each lane reads two
        // keys' pairs, a ballot makes it uniform over the warp, and tiles of ordinary rows skip
        // the multiplies. (Ballots per tile rather than flags fixed before the loop, which the
        // compiler would unswitch into copies of the whole unrolled loop.)
        let (mut k_mul, mut v_scaled) = (false, false);
        if SCALED {
            let (a, b) = (*sct.add(lane), *sct.add(lane + 32));
            k_mul = ballot(q_scaled || (scaled && (a[0] != 1.0 || b[0] != 1.0))) != 0;
            v_scaled = ballot(scaled && (a[1] != 1.0 || b[1] != 1.0)) != 0;
        }
        if !db {
            stage::<D, WG>(vs, v, k0, keys(j), kv_row, d, tid);
            cp_async_commit();
        }

        // 2a. S = Q Kᵀ: by the warpgroup, or per k-step of 16 dims one ldmatrix.x4 giving the
        //     B fragments of two n-tiles, used by every m-tile of the warp
        let mut s = [[[0.0f32; 4]; BN / 8]; MAX_MT];
        if WG {
            s = qk_wgmma::<D>(qa, kt, q_shared::<D, WG>().then(|| qs + (w / 4 * 64 * 128) as u32));
        } else {
            unroll!(kk < D / 16, [0, 1, 2, 3, 4, 5, 6, 7], {
                unroll!(np < BN / 16, [0, 1, 2, 3], {
                    let b = ldmatrix_x4(k_lane[kk % 4], (np * 16 * 128 + (kk / 4) * BN * 128) as u32);
                    unroll!(mt < mt_n, [0, 1], {
                        s[mt][2 * np] = mma(s[mt][2 * np], qa[mt][kk], b[0], b[1]);
                        s[mt][2 * np + 1] = mma(s[mt][2 * np + 1], qa[mt][kk], b[2], b[3]);
                    });
                });
            });
        }
        // 2b. scales (query rows, keys), masks, row maxima over the quad, rescaled state,
        //     probabilities as A fragments
        if k_mul {
            unroll!(nt < BN / 8, [0, 1, 2, 3, 4, 5, 6, 7], {
                unroll!(e < 2, [0, 1], {
                    let kscale = if scaled { (*sct.add(8 * nt + 2 * tq + e))[0] } else { 1.0 };
                    unroll!(mt < mt_n, [0, 1], {
                        unroll!(h < 2, [0, 1], {
                            s[mt][nt][2 * h + e] *= qsc[2 * mt + h] * kscale;
                        });
                    });
                });
            });
        }
        // the tile's largest value scale (each quad's lanes cover all BN keys) and how `o`
        // changes unit
        let mut vr = 1.0f32;
        if v_scaled {
            let mut tv = 1.0f32;
            unroll!(nt < BN / 8, [0, 1, 2, 3, 4, 5, 6, 7], {
                tv = tv.max((*sct.add(8 * nt + 2 * tq))[1]).max((*sct.add(8 * nt + 2 * tq + 1))[1]);
            });
            tv = tv.max(shfl_xor(tv, 1));
            tv = tv.max(shfl_xor(tv, 2));
            if tv > vmax {
                vr = vmax / tv;
                vmax = tv;
            }
        }
        if check {
            unroll!(nt < BN / 8, [0, 1, 2, 3, 4, 5, 6, 7], {
                unroll!(e < 2, [0, 1], {
                    let key = k0 + 8 * nt + 2 * tq + e;
                    let kb = if plan.mask.is_some() { plan.key_block(key) } else { 0 };
                    unroll!(mt < mt_n, [0, 1], {
                        unroll!(h < 2, [0, 1], {
                            if !plan.sees(st[2 * mt + h], key, kb) {
                                s[mt][nt][2 * h + e] = f32::NEG_INFINITY;
                            }
                        });
                    });
                });
            });
        }
        let mut pa = [[[0u32; 4]; BN / 16]; MAX_MT];
        unroll!(mt < mt_n, [0, 1], {
            // row maxima and sums as trees over the n-tiles (short dependency chains)
            let mut tm = [f32::NEG_INFINITY; 2];
            unroll!(h < 2, [0, 1], {
                let mut x = [0.0f32; BN / 8];
                unroll!(nt < BN / 8, [0, 1, 2, 3, 4, 5, 6, 7], {
                    x[nt] = s[mt][nt][2 * h].max(s[mt][nt][2 * h + 1]);
                });
                tm[h] = tree8(x, f32::max);
            });
            let mut base = [0.0f32; 2];
            let mut alpha = [1.0f32; 2];
            unroll!(h < 2, [0, 1], {
                tm[h] = tm[h].max(shfl_xor(tm[h], 1));
                tm[h] = tm[h].max(shfl_xor(tm[h], 2));
                let r = 2 * mt + h;
                // the row's base moves only when the tile's maximum passes it by more than
                // `MAX_SLACK` (log2 units): the probabilities then stay below 2^MAX_SLACK, well
                // inside f16's range, and `o` and `l` share the base, so the result is the same
                let mn = if skip_rescale { if tm[h] > m[r] + MAX_SLACK { tm[h] } else { m[r] } } else { m[r].max(tm[h]) };
                if mn != f32::NEG_INFINITY {
                    alpha[h] = ex2(m[r] - mn);
                    base[h] = mn;
                }
                m[r] = mn;
                l[r] *= alpha[h];
            });
            let (a0, a1) = (alpha[0] * vr, alpha[1] * vr);
            // most tiles move no base of the warp's rows: their rescale is skipped
            if !skip_rescale || ballot(a0 != 1.0 || a1 != 1.0) != 0 {
                unroll!(dt < D / 8, [0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15], {
                    o[mt][dt][0] *= a0;
                    o[mt][dt][1] *= a0;
                    o[mt][dt][2] *= a1;
                    o[mt][dt][3] *= a1;
                });
            }
            // probabilities, packed into A fragments as they are made; row sums in two chains
            let mut rs = [[0.0f32; 2]; 2];
            unroll!(kc < BN / 16, [0, 1, 2, 3], {
                let mut p4 = [[0.0f32; 4]; 2];
                unroll!(u < 2, [0, 1], {
                    unroll!(e < 4, [0, 1, 2, 3], {
                        p4[u][e] = ex2(s[mt][2 * kc + u][e] - base[e / 2]);
                    });
                    rs[0][u] += p4[u][0] + p4[u][1];
                    rs[1][u] += p4[u][2] + p4[u][3];
                    if SCALED && (v_scaled || vmax != 1.0) {
                        let inv = 1.0 / vmax;
                        let c = 16 * kc + 8 * u + 2 * tq;
                        let (f0, f1) = ((*sct.add(c))[1] * inv, (*sct.add(c + 1))[1] * inv);
                        p4[u] = [p4[u][0] * f0, p4[u][1] * f1, p4[u][2] * f0, p4[u][3] * f1];
                    }
                });
                pa[mt][kc] = [pack_f16x2(p4[0][0], p4[0][1]), pack_f16x2(p4[0][2], p4[0][3]), pack_f16x2(p4[1][0], p4[1][1]), pack_f16x2(p4[1][2], p4[1][3])];
            });
            l[2 * mt] += rs[0][0] + rs[0][1];
            l[2 * mt + 1] += rs[1][0] + rs[1][1];
        });
        if !db {
            cp_async_wait_all();
            if WG {
                fence_proxy_async();
            }
            thread::sync_threads(); // V_j landed; every warp is done with K_j
            jn = plan.next_tile(j + 1, BN);
            if jn < tiles {
                stage::<D, WG>(ks, k, jn * BN, keys(jn), kv_row, d, tid);
                if scaled {
                    stage_scales(smem_addr(scs), &sc, jn * BN, keys(jn), tid);
                }
                cp_async_commit();
            }
        }
        // 2c. O += P V: by the warpgroup, or per 16 keys one ldmatrix.x4.trans giving the B
        //     fragments of two dim tiles, used by every m-tile of the warp
        if WG {
            pv_wgmma::<D>(&mut o[0], &pa[0], vt);
        } else {
            unroll!(kc < BN / 16, [0, 1, 2, 3], {
                unroll!(dp < D / 16, [0, 1, 2, 3, 4, 5, 6, 7], {
                    let b = ldmatrix_x4_trans(v_lane[dp % 4], (kc * 16 * 128 + (dp / 4) * BN * 128) as u32);
                    unroll!(mt < mt_n, [0, 1], {
                        o[mt][2 * dp] = mma(o[mt][2 * dp], pa[mt][kc], b[0], b[1]);
                        o[mt][2 * dp + 1] = mma(o[mt][2 * dp + 1], pa[mt][kc], b[2], b[3]);
                    });
                });
            });
        }
        j = jn;
        it += 1;
    }

    // 3. row sums over the quad, normalized output
    let out = p.out as *mut f32;
    unroll!(mt < mt_n, [0, 1], {
        unroll!(h < 2, [0, 1], {
            let r = 2 * mt + h;
            l[r] += shfl_xor(l[r], 1);
            l[r] += shfl_xor(l[r], 2);
            let (row, head, ok) = vector(mt, h);
            if ok {
                let inv = if l[r] > 0.0 { vmax / l[r] } else { 0.0 };
                let dst = out.add((row * heads + head) * d);
                unroll!(dt < D / 8, [0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15], {
                    let e = 8 * dt + 2 * tq;
                    if e < d {
                        *(dst.add(e) as *mut [f32; 2]) = [o[mt][dt][2 * h] * inv, o[mt][dt][2 * h + 1] * inv];
                    }
                });
            }
        });
    });
}

/// Whether the kernel of head-dim class `D` double-buffers its K/V tiles: the warpgroup kernel
/// for 64 (the tower: `kernels-bench` 4,096 patches 267 → 256 µs). For 128 it made the causal
/// prefill @4096 faster (317 → 282 µs) but prefill @32k slower (59.9k → 58.7k tok/s), so that
/// keeps one K and one V tile, as `mma.sync` does, whose loads overlap the other's products.
const fn double_buffered<const D: usize, const WG: bool>() -> bool {
    WG && D <= 64
}

/// Whether the warpgroup kernel of head-dim class `D` keeps the queries in shared memory (64:
/// without the registers of the Q fragments two blocks of 256 threads fit a multiprocessor)
/// rather than in registers (128: its static K/V tiles and 16 KiB of queries would pass the 48
/// KiB of static shared memory, and one block of 128 threads fits twice either way).
const fn q_shared<const D: usize, const WG: bool>() -> bool {
    WG && D <= 64
}

/// Stores a lane's Q fragments (`qa`, 64 dims) of warp `w4` of its warpgroup into the
/// warpgroup's `[64][64]` f16 query tile at shared address `q` (rows of 128 bytes, the
/// 128-byte swizzle): fragment register `j` of k-step `kk` is row `16 w4 + l/4 + 8 (j % 2)`,
/// dims `16 kk + 8 (j / 2) + 2 (l % 4) ..+2`.
#[inline(always)]
unsafe fn store_q(q: u32, qa: &[[u32; 4]; 8], w4: usize, lane: usize) {
    let (gq, tq) = (lane / 4, lane % 4);
    unroll!(kk < 4, [0, 1, 2, 3], {
        unroll!(j < 4, [0, 1, 2, 3], {
            let r = 16 * w4 + gq + 8 * (j % 2);
            let a = q + tile_offset(r, 2 * kk + j / 2) + 4 * tq as u32;
            core::arch::asm!("st.shared.u32 [{}], {};", in(reg32) a, in(reg32) qa[kk][j], options(nostack));
        });
    });
}

/// `S = Q Kⱼᵀ` by the warpgroup (sm_90a): per 16 dims one `m64n64k16`, Q from the query tile
/// at shared address `q` (K-major, `q_shared`) or else from the lane's A fragments (the warp's 16
/// rows, as `mma.sync` takes them), K from its staged tile (K-major); the accumulator's layout
/// is `mma.sync`'s per 8 keys.
#[inline(always)]
unsafe fn qk_wgmma<const D: usize>(qa: &[[[u32; 4]; 8]; MAX_MT], ks: u32, q: Option<u32>) -> [[[f32; 4]; BN / 8]; MAX_MT] {
    let mt_n = flash_mma_tile::m_tiles(D, true);
    let mut acc = [[0u32; 4 * (BN / 8)]; MAX_MT];
    wgmma_fence();
    unroll!(kk < D / 16, [0, 1, 2, 3, 4, 5, 6, 7], {
        // dims 16 kk ..: slab kk / 4, 32 bytes a step within its rows
        let step = ((kk / 4) * BN * 128 + (kk % 4) * 32) as u64;
        let db = descriptor(ks as u64 + step);
        match q {
            Some(q) => acc[0].mma_f16(descriptor(q as u64 + step), db),
            None => {
                unroll!(mt < mt_n, [0, 1], {
                    acc[mt].mma_rs_f16(qa[mt][kk], db);
                });
            }
        }
    });
    wgmma_commit();
    unroll!(mt < mt_n, [0, 1], {
        acc[mt].wait_all();
    });
    let mut s = [[[0.0f32; 4]; BN / 8]; MAX_MT];
    unroll!(mt < mt_n, [0, 1], {
        for i in 0..4 * (BN / 8) {
            s[mt][i / 4][i % 4] = f32::from_bits(acc[mt][i]);
        }
    });
    s
}

/// `O += P Vⱼ` by the warpgroup (sm_90a): per 16 keys one `m64nDk16` (D 64 or 128), P from the
/// lane's A fragments, V from its staged tile (MN-major: keys are the rows, the slabs of 64 dims
/// `BN · 128` bytes apart).
#[inline(always)]
unsafe fn pv_wgmma<const D: usize>(o: &mut [[f32; 4]; 16], pa: &[[u32; 4]; BN / 16], vs: u32) {
    if D <= 64 {
        pv_products::<32>(o, pa, vs)
    } else {
        pv_products::<64>(o, pa, vs)
    }
}

/// [`pv_wgmma`] into the first `N` accumulator registers of `o` (`N / 4` dim tiles of 8).
#[inline(always)]
unsafe fn pv_products<const N: usize>(o: &mut [[f32; 4]; 16], pa: &[[u32; 4]; BN / 16], vs: u32)
where
    [u32; N]: WgAcc,
{
    let mut acc = [0u32; N];
    for i in 0..N {
        acc[i] = o[i / 4][i % 4].to_bits();
    }
    wgmma_fence();
    unroll!(kc < BN / 16, [0, 1, 2, 3], {
        acc.mma_rs_f16_tb(pa[kc], descriptor_mn(vs as u64 + (kc * 16 * 128) as u64, (BN * 128) as u64));
    });
    wgmma_commit();
    acc.wait_all();
    for i in 0..N {
        o[i / 4][i % 4] = f32::from_bits(acc[i]);
    }
}

// the warpgroup products: one m-tile a warp
const _: () = assert!(flash_mma_tile::m_tiles(64, true) == 1 && flash_mma_tile::m_tiles(128, true) == 1 && flash_mma_tile::m_tiles(64, false) == MAX_MT && BN / 8 == 8);

/// Flash attention on tensor cores, head dims up to 64, f16 K/V (`cp.async`).
#[kernel]
pub unsafe fn flash_attention_mma_d64_f16(p: FlashParams) {
    flash_mma::<64, false>(p)
}

/// Flash attention on tensor cores, head dims up to 128, f16 K/V (`cp.async`).
#[kernel]
pub unsafe fn flash_attention_mma_d128_f16(p: FlashParams) {
    flash_mma::<128, false>(p)
}

/// [`flash_attention_mma_d64_f16`] with the products by warpgroups (sm_90a `wgmma`).
#[kernel]
pub unsafe fn flash_attention_wgmma_d64_f16(p: FlashParams) {
    flash_mma::<64, true>(p)
}

/// [`flash_attention_mma_d128_f16`] with the products by warpgroups (sm_90a `wgmma`).
#[kernel]
pub unsafe fn flash_attention_wgmma_d128_f16(p: FlashParams) {
    flash_mma::<128, true>(p)
}
