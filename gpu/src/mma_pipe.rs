//! Tensor-core linear layers over 16-bit activations (`--precision bf16`, compute_80): the
//! prefill-sized `matmul_mma_pipe_*` with a multi-stage `cp.async` pipeline for both operands,
//! and `cast_a16_*`, which rounds the f32 activations to the weights' 16-bit type first.
//!
//! # Parameters
//! [`CastA16Params`]: `a` `[m, k]` f32 (row stride `lda`), `out` `[m, k]` 16-bit (row stride
//! `k`), `row_scale` `[m]` f32 or 0 (f16: each row is multiplied by its exact power-of-two
//! factor, `row_scale_f32`, so it stays finite). `k % 8 == 0` and `lda % 4 == 0`.
//!
//! [`LinearParams`] as for `matmul_mma_*` (`gpu/src/mma.rs`), except that `a` holds `[m, k]`
//! 16-bit activations of the weights' type (from `cast_a16_*`, row stride `lda`, a multiple of
//! 8); with f16 weights `row_scale` is the factor the cast applied, undone before the epilogue.
//! The `*_c16_*` variants write their output in bf16 (`c` `[m, n]` 16-bit, `n` even, no
//! residual): the next pipelined GEMM's activations, rounded once in the epilogue.
//!
//! # Tiling
//! A block computes a `TM × TN` tile of `c` (128 × 256, 128 × 128, 64 × 128, 64 × 64; split-K
//! over grid z as in `mma.rs`, or on sm_90 over the blocks of a thread-block cluster, which
//! merge the slices themselves: `matmul_mma_pipe_64x64_cluster_*`), walking `k` in stages of
//! `KB` elements (`mma_pipe_tile::bk`: 32 for 128 × 128, 64 for the others). `STAGES` (3)
//! stages of both operands live in dynamic shared memory (`mma_pipe_tile::shared_bytes`: 72 KiB
//! for 64 × 128 and 144 KiB for 128 × 256, past the 48 KiB default, which the module loader
//! raises for these kernels where the device allows; 128 × 128's 48 KiB are static):
//! stage `s + STAGES - 1` is being copied (`cp.async`, 16 bytes per copy, zero-filled past
//! `m`, `n` and `k`) while stage `s` is multiplied, and nothing passes through registers on the
//! way. Each stage's copies are issued branch-free after the first k step's fragments are read
//! (their sources and shared offsets worked out once per thread), and each k step's fragments
//! are read before the mmas of the step before. Rows of 64 elements are eight 16-byte chunks
//! stored at chunk `c ^ (row & 7)`, rows of 32 four chunks at `c ^ ((row >> 1) & 3)` (XOR
//! swizzles: the eight rows an `ldmatrix` reads at one logical chunk fall in eight bank
//! groups).
//!
//! # Thread mapping
//! 256 threads = 8 warps as 2 (m) × 4 (n), a warp owning a `TM/2 × TN/4` tile of m16n8k16
//! mma tiles, fragments by `ldmatrix.x4`; one mma per tile and k step (the activations were
//! rounded once). A warp's 64 × 64 of the 128 × 256 tile reads 128 bytes of shared memory per
//! mma where 128 × 128's 64 × 32 reads 192: on an H100 / H200 (128 bytes a clock per SM, about
//! 0.7 mma a clock) the smaller warp tile is bound by those reads. The 128 × 256 epilogue goes
//! through shared memory ([`store_staged`]). Copies: thread `t` takes the 16-byte chunks
//! `t, t + 256, ...` of each operand's stage. `cast_a16_*`: one thread per 8 activations (two
//! 16-byte loads, one 16-byte store), grid x over `m · k / 8`.
//!
//! # Safety
//! The launchers check sizes, `k % 8 == 0`, the 16-bit row stride and the module. Every thread
//! reaches every barrier and commits every copy group (loop counts are uniform over the block);
//! out-of-range rows and columns are zero-filled on load (a copy of 0 bytes, whose source
//! address is not read) and skipped on store; the stages past the block's `k` range are
//! zero-fills, waited for before an epilogue reuses the stages' shared memory.

use crate::math::{Bf16, F16};
use crate::mem::{cluster_map, cluster_sync, ld_cluster_f32x4, ld_f32x4, shared_addr, F32x2, F32x4, U32x4};
use crate::mma::{cp_async_16, cp_async_commit, cp_async_wait_all, ldmatrix_x4, store_tile, MmaElem};
use crate::params::mma_pipe_tile::{STAGES, THREADS, WARPS_N};
use crate::params::{CastA16Params, GateUpParams, LayerNormParams, LinearParams, RmsNormParams, WARP_ROWS};
use crate::reduce::{block_sum, warp_sum};
use cuda_std::shared::dynamic_shared_mem;
use cuda_std::{kernel, shared_array, thread};

const NSTAGES: usize = STAGES as usize;

/// Waits until at most `STAGES - 2` committed copy groups are still in flight (the oldest
/// stage has landed).
#[inline(always)]
unsafe fn cp_async_wait_stage() {
    // STAGES is 3: one group (the next stage's) may stay in flight
    core::arch::asm!("cp.async.wait_group 1;", options(nostack));
}

/// Byte offset of 16-byte chunk `c` of staged row `row` of `C` chunks (8 or 4; XOR swizzle,
/// see the module docs).
#[inline(always)]
fn chunk_offset<const C: usize>(row: usize, c: usize) -> usize {
    let sw = if C == 8 { row & 7 } else { (row >> 1) & 3 };
    16 * (row * C + (c ^ sw))
}

/// The operands of [`pipe_core`]: 16-bit activations `[m, k]` (row stride `lda`), weights
/// `[n, k]` (and a second matrix of the same shape for a pair), the block's `k` range.
pub(crate) struct PipeArgs {
    pub(crate) a: *const u8,
    pub(crate) lda: usize,
    pub(crate) w: *const u8,
    pub(crate) w2: *const u8,
    pub(crate) m: usize,
    pub(crate) n: usize,
    pub(crate) k: usize,
    pub(crate) kb: usize,
    pub(crate) ke: usize,
}

impl PipeArgs {
    /// A linear layer's operands over this block's `k` slice (`matmul::k_slice`).
    #[inline(always)]
    pub(crate) fn linear<const SPLIT: bool>(p: &LinearParams) -> PipeArgs {
        let (kb, ke) = crate::matmul::k_slice::<SPLIT>(p);
        PipeArgs { a: p.a as *const u8, lda: p.lda as usize, w: p.w as *const u8, w2: core::ptr::null(), m: p.m as usize, n: p.n as usize, k: p.k as usize, kb, ke }
    }

    /// A SwiGLU pair's operands (the gate and up matrices), all of `k`.
    #[inline(always)]
    pub(crate) fn gate_up(p: &GateUpParams) -> PipeArgs {
        PipeArgs { a: p.a as *const u8, lda: p.lda as usize, w: p.gate as *const u8, w2: p.up as *const u8, m: p.m as usize, n: p.n as usize, k: p.k as usize, kb: 0, ke: p.k as usize }
    }
}

/// A thread's share of the copies of one pipeline stage of a `TM × TN` tile (`C` 16-byte chunks
/// per staged row): both operands' sources, shared offsets and which of its rows exist, worked
/// out once per thread ([`pipe_core`], and the warpgroup kernels of `wgmma.rs`).
pub(crate) struct StageCopies<const TM: usize, const TN: usize, const C: usize> {
    a_src: *const u8,
    a_step: usize,
    w_src: *const u8,
    w_step: usize,
    sh0: usize,
    kc: usize,
    ke: usize,
    a_ok: u32,
    w_ok: u32,
    a: (u64, usize),
    w: (u64, usize),
}

impl<const TM: usize, const TN: usize, const C: usize> StageCopies<TM, TN, C> {
    /// The copies of the block whose tile starts at row `row0` of the activations and staged
    /// weight row `col0` (see [`pipe_core`] for `PAIR`), into stages of `a = (shared address,
    /// bytes per stage)` and `w` likewise.
    #[inline(always)]
    pub(crate) unsafe fn new<const PAIR: bool>(x: &PipeArgs, row0: usize, col0: usize, a: (u64, usize), w: (u64, usize)) -> Self {
        let tid = thread::thread_idx_x() as usize;
        let (m, n, k, lda) = (x.m, x.n, x.k, x.lda);
        // Thread `t` copies 16-byte chunk `ct = t % C` of the rows `rt + R·i` (`rt = t / C`, `R =
        // THREADS / C` rows a round) of each operand's stage. `R` is a multiple of 8 (and of 16
        // with `PAIR`), so every one of those rows has the first one's swizzle and matrix: a copy's
        // shared offset is the first one's plus `16 · THREADS · i`, its source the first one's
        // plus `i` row steps, all worked out once here (worked out per copy, the 128 × 256 tile's
        // copies were ~190 instructions between the stage barrier and the first mma on sm_90).
        let rper = THREADS as usize / C;
        let (rt, ct) = (tid / C, tid % C);
        let kc = 8 * ct;
        let a_row = row0 + rt;
        // with `PAIR`, staged row `rs` is row `8 · (rs / 16) + rs % 8` of `w` (`(rs / 8)` even) or `w2`
        let (w_mat, w_row, w_rstep) = if PAIR {
            (if (rt / 8) % 2 == 0 { x.w } else { x.w2 }, col0 + 8 * (rt / 16) + rt % 8, rper / 2)
        } else {
            (x.w, col0 + rt, rper)
        };
        // which of the thread's rows exist (bit i: row `i`), the same at every stage
        let (mut a_ok, mut w_ok) = (0u32, 0u32);
        for i in 0..Self::A_CHUNKS {
            a_ok |= ((a_row + rper * i < m) as u32) << i;
        }
        for i in 0..Self::W_CHUNKS {
            w_ok |= ((w_row + w_rstep * i < n) as u32) << i;
        }
        StageCopies {
            a_src: x.a.wrapping_add((a_row * lda + kc) * 2),
            a_step: rper * lda * 2,
            w_src: w_mat.wrapping_add((w_row * k + kc) * 2),
            w_step: w_rstep * k * 2,
            sh0: chunk_offset::<C>(rt, ct),
            kc,
            ke: x.ke,
            a_ok,
            w_ok,
            a,
            w,
        }
    }

    const A_CHUNKS: usize = TM * C / THREADS as usize;
    const W_CHUNKS: usize = TN * C / THREADS as usize;

    /// Stage `buf` of k elements [k0, k0 + 8·C): both operands, asynchronously, zero-filled past
    /// `m`, `n` and the block's `k` range (a copy of 0 bytes reads nothing: its source address
    /// is not dereferenced). Branch-free, so the first k step's mmas can be scheduled among the
    /// copies; a stage past the range is a group of zero-fills.
    #[inline(always)]
    pub(crate) unsafe fn load(&self, buf: usize, k0: usize) {
        let sh_step = 16 * THREADS as usize;
        let k_ok = if k0 + self.kc < self.ke { u32::MAX } else { 0 };
        let (a_ok, w_ok) = (self.a_ok & k_ok, self.w_ok & k_ok);
        for i in 0..Self::A_CHUNKS {
            let src = self.a_src.wrapping_add(k0 * 2 + i * self.a_step);
            cp_async_16(self.a.0 + (buf * self.a.1 + self.sh0 + sh_step * i) as u64, src, 16 * ((a_ok >> i) & 1));
        }
        for i in 0..Self::W_CHUNKS {
            let src = self.w_src.wrapping_add(k0 * 2 + i * self.w_step);
            cp_async_16(self.w.0 + (buf * self.w.1 + self.sh0 + sh_step * i) as u64, src, 16 * ((w_ok >> i) & 1));
        }
    }
}

/// The block's `TM × TN` accumulator tile (see the module docs), rows from `block_idx.y · TM`.
/// Its staged weight rows are `block_idx.x · TN + r`; with `PAIR`, groups of 8 alternate
/// between `w` and `w2` at `block_idx.x · TN / 2 + 8 · (group / 2) + r % 8`, so a thread's
/// n tiles `2j` and `2j + 1` hold the two matrices' sums for the same output columns.
#[inline(always)]
unsafe fn pipe_core<W: MmaElem, const TM: usize, const TN: usize, const KB: usize, const C: usize, const PAIR: bool, const MT: usize, const NT: usize>(x: &PipeArgs) -> [[[f32; 4]; NT]; MT] {
    // KB = mma_pipe_tile::bk(TM, TN) (the kernels below pass it), C = KB / 8 chunks per row;
    // MT = TM / 32 m16 tiles and NT = TN / 32 n8 tiles per warp (the accumulator is exactly
    // the warp's tile: no unused part to keep in local memory)
    assert!(MT == TM / 32 && NT == TN / 32);
    let depth = KB;
    // [STAGES][rows][KB elements] of 16 bits for the activations, then the weights
    let (a_buf, w_buf) = (TM * depth * 2, TN * depth * 2);
    let (a_s, w_s) = if depth == 32 && TM == 128 && TN == 128 {
        // 128 × 128 (see `mma_pipe_tile::shared_bytes`): static stages, 24 KiB per operand
        (shared_array![F32x4; NSTAGES * 128 * 32 / 8] as *mut u8, shared_array![F32x4; NSTAGES * 128 * 32 / 8] as *mut u8)
    } else {
        let d = dynamic_shared_mem::<u8>();
        (d, d.add(NSTAGES * a_buf))
    };
    let tid = thread::thread_idx_x() as usize;
    let (warp, lane) = (tid / 32, tid % 32);
    let (wm, wn) = (warp / WARPS_N as usize, warp % WARPS_N as usize);
    let row0 = thread::block_idx_y() as usize * TM;
    let col0 = thread::block_idx_x() as usize * if PAIR { TN / 2 } else { TN };
    let (kb, ke) = (x.kb, x.ke);
    let (a_sh, w_sh) = (shared_addr(a_s), shared_addr(w_s));
    let copies = StageCopies::<TM, TN, C>::new::<PAIR>(x, row0, col0, (a_sh, a_buf), (w_sh, w_buf));
    let load = |buf: usize, k0: usize| copies.load(buf, k0);
    // the warp's A and B fragments of k step `ks` of stage `cur`
    let frags = |cur: usize, ks: usize| {
        let mut af = [[0u32; 4]; MT];
        for mt in 0..MT {
            let r = wm * (TM / 2) + mt * 16 + (lane & 15);
            af[mt] = ldmatrix_x4(a_sh + (cur * a_buf + chunk_offset::<C>(r, ks * 2 + (lane >> 4))) as u64);
        }
        let mut bf = [[0u32; 2]; NT];
        for np in 0..NT / 2 {
            let r = wn * (TN / 4) + np * 16 + (lane & 7) + 8 * (lane >> 4);
            let x = ldmatrix_x4(w_sh + (cur * w_buf + chunk_offset::<C>(r, ks * 2 + ((lane >> 3) & 1))) as u64);
            bf[2 * np] = [x[0], x[1]];
            bf[2 * np + 1] = [x[2], x[3]];
        }
        (af, bf)
    };

    let mut acc = [[[0.0f32; 4]; NT]; MT];
    let steps = (ke - kb + depth - 1) / depth;
    // 1. the first STAGES - 1 stages in flight (a group per stage, zero-fills past the end)
    for s in 0..NSTAGES - 1 {
        load(s, kb + s * depth);
        cp_async_commit();
    }
    // the buffers of stage `step` and of stage `step + STAGES - 1`: counted round, or as
    // `step % STAGES` for the bf16 128 × 256 tiles. The two compile to different schedules under
    // the driver's ptxas (CUDA 13), and each measured faster where it is taken (H200,
    // `kernels-bench --only matmul`: 128 × 256 3-5% faster by the remainder; 64 × 128 up to 9%
    // and 128 × 128 up to 5% faster counted round). The f16 128 × 256 pair spills with the
    // remainder under CUDA 11.8's ptxas, so f16 counts round.
    let next = |b: usize| if b + 1 == NSTAGES { 0 } else { b + 1 };
    let (mut round_cur, mut round_ahead) = (0, NSTAGES - 1);
    for step in 0..steps {
        // 2. stage `step` has landed for every thread; every warp is done with stage step - 1
        cp_async_wait_stage();
        thread::sync_threads();
        // 3. the first k step's fragments, then stage step + STAGES - 1 goes out into the
        //    buffer stage step - 1 used (branch-free, so the scheduler can start the mmas while
        //    the copies are issued)
        let cur = if TN == 256 && !W::ROW_SCALE { step % NSTAGES } else { round_cur };
        let mut f = frags(cur, 0);
        let ahead = if TN == 256 && !W::ROW_SCALE { (step + NSTAGES - 1) % NSTAGES } else { round_ahead };
        load(ahead, kb + (step + NSTAGES - 1) * depth);
        cp_async_commit();
        // 4. KB / 16 k steps of mma over the warp's tile, the next step's fragments read first
        //    (written out: 2 or 4 k steps)
        unroll!(ks < KB / 16, [0, 1, 2, 3], {
            let (af, bf) = f;
            if ks + 1 < KB / 16 {
                f = frags(cur, ks + 1);
            }
            for mt in 0..MT {
                for nt in 0..NT {
                    W::mma(&mut acc[mt][nt], &af[mt], &bf[nt]);
                }
            }
        });
        round_cur = next(round_cur);
        round_ahead = next(round_ahead);
    }
    // the zero-fills of the stages past the range have landed before any epilogue reuses the
    // stages' shared memory
    cp_async_wait_all();
    acc
}

#[inline(always)]
unsafe fn mma_pipe<W: MmaElem, const TM: usize, const TN: usize, const SPLIT: bool, const KB: usize, const C: usize, const C16: bool, const MT: usize, const NT: usize>(p: LinearParams) {
    let x = PipeArgs::linear::<SPLIT>(&p);
    let acc = pipe_core::<W, TM, TN, KB, C, false, MT, NT>(&x);
    if TN == 256 {
        // (the staged tile fits in the stages' dynamic shared memory)
        assert!(TM * (TN + 8) * 4 <= NSTAGES * (TM + TN) * KB * 2);
        // 5. epilogue through shared memory (see `store_staged`)
        store_staged::<W, TM, TN, C16, MT, NT>(&p, &acc);
        return;
    }
    // 5. epilogue (row scales undone, bias, activation, residual), one mma tile at a time
    let lane = thread::thread_idx_x() as usize % 32;
    let warp = thread::thread_idx_x() as usize / 32;
    let (wm, wn) = (warp / WARPS_N as usize, warp % WARPS_N as usize);
    let (row0, col0) = (thread::block_idx_y() as usize * TM, thread::block_idx_x() as usize * TN);
    // (written out: a rolled loop would index `acc` dynamically, through local memory)
    unroll!(mt < TM / 32, [0, 1, 2, 3], {
        unroll!(nt < TN / 32, [0, 1, 2, 3, 4, 5, 6, 7], {
            let r = row0 + wm * (TM / 2) + mt * 16 + lane / 4;
            let col = col0 + wn * (TN / 4) + nt * 8 + 2 * (lane % 4);
            if C16 {
                store_tile_c16::<W>(&p, acc[mt][nt], r, col);
            } else {
                store_tile::<W, SPLIT>(&p, acc[mt][nt], r, col);
            }
        });
    });
}

/// An m16n8 accumulator tile `d` (rows `r`, `r + 8`; columns `col`, `col + 1`) finished (bias,
/// activation) and stored in 16 bits: each row's column pair rounded into one 32-bit word of
/// `c` (`n` even, row stride `ldc`).
#[inline(always)]
pub(crate) unsafe fn store_tile_c16<W: MmaElem>(p: &LinearParams, d: [f32; 4], r: usize, col: usize) {
    let (m, n, ldc) = (p.m as usize, p.n as usize, p.ldc as usize);
    unroll!(h < 2, [0, 1], {
        let rr = r + 8 * h;
        if rr < m && col < n {
            let v = W::pack(crate::matmul::finish(p, d[2 * h], rr, col), crate::matmul::finish(p, d[2 * h + 1], rr, col + 1));
            *((p.c as *mut u8).add((rr * ldc + col) * 2) as *mut u32) = v;
        }
    });
}

/// The block's raw `TM × TN` sums from every warp's accumulator into `[TM][stride]` f32 at
/// `tile` (dynamic shared memory over the pipeline's stages), once every warp is done reading
/// those stages; 8-byte stores, a row pair per lane and mma tile. The caller syncs (or
/// cluster-syncs) before reading it back.
#[inline(always)]
unsafe fn stage_acc<const TM: usize, const TN: usize, const MT: usize, const NT: usize>(tile: *mut f32, stride: usize, acc: &[[[f32; 4]; NT]; MT]) {
    let tid = thread::thread_idx_x() as usize;
    let (warp, lane) = (tid / 32, tid % 32);
    let (wm, wn) = (warp / WARPS_N as usize, warp % WARPS_N as usize);
    thread::sync_threads();
    unroll!(mt < TM / 32, [0, 1, 2, 3], {
        unroll!(nt < TN / 32, [0, 1, 2, 3, 4, 5, 6, 7], {
            let r = wm * (TM / 2) + mt * 16 + lane / 4;
            let col = wn * (TN / 4) + nt * 8 + 2 * (lane % 4);
            let d = acc[mt % MT][nt % NT];
            unroll!(h < 2, [0, 1], {
                *(tile.add((r + 8 * h) * stride + col) as *mut F32x2) = F32x2([d[2 * h], d[2 * h + 1]]);
            });
        });
    });
}

/// The epilogue of the 128 × 256 tiles: the block's raw sums staged in its shared memory (the
/// pipeline's stages, free once every warp has read its last one; rows of `TN + 8` f32, so the
/// four rows a half-warp's 8-byte stores reach fall in distinct banks), then each thread
/// finishes four adjacent outputs per round (row scales undone, bias, activation, residual) and
/// stores them as one 16-byte vector (8 bytes in bf16 with `C16`) where the row allows, the
/// rows in order. Unrolled per mma tile, the 128 × 256 epilogue's stores and their
/// bookkeeping made the kernel's code ~4× the size of its main loop and measured at half the
/// speed of the gate/up kernel, whose epilogue is short (ncu: warps waiting on instruction fetch).
#[inline(always)]
unsafe fn store_staged<W: MmaElem, const TM: usize, const TN: usize, const C16: bool, const MT: usize, const NT: usize>(p: &LinearParams, acc: &[[[f32; 4]; NT]; MT]) {
    const PAD: usize = 8;
    let stride = TN + PAD;
    let tile = dynamic_shared_mem::<u8>() as *mut f32;
    stage_acc::<TM, TN, MT, NT>(tile, stride, acc);
    thread::sync_threads();
    finish_staged::<W, TM, TN, C16>(p, tile, stride);
}

/// The second half of [`store_staged`] (also the warpgroup kernels' epilogue, `wgmma.rs`): the
/// block's raw `TM × TN` sums, staged at `tile` in rows of `stride` f32 and synced, finished
/// and stored four adjacent outputs per thread and round.
///
/// Thread `t` keeps the four columns `4 · (t % (TN / 4))` (their bias read once) and walks the
/// rows `t / (TN / 4) + R · i`, `R = THREADS / (TN / 4)` rows a round. With a residual, the
/// residuals of [`FINISH_ROUNDS`] rounds are loaded before any of them is finished: with one
/// 128 × 256 block per multiprocessor nothing else hides a load's latency, and a load, finish
/// and store per round (32 rounds) had made `o_proj` 15 µs slower than the same product without
/// its residual (ncu, H200, the 1024² tower).
#[inline(always)]
pub(crate) unsafe fn finish_staged<W: MmaElem, const TM: usize, const TN: usize, const C16: bool>(p: &LinearParams, tile: *const f32, stride: usize) {
    let tid = thread::thread_idx_x() as usize;
    let (m, n, ldc) = (p.m as usize, p.n as usize, p.ldc as usize);
    let (row0, col0) = (thread::block_idx_y() as usize * TM, thread::block_idx_x() as usize * TN);
    let groups = TN / 4;
    let rows_per_round = THREADS as usize / groups;
    let (lc, lr0) = (4 * (tid % groups), tid / groups);
    let col = col0 + lc;
    if col >= n {
        return;
    }
    let (bias, res) = (p.bias as *const f32, p.residual as *const f32);
    let row_scale = p.row_scale as *const f32;
    let mut bv = [0.0f32; 4];
    if !bias.is_null() {
        unroll!(e < 4, [0, 1, 2, 3], {
            if col + e < n {
                bv[e] = *bias.add(col + e);
            }
        });
    }
    let mut base = 0;
    while base < TM {
        // 1. this thread's residuals of FINISH_ROUNDS rounds, all in flight at once
        let mut rv = [[0.0f32; 4]; FINISH_ROUNDS];
        if !res.is_null() {
            unroll!(u < FINISH_ROUNDS, [0, 1, 2, 3, 4, 5, 6, 7], {
                let lr = base + lr0 + rows_per_round * u;
                if lr < TM && row0 + lr < m {
                    let at = (row0 + lr) * ldc + col;
                    if col + 3 < n && (res.add(at) as usize) % 16 == 0 {
                        rv[u] = ld_f32x4(res.add(at));
                    } else {
                        unroll!(e < 4, [0, 1, 2, 3], {
                            if col + e < n {
                                rv[u][e] = *res.add(at + e);
                            }
                        });
                    }
                }
            });
        }
        // 2. finished (`matmul::finish`'s steps: row scale undone, bias, activation, residual)
        //    and stored
        unroll!(u < FINISH_ROUNDS, [0, 1, 2, 3, 4, 5, 6, 7], {
            let lr = base + lr0 + rows_per_round * u;
            let r = row0 + lr;
            if lr < TM && r < m {
                let v = ld_f32x4(tile.add(lr * stride + lc));
                let sc = if W::ROW_SCALE && !row_scale.is_null() { *row_scale.add(r) } else { 1.0 };
                let mut o = [0.0f32; 4];
                unroll!(e < 4, [0, 1, 2, 3], {
                    let mut x = v[e] / sc;
                    if !bias.is_null() {
                        x += bv[e];
                    }
                    x = crate::matmul::activate(p.act, x);
                    if !res.is_null() {
                        x += rv[u][e];
                    }
                    o[e] = x;
                });
                let at = r * ldc + col;
                if C16 {
                    // `n` even: the pairs (col, col + 1) and (col + 2, col + 3) are whole or absent
                    let c = (p.c as *mut u8).add(at * 2);
                    let (lo, hi) = (W::pack(o[0], o[1]), W::pack(o[2], o[3]));
                    if col + 3 < n && at % 4 == 0 {
                        *(c as *mut F32x2) = F32x2([f32::from_bits(lo), f32::from_bits(hi)]);
                    } else {
                        *(c as *mut u32) = lo;
                        if col + 2 < n {
                            *(c.add(4) as *mut u32) = hi;
                        }
                    }
                } else {
                    let c = (p.c as *mut f32).add(at);
                    if col + 3 < n && at % 4 == 0 {
                        *(c as *mut F32x4) = F32x4(o);
                    } else {
                        unroll!(e < 4, [0, 1, 2, 3], {
                            if col + e < n {
                                *c.add(e) = o[e];
                            }
                        });
                    }
                }
            }
        });
        base += rows_per_round * FINISH_ROUNDS;
    }
}

/// Rounds of [`finish_staged`] whose residual loads are in flight together.
const FINISH_ROUNDS: usize = 8;

/// `c = silu(a · gateᵀ) ⊙ (a · upᵀ)` over 16-bit activations ([`GateUpParams`]: `a` from
/// `cast_a16_*`, row stride `lda`; f16 row scales undone first): [`pipe_core`] with the two
/// matrices' rows interleaved by eights, `TN / 2` output columns per block.
#[inline(always)]
unsafe fn gate_up_pipe<W: MmaElem, const TM: usize, const TN: usize, const KB: usize, const C: usize, const C16: bool, const MT: usize, const NT: usize>(p: GateUpParams) {
    let (m, n) = (p.m as usize, p.n as usize);
    let x = PipeArgs::gate_up(&p);
    let acc = pipe_core::<W, TM, TN, KB, C, true, MT, NT>(&x);
    let lane = thread::thread_idx_x() as usize % 32;
    let warp = thread::thread_idx_x() as usize / 32;
    let (wm, wn) = (warp / WARPS_N as usize, warp % WARPS_N as usize);
    let (row0, col0) = (thread::block_idx_y() as usize * TM, thread::block_idx_x() as usize * (TN / 2));
    let (c, row_scale) = (p.c as *mut f32, p.row_scale as *const f32);
    unroll!(mt < TM / 32, [0, 1, 2, 3], {
        unroll!(j < TN / 64, [0, 1, 2, 3], {
            let (g, u) = (acc[mt][2 * j], acc[mt][2 * j + 1]);
            let r = row0 + wm * (TM / 2) + mt * 16 + lane / 4;
            let col = col0 + wn * (TN / 8) + j * 8 + 2 * (lane % 4);
            if C16 {
                // each row's column pair rounded into one 32-bit word of the 16-bit output (`n`
                // even; no row scales: bf16 only)
                unroll!(h < 2, [0, 1], {
                    let rr = r + 8 * h;
                    if rr < m && col < n {
                        let v = W::pack(crate::math::silu_mul(g[2 * h], u[2 * h]), crate::math::silu_mul(g[2 * h + 1], u[2 * h + 1]));
                        *((p.c as *mut u8).add((rr * n + col) * 2) as *mut u32) = v;
                    }
                });
            } else {
                unroll!(i < 4, [0, 1, 2, 3], {
                    let (rr, cc) = (r + 8 * (i / 2), col + i % 2);
                    if rr < m && cc < n {
                        let s = if W::ROW_SCALE && !row_scale.is_null() { *row_scale.add(rr) } else { 1.0 };
                        *c.add(rr * n + cc) = crate::math::silu_mul(g[i] / s, u[i] / s);
                    }
                });
            }
        });
    });
}

/// SwiGLU's gate and up projections with the SiLU product, bf16 activations and weights,
/// 128 × 128 tiles (64 columns of each). See [`gate_up_pipe`].
#[kernel]
pub unsafe fn gate_up_pipe_bf16(p: GateUpParams) {
    gate_up_pipe::<Bf16, 128, 128, 32, 4, false, 4, 4>(p)
}

/// [`gate_up_pipe_bf16`] with f16 (row-scaled activations).
#[kernel]
pub unsafe fn gate_up_pipe_f16(p: GateUpParams) {
    gate_up_pipe::<F16, 128, 128, 32, 4, false, 4, 4>(p)
}

/// [`gate_up_pipe_bf16`] with 64 × 128 tiles.
#[kernel]
pub unsafe fn gate_up_pipe_64x128_bf16(p: GateUpParams) {
    gate_up_pipe::<Bf16, 64, 128, 64, 8, false, 2, 4>(p)
}

/// [`gate_up_pipe_f16`] with 64 × 128 tiles.
#[kernel]
pub unsafe fn gate_up_pipe_64x128_f16(p: GateUpParams) {
    gate_up_pipe::<F16, 64, 128, 64, 8, false, 2, 4>(p)
}

/// [`gate_up_pipe_bf16`] writing the products in bf16 (`c` `[m, n]` 16-bit): the activations of
/// the down projection's pipelined GEMM, rounded once here instead of by `cast_a16_bf16`.
#[kernel]
pub unsafe fn gate_up_pipe_c16_bf16(p: GateUpParams) {
    gate_up_pipe::<Bf16, 128, 128, 32, 4, true, 4, 4>(p)
}

/// [`gate_up_pipe_c16_bf16`] with 64 × 128 tiles.
#[kernel]
pub unsafe fn gate_up_pipe_64x128_c16_bf16(p: GateUpParams) {
    gate_up_pipe::<Bf16, 64, 128, 64, 8, true, 2, 4>(p)
}

/// [`matmul_mma_pipe_bf16`] writing `act(a · wᵀ + bias)` in bf16 (`c` `[m, n]` 16-bit, row
/// stride `ldc`, no residual): the activations of the next pipelined GEMM, rounded once here.
#[kernel]
pub unsafe fn matmul_mma_pipe_c16_bf16(p: LinearParams) {
    mma_pipe::<Bf16, 128, 128, false, 32, 4, true, 4, 4>(p)
}

/// [`matmul_mma_pipe_c16_bf16`] with 64 × 128 tiles.
#[kernel]
pub unsafe fn matmul_mma_pipe_64x128_c16_bf16(p: LinearParams) {
    mma_pipe::<Bf16, 64, 128, false, 64, 8, true, 2, 4>(p)
}

/// `c = act(a · wᵀ + bias) + residual`, bf16 activations and weights, 128 × 128 tiles. See the
/// module docs.
#[kernel]
pub unsafe fn matmul_mma_pipe_bf16(p: LinearParams) {
    mma_pipe::<Bf16, 128, 128, false, 32, 4, false, 4, 4>(p)
}

/// As [`matmul_mma_pipe_bf16`], f16 (row-scaled activations).
#[kernel]
pub unsafe fn matmul_mma_pipe_f16(p: LinearParams) {
    mma_pipe::<F16, 128, 128, false, 32, 4, false, 4, 4>(p)
}

/// As [`matmul_mma_pipe_f16`], 128 × 256 tiles.
#[kernel]
pub unsafe fn matmul_mma_pipe_128x256_f16(p: LinearParams) {
    mma_pipe::<F16, 128, 256, false, 64, 8, false, 4, 8>(p)
}

/// [`matmul_mma_pipe_c16_bf16`] with 128 × 256 tiles.
#[kernel]
pub unsafe fn matmul_mma_pipe_128x256_c16_bf16(p: LinearParams) {
    mma_pipe::<Bf16, 128, 256, false, 64, 8, true, 4, 8>(p)
}

/// [`gate_up_pipe_bf16`] with 128 × 256 tiles (128 columns of each matrix).
#[kernel]
pub unsafe fn gate_up_pipe_128x256_bf16(p: GateUpParams) {
    gate_up_pipe::<Bf16, 128, 256, 64, 8, false, 4, 8>(p)
}

/// [`gate_up_pipe_f16`] with 128 × 256 tiles.
#[kernel]
pub unsafe fn gate_up_pipe_128x256_f16(p: GateUpParams) {
    gate_up_pipe::<F16, 128, 256, 64, 8, false, 4, 8>(p)
}

/// [`gate_up_pipe_c16_bf16`] with 128 × 256 tiles.
#[kernel]
pub unsafe fn gate_up_pipe_128x256_c16_bf16(p: GateUpParams) {
    gate_up_pipe::<Bf16, 128, 256, 64, 8, true, 4, 8>(p)
}

/// As [`matmul_mma_pipe_bf16`], 128 × 256 tiles (a warp owns 64 × 64: two thirds of the
/// shared-memory reads per mma of 128 × 128's 64 × 32), 64-deep stages, the epilogue through
/// shared memory ([`store_staged`]).
#[kernel]
pub unsafe fn matmul_mma_pipe_128x256_bf16(p: LinearParams) {
    mma_pipe::<Bf16, 128, 256, false, 64, 8, false, 4, 8>(p)
}

/// As [`matmul_mma_pipe_bf16`], 64 × 128 tiles.
#[kernel]
pub unsafe fn matmul_mma_pipe_64x128_bf16(p: LinearParams) {
    mma_pipe::<Bf16, 64, 128, false, 64, 8, false, 2, 4>(p)
}

/// As [`matmul_mma_pipe_f16`], 64 × 128 tiles.
#[kernel]
pub unsafe fn matmul_mma_pipe_64x128_f16(p: LinearParams) {
    mma_pipe::<F16, 64, 128, false, 64, 8, false, 2, 4>(p)
}

/// As [`matmul_mma_pipe_bf16`], 64 × 64 tiles.
#[kernel]
pub unsafe fn matmul_mma_pipe_64x64_bf16(p: LinearParams) {
    mma_pipe::<Bf16, 64, 64, false, 64, 8, false, 2, 2>(p)
}

/// As [`matmul_mma_pipe_f16`], 64 × 64 tiles.
#[kernel]
pub unsafe fn matmul_mma_pipe_64x64_f16(p: LinearParams) {
    mma_pipe::<F16, 64, 64, false, 64, 8, false, 2, 2>(p)
}

/// [`matmul_mma_pipe_64x64_bf16`] over one z-slice of `k` (split-K: raw partial sums).
#[kernel]
pub unsafe fn matmul_mma_pipe_64x64_split_bf16(p: LinearParams) {
    mma_pipe::<Bf16, 64, 64, true, 64, 8, false, 2, 2>(p)
}

/// [`matmul_mma_pipe_64x64_f16`] over one z-slice of `k` (split-K: raw partial sums).
#[kernel]
pub unsafe fn matmul_mma_pipe_64x64_split_f16(p: LinearParams) {
    mma_pipe::<F16, 64, 64, true, 64, 8, false, 2, 2>(p)
}

/// [`mma_pipe`] split over `k` into the blocks of one thread-block cluster (sm_90; grid z =
/// the cluster's size, at most 8): each block stages its slice's raw `TM × TN` sums in its own
/// shared memory (over the pipeline's stages), and after a cluster barrier block `z` adds rows
/// `z · ⌈TM / S⌉ ..` of every block's tile, in rank order (the order of
/// `linear_split_reduce_f32`), through distributed shared memory, and applies the epilogue. No
/// workspace and no reduce launch; the merge is spread over the cluster's blocks.
#[inline(always)]
unsafe fn mma_pipe_cluster<W: MmaElem, const TM: usize, const TN: usize, const KB: usize, const C: usize, const MT: usize, const NT: usize>(p: LinearParams) {
    /// Row stride of the staged tile (f32; 16-byte rows, fewer bank conflicts than `TN`).
    const PAD: usize = 4;
    let stride = TN + PAD;
    let x = PipeArgs::linear::<true>(&p);
    let acc = pipe_core::<W, TM, TN, KB, C, false, MT, NT>(&x);
    // 5. this slice's raw sums into [TM][stride] f32 of this block's shared memory, once every
    //    warp is done reading the pipeline's stages
    let tile = dynamic_shared_mem::<u8>() as *mut f32;
    stage_acc::<TM, TN, MT, NT>(tile, stride, &acc);
    cluster_merge::<W, TM, TN>(&p, tile, stride);
}

/// Steps 6 and 7 of [`mma_pipe_cluster`] (also the warpgroup cluster kernels', `wgmma.rs`):
/// every slice's raw sums staged at `tile` (`[TM][stride]` f32 at the same place of each
/// block's shared memory, not yet cluster-synced); this block adds its share of the rows over
/// the slices, four columns per thread and step, finishes and stores them.
#[inline(always)]
pub(crate) unsafe fn cluster_merge<W: MmaElem, const TM: usize, const TN: usize>(p: &LinearParams, tile: *mut f32, stride: usize) {
    let tid = thread::thread_idx_x() as usize;
    // 6. every slice's tile is staged: this block adds its rows over the slices, four columns
    //    per thread and step
    cluster_sync();
    let slices = thread::grid_dim_z() as usize;
    let rank = thread::block_idx_z() as usize;
    let rows = (TM + slices - 1) / slices;
    let (m, n, ldc) = (p.m as usize, p.n as usize, p.ldc as usize);
    let (row0, col0) = (thread::block_idx_y() as usize * TM, thread::block_idx_x() as usize * TN);
    let (base, row_scale, c) = (shared_addr(tile), p.row_scale as *const f32, p.c as *mut f32);
    let (bias, res) = (p.bias as *const f32, p.residual as *const f32);
    let mut i = tid;
    while i < rows * (TN / 4) {
        let (lr, lc) = (rank * rows + i / (TN / 4), 4 * (i % (TN / 4)));
        let (r, col) = (row0 + lr, col0 + lc);
        if lr < TM && r < m {
            // the epilogue's global reads (bias, residual) issued before the slices' sums and
            // any store, so their latencies overlap (`matmul::finish` read them one output at a
            // time, each after the store before it, which may alias the residual)
            let at = r * ldc + col;
            let (mut bv, mut rv) = ([0.0f32; 4], [0.0f32; 4]);
            unroll!(e < 4, [0, 1, 2, 3], {
                if col + e < n {
                    if !bias.is_null() {
                        bv[e] = *bias.add(col + e);
                    }
                    if !res.is_null() {
                        rv[e] = *res.add(at + e);
                    }
                }
            });
            let sh = base + ((lr * stride + lc) * 4) as u64;
            let mut v = [0.0f32; 4];
            for s in 0..slices {
                let y = ld_cluster_f32x4(cluster_map(sh, s as u32));
                unroll!(e < 4, [0, 1, 2, 3], {
                    v[e] += y[e];
                });
            }
            let sc = if W::ROW_SCALE && !row_scale.is_null() { *row_scale.add(r) } else { 1.0 };
            // `matmul::finish`'s steps: row scale undone, bias, activation, residual
            unroll!(e < 4, [0, 1, 2, 3], {
                if col + e < n {
                    let mut x = v[e] / sc;
                    if !bias.is_null() {
                        x += bv[e];
                    }
                    x = crate::matmul::activate(p.act, x);
                    if !res.is_null() {
                        x += rv[e];
                    }
                    *c.add(at + e) = x;
                }
            });
        }
        i += THREADS as usize;
    }
    // 7. no block leaves while another may still read its tile
    cluster_sync();
}

/// [`matmul_mma_pipe_64x64_split_bf16`] with its `k` slices the blocks of a thread-block
/// cluster, merged in the launch (sm_90 only; see [`mma_pipe_cluster`]).
#[kernel]
pub unsafe fn matmul_mma_pipe_64x64_cluster_bf16(p: LinearParams) {
    mma_pipe_cluster::<Bf16, 64, 64, 64, 8, 2, 2>(p)
}

/// [`matmul_mma_pipe_64x64_cluster_bf16`] for f16 (row-scaled activations).
#[kernel]
pub unsafe fn matmul_mma_pipe_64x64_cluster_f16(p: LinearParams) {
    mma_pipe_cluster::<F16, 64, 64, 64, 8, 2, 2>(p)
}

#[inline(always)]
unsafe fn cast_a16<W: MmaElem>(p: CastA16Params) {
    let i = thread::index_1d() as usize;
    let (m, k) = (p.m as usize, p.k as usize);
    if i >= m * k / 8 {
        return;
    }
    let (r, j) = (i / (k / 8), 8 * (i % (k / 8)));
    let src = (p.a as *const f32).add(r * p.lda as usize + j);
    let (x, y) = (ld_f32x4(src), ld_f32x4(src.add(4)));
    let s = if p.row_scale != 0 { *(p.row_scale as *const f32).add(r) } else { 1.0 };
    let v = [W::pack(x[0] * s, x[1] * s), W::pack(x[2] * s, x[3] * s), W::pack(y[0] * s, y[1] * s), W::pack(y[2] * s, y[3] * s)];
    *((p.out as *mut u8).add((r * k + j) * 2) as *mut U32x4) = U32x4(v);
}

/// f32 activations rounded to bf16 for `matmul_mma_pipe_*_bf16`. See the module docs.
#[kernel]
pub unsafe fn cast_a16_bf16(p: CastA16Params) {
    cast_a16::<Bf16>(p)
}

/// f32 activations, times their row scales, rounded to f16 for `matmul_mma_pipe_*_f16`.
#[kernel]
pub unsafe fn cast_a16_f16(p: CastA16Params) {
    cast_a16::<F16>(p)
}

/// RMSNorm of each row of `x` rounded to bf16 into `y` (`[rows, n]` 16-bit: the operand of
/// `matmul_mma_pipe_*_bf16` and `gate_up_pipe_*_bf16`): `rms_norm_f32` then `cast_a16_bf16` in
/// one pass, the same f32 values rounded once.
///
/// Parameters: [`RmsNormParams`] with `y` 16-bit; `n % 8 == 0`, `x` and `w` 16-byte aligned
/// (the launcher checks). Thread mapping: one block of `ROW_THREADS` per row (grid = rows);
/// threads stride over the row's 16-byte vectors for Σ x², reduce (`block_sum`), then write 8
/// outputs (16 bytes) per step. Safety: every thread reaches the barriers of `block_sum`.
#[kernel]
pub unsafe fn rms_norm_a16_bf16(p: RmsNormParams) {
    let scratch = shared_array![f32; 32];
    let tid = thread::thread_idx_x() as usize;
    let step = thread::block_dim_x() as usize;
    let n = p.n as usize;
    let row = thread::block_idx_x() as usize;
    let x = (p.x as *const f32).add(row * n);
    let w = p.w as *const f32;
    // 1. Σ x², 16 bytes at a time
    let mut ss = 0.0f32;
    let mut i = tid;
    while i < n / 4 {
        let v = ld_f32x4(x.add(4 * i));
        // (four statements, not a loop over the array: that kept it in local memory)
        ss += v[0] * v[0];
        ss += v[1] * v[1];
        ss += v[2] * v[2];
        ss += v[3] * v[3];
        i += step;
    }
    let scale = crate::math::rms_scale(block_sum(ss, scratch) / n as f32, p.eps);
    // 2. y = bf16(x · scale · w), 8 at a time
    let y = (p.y as *mut u8).add(row * n * 2);
    let mut i = tid;
    while i < n / 8 {
        let (v0, v1) = (ld_f32x4(x.add(8 * i)), ld_f32x4(x.add(8 * i + 4)));
        let (g0, g1) = (ld_f32x4(w.add(8 * i)), ld_f32x4(w.add(8 * i + 4)));
        let o = |v: f32, g: f32| v * scale * g;
        let q = [
            Bf16::pack(o(v0[0], g0[0]), o(v0[1], g0[1])),
            Bf16::pack(o(v0[2], g0[2]), o(v0[3], g0[3])),
            Bf16::pack(o(v1[0], g1[0]), o(v1[1], g1[1])),
            Bf16::pack(o(v1[2], g1[2]), o(v1[3], g1[3])),
        ];
        *(y.add(16 * i) as *mut U32x4) = U32x4(q);
        i += step;
    }
}

/// LayerNorm of each row of `x` rounded to bf16 into `y` (`[rows, n]` 16-bit: the operand of
/// `matmul_mma_pipe_*_bf16`): `layer_norm_f32` then `cast_a16_bf16` in one pass, each output the
/// same f32 expression (`math::layer_norm_elem`) rounded once.
///
/// Parameters: [`LayerNormParams`] with `y` 16-bit; `n % 8 == 0`, `x`, `w` and `b` 16-byte
/// aligned (the launcher checks). Thread mapping: a warp per row, [`WARP_ROWS`] rows a block of
/// 256 threads (grid = ⌈rows / WARP_ROWS⌉); lane `l` takes the row's 16-byte vectors `l + 32 c`,
/// holding the first [`LN_CACHED`] of them in registers (rows up to 1,024 values are read
/// once; the rest are read again per pass), and reduces Σ x, then Σ (x - mean)², with
/// shuffles. A block per row with two block-wide sums and three passes over the row had taken
/// 13.8 µs for the tower's 4,096 × 1,024 (ncu, H200: 24 MB moved, under half the copy rate).
/// Safety: no barriers; a warp past the last row returns whole.
#[kernel]
pub unsafe fn layer_norm_a16_bf16(p: LayerNormParams) {
    let lane = thread::thread_idx_x() as usize % 32;
    let row = thread::block_idx_x() as usize * WARP_ROWS + thread::thread_idx_x() as usize / 32;
    if row >= p.rows as usize {
        return;
    }
    let n = p.n as usize;
    let nv = n / 4;
    let x = (p.x as *const f32).add(row * n);
    let (w, b) = (p.w as *const f32, p.b as *const f32);
    // 1. the mean: the cached vectors' loads all issued first, then any beyond them
    let ld = |c: usize| if lane + 32 * c < nv { ld_f32x4(x.add(4 * (lane + 32 * c))) } else { [0.0; 4] };
    let v: [[f32; 4]; LN_CACHED] = [ld(0), ld(1), ld(2), ld(3), ld(4), ld(5), ld(6), ld(7)];
    let mut s = 0.0f32;
    unroll!(c < LN_CACHED, [0, 1, 2, 3, 4, 5, 6, 7], {
        s += v[c][0];
        s += v[c][1];
        s += v[c][2];
        s += v[c][3];
    });
    let mut i = lane + 32 * LN_CACHED;
    while i < nv {
        let t = ld_f32x4(x.add(4 * i));
        s += t[0];
        s += t[1];
        s += t[2];
        s += t[3];
        i += 32;
    }
    let mean = warp_sum(s) / n as f32;
    // 2. the variance about it
    let sq = |t: [f32; 4]| {
        let d = [t[0] - mean, t[1] - mean, t[2] - mean, t[3] - mean];
        d[0] * d[0] + d[1] * d[1] + d[2] * d[2] + d[3] * d[3]
    };
    let mut ss = 0.0f32;
    unroll!(c < LN_CACHED, [0, 1, 2, 3, 4, 5, 6, 7], {
        if lane + 32 * c < nv {
            ss += sq(v[c]);
        }
    });
    let mut i = lane + 32 * LN_CACHED;
    while i < nv {
        ss += sq(ld_f32x4(x.add(4 * i)));
        i += 32;
    }
    let inv = crate::math::rms_scale(warp_sum(ss) / n as f32, p.eps);
    // 3. y = bf16(layer_norm_elem(x)), 4 outputs (8 bytes) per vector
    let y = (p.y as *mut u8).add(row * n * 2);
    let put = |t: [f32; 4], i: usize| {
        let (g, bb) = (ld_f32x4(w.add(4 * i)), ld_f32x4(b.add(4 * i)));
        let o = |e: usize| crate::math::layer_norm_elem(t[e], mean, inv, g[e], bb[e]);
        let (lo, hi) = (Bf16::pack(o(0), o(1)), Bf16::pack(o(2), o(3)));
        *(y.add(8 * i) as *mut F32x2) = F32x2([f32::from_bits(lo), f32::from_bits(hi)]);
    };
    unroll!(c < LN_CACHED, [0, 1, 2, 3, 4, 5, 6, 7], {
        if lane + 32 * c < nv {
            put(v[c], lane + 32 * c);
        }
    });
    let mut i = lane + 32 * LN_CACHED;
    while i < nv {
        put(ld_f32x4(x.add(4 * i)), i);
        i += 32;
    }
}

/// 16-byte vectors a `layer_norm_a16_bf16` lane holds in registers (rows of up to 1,024 values).
const LN_CACHED: usize = 8;
