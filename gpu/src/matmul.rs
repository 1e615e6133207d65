//! Tiled matmul for linear layers: `c = a · wᵀ (+ bias) (+ residual)`.
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

use crate::math::{Bf16, WeightElem, F16};
use crate::params::matmul_tile::{BK, BM, BN};
use crate::params::LinearParams;
use cuda_std::{kernel, shared_array, thread};

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
    let bias = p.bias as *const f32;
    let res = p.residual as *const f32;
    for i in 0..4 {
        let r = row0 + ty + 16 * i;
        if r < m {
            for j in 0..4 {
                let col = col0 + tx + 16 * j;
                if col < n {
                    let b = if bias.is_null() { 0.0 } else { *bias.add(col) };
                    let x = if res.is_null() { 0.0 } else { *res.add(r * ldc + col) };
                    *c.add(r * ldc + col) = acc[i][j] + b + x;
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
