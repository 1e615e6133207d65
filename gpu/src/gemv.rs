//! Matrix-vector products for decode: `c[r] = wᵀ · a[r] (+ bias) (+ residual[r])` for a few
//! activation rows, bound by the bandwidth of reading the weights once.
//!
//! # Parameters ([`LinearParams`], [`GateUpParams`])
//! As for `matmul_*`: `a` `[m, k]` f32 (m small, usually 1), `w` `[n, k]` f32/f16/bf16,
//! `bias` `[n]` f32 or 0, `residual` `[m, n]` f32 or 0 (may be `c`), `c` `[m, n]` f32.
//!
//! # Kernels
//! - `gemv_vec_*` (the decode path; `k · size_of(w)` a multiple of 16 bytes): one warp per
//!   output feature, `blockDim / 32` warps per block (the launcher picks 4 or 8), grid =
//!   `ceil(n / warps)`. Lane `l` reads 16-byte weight vectors `l, l + 32, ...` of its row
//!   through the read-only path, `UNROLL` (8) vectors in flight before any arithmetic (a
//!   2048-wide bf16 row in one round), and multiplies each with the matching activations of
//!   all `m ≤ MAX_ROWS` rows (the weights are read once whatever `m`). A butterfly shuffle
//!   reduces each row's sum; lane `r` writes row `r`, adding bias and residual (each output
//!   element is read and written by that one lane, so `residual = c` is safe). With `norm`
//!   set, the block first RMS-norms the `m` activation rows into dynamic shared memory
//!   (`m · k` floats) and reads them from there: the decoder's RMSNorm costs no launch.
//! - `gemv_gate_up_*`: the same over two weight matrices at once (gate and up rows of one
//!   feature), writing `silu(gate · a) · (up · a)`, with the same optional RMSNorm.
//! - `gemv_*` (any `k`): one warp per (row, output), scalar strided loads, four partial sums.
//!
//! # Safety
//! The launcher validates pointers, sizes and the 16-byte alignment rule. A warp whose feature
//! is past `n` exits as a whole, so every shuffle runs with all 32 lanes; no block barriers.

use crate::math::{rms_scale, silu, Bf16, WeightElem, F16};
use crate::mem::{ld_nc_v4, VecElem};
use crate::params::gemv_tile::WARPS;
use crate::params::gemv_vec_tile::{MAX_ROWS, UNROLL};
use crate::params::{GateUpParams, LinearParams};
use crate::reduce::{block_sum, warp_sum};
use cuda_std::shared::dynamic_shared_mem;
use cuda_std::{kernel, shared_array, thread};

/// `bias[col] + residual[r, col]` (each optional) for output element `(r, col)`.
#[inline(always)]
unsafe fn epilogue(p: &LinearParams, r: usize, col: usize) -> f32 {
    let bias = p.bias as *const f32;
    let res = p.residual as *const f32;
    let b = if bias.is_null() { 0.0 } else { *bias.add(col) };
    let x = if res.is_null() { 0.0 } else { *res.add(r * p.ldc as usize + col) };
    b + x
}

#[inline(always)]
unsafe fn gemv<W: WeightElem>(p: LinearParams) {
    let tid = thread::thread_idx_x() as usize;
    let lane = tid % 32;
    let col = thread::block_idx_x() as usize * WARPS as usize + tid / 32;
    let row = thread::block_idx_y() as usize;
    let (n, k) = (p.n as usize, p.k as usize);
    if col >= n {
        return; // uniform per warp
    }
    let x = (p.a as *const f32).add(row * p.lda as usize);
    let wr = (p.w as *const W).add(col * k);
    let mut s = [0.0f32; 4];
    let mut i = lane;
    while i + 96 < k {
        for u in 0..4 {
            s[u] += (*wr.add(i + 32 * u)).to_f32() * *x.add(i + 32 * u);
        }
        i += 128;
    }
    while i < k {
        s[0] += (*wr.add(i)).to_f32() * *x.add(i);
        i += 32;
    }
    let total = warp_sum((s[0] + s[1]) + (s[2] + s[3]));
    if lane == 0 {
        *(p.c as *mut f32).add(row * p.ldc as usize + col) = total + epilogue(&p, row, col);
    }
}

/// Sums `w_row · a[r]` for `r < M` into `acc[r]` (this lane's share): the 16-byte vectors
/// `lane, lane + 32, ...` of the `vecs` in the row, `UNROLL` loads in flight.
#[inline(always)]
unsafe fn row_dots<W: VecElem, const M: usize>(w: *const u32, vecs: usize, a: *const f32, lda: usize, lane: usize, acc: &mut [f32; MAX_ROWS]) {
    let mut v = lane;
    while v + 32 * (UNROLL - 1) < vecs {
        let mut ws = [[0u32; 4]; UNROLL];
        for u in 0..UNROLL {
            ws[u] = ld_nc_v4(w.add((v + 32 * u) * 4));
        }
        for u in 0..UNROLL {
            let e = (v + 32 * u) * W::PER_VEC;
            for r in 0..M {
                acc[r] += W::dot(ws[u], a.add(r * lda + e));
            }
        }
        v += 32 * UNROLL;
    }
    while v < vecs {
        let wv = ld_nc_v4(w.add(v * 4));
        for r in 0..M {
            acc[r] += W::dot(wv, a.add(r * lda + v * W::PER_VEC));
        }
        v += 32;
    }
}

/// The activations the dot products read: `a` itself, or (with an RMSNorm weight) its rows
/// normed into the block's dynamic shared memory, `x · rsqrt(mean(x²) + eps) · g` (the CPU's
/// `rms_norm` arithmetic). Every thread of the block must call it (it has barriers; `m` is
/// uniform). Returns the activations and their row stride.
#[inline(always)]
unsafe fn activations(a: *const f32, lda: usize, m: usize, k: usize, norm: u64, eps: f32) -> (*const f32, usize) {
    if norm == 0 {
        return (a, lda);
    }
    let scratch = shared_array![f32; 32];
    let stage = dynamic_shared_mem::<f32>();
    let (tid, step) = (thread::thread_idx_x() as usize, thread::block_dim_x() as usize);
    let g = norm as *const f32;
    for r in 0..m {
        let row = a.add(r * lda);
        let mut ss = 0.0f32;
        let mut i = tid;
        while i < k {
            let v = *row.add(i);
            ss += v * v;
            i += step;
        }
        let scale = rms_scale(block_sum(ss, scratch) / k as f32, eps);
        let mut i = tid;
        while i < k {
            *stage.add(r * k + i) = *row.add(i) * scale * *g.add(i);
            i += step;
        }
    }
    thread::sync_threads();
    (stage, k)
}

#[inline(always)]
unsafe fn gemv_vec_rows<W: VecElem, const M: usize>(p: &LinearParams, act: (*const f32, usize), col: usize, lane: usize) {
    let vecs = p.k as usize / W::PER_VEC;
    let w = (p.w as *const u32).add(col * vecs * 4);
    let mut acc = [0.0f32; MAX_ROWS];
    row_dots::<W, M>(w, vecs, act.0, act.1, lane, &mut acc);
    let mut mine = 0.0f32;
    for r in 0..M {
        let total = warp_sum(acc[r]);
        if lane == r {
            mine = total;
        }
    }
    if lane < M {
        *(p.c as *mut f32).add(lane * p.ldc as usize + col) = mine + epilogue(p, lane, col);
    }
}

#[inline(always)]
unsafe fn gemv_vec<W: VecElem>(p: LinearParams) {
    let tid = thread::thread_idx_x() as usize;
    let lane = tid % 32;
    let col = thread::block_idx_x() as usize * (thread::block_dim_x() as usize / 32) + tid / 32;
    let act = activations(p.a as *const f32, p.lda as usize, p.m as usize, p.k as usize, p.norm, p.eps);
    if col >= p.n as usize {
        return; // uniform per warp, after the block's barriers
    }
    match p.m {
        1 => gemv_vec_rows::<W, 1>(&p, act, col, lane),
        2 => gemv_vec_rows::<W, 2>(&p, act, col, lane),
        3 => gemv_vec_rows::<W, 3>(&p, act, col, lane),
        _ => gemv_vec_rows::<W, MAX_ROWS>(&p, act, col, lane),
    }
}

#[inline(always)]
unsafe fn gate_up_rows<W: VecElem, const M: usize>(p: &GateUpParams, (a, lda): (*const f32, usize), col: usize, lane: usize) {
    let vecs = p.k as usize / W::PER_VEC;
    let mut g = [0.0f32; MAX_ROWS];
    let mut u = [0.0f32; MAX_ROWS];
    row_dots::<W, M>((p.gate as *const u32).add(col * vecs * 4), vecs, a, lda, lane, &mut g);
    row_dots::<W, M>((p.up as *const u32).add(col * vecs * 4), vecs, a, lda, lane, &mut u);
    let mut mine = 0.0f32;
    for r in 0..M {
        let (gs, us) = (warp_sum(g[r]), warp_sum(u[r]));
        if lane == r {
            mine = silu(gs) * us;
        }
    }
    if lane < M {
        *(p.c as *mut f32).add(lane * p.n as usize + col) = mine;
    }
}

#[inline(always)]
unsafe fn gemv_gate_up<W: VecElem>(p: GateUpParams) {
    let tid = thread::thread_idx_x() as usize;
    let lane = tid % 32;
    let col = thread::block_idx_x() as usize * (thread::block_dim_x() as usize / 32) + tid / 32;
    let act = activations(p.a as *const f32, p.lda as usize, p.m as usize, p.k as usize, p.norm, p.eps);
    if col >= p.n as usize {
        return; // uniform per warp, after the block's barriers
    }
    match p.m {
        1 => gate_up_rows::<W, 1>(&p, act, col, lane),
        2 => gate_up_rows::<W, 2>(&p, act, col, lane),
        3 => gate_up_rows::<W, 3>(&p, act, col, lane),
        _ => gate_up_rows::<W, MAX_ROWS>(&p, act, col, lane),
    }
}

/// `c[r] = wᵀ · a[r] (+ bias) (+ residual[r])`, f32 weights as 16-byte vectors. See the module docs.
#[kernel]
pub unsafe fn gemv_vec_f32(p: LinearParams) {
    gemv_vec::<f32>(p)
}

/// `c[r] = wᵀ · a[r] (+ bias) (+ residual[r])`, f16 weights as 16-byte vectors. See the module docs.
#[kernel]
pub unsafe fn gemv_vec_f16(p: LinearParams) {
    gemv_vec::<F16>(p)
}

/// `c[r] = wᵀ · a[r] (+ bias) (+ residual[r])`, bf16 weights as 16-byte vectors. See the module docs.
#[kernel]
pub unsafe fn gemv_vec_bf16(p: LinearParams) {
    gemv_vec::<Bf16>(p)
}

/// `c[r] = silu(gate · a[r]) · (up · a[r])`, f32 weights. See the module docs.
#[kernel]
pub unsafe fn gemv_gate_up_f32(p: GateUpParams) {
    gemv_gate_up::<f32>(p)
}

/// `c[r] = silu(gate · a[r]) · (up · a[r])`, f16 weights. See the module docs.
#[kernel]
pub unsafe fn gemv_gate_up_f16(p: GateUpParams) {
    gemv_gate_up::<F16>(p)
}

/// `c[r] = silu(gate · a[r]) · (up · a[r])`, bf16 weights. See the module docs.
#[kernel]
pub unsafe fn gemv_gate_up_bf16(p: GateUpParams) {
    gemv_gate_up::<Bf16>(p)
}

/// `c[r] = wᵀ · a[r] (+ bias)`, f32 weights. See the module docs.
#[kernel]
pub unsafe fn gemv_f32(p: LinearParams) {
    gemv::<f32>(p)
}

/// `c[r] = wᵀ · a[r] (+ bias)`, f16 weights. See the module docs.
#[kernel]
pub unsafe fn gemv_f16(p: LinearParams) {
    gemv::<F16>(p)
}

/// `c[r] = wᵀ · a[r] (+ bias)`, bf16 weights. See the module docs.
#[kernel]
pub unsafe fn gemv_bf16(p: LinearParams) {
    gemv::<Bf16>(p)
}
