//! Matrix-vector products with block-quantized weights (`Q8_0`, `Q4_K`, `Q6_K`) for decode:
//! the activations are quantized once per call to 8-bit blocks, then every weight block's dot
//! product is an exact integer sum (`dp4a`) scaled in f32, as the CPU's int8 path computes it
//! (`host/src/cpu/qlinear.rs`, reference math `host/src/quant/act.rs`).
//!
//! # Kernels and parameters
//! - `quantize_act_f32` ([`QuantActParams`]): `x [m, k]` f32 (optionally RMS-normed first with
//!   `norm [k]`, the decoder's norm fused here instead of in the GEMV; grid (chunks of 2,048
//!   values, rows)) into `acts`
//!   (`qmath::act_layout`): blocks of `block` values (32 against `Q8_0`, 256 against the
//!   K-quants, as the CPU), scale `d = max|x| / 127`, values `round(x · 127 / max|x|)` (ties to
//!   even, the CPU's bits), and the sums of every 16 values.
//! - `mmvq_<type>` ([`QLinearParams`]): `c[m, n] = acts · wᵀ (+ bias) (+ residual)`, `w` `[n, k]`
//!   in the device layout of `qmath` (`k` a multiple of 256).
//! - `mmvq_gate_up_<type>`: `c = silu(acts · wᵀ) ⊙ (acts · upᵀ)` (SwiGLU's first half).
//!
//! # Tiling and thread mapping
//! One warp per output feature (`WARPS` per block, grid x = `ceil(n / WARPS)`), serving up to
//! `ROWS` activation rows (grid y = `ceil(m / ROWS)` row groups), so each weight byte is read
//! once per row group. Within the row, every lane takes 16 bytes of weight values per step
//! (one 16-byte load):
//! - `Q8_0` (planar): lane `l` takes the 16-value halves `l, l + 32, ...` of the row and the f16
//!   scale of its block; a step covers 512 values.
//! - `Q4_K`: `SUPER_LANES` (8) lanes per super-block, 4 super-blocks per step; lane `u` takes
//!   the 16 bytes `16u ..` of the values (16 values of sub-block `2(u/2)` in the low nibbles, 16
//!   of the next in the high ones) and reads the 16-byte super-block head (scale, min, 6-bit
//!   sub-block scales; the 8 lanes' loads of it are one broadcast).
//! - `Q6_K` (planar): 8 lanes per super-block; lane `u` takes 16 bytes of `ql` and the 16 bytes
//!   of `qh` holding their top bits (two lanes share each), so 32 values of two sub-blocks of 16.
//! Each lane loads its next step's bytes before the current step's arithmetic (double
//! buffering), so two steps' loads are in flight per lane.
//! The integer sums of a lane's values are scaled per lane in f32 and the warp sums the lanes
//! (butterfly shuffle); lane 0 writes with bias and residual. Results differ from the CPU's by
//! float reassociation only (the CPU scales each whole block's integer sum).
//!
//! # Safety
//! The launcher checks sizes, `k % 256 == 0` and the row counts. `quantize_act_f32` reaches its
//! barriers in every thread (the norm branch is uniform: a launch parameter); the GEMVs have no
//! barriers, and a warp past `n` exits as a whole, so every shuffle runs with all 32 lanes.

use crate::math::{rms_scale, silu_mul};
use crate::mem::{dot16, f16x2_to_f32, grid_dep_launch, grid_dep_wait, ld_f32x4, ld_nc_u16, ld_nc_v4, round_mul};
use crate::params::qtile::{ROWS, SUPER_LANES, WARPS};
use crate::params::{QLinearParams, QuantActParams};
use crate::qmath::{act_layout, q4_k_scale_bytes, q4_k_scale_min, q6_k_center, q6_k_planes, q8_0_d_at, Q4_K_BYTES, QK8_0, QK_K};
use crate::reduce::{block_sum, shfl_xor, warp_sum};
use cuda_std::{kernel, shared_array, thread};

#[inline(always)]
fn fabs(x: f32) -> f32 {
    f32::from_bits(x.to_bits() & 0x7fff_ffff)
}

/// An f16 (raw bits) widened to f32 with the hardware conversion.
#[inline(always)]
fn h2f(h: u16) -> f32 {
    f16x2_to_f32(h as u32).0
}

/// Quantizes rows of activations into 8-bit blocks (see the module docs). Grid: (chunks of
/// `ROW_THREADS · 8` values, rows); with `norm` every block first reduces its whole row's sum
/// of squares (the row is small and L2-resident), then each thread quantizes 8 consecutive
/// values: an activation block spans `block / 8` lanes (4 or 32), whose maximum and 16-sums
/// are butterfly reductions over those lanes.
#[kernel]
pub unsafe fn quantize_act_f32(p: QuantActParams) {
    // the activations are the kernel's before (launched early on compute 9.0)
    grid_dep_wait();
    let scratch = shared_array![f32; 32];
    let (tid, threads) = (thread::thread_idx_x() as usize, thread::block_dim_x() as usize);
    let r = thread::block_idx_y() as usize;
    let (m, k, block) = (p.m as usize, p.k as usize, p.block as usize);
    let x = (p.x as *const f32).add(r * k);
    let g = p.norm as *const f32;
    let normed = p.norm != 0;
    // 1. the RMSNorm scale: a uniform branch (every thread reaches block_sum's barriers)
    let scale = if normed {
        let mut ss = 0.0f32;
        let mut c = tid;
        while c < k / 4 {
            let v = ld_f32x4(x.add(4 * c));
            ss += (v[0] * v[0] + v[1] * v[1]) + (v[2] * v[2] + v[3] * v[3]);
            c += threads;
        }
        rms_scale(block_sum(ss, scratch) / k as f32, p.eps)
    } else {
        1.0
    };
    // 2. 8 values per thread; a block's `block / 8` lanes are all inside the row or all past it
    //    (k % block == 0); lanes past it take zeros and store nothing, so every shuffle runs
    //    with the whole warp
    let at = 8 * (thread::block_idx_x() as usize * threads + tid);
    let live = at < k;
    let (d_at, bs_at, _) = act_layout(m, k, block);
    let lanes = block / 8;
    let mut v = [0.0f32; 8];
    if live {
        let (x0, x1) = (ld_f32x4(x.add(at)), ld_f32x4(x.add(at + 4)));
        v = [x0[0], x0[1], x0[2], x0[3], x1[0], x1[1], x1[2], x1[3]];
    }
    if normed && live {
        let (g0, g1) = (ld_f32x4(g.add(at)), ld_f32x4(g.add(at + 4)));
        let gs = [g0[0], g0[1], g0[2], g0[3], g1[0], g1[1], g1[2], g1[3]];
        for i in 0..8 {
            v[i] = v[i] * scale * gs[i];
        }
    }
    let mut amax = 0.0f32;
    for i in 0..8 {
        amax = amax.max(fabs(v[i]));
    }
    let mut o = 1;
    while o < lanes {
        amax = amax.max(shfl_xor(amax, o as u32));
        o *= 2;
    }
    let id = if amax > 0.0 { 127.0 / amax } else { 0.0 };
    let mut q = [0i32; 8];
    let mut sum = 0i32;
    for i in 0..8 {
        q[i] = round_mul(v[i], id).max(-127).min(127);
        sum += q[i];
    }
    // the sum of 16 values: this lane's 8 and its neighbour's (exact in f32)
    let s = sum as f32 + shfl_xor(sum as f32, 1);
    let lane = tid % 32;
    if !live {
        return; // after the last shuffle
    }
    if lane % 2 == 0 {
        *((p.acts as *mut u8).add(bs_at) as *mut i16).add((r * k + at) / 16) = s as i16;
    }
    let pack = |a: usize| (q[a] as u32 & 0xff) | (q[a + 1] as u32 & 0xff) << 8 | (q[a + 2] as u32 & 0xff) << 16 | (q[a + 3] as u32 & 0xff) << 24;
    let dst = (p.acts as *mut u8).add(r * k + at) as *mut u32;
    *dst = pack(0);
    *dst.add(1) = pack(4);
    if lane % lanes == 0 {
        *((p.acts as *mut u8).add(d_at) as *mut f32).add((r * k + at) / block) = amax / 127.0;
    }
}

/// The 8-bit activations of a row group: values, scales and 16-sums of row `row0`, with the
/// strides to the next rows.
#[derive(Clone, Copy)]
struct Acts {
    qs: *const u8,
    d: *const f32,
    bs: *const i16,
    k: usize,
    nb: usize,
}

impl Acts {
    #[inline(always)]
    unsafe fn new(acts: u64, m: usize, k: usize, block: usize, row0: usize) -> Acts {
        let (d_at, bs_at, _) = act_layout(m, k, block);
        let base = acts as *const u8;
        let nb = k / block;
        Acts { qs: base.add(row0 * k), d: (base.add(d_at) as *const f32).add(row0 * nb), bs: (base.add(bs_at) as *const i16).add(row0 * k / 16), k, nb }
    }

    /// 16 values of row `r` from element `e` (a multiple of 16).
    #[inline(always)]
    unsafe fn q16(&self, r: usize, e: usize) -> [u32; 4] {
        ld_nc_v4(self.qs.add(r * self.k + e) as *const u32)
    }

    /// Scale of activation block `b` of row `r`.
    #[inline(always)]
    unsafe fn d(&self, r: usize, b: usize) -> f32 {
        *self.d.add(r * self.nb + b)
    }

    /// Sum of the 16 values of row `r` from element `e`.
    #[inline(always)]
    unsafe fn bsum(&self, r: usize, e: usize) -> i32 {
        *self.bs.add((r * self.k + e) / 16) as i32
    }
}

/// One block-quantized weight type: a lane's share of a weight row's dot products.
trait QWeight {
    /// Values per activation scale this type takes (the CPU's choice).
    const ACT_BLOCK: usize;
    /// Adds this lane's share of `w[col] · acts[r]` to `acc[r]` for `r < rows`; `w` is the
    /// `[n, k]` tensor in the type's device layout.
    unsafe fn row_dots(w: u64, n: usize, k: usize, col: usize, lane: usize, a: &Acts, rows: usize, acc: &mut [f32; ROWS]);
}

struct Q8_0;
struct Q4K;
struct Q6K;

impl QWeight for Q8_0 {
    const ACT_BLOCK: usize = QK8_0;
    #[inline(always)]
    unsafe fn row_dots(w: u64, n: usize, k: usize, col: usize, lane: usize, a: &Acts, rows: usize, acc: &mut [f32; ROWS]) {
        let base = w as *const u8;
        let qs = base.add(col * k) as *const u32;
        let ds = (base.add(q8_0_d_at(n, k)) as *const u16).add(col * (k / QK8_0));
        let halves = k / 16;
        let step = |v: usize, q: [u32; 4], dw: f32, acc: &mut [f32; ROWS]| {
            for r in 0..ROWS {
                if r < rows {
                    acc[r] += dw * a.d(r, v / 2) * dot16(q, a.q16(r, 16 * v)) as f32;
                }
            }
        };
        // two halves per lane and round, the next round's loads issued before this round's
        // arithmetic (double buffering: four vectors in flight per lane)
        let load = |v: usize| (ld_nc_v4(qs.add(4 * v)), ld_nc_v4(qs.add(4 * (v + 32))), ld_nc_u16(ds.add(v / 2)), ld_nc_u16(ds.add((v + 32) / 2)));
        let mut v = lane;
        if v + 32 < halves {
            let mut cur = load(v);
            loop {
                let next_v = v + 64;
                let more = next_v + 32 < halves;
                let next = if more { load(next_v) } else { cur };
                step(v, cur.0, h2f(cur.2), acc);
                step(v + 32, cur.1, h2f(cur.3), acc);
                v = next_v;
                if !more {
                    break;
                }
                cur = next;
            }
        }
        if v < halves {
            step(v, ld_nc_v4(qs.add(4 * v)), h2f(ld_nc_u16(ds.add(v / 2))), acc);
        }
    }
}

impl QWeight for Q4K {
    const ACT_BLOCK: usize = QK_K;
    #[inline(always)]
    unsafe fn row_dots(w: u64, _n: usize, k: usize, col: usize, lane: usize, a: &Acts, rows: usize, acc: &mut [f32; ROWS]) {
        let s = k / QK_K;
        let row = (w as *const u8).add(col * s * Q4_K_BYTES);
        let (first, u) = (lane / SUPER_LANES, lane % SUPER_LANES);
        let (j0, h) = (2 * (u / 2), u % 2);
        // this lane's elements: 16 of sub-block j0 (low nibbles), 16 of j0 + 1 (high nibbles)
        let (e0, e1) = (32 * j0 + 16 * h, 32 * j0 + 32 + 16 * h);
        let per_step = 32 / SUPER_LANES;
        // a super-block's head and this lane's 16 value bytes; the next step's are loaded
        // before this step's arithmetic (double buffering, as the Q8_0 rows)
        let load = |b: usize| {
            let blk = row.add(b * Q4_K_BYTES) as *const u32;
            (ld_nc_v4(blk), ld_nc_v4(blk.add(4 + 4 * u)))
        };
        let mut b = first;
        let mut cur = if b < s { load(b) } else { ([0u32; 4], [0u32; 4]) };
        while b < s {
            let next_b = b + per_step;
            let next = if next_b < s { load(next_b) } else { cur };
            let (head, q) = cur;
            cur = next;
            let sc = q4_k_scale_bytes(head);
            let ((s0, m0), (s1, m1)) = (q4_k_scale_min(&sc, j0), q4_k_scale_min(&sc, j0 + 1));
            let (dw, dmin) = f16x2_to_f32(head[0]);
            let lo = [q[0] & 0x0f0f_0f0f, q[1] & 0x0f0f_0f0f, q[2] & 0x0f0f_0f0f, q[3] & 0x0f0f_0f0f];
            let hi = [(q[0] >> 4) & 0x0f0f_0f0f, (q[1] >> 4) & 0x0f0f_0f0f, (q[2] >> 4) & 0x0f0f_0f0f, (q[3] >> 4) & 0x0f0f_0f0f];
            for r in 0..ROWS {
                if r < rows {
                    let at = QK_K * b;
                    let sumi = s0 as i32 * dot16(lo, a.q16(r, at + e0)) + s1 as i32 * dot16(hi, a.q16(r, at + e1));
                    let summ = m0 as i32 * a.bsum(r, at + e0) + m1 as i32 * a.bsum(r, at + e1);
                    acc[r] += a.d(r, b) * (dw * sumi as f32 - dmin * summ as f32);
                }
            }
            b += per_step;
        }
    }
}

impl QWeight for Q6K {
    const ACT_BLOCK: usize = QK_K;
    #[inline(always)]
    unsafe fn row_dots(w: u64, n: usize, k: usize, col: usize, lane: usize, a: &Acts, rows: usize, acc: &mut [f32; ROWS]) {
        let s = k / QK_K;
        let base = w as *const u8;
        let (qh_at, sc_at, d_at) = q6_k_planes(n * s);
        let (first, u) = (lane / SUPER_LANES, lane % SUPER_LANES);
        // ql bytes 64 hh + o .. + 16 of each super-block: quarters t and t + 2 of half hh
        let (hh, o) = (u / 4, 16 * (u % 4));
        let (t, l0) = (o / 32, o % 32);
        let (e_lo, e_hi) = (128 * hh + 32 * t + l0, 128 * hh + 32 * (t + 2) + l0);
        let (sh_lo, sh_hi) = (2 * t as u32, 2 * (t + 2) as u32);
        let per_step = 32 / SUPER_LANES;
        // the step's value planes, sub-block scales and super-block scale; the next step's are
        // loaded before this step's arithmetic (double buffering, as the Q8_0 rows)
        let load = |b: usize| {
            let i = col * s + b;
            let ql = ld_nc_v4(base.add(128 * i + 64 * hh + o) as *const u32);
            let qh = ld_nc_v4(base.add(qh_at + 64 * i + 32 * hh + l0) as *const u32);
            let sc_lo = *(base.add(sc_at + 16 * i + e_lo / 16) as *const i8) as i32;
            let sc_hi = *(base.add(sc_at + 16 * i + e_hi / 16) as *const i8) as i32;
            (ql, qh, sc_lo, sc_hi, ld_nc_u16(base.add(d_at + 2 * i) as *const u16))
        };
        let mut b = first;
        let mut cur = if b < s { load(b) } else { ([0u32; 4], [0u32; 4], 0, 0, 0) };
        while b < s {
            let next_b = b + per_step;
            let next = if next_b < s { load(next_b) } else { cur };
            let (ql, qh, sc_lo, sc_hi, dh) = cur;
            cur = next;
            let dd = h2f(dh);
            let mut lo = [0u32; 4];
            let mut hi = [0u32; 4];
            for x in 0..4 {
                lo[x] = q6_k_center((ql[x] & 0x0f0f_0f0f) | ((qh[x] >> sh_lo) & 0x0303_0303) << 4);
                hi[x] = q6_k_center(((ql[x] >> 4) & 0x0f0f_0f0f) | ((qh[x] >> sh_hi) & 0x0303_0303) << 4);
            }
            for r in 0..ROWS {
                if r < rows {
                    let at = QK_K * b;
                    let sum = sc_lo * dot16(lo, a.q16(r, at + e_lo)) + sc_hi * dot16(hi, a.q16(r, at + e_hi));
                    acc[r] += a.d(r, b) * dd * sum as f32;
                }
            }
            b += per_step;
        }
    }
}

/// The warp's output feature, lane and row group (`None` past `n`: uniform per warp).
#[inline(always)]
fn warp_task(n: u32, m: u32) -> Option<(usize, usize, usize, usize)> {
    let tid = thread::thread_idx_x() as usize;
    let col = thread::block_idx_x() as usize * WARPS as usize + tid / 32;
    let row0 = thread::block_idx_y() as usize * ROWS;
    if col >= n as usize || row0 >= m as usize {
        return None;
    }
    Some((col, tid % 32, row0, (m as usize - row0).min(ROWS)))
}

#[inline(always)]
unsafe fn mmvq<W: QWeight>(p: QLinearParams) {
    // the quantized activations are the kernel's before (launched early on compute 9.0)
    grid_dep_wait();
    let (col, lane, row0, rows) = match warp_task(p.n, p.m) {
        Some(t) => t,
        None => return,
    };
    let (n, k) = (p.n as usize, p.k as usize);
    let a = Acts::new(p.acts, p.m as usize, k, W::ACT_BLOCK, row0);
    let mut acc = [0.0f32; ROWS];
    W::row_dots(p.w, n, k, col, lane, &a, rows, &mut acc);
    // the next kernel may launch: this block's weights are read
    grid_dep_launch();
    let (bias, res, c) = (p.bias as *const f32, p.residual as *const f32, p.c as *mut f32);
    for r in 0..ROWS {
        if r < rows {
            let total = warp_sum(acc[r]);
            if lane == 0 {
                let at = (row0 + r) * p.ldc as usize + col;
                let b = if bias.is_null() { 0.0 } else { *bias.add(col) };
                let x = if res.is_null() { 0.0 } else { *res.add(at) };
                *c.add(at) = total + b + x;
            }
        }
    }
}

#[inline(always)]
unsafe fn mmvq_gate_up<W: QWeight>(p: QLinearParams) {
    grid_dep_wait();
    let (col, lane, row0, rows) = match warp_task(p.n, p.m) {
        Some(t) => t,
        None => return,
    };
    let (n, k) = (p.n as usize, p.k as usize);
    let a = Acts::new(p.acts, p.m as usize, k, W::ACT_BLOCK, row0);
    let (mut g, mut u) = ([0.0f32; ROWS], [0.0f32; ROWS]);
    W::row_dots(p.w, n, k, col, lane, &a, rows, &mut g);
    W::row_dots(p.up, n, k, col, lane, &a, rows, &mut u);
    grid_dep_launch();
    for r in 0..ROWS {
        if r < rows {
            let (gs, us) = (warp_sum(g[r]), warp_sum(u[r]));
            if lane == 0 {
                *(p.c as *mut f32).add((row0 + r) * p.ldc as usize + col) = silu_mul(gs, us);
            }
        }
    }
}

/// `c = acts · wᵀ (+ bias) (+ residual)`, planar `Q8_0` weights. See the module docs.
#[kernel]
pub unsafe fn mmvq_q8_0(p: QLinearParams) {
    mmvq::<Q8_0>(p)
}

/// `c = acts · wᵀ (+ bias) (+ residual)`, `Q4_K` weights. See the module docs.
#[kernel]
pub unsafe fn mmvq_q4_k(p: QLinearParams) {
    mmvq::<Q4K>(p)
}

/// `c = acts · wᵀ (+ bias) (+ residual)`, planar `Q6_K` weights. See the module docs.
#[kernel]
pub unsafe fn mmvq_q6_k(p: QLinearParams) {
    mmvq::<Q6K>(p)
}

/// `c = silu(acts · wᵀ) ⊙ (acts · upᵀ)`, planar `Q8_0` weights. See the module docs.
#[kernel]
pub unsafe fn mmvq_gate_up_q8_0(p: QLinearParams) {
    mmvq_gate_up::<Q8_0>(p)
}

/// `c = silu(acts · wᵀ) ⊙ (acts · upᵀ)`, `Q4_K` weights. See the module docs.
#[kernel]
pub unsafe fn mmvq_gate_up_q4_k(p: QLinearParams) {
    mmvq_gate_up::<Q4K>(p)
}

/// `c = silu(acts · wᵀ) ⊙ (acts · upᵀ)`, planar `Q6_K` weights. See the module docs.
#[kernel]
pub unsafe fn mmvq_gate_up_q6_k(p: QLinearParams) {
    mmvq_gate_up::<Q6K>(p)
}
