//! Tensor-core linear layers for the compute_80 module (Ampere, Ada, Hopper):
//! `c = act(a · wᵀ + bias) + residual` with `mma.sync.m16n8k16` on bf16 or f16 operands and f32
//! accumulation, written as inline PTX.
//!
//! # Parameters ([`LinearParams`])
//! `a` `[m, k]` f32 activations (row stride `lda`), split as they are staged into a high part in
//! the weights' 16-bit type and the low remainder `a - hi` in the same type (f16: each row first
//! multiplied by its exact power-of-two `row_scale`, undone before the epilogue, so values past
//! f16's 65504 split into finite parts; `row_scale_f32` makes the factors), each multiplied
//! with the weights by its own mma (the products with 16-bit weights are exact in the f32
//! accumulator, so the result is as precise as f32 activations to about 2^-16 relative, not the
//! 2^-9 of bf16 activations: the fixtures' logits stay within 1e-3 of f32; `--precision bf16`
//! takes `mma_pipe.rs` instead, and the few-row `*_a16_*` below); `w` `[n, k]` bf16/f16
//! weights as stored; `bias` `[n]` f32 or 0; `residual` `[m, n]`
//! f32 or 0 (may be `c`); `act` 0 none, 1 tanh GELU, 2 erf GELU (applied before the residual);
//! `c` `[m, n]` f32. `k` a multiple of 8 (16-byte weight rows); the launcher checks.
//!
//! # Tiling
//! A block computes a `TM × TN` tile of `c` (128 × 128; 64 × 128 and 64 × 64 variants give
//! more blocks for smaller `m`), walking `k` in steps of `BK` (32); with split-K
//! (`k_split`), z-slice `z` of the grid walks only `k` in `[z·k_split, (z+1)·k_split)` and
//! writes raw partial sums (see `LinearParams::k_split`). Each
//! step stages `a[128 rows, 32]` (f32 loads, split into high and low parts, 16-byte shared
//! stores) and `w[128 rows, 32]` (`cp.async` 16-byte copies, zero-filled past `n` and `k`) in
//! shared memory (48 KiB in all), two buffers:
//! the next step's loads are issued before the current step's math. Rows of 32 elements are
//! 4 chunks of 16 bytes, stored at chunk `c ^ ((row >> 1) & 3)` (an XOR swizzle), so the eight
//! rows an `ldmatrix` reads at one logical chunk fall in eight different bank groups.
//!
//! # Thread mapping
//! 256 threads = 8 warps as 2 (m) × 4 (n); a warp owns a `TM/2 × TN/4` tile (64 × 32 for the
//! largest: 4 × 4 mma tiles of 16 × 8, 64 f32 accumulators per thread). Per 16-wide k step a warp loads its
//! A fragments with `ldmatrix.x4` (one per 16 rows, high and low) and its B fragments with
//! `ldmatrix.x4` (two n-tiles each), then issues two `mma`s per tile. Staging: thread `t` takes
//! the 16-byte chunks `t, t + 256, ...` of each tile (8 activations converted and split, or 8
//! weights copied asynchronously).
//!
//! # Safety
//! The launcher checks sizes, `k % 8 == 0`, and that the compute_80 module is loaded. Every
//! thread reaches every barrier (loop counts are uniform); out-of-range rows and columns are
//! zero-filled on load and skipped on store.

use crate::math::{f16_row_scale, Bf16, F16};
use crate::matmul::{k_slice, store_out};
use crate::mem::{ld_f32x4, shared_addr, st_shared_v4, F32x2};
use crate::params::mma_tile::{BK, BM, BN, WARPS_N};
use crate::params::row_scale_tile::THREADS as ROW_SCALE_THREADS;
use crate::params::{GateUpParams, LinearParams, RowScaleParams, SkinnyParams};
use crate::reduce::block_max;
use cuda_std::{kernel, shared_array, thread};

const TBM: usize = BM as usize;
const TBN: usize = BN as usize;
const TBK: usize = BK as usize;
/// 16-byte chunks per staged row.
const CHUNKS: usize = TBK / 8;
/// The largest warp tile: 64 rows × 32 columns as 4 × 4 mma tiles (register arrays are this
/// size; smaller tiles use part of them).
const MT: usize = 4;
const NT: usize = 4;

/// A 16-bit operand type of `mma`: its PTX name and the f32 → pair conversion.
pub trait MmaElem {
    /// Packs two f32 into one 32-bit register, `lo` in the low half (round to nearest even).
    fn pack(lo: f32, hi: f32) -> u32;
    /// The f32 value of the low 16 bits of a packed register.
    fn low(v: u32) -> f32;
    /// The f32 value of the high 16 bits of a packed register.
    fn high(v: u32) -> f32;
    /// `d += a · b` for one m16n8k16 tile.
    unsafe fn mma(d: &mut [f32; 4], a: &[u32; 4], b: &[u32; 2]);
    /// Whether activations are scaled per row into this type's range (`LinearParams::row_scale`):
    /// f16 (largest 65504), not bf16 (f32's exponent range).
    const ROW_SCALE: bool;
}

impl MmaElem for Bf16 {
    const ROW_SCALE: bool = false;

    #[inline(always)]
    fn pack(lo: f32, hi: f32) -> u32 {
        let d: u32;
        unsafe { core::arch::asm!("cvt.rn.bf16x2.f32 {}, {}, {};", out(reg32) d, in(reg32) hi, in(reg32) lo, options(pure, nomem, nostack)) };
        d
    }

    #[inline(always)]
    fn low(v: u32) -> f32 {
        f32::from_bits(v << 16)
    }

    #[inline(always)]
    fn high(v: u32) -> f32 {
        f32::from_bits(v & 0xffff_0000)
    }

    #[inline(always)]
    unsafe fn mma(d: &mut [f32; 4], a: &[u32; 4], b: &[u32; 2]) {
        core::arch::asm!(
            "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {{{}, {}, {}, {}}}, {{{}, {}, {}, {}}}, {{{}, {}}}, {{{}, {}, {}, {}}};",
            lateout(reg32) d[0], lateout(reg32) d[1], lateout(reg32) d[2], lateout(reg32) d[3],
            in(reg32) a[0], in(reg32) a[1], in(reg32) a[2], in(reg32) a[3],
            in(reg32) b[0], in(reg32) b[1],
            in(reg32) d[0], in(reg32) d[1], in(reg32) d[2], in(reg32) d[3],
            options(pure, nomem, nostack),
        );
    }
}

impl MmaElem for F16 {
    const ROW_SCALE: bool = true;

    #[inline(always)]
    fn pack(lo: f32, hi: f32) -> u32 {
        let d: u32;
        unsafe { core::arch::asm!("cvt.rn.f16x2.f32 {}, {}, {};", out(reg32) d, in(reg32) hi, in(reg32) lo, options(pure, nomem, nostack)) };
        d
    }

    #[inline(always)]
    fn low(v: u32) -> f32 {
        crate::mem::f16x2_to_f32(v).0
    }

    #[inline(always)]
    fn high(v: u32) -> f32 {
        crate::mem::f16x2_to_f32(v).1
    }

    #[inline(always)]
    unsafe fn mma(d: &mut [f32; 4], a: &[u32; 4], b: &[u32; 2]) {
        core::arch::asm!(
            "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {{{}, {}, {}, {}}}, {{{}, {}, {}, {}}}, {{{}, {}}}, {{{}, {}, {}, {}}};",
            lateout(reg32) d[0], lateout(reg32) d[1], lateout(reg32) d[2], lateout(reg32) d[3],
            in(reg32) a[0], in(reg32) a[1], in(reg32) a[2], in(reg32) a[3],
            in(reg32) b[0], in(reg32) b[1],
            in(reg32) d[0], in(reg32) d[1], in(reg32) d[2], in(reg32) d[3],
            options(pure, nomem, nostack),
        );
    }
}

/// Four 8 × 8 b16 matrices from shared memory, lane `l` giving the address of row `l % 8` of
/// matrix `l / 8`.
#[inline(always)]
pub(crate) unsafe fn ldmatrix_x4(addr: u64) -> [u32; 4] {
    let (a, b, c, d): (u32, u32, u32, u32);
    core::arch::asm!(
        "ldmatrix.sync.aligned.m8n8.x4.shared.b16 {{{}, {}, {}, {}}}, [{}];",
        out(reg32) a, out(reg32) b, out(reg32) c, out(reg32) d,
        in(reg64) addr,
        options(readonly, nostack),
    );
    [a, b, c, d]
}

/// An asynchronous 16-byte copy from global memory to shared memory; `bytes` (0 or 16) are
/// read, the rest of the 16 zero-filled.
#[inline(always)]
pub(crate) unsafe fn cp_async_16(dst_shared: u64, src: *const u8, bytes: u32) {
    core::arch::asm!(
        "{{ .reg .u64 g; cvta.to.global.u64 g, {}; cp.async.cg.shared.global [{}], [g], 16, {}; }}",
        in(reg64) src, in(reg64) dst_shared, in(reg32) bytes,
        options(nostack),
    );
}

#[inline(always)]
pub(crate) unsafe fn cp_async_commit() {
    core::arch::asm!("cp.async.commit_group;", options(nostack));
}

#[inline(always)]
pub(crate) unsafe fn cp_async_wait_all() {
    core::arch::asm!("cp.async.wait_all;", options(nostack));
}

/// Byte offset of 16-byte chunk `c` of staged row `row` (XOR swizzle, see the module docs).
#[inline(always)]
pub(crate) fn chunk_offset(row: usize, c: usize) -> usize {
    16 * (row * CHUNKS + (c ^ ((row >> 1) & 3)))
}

#[inline(always)]
unsafe fn mma_linear<W: MmaElem, const TM: usize, const TN: usize, const SPLIT: bool>(p: LinearParams) {
    // 16-byte aligned staging buffers for the largest tile: [2 buffers][rows][32 elements] of
    // 16 bits each, for the activations' high parts, their low parts, and the weights
    let a_s = shared_array![crate::mem::F32x4; 2 * TBM * TBK / 8] as *mut u8;
    let l_s = shared_array![crate::mem::F32x4; 2 * TBM * TBK / 8] as *mut u8;
    let w_s = shared_array![crate::mem::F32x4; 2 * TBN * TBK / 8] as *mut u8;
    let (a_buf, w_buf) = (TM * TBK * 2, TN * TBK * 2);
    // the warp tile: (TM / 2) × (TN / 4) as mt × nt mma tiles (at most 4 × 4)
    let (mts, nts) = (TM / 32, TN / 32);
    let tid = thread::thread_idx_x() as usize;
    let (warp, lane) = (tid / 32, tid % 32);
    let (wm, wn) = (warp / WARPS_N as usize, warp % WARPS_N as usize);
    let (m, n, k, lda) = (p.m as usize, p.n as usize, p.k as usize, p.lda as usize);
    let (row0, col0) = (thread::block_idx_y() as usize * TM, thread::block_idx_x() as usize * TN);
    // split-K: this z-slice sums k in [kb, ke)
    let (kb, ke) = k_slice::<SPLIT>(&p);
    let a = p.a as *const f32;
    let row_scale = p.row_scale as *const f32;
    let w = p.w as *const u8;
    let (a_sh, l_sh, w_sh) = (shared_addr(a_s), shared_addr(l_s), shared_addr(w_s));
    // staging: thread t takes 16-byte chunks t, t + 256, ... of each tile (4 chunks per row)
    let (a_chunks, w_chunks) = (TM * CHUNKS / 256, TN * CHUNKS / 256);
    let load_a = |k0: usize| -> [[f32; 8]; 2] {
        let mut v = [[0.0f32; 8]; 2];
        for i in 0..a_chunks {
            let ch = tid + 256 * i;
            let (r, kk) = (row0 + ch / CHUNKS, k0 + 8 * (ch % CHUNKS));
            if r < m {
                for q in 0..2 {
                    if kk + 4 * q < k {
                        let x = ld_f32x4(a.add(r * lda + kk + 4 * q));
                        for e in 0..4 {
                            v[i][4 * q + e] = x[e];
                        }
                    }
                }
            }
        }
        v
    };
    // f16 operands: each staged row's exact power-of-two scale keeps its parts finite. A
    // thread stages the same rows at every k step, so their scales are read once, and applied
    // where the loaded values are consumed (after the math), not as they arrive.
    let mut scale = [1.0f32; 2];
    if W::ROW_SCALE && !row_scale.is_null() {
        for i in 0..a_chunks {
            let r = row0 + (tid + 256 * i) / CHUNKS;
            if r < m {
                scale[i] = *row_scale.add(r);
            }
        }
    }
    let store_a = |buf: usize, v: &[[f32; 8]; 2]| {
        for i in 0..a_chunks {
            let ch = tid + 256 * i;
            let mut hi = [0u32; 4];
            let mut lo = [0u32; 4];
            for q in 0..4 {
                let (x0, x1) = if W::ROW_SCALE { (v[i][2 * q] * scale[i], v[i][2 * q + 1] * scale[i]) } else { (v[i][2 * q], v[i][2 * q + 1]) };
                hi[q] = W::pack(x0, x1);
                lo[q] = W::pack(x0 - W::low(hi[q]), x1 - W::high(hi[q]));
            }
            let at = (buf * a_buf + chunk_offset(ch / CHUNKS, ch % CHUNKS)) as u64;
            st_shared_v4(a_sh + at, hi);
            st_shared_v4(l_sh + at, lo);
        }
    };
    let load_w = |buf: usize, k0: usize| {
        for i in 0..w_chunks {
            let ch = tid + 256 * i;
            let (r, kk) = (col0 + ch / CHUNKS, k0 + 8 * (ch % CHUNKS));
            let ok = r < n && kk < k;
            let src = if ok { w.add((r * k + kk) * 2) } else { w };
            cp_async_16(w_sh + (buf * w_buf + chunk_offset(ch / CHUNKS, ch % CHUNKS)) as u64, src, if ok { 16 } else { 0 });
        }
    };

    let mut acc = [[[0.0f32; 4]; NT]; MT];
    let steps = (ke - kb + TBK - 1) / TBK;
    // 1. the first tile
    let mut next_a = load_a(kb);
    load_w(0, kb);
    cp_async_commit();
    store_a(0, &next_a);
    cp_async_wait_all();
    thread::sync_threads();
    for step in 0..steps {
        let (cur, nxt) = (step % 2, (step + 1) % 2);
        let more = step + 1 < steps;
        // 2. the next tile's loads go out before this tile's math
        if more {
            load_w(nxt, kb + (step + 1) * TBK);
            cp_async_commit();
            next_a = load_a(kb + (step + 1) * TBK);
        }
        // 3. two 16-wide k steps of mma over the warp's tile (high and low activation parts)
        for ks in 0..TBK / 16 {
            let mut af = [[0u32; 4]; MT];
            let mut lf = [[0u32; 4]; MT];
            for mt in 0..mts {
                let r = wm * (TM / 2) + mt * 16 + (lane & 15);
                let at = (cur * a_buf + chunk_offset(r, ks * 2 + (lane >> 4))) as u64;
                af[mt] = ldmatrix_x4(a_sh + at);
                lf[mt] = ldmatrix_x4(l_sh + at);
            }
            let mut bf = [[0u32; 2]; NT];
            for np in 0..nts / 2 {
                let r = wn * (TN / 4) + np * 16 + (lane & 7) + 8 * (lane >> 4);
                let x = ldmatrix_x4(w_sh + (cur * w_buf + chunk_offset(r, ks * 2 + ((lane >> 3) & 1))) as u64);
                bf[2 * np] = [x[0], x[1]];
                bf[2 * np + 1] = [x[2], x[3]];
            }
            for mt in 0..mts {
                for nt in 0..nts {
                    W::mma(&mut acc[mt][nt], &lf[mt], &bf[nt]);
                    W::mma(&mut acc[mt][nt], &af[mt], &bf[nt]);
                }
            }
        }
        // 4. the next tile into the other buffer (last read before the previous barrier)
        if more {
            store_a(nxt, &next_a);
            cp_async_wait_all();
        }
        thread::sync_threads();
    }

    // 5. epilogue (bias, activation, residual), one mma tile at a time (written out: a rolled
    //    loop would index `acc` dynamically, through local memory)
    unroll!(mt < mts, [0, 1, 2, 3], {
        unroll!(nt < nts, [0, 1, 2, 3], {
            let r = row0 + wm * (TM / 2) + mt * 16 + lane / 4;
            let col = col0 + wn * (TN / 4) + nt * 8 + 2 * (lane % 4);
            store_tile::<W, SPLIT>(&p, acc[mt][nt], r, col);
        });
    });
}

/// Writes one thread's share of an m16n8 accumulator tile: `d[0..2]` at row `r`, columns
/// `col, col + 1`; `d[2..4]` at row `r + 8` (the mma C layout), through the tiled epilogue
/// (split-K: raw into this z-slice's part of the workspace).
/// With f16 operands the sums are first divided by the row's scale (exactly: a power of two).
/// Split-K partial sums of a row's two columns go out as one 8-byte store where both exist
/// (four lanes then fill a 32-byte sector, where two 4-byte stores used half of each: batch-64
/// decode +12%, prefill @64 +11% on the H100); the final outputs keep their 4-byte stores,
/// which measured faster beside the residual's loads (prefill @512 48.3k against 51k).
#[inline(always)]
pub(crate) unsafe fn store_tile<W: MmaElem, const SPLIT: bool>(p: &LinearParams, d: [f32; 4], r: usize, col: usize) {
    let c = p.c as *mut f32;
    let (m, n, ldc) = (p.m as usize, p.n as usize, p.ldc as usize);
    let row_scale = p.row_scale as *const f32;
    let split = SPLIT && p.k_split != 0;
    unroll!(h < 2, [0, 1], {
        let rr = r + 8 * h;
        if rr < m {
            let (v0, v1) = if W::ROW_SCALE && !row_scale.is_null() {
                let s = *row_scale.add(rr);
                (d[2 * h] / s, d[2 * h + 1] / s)
            } else {
                (d[2 * h], d[2 * h + 1])
            };
            // (split-K: this z-slice's part of the workspace, as `store_out` addresses it)
            let part = c.add((thread::block_idx_z() as usize * m + rr) * ldc + col);
            if split && col + 1 < n && (part as usize) % 8 == 0 {
                *(part as *mut F32x2) = F32x2([v0, v1]);
            } else {
                if col < n {
                    store_out::<SPLIT>(p, c, v0, rr, col);
                }
                if col + 1 < n {
                    store_out::<SPLIT>(p, c, v1, rr, col + 1);
                }
            }
        }
    });
}

/// `out[r] = f16_row_scale(max_j |a[r, j]|)`: the per-row factors of the f16 tensor-core
/// kernels (see `LinearParams::row_scale`).
///
/// Parameters: [`RowScaleParams`]: `a` `[m, k]` f32 (row stride `lda`), `out` `[m]` f32.
/// Thread mapping: one 256-thread block per row (grid x = `m`): each thread takes 16-byte
/// chunks `tid, tid + 256, ...` of the row (two in flight per step) when `k` and `lda` are
/// multiples of 4 (16-byte rows), else single values, then a block maximum. A NaN is skipped
/// by the comparison; an infinity gives the factor 1.
/// Safety: the launcher checks the sizes; every thread reaches both barriers of `block_max`.
#[kernel]
pub unsafe fn row_scale_f32(p: RowScaleParams) {
    let scratch = shared_array![f32; 32];
    let tid = thread::thread_idx_x() as usize;
    let r = thread::block_idx_x() as usize;
    let (k, lda) = (p.k as usize, p.lda as usize);
    let row = (p.a as *const f32).add(r * lda);
    let abs = |v: f32| f32::from_bits(v.to_bits() & 0x7fff_ffff);
    let mut mx = 0.0f32;
    let mut take = |v: f32| {
        let v = abs(v);
        if v > mx {
            mx = v;
        }
    };
    if k % 4 == 0 && lda % 4 == 0 {
        let step = ROW_SCALE_THREADS as usize * 4;
        let mut j = tid * 4;
        while j + step < k {
            let (x, y) = (ld_f32x4(row.add(j)), ld_f32x4(row.add(j + step)));
            for e in 0..4 {
                take(x[e]);
                take(y[e]);
            }
            j += 2 * step;
        }
        if j < k {
            let x = ld_f32x4(row.add(j));
            for e in 0..4 {
                take(x[e]);
            }
        }
    } else {
        let mut j = tid;
        while j < k {
            take(*row.add(j));
            j += ROW_SCALE_THREADS as usize;
        }
    }
    let mx = block_max(mx, scratch);
    if tid == 0 {
        *(p.out as *mut f32).add(r) = f16_row_scale(mx);
    }
}

/// `c = act(a · wᵀ + bias) + residual` on tensor cores, bf16 weights, 128 × 128 tiles. See the
/// module docs.
#[kernel]
pub unsafe fn matmul_mma_bf16(p: LinearParams) {
    mma_linear::<Bf16, 128, 128, false>(p)
}

/// As [`matmul_mma_bf16`], f16 weights.
#[kernel]
pub unsafe fn matmul_mma_f16(p: LinearParams) {
    mma_linear::<F16, 128, 128, false>(p)
}

/// As [`matmul_mma_bf16`], 64 × 128 tiles (twice the blocks for medium `m`).
#[kernel]
pub unsafe fn matmul_mma_64x128_bf16(p: LinearParams) {
    mma_linear::<Bf16, 64, 128, false>(p)
}

/// As [`matmul_mma_f16`], 64 × 128 tiles.
#[kernel]
pub unsafe fn matmul_mma_64x128_f16(p: LinearParams) {
    mma_linear::<F16, 64, 128, false>(p)
}

/// As [`matmul_mma_bf16`], 64 × 64 tiles (small `m`: four times the blocks).
#[kernel]
pub unsafe fn matmul_mma_64x64_bf16(p: LinearParams) {
    mma_linear::<Bf16, 64, 64, false>(p)
}

/// As [`matmul_mma_f16`], 64 × 64 tiles.
#[kernel]
pub unsafe fn matmul_mma_64x64_f16(p: LinearParams) {
    mma_linear::<F16, 64, 64, false>(p)
}

/// [`matmul_mma_64x64_bf16`] over one z-slice of `k` (split-K for few rows: raw partial sums
/// into the workspace; see `LinearParams::k_split`). Only the smallest tile splits: the
/// backend splits only when even it gives fewer blocks than multiprocessors.
#[kernel]
pub unsafe fn matmul_mma_64x64_split_bf16(p: LinearParams) {
    mma_linear::<Bf16, 64, 64, true>(p)
}

/// [`matmul_mma_64x64_f16`] over one z-slice of `k` (split-K).
#[kernel]
pub unsafe fn matmul_mma_64x64_split_f16(p: LinearParams) {
    mma_linear::<F16, 64, 64, true>(p)
}

// ---------------------------------------------------------------------------------------------
// `matmul_skinny_*`: the same product for few rows (a batched decode step, a short prompt).
//
// Parameters: [`SkinnyParams`]: its `lin` as for `matmul_mma_*` (`k % 8 == 0`; f16 weights
// take the row scales; split-K by `k_split`, a multiple of 32, slices over grid z, the sums
// merged by the last slice of each column block, no separate reduce), `m <= 16 · MT` (MT 1
// or 2: a 64-row variant measured slower than the 64 × 64 `matmul_mma` tile on the H100, its
// A fragments reloaded four times per weight load).
//
// Tiling: a block owns `8 · SKINNY_NT` output columns and all `m` rows (`MT` m16 tiles) over
// its z-slice of `k` (all of it without split-K: the launcher splits only when the columns
// alone leave multiprocessors idle, e.g. 64 blocks for 2048 columns on 132); its
// `SKINNY_WARPS` warps split the slice in blocks of 32 (warp `w` takes blocks `w, w + W, ...`,
// `SKINNY_UNROLL` at a time, their weight loads issued before any math), and add their partial
// tiles through shared memory at the end, where the epilogue is applied. Nothing is staged in
// shared memory on the way: every weight is read once, straight into mma B fragments.
//
// Thread mapping: lane `l` (group `g = l / 4`, `t = l % 4`) reads 16 bytes of weight row
// `col0 + 8j + g` at `k0 + 8t` for each n tile `j`. The contraction runs over a permutation of
// each 32-wide k block: step `s` (two per block) feeds the mma's logical k `2t, 2t+1` with
// physical `k0 + 8t + 4s + 0, 1` and `2t+8, 2t+9` with `+ 2, 3`, so the lane's 16 weight bytes
// are exactly its B fragments of both steps, and its A fragments are one 16-byte f32 load per
// row (`a[g][k0 + 8t + 4s ..]` and row `g + 8`), split into high and low parts as in
// `mma_linear`; the weights and activations of all `UNROLL` blocks are loaded before the first
// mma (measured on the H100, batch-16 decode: NT 4 / UNROLL 2 4,013 tok/s; NT 2 / UNROLL 4
// 3,754 before the activations moved up front; NT 1 slower still, its activations re-read per
// 8 columns). Accumulators: mma C fragments, rows `g`, `g + 8` and columns `2t, 2t+1` of
// each tile.
//
// Safety: the launcher checks sizes, `k % 8 == 0`, `m <= 16 · MT` and the row scales of f16.
// Every thread reaches every barrier (split-K is uniform over the grid); loads past `m`, `n` or
// `k` are zero-filled, stores past them skipped. Split-K needs a column block's counter at zero
// on entry (the launcher's arrival counters; the merging block resets it).
// ---------------------------------------------------------------------------------------------

use crate::mem::{last_to_arrive, ld_cg, ld_nc_v4};
use crate::params::skinny_tile::{NT as SKINNY_NT, UNROLL as SKINNY_UNROLL, WARPS as SKINNY_WARPS};

#[inline(always)]
unsafe fn skinny_linear<W: MmaElem, const MT: usize, const NT: usize, const U: usize, const LO: bool>(sp: SkinnyParams) {
    let p = sp.lin;
    let (kb, ke) = crate::matmul::k_slice::<true>(&p);
    let x = SkinnyArgs { a: p.a as *const f32, lda: p.lda as usize, w: p.w as *const u16, w2: core::ptr::null(), m: p.m as usize, n: p.n as usize, k: p.k as usize, kb, ke, row_scale: p.row_scale as *const f32 };
    let (m, n, ldc) = (p.m as usize, p.n as usize, p.ldc as usize);
    let c = p.c as *mut f32;
    let split = p.k_split != 0; // uniform over the grid
    let (part, z) = (sp.part as *mut f32, thread::block_idx_z() as usize);
    // through the epilogue, or under split-K the slice's raw sums into the workspace
    skinny_core::<W, _, MT, NT, U, false, LO>(&x, |r, col, v, _| {
        if split {
            *part.add((z * m + r) * n + col) = v;
        } else {
            *c.add(r * ldc + col) = crate::matmul::finish(&p, v, r, col);
        }
    });
    if !split {
        return;
    }
    // the last slice of this column block to arrive adds every slice's sums, in slice order
    let tid = thread::thread_idx_x() as usize;
    let counter = (sp.counters as *mut u32).add(thread::block_idx_x() as usize);
    let slices = thread::grid_dim_z() as usize;
    if last_to_arrive(counter, slices) {
        let cols = 8 * NT;
        let col0 = thread::block_idx_x() as usize * cols;
        let mut i = tid;
        while i < m.min(16 * MT) * cols {
            let (r, col) = (i / cols, col0 + i % cols);
            if col < n {
                let mut v = 0.0f32;
                for s in 0..slices {
                    v += ld_cg(part.add((s * m + r) * n + col));
                }
                *c.add(r * ldc + col) = crate::matmul::finish(&p, v, r, col);
            }
            i += thread::block_dim_x() as usize;
        }
    }
}

/// `silu(a · gateᵀ) ⊙ (a · upᵀ)` for few rows: [`skinny_core`] with the gate's and the up
/// projection's tiles side by side in each block ([`GateUpParams`], with the f16 row scales).
#[inline(always)]
unsafe fn skinny_gate_up<W: MmaElem, const MT: usize, const NT: usize, const U: usize, const LO: bool>(p: GateUpParams) {
    let x = SkinnyArgs { a: p.a as *const f32, lda: p.lda as usize, w: p.gate as *const u16, w2: p.up as *const u16, m: p.m as usize, n: p.n as usize, k: p.k as usize, kb: 0, ke: p.k as usize, row_scale: p.row_scale as *const f32 };
    skinny_core::<W, _, MT, NT, U, true, LO>(&x, |r, col, gv, uv| *(p.c as *mut f32).add(r * p.n as usize + col) = crate::math::silu_mul(gv, uv))
}

/// The operands of [`skinny_core`]: activations `[m, k]` (row stride `lda`), weights `[n, k]`
/// (and a second matrix of the same shape for a pair), the f16 row scales or null.
struct SkinnyArgs {
    a: *const f32,
    lda: usize,
    w: *const u16,
    w2: *const u16,
    m: usize,
    n: usize,
    k: usize,
    /// The block's `k` range `[kb, ke)`: `kb` a multiple of 32, `ke` ≤ `k`.
    kb: usize,
    ke: usize,
    row_scale: *const f32,
}

/// The few-row product (see the section docs); `PAIR`: the block's first `NT / 2` n tiles come
/// from `w` and the last from `w2` at the same columns. `store(r, col, v, v2)` gets each output
/// (row scales undone; `v2` the second matrix's, 0 without a pair).
#[inline(always)]
unsafe fn skinny_core<W: MmaElem, F: Fn(usize, usize, f32, f32), const MT: usize, const NT: usize, const U: usize, const PAIR: bool, const LO: bool>(args: &SkinnyArgs, store: F) {
    const WARPS: usize = SKINNY_WARPS as usize;
    let tid = thread::thread_idx_x() as usize;
    let (warp, lane) = (tid / 32, tid % 32);
    let (g, t) = (lane / 4, lane % 4);
    let (m, n, k, lda) = (args.m, args.n, args.k, args.lda);
    // output columns per block: 8 per n tile, half of them for a pair
    let cols = if PAIR { 8 * NT / 2 } else { 8 * NT };
    let col0 = thread::block_idx_x() as usize * cols;
    let (a, row_scale) = (args.a, args.row_scale);
    // 1. this lane's rows (g and g + 8 of each m tile) and their f16 scales
    let mut scale = [[1.0f32; 2]; MT];
    if W::ROW_SCALE && !row_scale.is_null() {
        for mi in 0..MT {
            for h in 0..2 {
                let r = 16 * mi + g + 8 * h;
                if r < m {
                    scale[mi][h] = *row_scale.add(r);
                }
            }
        }
    }
    let mut acc = [[[0.0f32; 4]; NT]; MT];
    let (kbase, ke) = (args.kb, args.ke);
    let blocks = (ke - kbase + 31) / 32;
    let mut kb = warp;
    while kb < blocks {
        // 2. U blocks of weights and activations in flight before any math: [u][j] = 8 weights
        //    of row col0 + 8j + g at 8t; [u][mi][h] = 8 activations of row 16mi + g + 8h at 8t
        let mut wv = [[[0u32; 4]; NT]; U];
        let mut xa = [[[[0.0f32; 8]; 2]; MT]; U];
        for u in 0..U {
            let kk = kbase + (kb + u * WARPS) * 32 + 8 * t;
            for j in 0..NT {
                let (w, jj) = if PAIR && j >= NT / 2 { (args.w2, j - NT / 2) } else { (args.w, j) };
                let col = col0 + 8 * jj + g;
                if col < n && kk < ke {
                    wv[u][j] = ld_nc_v4(w.add(col * k + kk) as *const u32);
                }
            }
            for mi in 0..MT {
                for h in 0..2 {
                    let r = 16 * mi + g + 8 * h;
                    if r < m && kk < ke {
                        let (v0, v1) = (ld_f32x4(a.add(r * lda + kk)), ld_f32x4(a.add(r * lda + kk + 4)));
                        xa[u][mi][h] = [v0[0], v0[1], v0[2], v0[3], v1[0], v1[1], v1[2], v1[3]];
                    }
                }
            }
        }
        // 3. per block and step: A fragments of every m tile (high, low), two mmas per tile
        for u in 0..U {
            let k0 = kbase + (kb + u * WARPS) * 32;
            if k0 >= ke {
                break; // uniform per warp
            }
            for s in 0..2 {
                for mi in 0..MT {
                    let mut x = [[0.0f32; 4]; 2];
                    for h in 0..2 {
                        for e in 0..4 {
                            x[h][e] = xa[u][mi][h][4 * s + e] * scale[mi][h];
                        }
                    }
                    let hi = [W::pack(x[0][0], x[0][1]), W::pack(x[1][0], x[1][1]), W::pack(x[0][2], x[0][3]), W::pack(x[1][2], x[1][3])];
                    for j in 0..NT {
                        let b = [wv[u][j][2 * s], wv[u][j][2 * s + 1]];
                        W::mma(&mut acc[mi][j], &hi, &b);
                    }
                    if LO {
                        let lo = [
                            W::pack(x[0][0] - W::low(hi[0]), x[0][1] - W::high(hi[0])),
                            W::pack(x[1][0] - W::low(hi[1]), x[1][1] - W::high(hi[1])),
                            W::pack(x[0][2] - W::low(hi[2]), x[0][3] - W::high(hi[2])),
                            W::pack(x[1][2] - W::low(hi[3]), x[1][3] - W::high(hi[3])),
                        ];
                        for j in 0..NT {
                            let b = [wv[u][j][2 * s], wv[u][j][2 * s + 1]];
                            W::mma(&mut acc[mi][j], &lo, &b);
                        }
                    }
                }
            }
        }
        kb += U * WARPS;
    }
    // 4. the warps' partial tiles summed through shared memory: [warp][row][col]
    // (room for 32 rows × 32 columns per warp)
    const PER_WARP: usize = 1024;
    let part = shared_array![f32; SKINNY_WARPS as usize * PER_WARP];
    let width = 8 * NT;
    let rows = 16 * MT;
    for mi in 0..MT {
        for j in 0..NT {
            for h in 0..2 {
                let r = 16 * mi + g + 8 * h;
                for e in 0..2 {
                    *part.add((warp * rows + r) * width + 8 * j + 2 * t + e) = acc[mi][j][2 * h + e];
                }
            }
        }
    }
    thread::sync_threads();
    let mut i = tid;
    while i < m.min(16 * MT) * cols {
        let (r, c) = (i / cols, i % cols);
        let col = col0 + c;
        if col < n {
            let (mut v, mut v2) = (0.0f32, 0.0f32);
            for wi in 0..WARPS {
                v += *part.add((wi * rows + r) * width + c);
                if PAIR {
                    v2 += *part.add((wi * rows + r) * width + cols + c);
                }
            }
            if W::ROW_SCALE && !row_scale.is_null() {
                let sc = *row_scale.add(r);
                v /= sc;
                v2 /= sc;
            }
            store(r, col, v, v2);
        }
        i += thread::block_dim_x() as usize;
    }
}

/// Tensor-core linear layer for at most 16 rows, bf16 weights. See `skinny_linear`.
#[kernel]
pub unsafe fn matmul_skinny_m16_bf16(p: SkinnyParams) {
    skinny_linear::<Bf16, 1, SKINNY_NT, SKINNY_UNROLL, true>(p)
}

/// Tensor-core linear layer for at most 16 rows, f16 weights (row scales). See `skinny_linear`.
#[kernel]
pub unsafe fn matmul_skinny_m16_f16(p: SkinnyParams) {
    skinny_linear::<F16, 1, SKINNY_NT, SKINNY_UNROLL, true>(p)
}

/// Tensor-core linear layer for at most 32 rows, bf16 weights. See `skinny_linear`.
#[kernel]
pub unsafe fn matmul_skinny_m32_bf16(p: SkinnyParams) {
    skinny_linear::<Bf16, 2, SKINNY_NT, SKINNY_UNROLL, true>(p)
}

/// Tensor-core linear layer for at most 32 rows, f16 weights (row scales). See `skinny_linear`.
#[kernel]
pub unsafe fn matmul_skinny_m32_f16(p: SkinnyParams) {
    skinny_linear::<F16, 2, SKINNY_NT, SKINNY_UNROLL, true>(p)
}

/// SwiGLU's gate and up projections with the SiLU product, at most 16 rows, bf16 weights. See
/// `skinny_gate_up`.
#[kernel]
pub unsafe fn gate_up_skinny_m16_bf16(p: GateUpParams) {
    skinny_gate_up::<Bf16, 1, SKINNY_NT, SKINNY_UNROLL, true>(p)
}

/// [`gate_up_skinny_m16_bf16`] for f16 weights (row scales).
#[kernel]
pub unsafe fn gate_up_skinny_m16_f16(p: GateUpParams) {
    skinny_gate_up::<F16, 1, SKINNY_NT, SKINNY_UNROLL, true>(p)
}

/// [`gate_up_skinny_m16_bf16`] for at most 32 rows.
#[kernel]
pub unsafe fn gate_up_skinny_m32_bf16(p: GateUpParams) {
    skinny_gate_up::<Bf16, 2, SKINNY_NT, SKINNY_UNROLL, true>(p)
}

/// [`gate_up_skinny_m16_bf16`] for at most 32 rows of f16 weights.
#[kernel]
pub unsafe fn gate_up_skinny_m32_f16(p: GateUpParams) {
    skinny_gate_up::<F16, 2, SKINNY_NT, SKINNY_UNROLL, true>(p)
}

/// [`matmul_skinny_m16_bf16`] with 16-bit activations: each rounded once to the weights' type,
/// one mma per tile and k step (`--precision bf16`).
#[kernel]
pub unsafe fn matmul_skinny_m16_a16_bf16(p: SkinnyParams) {
    skinny_linear::<Bf16, 1, SKINNY_NT, SKINNY_UNROLL, false>(p)
}

/// [`matmul_skinny_m16_f16`] with 16-bit activations.
#[kernel]
pub unsafe fn matmul_skinny_m16_a16_f16(p: SkinnyParams) {
    skinny_linear::<F16, 1, SKINNY_NT, SKINNY_UNROLL, false>(p)
}

/// [`matmul_skinny_m32_bf16`] with 16-bit activations.
#[kernel]
pub unsafe fn matmul_skinny_m32_a16_bf16(p: SkinnyParams) {
    skinny_linear::<Bf16, 2, SKINNY_NT, SKINNY_UNROLL, false>(p)
}

/// [`matmul_skinny_m32_f16`] with 16-bit activations.
#[kernel]
pub unsafe fn matmul_skinny_m32_a16_f16(p: SkinnyParams) {
    skinny_linear::<F16, 2, SKINNY_NT, SKINNY_UNROLL, false>(p)
}

/// [`gate_up_skinny_m16_bf16`] with 16-bit activations.
#[kernel]
pub unsafe fn gate_up_skinny_m16_a16_bf16(p: GateUpParams) {
    skinny_gate_up::<Bf16, 1, SKINNY_NT, SKINNY_UNROLL, false>(p)
}

/// [`gate_up_skinny_m16_f16`] with 16-bit activations.
#[kernel]
pub unsafe fn gate_up_skinny_m16_a16_f16(p: GateUpParams) {
    skinny_gate_up::<F16, 1, SKINNY_NT, SKINNY_UNROLL, false>(p)
}

/// [`gate_up_skinny_m32_bf16`] with 16-bit activations.
#[kernel]
pub unsafe fn gate_up_skinny_m32_a16_bf16(p: GateUpParams) {
    skinny_gate_up::<Bf16, 2, SKINNY_NT, SKINNY_UNROLL, false>(p)
}

/// [`gate_up_skinny_m32_f16`] with 16-bit activations.
#[kernel]
pub unsafe fn gate_up_skinny_m32_a16_f16(p: GateUpParams) {
    skinny_gate_up::<F16, 2, SKINNY_NT, SKINNY_UNROLL, false>(p)
}
