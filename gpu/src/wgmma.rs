//! Warpgroup tensor-core linear layers (sm_90a `wgmma.mma_async`) over 16-bit activations:
//! `matmul_wgmma_*` and `gate_up_wgmma_*`, the same products, parameters and epilogues as the
//! pipelined `matmul_mma_pipe_*` and `gate_up_pipe_*` of the same tile (`gpu/src/mma_pipe.rs`),
//! with the multiplies issued by whole warpgroups straight from shared memory (no `ldmatrix`,
//! no fragments in registers): 128 × 256 for prefills, 64 × 64 (also split over `k` in a
//! thread-block cluster) and 64 × 128 for batched decode steps' 33-64 rows.
//!
//! # Parameters
//! [`LinearParams`] / [`GateUpParams`] as for the pipelined kernels: `a` `[m, k]` 16-bit
//! activations of the weights' type (row stride `lda`, a multiple of 8), `w` `[n, k]` (`gate`,
//! `up`), `k % 8 == 0`; bias, activation, residual as there; `*_c16_*` writes bf16 (`n` even).
//!
//! # Tiling
//! A block computes a `TM × TN` tile of `c`, walking `k` in stages of 64 elements: `S` stages
//! (`wgmma_tile::stages`: 8 for 64 × 128, else 4) of both operands in
//! dynamic shared memory (`wgmma_tile::shared_bytes`, with the 1 KiB the stages are aligned by),
//! copied by `cp.async` exactly as the pipelined kernels do ([`StageCopies`]: rows of 128
//! bytes, 16-byte chunk `c` of row `r` at `c ^ (r & 7)`, which is the hardware's 128-byte
//! swizzle when each stage starts on a 1,024-byte boundary). `S - 2` stages are in flight ahead
//! of the one multiplied, and one stage's multiplies stay in flight while the next stage's are
//! issued: stage `s + S - 2` is copied into the buffer stage `s - 2` was read from, which every
//! warpgroup has finished (it waited for all but its latest group of multiplies before the
//! barrier). A pair (`gate_up_*`) stages the gate's and the up
//! projection's rows interleaved by eights as the pipelined pair does, so accumulator chunks
//! `2j` and `2j + 1` (8 columns each) hold both sums for the same 8 output columns.
//!
//! # Thread mapping
//! 256 threads = 2 warpgroups. 128 × 256: warpgroup `g` owns rows `64g ..= 64g + 63` and all 256
//! columns (`m64n256k16`, A descriptor at row `64g`). 64-row tiles: warpgroup `g` owns all 64
//! rows and columns `g·TN/2 ..` (`m64n32k16` / `m64n64k16`, B descriptor at weight row
//! `g·TN/2`). Four multiplies per stage, both descriptors advanced 32 bytes per k step within
//! the swizzled rows. A thread's accumulator (warp `w` of its warpgroup, lane `l`): element `i`
//! is row `16w + l/4 + 8·((i/2)%2)` and column `8·(i/4) + 2·(l%4) + i%2` of the warpgroup's
//! part — the m16n8 layout of `mma.sync` per 8 columns, so the pipelined kernels' per-tile
//! stores finish it. The 128 × 256 tiles stage it through shared memory for the pipelined
//! 128 × 256 epilogue (`finish_staged`), the cluster kernel for its merge (`cluster_merge`).
//!
//! # Safety
//! The instructions are sm_90a: the compute_80 PTX carries them as comments (`SM90A_MARK`,
//! `host/src/kernels.rs`) that the host turns into instructions only where it loads the module
//! for a compute 9.0 device as sm_90a, and these kernels launch only there. Every thread
//! reaches every barrier and every warpgroup-wide instruction (loop counts are uniform over the
//! block); each thread's copies are waited for and fenced into the async proxy
//! (`fence.proxy.async`) before the barrier that precedes the multiplies reading them; the
//! launchers check sizes and the module as for the pipelined kernels.

use crate::math::Bf16;
use crate::mem::{shared_addr, F32x2};
use crate::mma::{cp_async_commit, cp_async_wait_all, store_tile, MmaElem};
use crate::mma_pipe::{cluster_merge, finish_staged, store_tile_c16, PipeArgs, StageCopies};
use crate::params::{wgmma_tile, GateUpParams, LinearParams};
use cuda_std::shared::dynamic_shared_mem;
use cuda_std::{kernel, thread};

/// Depth of one stage (elements of `k`): rows of 128 bytes.
const KB: usize = 64;

/// One warpgroup's accumulator for `m64nNk16` with f32 sums (`N / 2` registers a thread), as
/// f32 bits: kept in the 32-bit registers the multiplies write (a conversion between them and
/// the multiplies would read the accumulator while a group is in flight, and ptxas would then
/// serialize the groups).
pub(crate) trait WgAcc: Copy {
    /// Registers a thread (`N / 2`).
    const REGS: usize;
    fn zero() -> Self;
    /// `self += a · b` (scale-d 1), A and B from shared memory through descriptors `da`, `db`,
    /// both K-major, bf16.
    unsafe fn mma(&mut self, da: u64, db: u64);
    /// [`WgAcc::mma`] with f16 operands.
    unsafe fn mma_f16(&mut self, da: u64, db: u64);
    /// `self += a · b` with f16 operands: A from registers (`a`, the `mma.sync` m16n8k16 A
    /// fragment of this thread's warp: rows `16w ..`), B from shared memory K-major.
    unsafe fn mma_rs_f16(&mut self, a: [u32; 4], db: u64);
    /// [`WgAcc::mma_rs_f16`] with B MN-major (transposed: `[k][n]` with `n` contiguous).
    unsafe fn mma_rs_f16_tb(&mut self, a: [u32; 4], db: u64);
    /// Waits until at most one group of this warpgroup's multiplies is in flight; the
    /// accumulator is named so the compiler neither reads nor moves it across the wait.
    unsafe fn wait_one(&mut self);
    /// Waits until none is.
    unsafe fn wait_all(&mut self);
    /// Element `i` (see the module docs).
    fn at(&self, i: usize) -> f32;
}

macro_rules! wg_acc {
    ($n:literal, $regs:literal, [$($i:literal),*]) => {
        impl WgAcc for [u32; $regs] {
            const REGS: usize = $regs;

            #[inline(always)]
            fn zero() -> Self {
                [0; $regs]
            }

            #[inline(always)]
            unsafe fn mma(&mut self, da: u64, db: u64) {
                core::arch::asm!(
                    concat!("// qwen3vl90a:wgmma.mma_async.sync.aligned.m64n", $n, "k16.f32.bf16.bf16 {{{0}", $(", {", $i, "}",)* "}}, {da}, {db}, 1, 1, 1, 0, 0;"),
                    inout(reg32) self[0], $(inout(reg32) self[$i],)*
                    da = in(reg64) da, db = in(reg64) db,
                    options(nostack),
                )
            }

            #[inline(always)]
            unsafe fn mma_f16(&mut self, da: u64, db: u64) {
                core::arch::asm!(
                    concat!("// qwen3vl90a:wgmma.mma_async.sync.aligned.m64n", $n, "k16.f32.f16.f16 {{{0}", $(", {", $i, "}",)* "}}, {da}, {db}, 1, 1, 1, 0, 0;"),
                    inout(reg32) self[0], $(inout(reg32) self[$i],)*
                    da = in(reg64) da, db = in(reg64) db,
                    options(nostack),
                )
            }

            #[inline(always)]
            unsafe fn mma_rs_f16(&mut self, a: [u32; 4], db: u64) {
                core::arch::asm!(
                    concat!("// qwen3vl90a:wgmma.mma_async.sync.aligned.m64n", $n, "k16.f32.f16.f16 {{{0}", $(", {", $i, "}",)* "}}, {{{a0}, {a1}, {a2}, {a3}}}, {db}, 1, 1, 1, 0;"),
                    inout(reg32) self[0], $(inout(reg32) self[$i],)*
                    a0 = in(reg32) a[0], a1 = in(reg32) a[1], a2 = in(reg32) a[2], a3 = in(reg32) a[3], db = in(reg64) db,
                    options(nostack),
                )
            }

            #[inline(always)]
            unsafe fn mma_rs_f16_tb(&mut self, a: [u32; 4], db: u64) {
                core::arch::asm!(
                    concat!("// qwen3vl90a:wgmma.mma_async.sync.aligned.m64n", $n, "k16.f32.f16.f16 {{{0}", $(", {", $i, "}",)* "}}, {{{a0}, {a1}, {a2}, {a3}}}, {db}, 1, 1, 1, 1;"),
                    inout(reg32) self[0], $(inout(reg32) self[$i],)*
                    a0 = in(reg32) a[0], a1 = in(reg32) a[1], a2 = in(reg32) a[2], a3 = in(reg32) a[3], db = in(reg64) db,
                    options(nostack),
                )
            }

            #[inline(always)]
            unsafe fn wait_one(&mut self) {
                core::arch::asm!(
                    concat!("// qwen3vl90a:wgmma.wait_group.sync.aligned 1;\n\t// {0}", $(" {", $i, "}",)*),
                    inout(reg32) self[0], $(inout(reg32) self[$i],)*
                    options(nostack),
                )
            }

            #[inline(always)]
            unsafe fn wait_all(&mut self) {
                core::arch::asm!(
                    concat!("// qwen3vl90a:wgmma.wait_group.sync.aligned 0;\n\t// {0}", $(" {", $i, "}",)*),
                    inout(reg32) self[0], $(inout(reg32) self[$i],)*
                    options(nostack),
                )
            }

            #[inline(always)]
            fn at(&self, i: usize) -> f32 {
                f32::from_bits(self[i])
            }
        }
    };
}

wg_acc!(256, 128, [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22, 23, 24, 25, 26, 27, 28, 29, 30, 31, 32, 33, 34, 35, 36, 37, 38, 39, 40, 41, 42, 43, 44, 45, 46, 47, 48, 49, 50, 51, 52, 53, 54, 55, 56, 57, 58, 59, 60, 61, 62, 63, 64, 65, 66, 67, 68, 69, 70, 71, 72, 73, 74, 75, 76, 77, 78, 79, 80, 81, 82, 83, 84, 85, 86, 87, 88, 89, 90, 91, 92, 93, 94, 95, 96, 97, 98, 99, 100, 101, 102, 103, 104, 105, 106, 107, 108, 109, 110, 111, 112, 113, 114, 115, 116, 117, 118, 119, 120, 121, 122, 123, 124, 125, 126, 127]);
wg_acc!(128, 64, [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22, 23, 24, 25, 26, 27, 28, 29, 30, 31, 32, 33, 34, 35, 36, 37, 38, 39, 40, 41, 42, 43, 44, 45, 46, 47, 48, 49, 50, 51, 52, 53, 54, 55, 56, 57, 58, 59, 60, 61, 62, 63]);
wg_acc!(64, 32, [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22, 23, 24, 25, 26, 27, 28, 29, 30, 31]);
wg_acc!(32, 16, [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15]);

/// Orders this warpgroup's register accesses before the multiplies issued after it.
#[inline(always)]
pub(crate) unsafe fn wgmma_fence() {
    core::arch::asm!("// qwen3vl90a:wgmma.fence.sync.aligned;", options(nostack));
}

/// Closes the group of multiplies issued since the last one.
#[inline(always)]
pub(crate) unsafe fn wgmma_commit() {
    core::arch::asm!("// qwen3vl90a:wgmma.commit_group.sync.aligned;", options(nostack));
}

/// Makes this thread's landed shared-memory writes (its `cp.async` copies) visible to the
/// async proxy the multiplies read through.
#[inline(always)]
pub(crate) unsafe fn fence_proxy_async() {
    core::arch::asm!("// qwen3vl90a:fence.proxy.async.shared::cta;", options(nostack));
}

/// Waits until at most `N` committed copy groups are still in flight (`N` is 1 or 5: the
/// stages copied ahead less one, `wgmma_tile::stages` less 3).
#[inline(always)]
unsafe fn cp_async_wait<const N: usize>() {
    match N {
        1 => core::arch::asm!("cp.async.wait_group 1;", options(nostack)),
        _ => core::arch::asm!("cp.async.wait_group 5;", options(nostack)),
    }
}

/// The shared-memory descriptor of a K-major operand at shared address `addr`: rows of 128
/// bytes in the 128-byte swizzle, groups of 8 rows 1,024 bytes apart (the leading offset is
/// unused by this layout).
#[inline(always)]
pub(crate) fn descriptor(addr: u64) -> u64 {
    ((addr & 0x3ffff) >> 4) | (1 << 16) | ((1024 >> 4) << 32) | (1 << 62)
}

/// The shared-memory descriptor of an MN-major operand (`[k][n]`, `n` contiguous) at shared
/// address `addr`: rows of 128 bytes (64 16-bit elements of `n`) in the 128-byte swizzle, groups
/// of 8 rows of `k` 1,024 bytes apart, the next 64 elements of `n` `lead` bytes on.
#[inline(always)]
pub(crate) fn descriptor_mn(addr: u64, lead: u64) -> u64 {
    ((addr & 0x3ffff) >> 4) | ((lead >> 4) << 16) | ((1024 >> 4) << 32) | (1 << 62)
}

/// This thread's warpgroup, and the tile row and column of its accumulator element `i` (see
/// the module docs).
#[inline(always)]
fn acc_at<const TM: usize, const TN: usize>(i: usize) -> (usize, usize) {
    let tid = thread::thread_idx_x() as usize;
    let (wg, warp, lane) = (tid / 128, (tid / 32) % 4, tid % 32);
    let (r0, c0) = if TM == 128 { (64 * wg, 0) } else { (0, wg * (TN / 2)) };
    (r0 + 16 * warp + lane / 4 + 8 * ((i / 2) % 2), c0 + 8 * (i / 4) + 2 * (lane % 4) + i % 2)
}

/// The block's `TM × TN` sums over its `k` range (see the module docs): this thread's part.
/// `A` holds `TN / 2` columns of 64 rows at 128 rows, `TN / 4` at 64.
#[inline(always)]
unsafe fn wgmma_core<A: WgAcc, const TM: usize, const TN: usize, const PAIR: bool>(x: &PipeArgs) -> A {
    assert!(A::REGS == if TM == 128 { TN / 2 } else { TN / 4 });
    const fn stages(tm: usize, tn: usize) -> usize {
        wgmma_tile::stages(tm as u32, tn as u32) as usize
    }
    let nstages = stages(TM, TN);
    let base = shared_addr(dynamic_shared_mem::<u8>());
    // the stages start on a 1,024-byte boundary (the swizzle repeats every 8 rows of 128 bytes)
    let a_sh = (base + 1023) & !1023;
    let (a_buf, w_buf) = (TM * KB * 2, TN * KB * 2);
    let w_sh = a_sh + (nstages * a_buf) as u64;
    let row0 = thread::block_idx_y() as usize * TM;
    let col0 = thread::block_idx_x() as usize * if PAIR { TN / 2 } else { TN };
    let copies = StageCopies::<TM, TN, { KB / 8 }>::new::<PAIR>(x, row0, col0, (a_sh, a_buf), (w_sh, w_buf));
    let wg = thread::thread_idx_x() as usize / 128;
    // this warpgroup's rows of the activations (128-row tiles) or of the weights (64-row)
    let (a_off, w_off) = if TM == 128 { (wg * 64 * 128, 0) } else { (0, wg * (TN / 2) * 128) };
    let (kb, ke) = (x.kb, x.ke);
    let steps = (ke - kb + KB - 1) / KB;
    let mut acc = A::zero();
    // 1. `stages - 2` stages in flight (a group each; zero-fills past the end)
    for s in 0..nstages - 2 {
        copies.load(s, kb + s * KB);
        cp_async_commit();
    }
    let mut cur = 0;
    for step in 0..steps {
        // 2. stage `step` has landed for this thread, is visible to the async proxy, and then
        //    for every thread; every warpgroup has finished the multiplies of stage step - 2
        match nstages {
            4 => cp_async_wait::<1>(),
            _ => cp_async_wait::<5>(),
        }
        fence_proxy_async();
        thread::sync_threads();
        // 3. the stage's four k steps, one group
        let (da, db) = (descriptor(a_sh + (cur * a_buf + a_off) as u64), descriptor(w_sh + (cur * w_buf + w_off) as u64));
        wgmma_fence();
        unroll!(ks < KB / 16, [0, 1, 2, 3], {
            // 32 bytes (16 elements) further along the rows: 2 in the descriptor's address field
            acc.mma(da + 2 * ks as u64, db + 2 * ks as u64);
        });
        wgmma_commit();
        // 4. stage step + stages - 2 into the buffer of stage step - 2
        let ahead = if cur >= 2 { cur - 2 } else { cur + nstages - 2 };
        copies.load(ahead, kb + (step + nstages - 2) * KB);
        cp_async_commit();
        // 5. the group of stage step - 1 done: its buffer is free after the next barrier
        acc.wait_one();
        cur = if cur + 1 == nstages { 0 } else { cur + 1 };
    }
    acc.wait_all();
    // the zero-fills past the range have landed before an epilogue reuses the stages
    cp_async_wait_all();
    acc
}

/// The block's sums (this thread's `acc`) into `[TM][stride]` f32 at `tile`, once every
/// warpgroup is done with the stages (the caller syncs before reading it back).
#[inline(always)]
unsafe fn stage_wgmma_acc<A: WgAcc, const TM: usize, const TN: usize>(tile: *mut f32, stride: usize, acc: &A) {
    thread::sync_threads();
    unroll!(j < A::REGS / 4, [0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22, 23, 24, 25, 26, 27, 28, 29, 30, 31], {
        unroll!(h < 2, [0, 1], {
            let i = 4 * j + 2 * h;
            let (r, c) = acc_at::<TM, TN>(i);
            *(tile.add(r * stride + c) as *mut F32x2) = F32x2([acc.at(i), acc.at(i + 1)]);
        });
    });
}

#[inline(always)]
unsafe fn matmul_wgmma<A: WgAcc, const TM: usize, const TN: usize, const C16: bool>(p: LinearParams) {
    let x = PipeArgs::linear::<false>(&p);
    let acc = wgmma_core::<A, TM, TN, false>(&x);
    if TM == 128 {
        // the 128 × 256 epilogue of the pipelined kernels, through shared memory
        let stride = TN + 8;
        let tile = dynamic_shared_mem::<u8>() as *mut f32;
        stage_wgmma_acc::<A, TM, TN>(tile, stride, &acc);
        thread::sync_threads();
        finish_staged::<Bf16, TM, TN, C16>(&p, tile, stride);
        return;
    }
    // 64 rows: per 8 columns, as the pipelined kernels' m16n8 tiles
    let (row0, col0) = (thread::block_idx_y() as usize * TM, thread::block_idx_x() as usize * TN);
    unroll!(j < A::REGS / 4, [0, 1, 2, 3, 4, 5, 6, 7], {
        let (r, c) = acc_at::<TM, TN>(4 * j);
        let d = [acc.at(4 * j), acc.at(4 * j + 1), acc.at(4 * j + 2), acc.at(4 * j + 3)];
        if C16 {
            store_tile_c16::<Bf16>(&p, d, row0 + r, col0 + c);
        } else {
            store_tile::<Bf16, false>(&p, d, row0 + r, col0 + c);
        }
    });
}

/// `c = act(a · wᵀ + bias) + residual`, bf16 activations and weights, 128 × 256 tiles by
/// warpgroups (sm_90a). See the module docs.
#[kernel]
pub unsafe fn matmul_wgmma_128x256_bf16(p: LinearParams) {
    matmul_wgmma::<[u32; 128], 128, 256, false>(p)
}

/// [`matmul_wgmma_128x256_bf16`] writing `act(a · wᵀ + bias)` in bf16 (`c` `[m, n]` 16-bit, row
/// stride `ldc`, no residual): the next pipelined GEMM's activations.
#[kernel]
pub unsafe fn matmul_wgmma_128x256_c16_bf16(p: LinearParams) {
    matmul_wgmma::<[u32; 128], 128, 256, true>(p)
}

/// [`matmul_wgmma_128x256_bf16`] with 64 × 128 tiles.
#[kernel]
pub unsafe fn matmul_wgmma_64x128_bf16(p: LinearParams) {
    matmul_wgmma::<[u32; 32], 64, 128, false>(p)
}

/// [`matmul_wgmma_128x256_c16_bf16`] with 64 × 128 tiles.
#[kernel]
pub unsafe fn matmul_wgmma_64x128_c16_bf16(p: LinearParams) {
    matmul_wgmma::<[u32; 32], 64, 128, true>(p)
}

/// [`matmul_wgmma_128x256_bf16`] with 64 × 64 tiles.
#[kernel]
pub unsafe fn matmul_wgmma_64x64_bf16(p: LinearParams) {
    matmul_wgmma::<[u32; 16], 64, 64, false>(p)
}

/// [`matmul_wgmma_64x64_bf16`] with its `k` slices the blocks of a thread-block cluster (grid
/// z, `k_split` deep), merged in the launch as `matmul_mma_pipe_64x64_cluster_bf16` does.
#[kernel]
pub unsafe fn matmul_wgmma_64x64_cluster_bf16(p: LinearParams) {
    let x = PipeArgs::linear::<true>(&p);
    let acc = wgmma_core::<[u32; 16], 64, 64, false>(&x);
    // 16-byte rows (as the pipelined cluster kernel's)
    let stride = 64 + 4;
    let tile = dynamic_shared_mem::<u8>() as *mut f32;
    stage_wgmma_acc::<[u32; 16], 64, 64>(tile, stride, &acc);
    cluster_merge::<Bf16, 64, 64>(&p, tile, stride);
}

/// `c = silu(a · gateᵀ) ⊙ (a · upᵀ)` ([`GateUpParams`], bf16, no row scales): [`wgmma_core`]
/// over the two matrices' rows interleaved by eights, `TN / 2` output columns per block; the
/// products go from registers to `c` (f32, or bf16 with `C16`: `n` even).
#[inline(always)]
unsafe fn gate_up_wgmma<A: WgAcc, const TM: usize, const TN: usize, const C16: bool>(p: GateUpParams) {
    let (m, n) = (p.m as usize, p.n as usize);
    let x = PipeArgs::gate_up(&p);
    let acc = wgmma_core::<A, TM, TN, true>(&x);
    let (row0, col0) = (thread::block_idx_y() as usize * TM, thread::block_idx_x() as usize * (TN / 2));
    unroll!(j < A::REGS / 8, [0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15], {
        // chunks 2j (gate) and 2j + 1 (up): staged rows `s .. s + 8` and `s + 8 ..`, `s` a
        // multiple of 16, are output columns `s / 2 ..`
        let (r, c) = acc_at::<TM, TN>(8 * j);
        let col = col0 + (c - c % 16) / 2 + c % 8;
        unroll!(h < 2, [0, 1], {
            let rr = row0 + r + 8 * h;
            let (g, u) = (8 * j + 2 * h, 8 * j + 4 + 2 * h);
            let v0 = crate::math::silu_mul(acc.at(g), acc.at(u));
            let v1 = crate::math::silu_mul(acc.at(g + 1), acc.at(u + 1));
            if rr < m && col < n {
                if C16 {
                    // the pair rounded into one 32-bit word of the 16-bit output (`n` even)
                    *((p.c as *mut u8).add((rr * n + col) * 2) as *mut u32) = <Bf16 as MmaElem>::pack(v0, v1);
                } else {
                    let c = (p.c as *mut f32).add(rr * n + col);
                    *c = v0;
                    if col + 1 < n {
                        *c.add(1) = v1;
                    }
                }
            }
        });
    });
}

/// SwiGLU's gate and up projections with the SiLU product, bf16, 128 × 256 tiles (128 columns
/// of each matrix) by warpgroups (sm_90a). See [`gate_up_wgmma`].
#[kernel]
pub unsafe fn gate_up_wgmma_128x256_bf16(p: GateUpParams) {
    gate_up_wgmma::<[u32; 128], 128, 256, false>(p)
}

/// [`gate_up_wgmma_128x256_bf16`] writing the products in bf16: the down projection's
/// activations.
#[kernel]
pub unsafe fn gate_up_wgmma_128x256_c16_bf16(p: GateUpParams) {
    gate_up_wgmma::<[u32; 128], 128, 256, true>(p)
}

/// [`gate_up_wgmma_128x256_bf16`] with 64 × 128 tiles (64 columns of each matrix).
#[kernel]
pub unsafe fn gate_up_wgmma_64x128_bf16(p: GateUpParams) {
    gate_up_wgmma::<[u32; 32], 64, 128, false>(p)
}

/// [`gate_up_wgmma_128x256_c16_bf16`] with 64 × 128 tiles.
#[kernel]
pub unsafe fn gate_up_wgmma_64x128_c16_bf16(p: GateUpParams) {
    gate_up_wgmma::<[u32; 32], 64, 128, true>(p)
}
