//! Tiled matmuls for linear layers (SIMT, FP32 math, every GPU): `c = act(a · wᵀ + bias) +
//! residual`. `matmul_*` (64 × 64 tiles) for small `m`, `matmul_big_*` (128 × 128) for prefill-sized `m`.
//!
//! # Parameters ([`LinearParams`])
//! - `a`: `[m, k]` f32 activations, row stride `lda`.
//! - `w`: `[n, k]` weights (PyTorch `Linear` layout), f32, f16 or bf16 by kernel, row stride `k`.
//! - `bias`: `[n]` f32 or 0.  `residual`: `[m, n]` f32 (row stride `ldc`) or 0; may be `c`, as
//!   each element is read and written by one thread.  `c`: `[m, n]` f32, row stride `ldc`.
//!   Accumulation is in f32.
//!
//! # Tiling
//! Each block computes a `BM × BN` (64 × 64) tile of `c`, walking `k` in stages of `BK` (16).
//! A stage stages `a[64 rows, 16]` and `w[64 rows, 16]` in shared memory, transposed to
//! `[k][row]` so the inner loop reads rows contiguously; weights are widened to f32 as they are
//! staged. Loads outside `m`, `n` or `k` are padded with zeros, so any size works.
//!
//! # Thread mapping
//! 256 threads as 16 × 16 (`tx = tid % 16`, `ty = tid / 16`). Thread (tx, ty) owns the 4 × 4
//! register block of rows `ty + 16 i` and columns `tx + 16 j` (i, j < 4): strided so that a
//! warp's shared reads hit 16 consecutive banks and its stores to `c` are coalesced.
//! For staging, thread `tid` loads 4 consecutive `k` of row `tid / 4` of each operand.
//! Grid: `(ceil(n / 64), ceil(m / 64))`.
//!
//! # Safety
//! The host launcher checks that every pointer covers the sizes in the params and that the
//! grid matches; barriers sit only in code that all threads of the block execute.

use crate::math::{gelu_erf, gelu_tanh, Bf16, WeightElem, F16};
use crate::mem::{ld_shared_f32x4, shared_addr, st_shared_f32, F32x4};
use crate::params::matmul_tile::{BK, BM, BN};
use crate::params::split_reduce_tile::MAX_SLICES;
use crate::params::{matmul_big_tile, LinearParams, SplitReduceParams, ACT_GELU_ERF, ACT_GELU_TANH};
use cuda_std::{kernel, shared_array, thread};

/// The epilogue of every tiled kernel: `act(acc + bias[col]) + residual[r, col]`.
#[inline(always)]
pub(crate) unsafe fn finish(p: &LinearParams, acc: f32, r: usize, col: usize) -> f32 {
    let bias = p.bias as *const f32;
    let res = p.residual as *const f32;
    let mut v = acc;
    if !bias.is_null() {
        v += *bias.add(col);
    }
    v = activate(p.act, v);
    if !res.is_null() {
        v += *res.add(r * p.ldc as usize + col);
    }
    v
}

/// The epilogues' activation: `ACT_*` of [`LinearParams::act`].
#[inline(always)]
pub(crate) fn activate(act: u32, v: f32) -> f32 {
    match act {
        ACT_GELU_TANH => gelu_tanh(v),
        ACT_GELU_ERF => gelu_erf(v),
        _ => v,
    }
}

/// The `k` range `[kb, ke)` of this block's z-slice under split-K (the `_split` kernels,
/// `SPLIT`; `p.k_split` 0 there also means all of `k`). The whole-`k` kernels compile without
/// it, so their code is the same as before split-K existed.
#[inline(always)]
pub(crate) fn k_slice<const SPLIT: bool>(p: &LinearParams) -> (usize, usize) {
    let k = p.k as usize;
    if !SPLIT || p.k_split == 0 {
        return (0, k);
    }
    let z = thread::block_idx_z() as usize;
    let ks = p.k_split as usize;
    let kb = (z * ks).min(k);
    (kb, (kb + ks).min(k))
}

/// Stores output element `(r, col)` of a tiled kernel: through the epilogue into `c`, or under
/// split-K the raw sum into this z-slice's `[m, n]` part of the workspace `c`.
#[inline(always)]
pub(crate) unsafe fn store_out<const SPLIT: bool>(p: &LinearParams, c: *mut f32, acc: f32, r: usize, col: usize) {
    let ldc = p.ldc as usize;
    if !SPLIT || p.k_split == 0 {
        *c.add(r * ldc + col) = finish(p, acc, r, col);
    } else {
        let z = thread::block_idx_z() as usize;
        *c.add((z * p.m as usize + r) * ldc + col) = acc;
    }
}

/// `lin.c = epilogue(Σ_z part[z])`: the second step of a split-K linear layer.
///
/// Parameters: [`SplitReduceParams`]: `part` `[slices, m, n]` f32 (contiguous), `lin` the
/// layer's output `c` `[m, n]` (row stride `ldc`), bias, activation and residual.
/// Thread mapping: one thread per output element, `blockDim.x` = 256, grid x over `m · n`.
/// Safety: the launcher checks the buffer sizes and `slices ≤ MAX_SLICES`.
#[kernel]
pub unsafe fn linear_split_reduce_f32(p: SplitReduceParams) {
    let (m, n) = (p.lin.m as usize, p.lin.n as usize);
    let i = thread::index_1d() as usize;
    if i >= m * n {
        return;
    }
    let (r, col) = (i / n, i % n);
    let part = p.part as *const f32;
    // every slice's value loaded before the first add (one memory latency, not one per
    // slice), then summed in slice order
    let slices = p.slices as usize;
    let mut vals = [0.0f32; MAX_SLICES as usize];
    for z in 0..MAX_SLICES as usize {
        if z < slices {
            vals[z] = *part.add(z * m * n + i);
        }
    }
    let mut acc = 0.0f32;
    for z in 0..MAX_SLICES as usize {
        if z < slices {
            acc += vals[z];
        }
    }
    *(p.lin.c as *mut f32).add(r * p.lin.ldc as usize + col) = finish(&p.lin, acc, r, col);
}

const TBM: usize = BM as usize;
const TBN: usize = BN as usize;
const TBK: usize = BK as usize;
/// Row length of a staged tile in shared memory (padded against bank conflicts on store).
const STRIDE: usize = TBM + 4;

#[inline(always)]
unsafe fn matmul<W: WeightElem>(p: LinearParams) {
    let a_s = shared_array![f32; TBK * STRIDE];
    let w_s = shared_array![f32; TBK * STRIDE];
    let tid = thread::thread_idx_x() as usize;
    let (tx, ty) = (tid % 16, tid / 16);
    let row0 = thread::block_idx_y() as usize * TBM;
    let col0 = thread::block_idx_x() as usize * TBN;
    let (m, n, k) = (p.m as usize, p.n as usize, p.k as usize);
    let (lda, ldc) = (p.lda as usize, p.ldc as usize);
    let a = p.a as *const f32;
    let w = p.w as *const W;
    // staging coordinates of this thread
    let lr = tid / 4;
    let lk = (tid % 4) * 4;
    let (ga, gw) = (row0 + lr, col0 + lr);

    let mut acc = [[0.0f32; 4]; 4];
    let mut k0 = 0usize;
    while k0 < k {
        for j in 0..4 {
            let gk = k0 + lk + j;
            let av = if ga < m && gk < k { *a.add(ga * lda + gk) } else { 0.0 };
            let wv = if gw < n && gk < k { (*w.add(gw * k + gk)).to_f32() } else { 0.0 };
            *a_s.add((lk + j) * STRIDE + lr) = av;
            *w_s.add((lk + j) * STRIDE + lr) = wv;
        }
        thread::sync_threads();
        for kk in 0..TBK {
            let mut av = [0.0f32; 4];
            let mut wv = [0.0f32; 4];
            for i in 0..4 {
                av[i] = *a_s.add(kk * STRIDE + ty + 16 * i);
                wv[i] = *w_s.add(kk * STRIDE + tx + 16 * i);
            }
            for i in 0..4 {
                for j in 0..4 {
                    acc[i][j] += av[i] * wv[j];
                }
            }
        }
        thread::sync_threads();
        k0 += TBK;
    }

    let c = p.c as *mut f32;
    for i in 0..4 {
        let r = row0 + ty + 16 * i;
        if r < m {
            for j in 0..4 {
                let col = col0 + tx + 16 * j;
                if col < n {
                    *c.add(r * ldc + col) = finish(&p, acc[i][j], r, col);
                }
            }
        }
    }
}

/// `c = a · wᵀ (+ bias) (+ residual)` with f32 weights. See the module docs.
#[kernel]
pub unsafe fn matmul_f32(p: LinearParams) {
    matmul::<f32>(p)
}

/// `c = a · wᵀ (+ bias) (+ residual)` with f16 weights widened to f32. See the module docs.
#[kernel]
pub unsafe fn matmul_f16(p: LinearParams) {
    matmul::<F16>(p)
}

/// `c = a · wᵀ (+ bias) (+ residual)` with bf16 weights widened to f32. See the module docs.
#[kernel]
pub unsafe fn matmul_bf16(p: LinearParams) {
    matmul::<Bf16>(p)
}

const GBM: usize = matmul_big_tile::BM as usize;
const GBN: usize = matmul_big_tile::BN as usize;
const GBK: usize = matmul_big_tile::BK as usize;
// `matmul_big`'s k steps are written out for this shape (byte offsets of its shared loads)
const _: () = assert!(GBM == 128 && GBN == 128 && GBK == 8);

/// Four 16-bit values, 8-byte aligned (one 8-byte load).
#[repr(C, align(8))]
#[derive(Clone, Copy)]
struct U16x4([u16; 4]);

/// Four consecutive weights at `p` (aligned to four elements) in one 8- or 16-byte load, raw.
#[inline(always)]
unsafe fn load4<W: WeightElem>(p: *const W) -> [W; 4] {
    if core::mem::size_of::<W>() == 4 {
        core::mem::transmute_copy(&*(p as *const F32x4))
    } else {
        core::mem::transmute_copy(&*(p as *const U16x4))
    }
}

/// Four f32 from shared memory at 32-bit shared-space address `base + OFF` (16-byte aligned;
/// `OFF` a literal, folded into the instruction).
macro_rules! lds128 {
    ($base:expr, $off:literal) => {{
        let (x, y, z, w): (f32, f32, f32, f32);
        core::arch::asm!(
            concat!("ld.shared.v4.f32 {{{}, {}, {}, {}}}, [{}+", stringify!($off), "];"),
            out(reg32) x, out(reg32) y, out(reg32) z, out(reg32) w, in(reg32) $base,
            options(readonly, nostack),
        );
        [x, y, z, w]
    }};
}

/// # `matmul_big_*`: register-blocked SIMT GEMM
/// Parameters as for `matmul_*` ([`LinearParams`]).
///
/// Tiling: a block computes a 128 × 128 tile of `c`, walking `k` in stages of 8. A stage holds
/// `a[128 rows, 8]` and `w[128 rows, 8]` transposed in shared memory (`[k][row]`, weights widened
/// to f32), two buffers: the next stage is loaded into registers while the current one is used
/// (raw: the weights are widened only when stored, so the loads stay in flight through the
/// math), then stored into the other buffer (one barrier per stage). Loads past `m`, `n`, `k`
/// are zeros.
///
/// Thread mapping: 256 threads as 16 × 16 (`tx = tid % 16`, `ty = tid / 16`); thread (tx, ty)
/// owns rows `4ty .. 4ty + 4` and `64 + 4ty ..`, columns `4tx .. 4tx + 4` and `64 + 4tx ..`:
/// an 8 × 8 register block fed by four 16-byte shared loads per `k` (the eight `k` of a stage
/// written out, their offsets in the instructions). For staging, thread `t` loads 4 consecutive
/// `k` of row `t / 2` of each operand: one 16-byte activation load and one 8-byte (16-bit) or
/// 16-byte (f32) weight load when `k`, `lda` and the pointers allow, else element by element.
///
/// Safety: the launcher checks sizes; every thread reaches every barrier.
#[inline(always)]
unsafe fn matmul_big<W: WeightElem, const SPLIT: bool>(p: LinearParams) {
    // shared-space byte addresses of the two staged operands (explicit ld/st.shared)
    let a_s = shared_addr(shared_array![F32x4; 2 * GBK * GBM / 4]);
    let w_s = shared_addr(shared_array![F32x4; 2 * GBK * GBN / 4]);
    let stage = GBK * GBM;
    let tid = thread::thread_idx_x() as usize;
    let (tx, ty) = (tid % 16, tid / 16);
    let row0 = thread::block_idx_y() as usize * GBM;
    let col0 = thread::block_idx_x() as usize * GBN;
    let (m, n, k, lda) = (p.m as usize, p.n as usize, p.k as usize, p.lda as usize);
    let (a, w) = (p.a as *const f32, p.w as *const W);
    let (lr, lk) = (tid / 2, (tid % 2) * 4);
    let (ga, gw) = (row0 + lr, col0 + lr);
    // whole four-element groups are aligned vectors (uniform over the grid)
    let vec = lda % 4 == 0 && k % 4 == 0 && p.a % 16 == 0 && p.w % (4 * core::mem::size_of::<W>()) as u64 == 0;
    let zero: W = core::mem::zeroed(); // 0.0 in f32, f16 and bf16 alike
    let load = |k0: usize| -> ([f32; 4], [W; 4]) {
        let (mut av, mut wv) = ([0.0f32; 4], [zero; 4]);
        let gk = k0 + lk;
        if vec && gk < k {
            // gk and k are multiples of 4: all four are in range
            if ga < m {
                av = crate::mem::ld_f32x4(a.add(ga * lda + gk));
            }
            if gw < n {
                wv = load4(w.add(gw * k + gk));
            }
        } else {
            for j in 0..4 {
                if gk + j < k {
                    if ga < m {
                        av[j] = *a.add(ga * lda + gk + j);
                    }
                    if gw < n {
                        wv[j] = *w.add(gw * k + gk + j);
                    }
                }
            }
        }
        (av, wv)
    };
    let store = |buf: usize, (av, wv): ([f32; 4], [W; 4])| {
        for j in 0..4 {
            st_shared_f32(a_s + 4 * (buf * stage + (lk + j) * GBM + lr) as u64, av[j]);
            st_shared_f32(w_s + 4 * (buf * stage + (lk + j) * GBN + lr) as u64, wv[j].to_f32());
        }
    };
    let mut acc = [[0.0f32; 8]; 8];
    // split-K: this z-slice sums k in [kb, ke)
    let (kb, ke) = k_slice::<SPLIT>(&p);
    let stages = (ke - kb + GBK - 1) / GBK;
    store(0, load(kb));
    thread::sync_threads();
    for s in 0..stages {
        let (cur, nxt) = (s % 2, (s + 1) % 2);
        let more = s + 1 < stages;
        let next = if more { load(kb + (s + 1) * GBK) } else { ([0.0; 4], [zero; 4]) };
        // this thread's first a and w vectors of the stage (32-bit shared addresses)
        let ab = (a_s + 4 * (cur * stage + 4 * ty) as u64) as u32;
        let wb = (w_s + 4 * (cur * stage + 4 * tx) as u64) as u32;
        let mut fma = |a0: [f32; 4], a1: [f32; 4], w0: [f32; 4], w1: [f32; 4]| {
            let av = [a0[0], a0[1], a0[2], a0[3], a1[0], a1[1], a1[2], a1[3]];
            let wv = [w0[0], w0[1], w0[2], w0[3], w1[0], w1[1], w1[2], w1[3]];
            unroll!(i < 8, [0, 1, 2, 3, 4, 5, 6, 7], {
                unroll!(j < 8, [0, 1, 2, 3, 4, 5, 6, 7], {
                    acc[i][j] += av[i] * wv[j];
                });
            });
        };
        // k step kk: rows at byte offset 4 · kk · 128, the second four 256 bytes on
        macro_rules! step {
            ($o0:literal, $o1:literal) => {
                fma(lds128!(ab, $o0), lds128!(ab, $o1), lds128!(wb, $o0), lds128!(wb, $o1))
            };
        }
        step!(0, 256);
        step!(512, 768);
        step!(1024, 1280);
        step!(1536, 1792);
        step!(2048, 2304);
        step!(2560, 2816);
        step!(3072, 3328);
        step!(3584, 3840);
        if more {
            store(nxt, next);
        }
        thread::sync_threads();
    }
    let c = p.c as *mut f32;
    for i in 0..8 {
        let r = row0 + 4 * ty + (i % 4) + 64 * (i / 4);
        if r < m {
            for j in 0..8 {
                let col = col0 + 4 * tx + (j % 4) + 64 * (j / 4);
                if col < n {
                    store_out::<SPLIT>(&p, c, acc[i][j], r, col);
                }
            }
        }
    }
}

/// `c = act(a · wᵀ + bias) + residual`, f32 weights, 128 × 128 tiles. See [`matmul_big`].
#[kernel]
pub unsafe fn matmul_big_f32(p: LinearParams) {
    matmul_big::<f32, false>(p)
}

/// `c = act(a · wᵀ + bias) + residual`, f16 weights, 128 × 128 tiles. See [`matmul_big`].
#[kernel]
pub unsafe fn matmul_big_f16(p: LinearParams) {
    matmul_big::<F16, false>(p)
}

/// `c = act(a · wᵀ + bias) + residual`, bf16 weights, 128 × 128 tiles. See [`matmul_big`].
#[kernel]
pub unsafe fn matmul_big_bf16(p: LinearParams) {
    matmul_big::<Bf16, false>(p)
}

/// [`matmul_big_f32`] over one z-slice of `k` (split-K: raw partial sums into the workspace;
/// see `LinearParams::k_split`).
#[kernel]
pub unsafe fn matmul_big_split_f32(p: LinearParams) {
    matmul_big::<f32, true>(p)
}

/// [`matmul_big_f16`] over one z-slice of `k` (split-K).
#[kernel]
pub unsafe fn matmul_big_split_f16(p: LinearParams) {
    matmul_big::<F16, true>(p)
}

/// [`matmul_big_bf16`] over one z-slice of `k` (split-K).
#[kernel]
pub unsafe fn matmul_big_split_bf16(p: LinearParams) {
    matmul_big::<Bf16, true>(p)
}
