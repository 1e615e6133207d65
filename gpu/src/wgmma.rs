//! Warpgroup tensor-core linear layers (sm_90a `wgmma.mma_async`) over 16-bit activations: the
//! prefill-sized `matmul_wgmma_128x256_*` and `gate_up_wgmma_128x256_*`, the same products and
//! epilogues as `matmul_mma_pipe_128x256_*` and `gate_up_pipe_128x256_*` (`gpu/src/mma_pipe.rs`)
//! with the multiplies issued by whole warpgroups straight from shared memory (no `ldmatrix`,
//! no fragments in registers).
//!
//! # Parameters
//! [`LinearParams`] as for `matmul_mma_pipe_*`: `a` `[m, k]` 16-bit activations of the weights'
//! type (row stride `lda`, a multiple of 8), `w` `[n, k]`, `k % 8 == 0`; bias, activation,
//! residual as there; `*_c16_*` writes bf16.
//!
//! # Tiling
//! A block computes a 128 × 256 tile of `c`, walking `k` in stages of 64 elements: `STAGES` (4)
//! stages of both operands in dynamic shared memory (`wgmma_tile::SHARED_BYTES`, 193 KiB with
//! the 1 KiB the stages are aligned by), copied by `cp.async` exactly as the pipelined kernels
//! do ([`StageCopies`]: rows of 128 bytes, 16-byte chunk `c` of row `r` at `c ^ (r & 7)`, which
//! is the hardware's 128-byte swizzle when each stage starts on a 1,024-byte boundary). Two
//! stages are in flight ahead of the one multiplied, and one stage's multiplies stay in flight
//! while the next stage's are issued: stage `s + 2` is copied into the buffer stage `s - 2` was
//! read from, which every warpgroup has finished (it waited for all but its latest group of
//! multiplies before the barrier).
//!
//! # Thread mapping
//! 256 threads = 2 warpgroups; warpgroup `g` owns rows `64g ..= 64g + 63` of the tile and all
//! 256 columns: four `m64n256k16` multiplies per stage, its A descriptor at row `64g`, B at row
//! 0, both advanced 32 bytes per k step within the swizzled rows. The accumulator is 128 f32
//! per thread (warp `w` of the warpgroup, lane `l`: element `i` is row `16w + l/4 + 8·((i/2)%2)`,
//! column `8·(i/4) + 2·(l%4) + i%2`), staged through shared memory for the 128 × 256 epilogue
//! of the pipelined kernels (`finish_staged`).
//!
//! # Safety
//! The instructions are sm_90a: the compute_80 PTX carries them as comments (`SM90A` marks,
//! `host/src/kernels.rs`) that the host turns into instructions only where it loads the module
//! for a compute 9.0 device as sm_90a, and these kernels launch only there. Every thread
//! reaches every barrier and every warpgroup-wide instruction (loop counts are uniform over the
//! block); each thread's copies are waited for and fenced into the async proxy
//! (`fence.proxy.async`) before the barrier that precedes the multiplies reading them; the
//! launchers check sizes and the module as for the pipelined kernels.

use crate::math::Bf16;
use crate::mem::shared_addr;
use crate::mma::{cp_async_commit, cp_async_wait_all, MmaElem};
use crate::mma_pipe::{finish_staged, PipeArgs, StageCopies};
use crate::params::{wgmma_tile, GateUpParams, LinearParams};
use cuda_std::shared::dynamic_shared_mem;
use cuda_std::{kernel, thread};

const TM: usize = 128;
const TN: usize = 256;
const KB: usize = 64;
const NSTAGES: usize = wgmma_tile::STAGES as usize;
/// Accumulator registers per thread (`m64n256k16`, f32).
const ACC: usize = 128;

/// `m64n256k16` with f32 accumulators `d` (scale-d 1: `d += a · b`), A and B from shared memory
/// through descriptors `da`, `db`, both K-major; element type `$ty` (`"bf16"`).
macro_rules! wgmma_m64n256k16 {
    ($ty:literal, $d:ident, $da:expr, $db:expr) => {
        wgmma_m64n256k16!(@go $ty, $d, $da, $db, [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22, 23, 24, 25, 26, 27, 28, 29, 30, 31, 32, 33, 34, 35, 36, 37, 38, 39, 40, 41, 42, 43, 44, 45, 46, 47, 48, 49, 50, 51, 52, 53, 54, 55, 56, 57, 58, 59, 60, 61, 62, 63, 64, 65, 66, 67, 68, 69, 70, 71, 72, 73, 74, 75, 76, 77, 78, 79, 80, 81, 82, 83, 84, 85, 86, 87, 88, 89, 90, 91, 92, 93, 94, 95, 96, 97, 98, 99, 100, 101, 102, 103, 104, 105, 106, 107, 108, 109, 110, 111, 112, 113, 114, 115, 116, 117, 118, 119, 120, 121, 122, 123, 124, 125, 126, 127])
    };
    (@go $ty:literal, $d:ident, $da:expr, $db:expr, [$($i:literal),*]) => {
        core::arch::asm!(
            concat!("// qwen3vl90a:wgmma.mma_async.sync.aligned.m64n256k16.f32.", $ty, ".", $ty, " {{{0}", $(", {", $i, "}",)* "}}, {128}, {129}, 1, 1, 1, 0, 0;"),
            inout(reg32) $d[0], $(inout(reg32) $d[$i],)*
            in(reg64) $da, in(reg64) $db,
            options(nostack),
        )
    };
}

/// Waits until at most `$n` groups of this warpgroup's multiplies are in flight; the
/// accumulator `d` is named so the compiler neither reads nor moves it across the wait.
macro_rules! wgmma_wait {
    ($n:literal, $d:ident) => {
        wgmma_wait!(@go $n, $d, [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22, 23, 24, 25, 26, 27, 28, 29, 30, 31, 32, 33, 34, 35, 36, 37, 38, 39, 40, 41, 42, 43, 44, 45, 46, 47, 48, 49, 50, 51, 52, 53, 54, 55, 56, 57, 58, 59, 60, 61, 62, 63, 64, 65, 66, 67, 68, 69, 70, 71, 72, 73, 74, 75, 76, 77, 78, 79, 80, 81, 82, 83, 84, 85, 86, 87, 88, 89, 90, 91, 92, 93, 94, 95, 96, 97, 98, 99, 100, 101, 102, 103, 104, 105, 106, 107, 108, 109, 110, 111, 112, 113, 114, 115, 116, 117, 118, 119, 120, 121, 122, 123, 124, 125, 126, 127])
    };
    (@go $n:literal, $d:ident, [$($i:literal),*]) => {
        core::arch::asm!(
            concat!("// qwen3vl90a:wgmma.wait_group.sync.aligned ", $n, ";\n\t// {0}", $(" {", $i, "}",)*),
            inout(reg32) $d[0], $(inout(reg32) $d[$i],)*
            options(nostack),
        )
    };
}

/// Orders this warpgroup's register accesses before the multiplies issued after it.
#[inline(always)]
unsafe fn wgmma_fence() {
    core::arch::asm!("// qwen3vl90a:wgmma.fence.sync.aligned;", options(nostack));
}

/// Closes the group of multiplies issued since the last one.
#[inline(always)]
unsafe fn wgmma_commit() {
    core::arch::asm!("// qwen3vl90a:wgmma.commit_group.sync.aligned;", options(nostack));
}

/// Makes this thread's landed shared-memory writes (its `cp.async` copies) visible to the
/// async proxy the multiplies read through.
#[inline(always)]
unsafe fn fence_proxy_async() {
    core::arch::asm!("// qwen3vl90a:fence.proxy.async.shared::cta;", options(nostack));
}

/// Waits until at most one committed copy group is still in flight.
#[inline(always)]
unsafe fn cp_async_wait_one() {
    core::arch::asm!("cp.async.wait_group 1;", options(nostack));
}

/// The shared-memory descriptor of a K-major operand at shared address `addr`: rows of 128
/// bytes in the 128-byte swizzle, groups of 8 rows 1,024 bytes apart (the leading offset is
/// unused by this layout).
#[inline(always)]
fn descriptor(addr: u64) -> u64 {
    ((addr & 0x3ffff) >> 4) | (1 << 16) | ((1024 >> 4) << 32) | (1 << 62)
}

/// The block's 128 × 256 sums over its `k` range (see the module docs): this thread's 128, as
/// f32 bits (kept in the 32-bit registers the multiplies write: a conversion between them and
/// the multiplies would read the accumulator while a group is in flight, and ptxas would then
/// serialize the groups).
#[inline(always)]
unsafe fn wgmma_core<const PAIR: bool>(x: &PipeArgs) -> [u32; ACC] {
    let base = shared_addr(dynamic_shared_mem::<u8>());
    // the stages start on a 1,024-byte boundary (the swizzle repeats every 8 rows of 128 bytes)
    let a_sh = (base + 1023) & !1023;
    let (a_buf, w_buf) = (TM * KB * 2, TN * KB * 2);
    let w_sh = a_sh + (NSTAGES * a_buf) as u64;
    let row0 = thread::block_idx_y() as usize * TM;
    let col0 = thread::block_idx_x() as usize * if PAIR { TN / 2 } else { TN };
    let copies = StageCopies::<TM, TN, { KB / 8 }>::new::<PAIR>(x, row0, col0, (a_sh, a_buf), (w_sh, w_buf));
    let wg = thread::thread_idx_x() as usize / 128;
    let (kb, ke) = (x.kb, x.ke);
    let steps = (ke - kb + KB - 1) / KB;
    let mut acc = [0u32; ACC];
    // 1. two stages in flight (a group each; zero-fills past the end)
    for s in 0..NSTAGES - 2 {
        copies.load(s, kb + s * KB);
        cp_async_commit();
    }
    let mut cur = 0;
    for step in 0..steps {
        // 2. stage `step` has landed for this thread, is visible to the async proxy, and then
        //    for every thread; every warpgroup has finished the multiplies of stage step - 2
        cp_async_wait_one();
        fence_proxy_async();
        thread::sync_threads();
        // 3. the stage's four k steps, one group
        let (da, db) = (descriptor(a_sh + (cur * a_buf + wg * 64 * 128) as u64), descriptor(w_sh + (cur * w_buf) as u64));
        wgmma_fence();
        unroll!(ks < KB / 16, [0, 1, 2, 3], {
            // 32 bytes (16 elements) further along the rows: 2 in the descriptor's address field
            wgmma_m64n256k16!("bf16", acc, da + 2 * ks as u64, db + 2 * ks as u64);
        });
        wgmma_commit();
        // 4. stage step + 2 into the buffer of stage step - 2
        let ahead = if cur >= 2 { cur - 2 } else { cur + 2 };
        copies.load(ahead, kb + (step + 2) * KB);
        cp_async_commit();
        // 5. the group of stage step - 1 done: its buffer is free after the next barrier
        wgmma_wait!(1, acc);
        cur = if cur + 1 == NSTAGES { 0 } else { cur + 1 };
    }
    wgmma_wait!(0, acc);
    // the zero-fills past the range have landed before the epilogue reuses the stages
    cp_async_wait_all();
    acc
}

/// The 128 × 256 tile's sums into `[128][TN + 8]` f32 at the start of dynamic shared memory,
/// once every warpgroup is done with the stages (the caller syncs before reading it back).
#[inline(always)]
unsafe fn stage_wgmma_acc(tile: *mut f32, stride: usize, acc: &[u32; ACC]) {
    let tid = thread::thread_idx_x() as usize;
    let (wg, warp, lane) = (tid / 128, (tid / 32) % 4, tid % 32);
    thread::sync_threads();
    let r0 = 64 * wg + 16 * warp + lane / 4;
    let c0 = 2 * (lane % 4);
    unroll!(j < 32, [0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22, 23, 24, 25, 26, 27, 28, 29, 30, 31], {
        unroll!(h < 2, [0, 1], {
            let at = tile.add((r0 + 8 * h) * stride + 8 * j + c0);
            *(at as *mut crate::mem::F32x2) = crate::mem::F32x2([f32::from_bits(acc[4 * j + 2 * h]), f32::from_bits(acc[4 * j + 2 * h + 1])]);
        });
    });
}

#[inline(always)]
unsafe fn matmul_wgmma<const C16: bool>(p: LinearParams) {
    let (kb, ke) = crate::matmul::k_slice::<false>(&p);
    let x = PipeArgs { a: p.a as *const u8, lda: p.lda as usize, w: p.w as *const u8, w2: core::ptr::null(), m: p.m as usize, n: p.n as usize, k: p.k as usize, kb, ke };
    let acc = wgmma_core::<false>(&x);
    const STRIDE: usize = TN + 8;
    let tile = dynamic_shared_mem::<u8>() as *mut f32;
    stage_wgmma_acc(tile, STRIDE, &acc);
    thread::sync_threads();
    finish_staged::<Bf16, TM, TN, C16>(&p, tile, STRIDE);
}

/// `c = act(a · wᵀ + bias) + residual`, bf16 activations and weights, 128 × 256 tiles by
/// warpgroups (sm_90a). See the module docs.
#[kernel]
pub unsafe fn matmul_wgmma_128x256_bf16(p: LinearParams) {
    matmul_wgmma::<false>(p)
}

/// [`matmul_wgmma_128x256_bf16`] writing `act(a · wᵀ + bias)` in bf16 (`c` `[m, n]` 16-bit, row
/// stride `ldc`, no residual): the next pipelined GEMM's activations.
#[kernel]
pub unsafe fn matmul_wgmma_128x256_c16_bf16(p: LinearParams) {
    matmul_wgmma::<true>(p)
}

/// `c = silu(a · gateᵀ) ⊙ (a · upᵀ)` ([`GateUpParams`], bf16, no row scales): [`wgmma_core`]
/// over the two matrices' rows interleaved by eights as the pipelined pair stages them
/// (`gate_up_pipe`, `mma_pipe.rs`), so accumulator chunks `2j` and `2j + 1` (8 columns each) hold
/// the gate's and the up projection's sums for the same 8 of the block's 128 output columns;
/// the products go from registers to `c` (f32, or bf16 with `C16`: `n` even).
#[inline(always)]
unsafe fn gate_up_wgmma<const C16: bool>(p: GateUpParams) {
    let (m, n) = (p.m as usize, p.n as usize);
    let x = PipeArgs { a: p.a as *const u8, lda: p.lda as usize, w: p.gate as *const u8, w2: p.up as *const u8, m, n, k: p.k as usize, kb: 0, ke: p.k as usize };
    let acc = wgmma_core::<true>(&x);
    let tid = thread::thread_idx_x() as usize;
    let (wg, warp, lane) = (tid / 128, (tid / 32) % 4, tid % 32);
    let r0 = thread::block_idx_y() as usize * TM + 64 * wg + 16 * warp + lane / 4;
    let c0 = thread::block_idx_x() as usize * (TN / 2) + 2 * (lane % 4);
    unroll!(j < 16, [0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15], {
        let col = c0 + 8 * j;
        unroll!(h < 2, [0, 1], {
            let r = r0 + 8 * h;
            let (g, u) = (8 * j + 2 * h, 8 * j + 4 + 2 * h);
            let v0 = crate::math::silu_mul(f32::from_bits(acc[g]), f32::from_bits(acc[u]));
            let v1 = crate::math::silu_mul(f32::from_bits(acc[g + 1]), f32::from_bits(acc[u + 1]));
            if r < m && col < n {
                if C16 {
                    // the pair rounded into one 32-bit word of the 16-bit output (`n` even)
                    *((p.c as *mut u8).add((r * n + col) * 2) as *mut u32) = <Bf16 as MmaElem>::pack(v0, v1);
                } else {
                    let c = (p.c as *mut f32).add(r * n + col);
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
    gate_up_wgmma::<false>(p)
}

/// [`gate_up_wgmma_128x256_bf16`] writing the products in bf16: the down projection's
/// activations.
#[kernel]
pub unsafe fn gate_up_wgmma_128x256_c16_bf16(p: GateUpParams) {
    gate_up_wgmma::<true>(p)
}
