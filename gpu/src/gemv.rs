//! Matrix-vector products for decode: `c[r] = wᵀ · a[r] (+ bias) (+ residual[r])` for a few
//! activation rows, bound by the bandwidth of reading the weights once.
//!
//! # Parameters ([`LinearParams`], [`GateUpParams`])
//! As for `matmul_*`: `a` `[m, k]` f32 (m small, usually 1), `w` `[n, k]` f32/f16/bf16,
//! `bias` `[n]` f32 or 0, `residual` `[m, n]` f32 or 0 (may be `c`), `c` `[m, n]` f32.
//!
//! # Kernels
//! - `gemv_vec_*` (the decode path: one activation row, `k · size_of(w)` a multiple of 16
//!   bytes): one warp per output feature, `blockDim / 32` warps per block (the launcher picks
//!   4 or 8), grid = `ceil(n / warps)`. Lane `l` reads 16-byte weight vectors `l, l + 32, ...`
//!   of its row through the read-only path in rounds of `UNROLL` (4) vectors, the next round's
//!   loads issued before the current round's arithmetic (8 loads in flight per lane),
//!   and multiplies each with the matching activations. A butterfly shuffle reduces the sum;
//!   lane 0 writes it, adding bias and residual (each output element is read and written by
//!   that one lane, so `residual = c` is safe). With `norm` set, the block first RMS-norms the
//!   activation row into dynamic shared memory (`k` floats) and reads it from there: the
//!   decoder's RMSNorm costs no launch. Each warp issues its first round of weight loads
//!   before that prologue (the weights do not wait on the activations), so the norm's two
//!   passes and barrier run while they are in flight; on a compute 9.0 device they are issued
//!   before the kernel waits for the one before it (`grid_dep_wait`), which it overlaps. One
//!   row only keeps the register count
//!   (occupancy) of the decode path low; a few rows take `gemv_*`.
//! - `gemv_gate_up_*`: the same over two weight matrices at once (gate and up rows of one
//!   feature), writing `silu(gate · a) · (up · a)`, with the same optional RMSNorm.
//! - `gemv_*` (any `k`): one warp per (row, output), scalar strided loads, four partial sums.
//!
//! # Safety
//! The launcher validates pointers, sizes and the 16-byte alignment rule. A warp whose feature
//! is past `n` exits as a whole, so every shuffle runs with all 32 lanes; no block barriers.

use crate::math::{rms_scale, silu, Bf16, WeightElem, F16};
use crate::mem::{grid_dep_launch, grid_dep_wait, ld_f32x4, ld_nc_v4, ld_nc_v4_now, VecElem};
use crate::params::gemv_tile::WARPS;
use crate::params::gemv_vec_tile::UNROLL;
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

/// Whether a whole round of `UNROLL` vectors starts at vector `v` of a row of `vecs`.
#[inline(always)]
fn full_round(v: usize, vecs: usize) -> bool {
    v + 32 * (UNROLL - 1) < vecs
}

/// The round of `UNROLL` 16-byte weight vectors `v, v + 32, ...` of row `w`.
#[inline(always)]
unsafe fn load_round(w: *const u32, v: usize) -> [[u32; 4]; UNROLL] {
    let mut ws = [[0u32; 4]; UNROLL];
    for u in 0..UNROLL {
        ws[u] = ld_nc_v4(w.add((v + 32 * u) * 4));
    }
    ws
}

/// The first round of a lane's loads, issued now (before a prologue with barriers: the asm is
/// not `pure`, so it is neither sunk to its use nor merged with a later load); zeros when the
/// row has no whole round at `lane` or the warp has no feature (`live` false).
#[inline(always)]
unsafe fn first_round(live: bool, w: *const u32, vecs: usize, lane: usize) -> [[u32; 4]; UNROLL] {
    let mut ws = [[0u32; 4]; UNROLL];
    if live && full_round(lane, vecs) {
        for u in 0..UNROLL {
            ws[u] = ld_nc_v4_now(w.add((lane + 32 * u) * 4));
        }
    }
    ws
}

/// Sums `w_row · a[r]` for `r < M` into `acc[r]` (this lane's share): the 16-byte vectors
/// `lane, lane + 32, ...` of the `vecs` in the row, in rounds of `UNROLL` per lane. Each round's
/// loads are issued before the previous round's arithmetic (double buffering), so a long row
/// keeps `2 · UNROLL` loads in flight instead of waiting once per round.
/// `first` is the round at vector `lane` when [`full_round`] holds there (from [`load_round`],
/// issued early by the caller), else unused.
#[inline(always)]
unsafe fn row_dots<W: VecElem>(w: *const u32, vecs: usize, a: *const f32, lane: usize, first: [[u32; 4]; UNROLL]) -> f32 {
    let mut acc = 0.0f32;
    let full = |v: usize| full_round(v, vecs);
    let load = |v: usize| load_round(w, v);
    let mut v = lane;
    if full(v) {
        let mut cur = first;
        loop {
            let next_v = v + 32 * UNROLL;
            let more = full(next_v);
            let next = if more { load(next_v) } else { cur };
            for u in 0..UNROLL {
                acc += W::dot(cur[u], a.add((v + 32 * u) * W::PER_VEC));
            }
            v = next_v;
            if !more {
                break;
            }
            cur = next;
        }
    }
    while v < vecs {
        acc += W::dot(ld_nc_v4(w.add(v * 4)), a.add(v * W::PER_VEC));
        v += 32;
    }
    acc
}

/// The activations the dot products read: `a` itself, or (with an RMSNorm weight) its rows
/// normed into the block's dynamic shared memory, `x · rsqrt(mean(x²) + eps) · g` (the CPU's
/// `rms_norm` arithmetic). Loads are 16-byte vectors, `STAGE_UNROLL` in flight per thread
/// (`k` is a multiple of 4, rows 16-byte aligned: the vector GEMVs' condition), so the prologue
/// costs about two memory round trips. Every thread of the block must call it (it has
/// barriers; `m` is uniform). Returns the activations and their row stride.
#[inline(always)]
unsafe fn activations(a: *const f32, k: usize, norm: u64, eps: f32) -> *const f32 {
    const STAGE_UNROLL: usize = 4;
    if norm == 0 {
        return a;
    }
    let scratch = shared_array![f32; 32];
    let stage = dynamic_shared_mem::<f32>();
    let (tid, step) = (thread::thread_idx_x() as usize, thread::block_dim_x() as usize);
    let g = norm as *const f32;
    let chunks = k / 4;
    {
        let row = a;
        // 1. sum of squares
        let mut ss = 0.0f32;
        let mut c = tid;
        while c < chunks {
            let mut v = [[0.0f32; 4]; STAGE_UNROLL];
            for u in 0..STAGE_UNROLL {
                if c + u * step < chunks {
                    v[u] = ld_f32x4(row.add(4 * (c + u * step)));
                }
            }
            for u in 0..STAGE_UNROLL {
                ss += (v[u][0] * v[u][0] + v[u][1] * v[u][1]) + (v[u][2] * v[u][2] + v[u][3] * v[u][3]);
            }
            c += STAGE_UNROLL * step;
        }
        let scale = rms_scale(block_sum(ss, scratch) / k as f32, eps);
        // 2. the normed row into the stage (the row is in L1 now)
        let dst = stage;
        let mut c = tid;
        while c < chunks {
            let mut v = [[0.0f32; 4]; STAGE_UNROLL];
            let mut w = [[0.0f32; 4]; STAGE_UNROLL];
            for u in 0..STAGE_UNROLL {
                if c + u * step < chunks {
                    v[u] = ld_f32x4(row.add(4 * (c + u * step)));
                    w[u] = ld_f32x4(g.add(4 * (c + u * step)));
                }
            }
            for u in 0..STAGE_UNROLL {
                if c + u * step < chunks {
                    let o = dst.add(4 * (c + u * step));
                    for e in 0..4 {
                        *o.add(e) = v[u][e] * scale * w[u][e];
                    }
                }
            }
            c += STAGE_UNROLL * step;
        }
    }
    thread::sync_threads();
    stage
}

/// The warp's output feature, its lane, and whether the feature exists (`col < n`, uniform per
/// warp) for the vector GEMVs.
#[inline(always)]
fn warp_feature(n: u32) -> (usize, usize, bool) {
    let tid = thread::thread_idx_x() as usize;
    let col = thread::block_idx_x() as usize * (thread::block_dim_x() as usize / 32) + tid / 32;
    (col, tid % 32, col < n as usize)
}

#[inline(always)]
unsafe fn gemv_vec<W: VecElem>(p: LinearParams) {
    let (col, lane, live) = warp_feature(p.n);
    let vecs = p.k as usize / W::PER_VEC;
    let w = (p.w as *const u32).wrapping_add(col * vecs * 4);
    // 1. the first round of weight loads, in flight during the RMSNorm prologue (and, on
    //    compute 9.0, while the kernel before finishes: the activations are its output)
    let first = first_round(live, w, vecs, lane);
    grid_dep_wait();
    // 2. the activations (normed when `norm` is set; every thread takes the barriers), then
    //    the warps past `n` leave
    let a = activations(p.a as *const f32, p.k as usize, p.norm, p.eps);
    if !live {
        return;
    }
    let total = warp_sum(row_dots::<W>(w, vecs, a, lane, first));
    // the next kernel may launch: this block's weights are read
    grid_dep_launch();
    if lane == 0 {
        *(p.c as *mut f32).add(col) = total + epilogue(&p, 0, col);
    }
}

/// `row_dots` over two weight rows at once (gate and up of one feature): both rows' vectors,
/// `UNROLL` of each per round, double-buffered like `row_dots`.
/// `first` holds both rows' rounds at vector `lane` (see [`row_dots`]).
#[inline(always)]
unsafe fn row_dots2<W: VecElem>(w: [*const u32; 2], vecs: usize, a: *const f32, lane: usize, first: [[[u32; 4]; UNROLL]; 2]) -> (f32, f32) {
    const H: usize = UNROLL;
    let mut acc = [0.0f32; 2];
    let full = |v: usize| full_round(v, vecs);
    let load = |v: usize| [load_round(w[0], v), load_round(w[1], v)];
    let mut v = lane;
    if full(v) {
        let mut cur = first;
        loop {
            let next_v = v + 32 * H;
            let more = full(next_v);
            let next = if more { load(next_v) } else { cur };
            for u in 0..H {
                let x = a.add((v + 32 * u) * W::PER_VEC);
                acc[0] += W::dot(cur[0][u], x);
                acc[1] += W::dot(cur[1][u], x);
            }
            v = next_v;
            if !more {
                break;
            }
            cur = next;
        }
    }
    while v < vecs {
        let x = a.add(v * W::PER_VEC);
        acc[0] += W::dot(ld_nc_v4(w[0].add(v * 4)), x);
        acc[1] += W::dot(ld_nc_v4(w[1].add(v * 4)), x);
        v += 32;
    }
    (acc[0], acc[1])
}

#[inline(always)]
unsafe fn gemv_gate_up<W: VecElem>(p: GateUpParams) {
    let (col, lane, live) = warp_feature(p.n);
    let vecs = p.k as usize / W::PER_VEC;
    let rows = [(p.gate as *const u32).wrapping_add(col * vecs * 4), (p.up as *const u32).wrapping_add(col * vecs * 4)];
    // as in `gemv_vec`: both rows' first rounds in flight during the RMSNorm prologue
    let first = [first_round(live, rows[0], vecs, lane), first_round(live, rows[1], vecs, lane)];
    grid_dep_wait();
    let a = activations(p.a as *const f32, p.k as usize, p.norm, p.eps);
    if !live {
        return;
    }
    let (g, u) = row_dots2::<W>(rows, vecs, a, lane, first);
    let (g, u) = (warp_sum(g), warp_sum(u));
    grid_dep_launch();
    if lane == 0 {
        *(p.c as *mut f32).add(col) = silu(g) * u;
    }
}

/// `c = wᵀ · a (+ bias) (+ residual)` for one row, f32 weights as 16-byte vectors. See the module docs.
#[kernel]
pub unsafe fn gemv_vec_f32(p: LinearParams) {
    gemv_vec::<f32>(p)
}

/// `c = wᵀ · a (+ bias) (+ residual)` for one row, f16 weights as 16-byte vectors. See the module docs.
#[kernel]
pub unsafe fn gemv_vec_f16(p: LinearParams) {
    gemv_vec::<F16>(p)
}

/// `c = wᵀ · a (+ bias) (+ residual)` for one row, bf16 weights as 16-byte vectors. See the module docs.
#[kernel]
pub unsafe fn gemv_vec_bf16(p: LinearParams) {
    gemv_vec::<Bf16>(p)
}

/// `c = silu(gate · a) · (up · a)` for one row, f32 weights. See the module docs.
#[kernel]
pub unsafe fn gemv_gate_up_f32(p: GateUpParams) {
    gemv_gate_up::<f32>(p)
}

/// `c = silu(gate · a) · (up · a)` for one row, f16 weights. See the module docs.
#[kernel]
pub unsafe fn gemv_gate_up_f16(p: GateUpParams) {
    gemv_gate_up::<F16>(p)
}

/// `c = silu(gate · a) · (up · a)` for one row, bf16 weights. See the module docs.
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
