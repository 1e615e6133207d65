//! Blocking shared by the x86-64 SIMD linear kernels (`avx512`, `avx2`); each ISA module only
//! supplies the register-level kernels through a [`Kernels`] table.
//!
//! Two regimes, both reading the weights exactly once and in their stored dtype:
//!
//! * **dot path** (`m ≤ Kernels::small_m`: decode, small batches, short prompts; the switch
//!   point was measured, 24 rows on both ISAs): memory-bound at `m = 1`. The `n` weight rows
//!   are cut into a few contiguous chunks per thread, so each thread streams one contiguous
//!   range of memory. Inside a chunk the kernel takes groups of `R` weight rows, widens them to
//!   f32 in registers (no scratch round trip) and accumulates their dot products with a few
//!   rows of `a` at a time, vectorised over `k`; the group stays in L1 while later chunks of
//!   `a` reuse it. Each weight row is software-prefetched a little ahead of its loads.
//! * **GEMM path** (larger `m`, prefill): compute-bound. `a` is packed once into groups of
//!   `lanes` rows stored k-major (`ap[g][kk][lane]`, zero-padded rows), so one vector holds
//!   `lanes` rows of `a` at one `kk`. Tasks own `NC = nr · TILES` weight rows (output columns);
//!   for each block of `kc` along `k` a task widens its `NC × kc` weight panel to f32 into a
//!   small scratch (packed once, reused by every row of `a`), then runs register tiles of
//!   `mrv · lanes` rows × `nr` columns over it (fewer rows: more columns): `mrv` vector loads
//!   of `a` and `nr` broadcast weights feed `mrv · nr` FMAs per `kk`. The `a` block
//!   (`kc × mrv · lanes` floats) stays in L1 across the tiles of a panel; partial sums live in
//!   a per-task column-major scratch `ct[NC][m_pad]` and are written to `out` (plus bias)
//!   after the last `k` block. The next weight block is software-prefetched a few lines per
//!   tile while the current one computes.

pub(crate) mod avx2;
pub(crate) mod avx512;
pub(crate) mod quant;

use super::weights::Weights;
use core::arch::x86_64::_MM_HINT_T1;
use gpu::math::{bf16_to_f32, f16_to_f32};
use super::pool;

/// Weight dtype tags, used as const generic parameters by the kernels.
pub(crate) const DT_F32: u8 = 0;
pub(crate) const DT_F16: u8 = 1;
pub(crate) const DT_BF16: u8 = 2;

/// Register tiles per GEMM task (a task owns `nr * TILES` weight rows).
const TILES: usize = 8;
/// Chunks per thread in the dot path (slack for threads slowed by a busy machine).
const DOT_CHUNKS_PER_THREAD: usize = 8;

/// `out` shared by tasks that each write a disjoint set of its elements.
#[derive(Clone, Copy)]
pub(crate) struct OutPtr(*mut f32);

impl OutPtr {
    /// Stores `v` at element `i`.
    ///
    /// # Safety
    /// `i` must be inside `out`, and no other task may access element `i` meanwhile.
    #[inline(always)]
    pub(crate) unsafe fn write(self, i: usize, v: f32) {
        *self.0.add(i) = v;
    }
}
// SAFETY: only used to hand disjoint output columns to pool tasks (see `dot_path` and
// `gemm_path`); no two tasks ever write the same element, and nobody reads `out` meanwhile.
unsafe impl Send for OutPtr {}
// SAFETY: as above.
unsafe impl Sync for OutPtr {}

/// The weight operand as a raw byte pointer plus dtype tag.
#[derive(Clone, Copy)]
pub(crate) struct RawW {
    pub(crate) ptr: *const u8,
    pub(crate) dt: u8,
}
// SAFETY: a `RawW` is made from a borrowed, immutable `Weights` slice that outlives the
// parallel call using it; tasks only ever read through it.
unsafe impl Send for RawW {}
// SAFETY: as above.
unsafe impl Sync for RawW {}

impl RawW {
    fn new(w: Weights<'_>) -> RawW {
        match w {
            Weights::F32(s) => RawW { ptr: s.as_ptr() as *const u8, dt: DT_F32 },
            Weights::F16(s) => RawW { ptr: s.as_ptr() as *const u8, dt: DT_F16 },
            Weights::Bf16(s) => RawW { ptr: s.as_ptr() as *const u8, dt: DT_BF16 },
        }
    }
}

/// Bytes per stored weight of dtype `dt`.
#[inline(always)]
pub(crate) const fn elem_size(dt: u8) -> usize {
    if dt == DT_F32 {
        4
    } else {
        2
    }
}

/// Element `i` of the weights at `w` (dtype `DT`), widened to f32 with the shared scalar math.
///
/// # Safety
/// `w` must point to at least `i + 1` weights of dtype `DT`.
#[inline(always)]
pub(crate) unsafe fn widen_at<const DT: u8>(w: *const u8, i: usize) -> f32 {
    match DT {
        DT_F32 => *(w as *const f32).add(i),
        DT_F16 => f16_to_f32(*(w as *const u16).add(i)),
        _ => bf16_to_f32(*(w as *const u16).add(i)),
    }
}

/// Cache lines for a GEMM tile to prefetch (into L2) while it computes: `lines` lines from
/// each of `rows` rows `stride` bytes apart, starting at `base`. Spreading them over the
/// tile's steps keeps few of them in flight at a time; a burst of prefetches fills the core's
/// line-fill buffers and stalls it.
#[derive(Clone, Copy)]
pub(crate) struct Prefetch {
    pub(crate) base: *const u8,
    pub(crate) stride: usize,
    pub(crate) rows: usize,
    pub(crate) lines: usize,
}

impl Prefetch {
    pub(crate) const NONE: Prefetch = Prefetch { base: std::ptr::null(), stride: 0, rows: 0, lines: 0 };

    /// Issues prefetch number `i` (row-major over rows × lines), if there is one.
    #[inline(always)]
    pub(crate) fn issue(&self, i: usize) {
        if i < self.rows * self.lines {
            let (r, l) = (i / self.lines, i % self.lines);
            // SAFETY: SSE is part of the x86-64 baseline; a prefetch reads nothing
            // architecturally and never faults, so any address is fine (wrapping_add keeps
            // the arithmetic defined).
            unsafe { core::arch::x86_64::_mm_prefetch::<_MM_HINT_T1>(self.base.wrapping_add(r * self.stride + l * 64) as *const i8) };
        }
    }

    /// Steps between two prefetches so that they spread over `steps`.
    #[inline(always)]
    pub(crate) fn every(&self, steps: usize) -> usize {
        (steps / (self.rows * self.lines + 1)).max(1)
    }
}

/// What one instruction set provides to the shared blocking.
pub(crate) struct Kernels {
    /// f32 lanes per vector: rows of `a` held by one packed vector in the GEMM path.
    pub(crate) lanes: usize,
    /// GEMM register tile: up to `mrv` vectors of rows of `a` ...
    pub(crate) mrv: usize,
    /// ... times `nr` weight rows (output columns).
    pub(crate) nr: usize,
    /// GEMM block length along `k` (the packed `a` block is `kc × mrv · lanes` floats).
    pub(crate) kc: usize,
    /// `tiles_per_call[gv]`: how many `nr`-column tiles one `tile` call may cover for `gv` row
    /// vectors (narrow row blocks use wider column blocks).
    pub(crate) tiles_per_call: &'static [usize],
    /// Largest `m` handled by the dot path.
    pub(crate) small_m: usize,
    /// Dot path: `out[r, c0 + j] = a[r] · w[c0 + j] + bias` for `r < m ≤ small_m`, `j < cols`.
    pub(crate) dot_rows:
        unsafe fn(a: &[f32], m: usize, k: usize, w: RawW, c0: usize, cols: usize, bias: Option<&[f32]>, out: OutPtr, n: usize),
    /// GEMM path: widens weights `[c0, c0 + cols) × [k0, k0 + kc)` into `dst` (row stride `ld`).
    pub(crate) widen: unsafe fn(w: RawW, c0: usize, cols: usize, k: usize, k0: usize, kc: usize, dst: *mut f32, ld: usize),
    /// GEMM path: one register tile of `gv ≤ mrv` row vectors × `nt · nr` columns over `kc`
    /// steps: `ct[j * ld_c + v * lanes + l] (+)= Σ_kk ap[v * ap_stride + kk * lanes + l] · wf[j * ld_w + kk]`,
    /// overwriting `ct` when `first`, accumulating otherwise. The tile also issues the
    /// prefetches of `pf`, spread over its `kc` steps.
    #[allow(clippy::type_complexity)]
    pub(crate) tile: unsafe fn(
        gv: usize,
        nt: usize,
        ap: *const f32,
        ap_stride: usize,
        wf: *const f32,
        ld_w: usize,
        kc: usize,
        ct: *mut f32,
        ld_c: usize,
        first: bool,
        pf: Prefetch,
    ),
}

/// `out = a · wᵀ + bias` on the given kernels (the caller checked the CPU supports them).
pub(crate) fn linear(kern: &Kernels, a: &[f32], w: Weights<'_>, bias: Option<&[f32]>, m: usize, n: usize, k: usize, out: &mut [f32]) {
    if m <= kern.small_m {
        dot_path(kern, a, RawW::new(w), bias, m, n, k, out);
    } else {
        gemm_path(kern, a, RawW::new(w), bias, m, n, k, out);
    }
}

fn dot_path(kern: &Kernels, a: &[f32], w: RawW, bias: Option<&[f32]>, m: usize, n: usize, k: usize, out: &mut [f32]) {
    let chunks = pool::threads() * DOT_CHUNKS_PER_THREAD;
    let chunk = round_up(n.div_ceil_(chunks).max(8), 8);
    let out = OutPtr(out.as_mut_ptr());
    pool::for_each(n.div_ceil_(chunk), |t| {
        let c0 = t * chunk;
        let cols = chunk.min(n - c0);
        // SAFETY: the kernels were chosen for this CPU; `a` holds `m * k` floats, the weights
        // `n * k` elements and `out` `m * n` floats (checked by `linear`); this task writes only
        // columns `c0..c0 + cols` of `out`, disjoint from every other task's.
        unsafe { (kern.dot_rows)(a, m, k, w, c0, cols, bias, out, n) }
    });
}

/// Shapes of one GEMM-path call: `a` is `[m, k]`, `w` `[n, k]`; `a` packed as `groups` groups
/// of `lanes` rows (`m_pad = groups * lanes`).
#[derive(Clone, Copy)]
struct Dims {
    m: usize,
    n: usize,
    k: usize,
    groups: usize,
    m_pad: usize,
    /// Block length along `k` (`Kernels::kc`).
    kc: usize,
}

fn gemm_path(kern: &Kernels, a: &[f32], w: RawW, bias: Option<&[f32]>, m: usize, n: usize, k: usize, out: &mut [f32]) {
    let groups = m.div_ceil_(kern.lanes);
    let d = Dims { m, n, k, groups, m_pad: groups * kern.lanes, kc: kern.kc };
    let ap = pack_a(a, d, kern.lanes);
    let nc = kern.nr * TILES;
    let out = OutPtr(out.as_mut_ptr());
    pool::for_each_init(
        n.div_ceil_(nc),
        || (vec![0.0f32; nc * d.kc], vec![0.0f32; nc * d.m_pad]),
        |(wf, ct), t| gemm_task(kern, &ap, w, bias, d, t * nc, wf, ct, out),
    );
}

/// `a` packed k-major per group of `lanes` rows: `ap[g][kk][l] = a[g * lanes + l][kk]`, zero
/// past row `m`.
fn pack_a(a: &[f32], d: Dims, lanes: usize) -> Vec<f32> {
    let mut ap = vec![0.0f32; d.m_pad * d.k];
    pool::chunks_mut(&mut ap, d.k * lanes, |g, blk| {
        let rows = lanes.min(d.m - g * lanes);
        // 64 columns at a time, so the 64 destination lines stay in L1 across the rows
        for kb in (0..d.k).step_by(64) {
            let kn = 64.min(d.k - kb);
            for l in 0..rows {
                let src = &a[(g * lanes + l) * d.k + kb..][..kn];
                for (i, &x) in src.iter().enumerate() {
                    blk[(kb + i) * lanes + l] = x;
                }
            }
        }
    });
    ap
}

/// One GEMM task: output columns `c0..c0 + NC` (weight rows) for all rows of `a`, using the
/// task scratch `wf` (`NC × kc` widened weights) and `ct` (`NC × m_pad` partial sums).
#[allow(clippy::too_many_arguments)]
fn gemm_task(kern: &Kernels, ap: &[f32], w: RawW, bias: Option<&[f32]>, d: Dims, c0: usize, wf: &mut [f32], ct: &mut [f32], out: OutPtr) {
    let (lanes, nr, kcb, k, es) = (kern.lanes, kern.nr, d.kc, d.k, elem_size(w.dt));
    let nc = nr * TILES;
    let cols = nc.min(d.n - c0);
    let cols_pad = round_up(cols, nr);
    // padding columns of a short last task multiply zeros
    wf[cols * kcb..cols_pad * kcb].iter_mut().for_each(|x| *x = 0.0);
    for k0 in (0..k).step_by(kcb) {
        let kc = kcb.min(k - k0);
        // SAFETY: rows c0..c0 + cols and elements k0..k0 + kc lie inside the `n × k` weights;
        // `wf` holds `nc` rows of `kcb >= kc` floats.
        unsafe { (kern.widen)(w, c0, cols, k, k0, kc, wf.as_mut_ptr(), kcb) };
        // What the next widen reads: this panel's next k block, or after the last one the
        // first block of the next panel (likely this thread's next task).
        let (pf_c0, pf_k0) = if k0 + kc < k { (c0, k0 + kc) } else { (c0 + nc, 0) };
        let pf_cols = nc.min(d.n.saturating_sub(pf_c0));
        let pf_lines = (kcb.min(k - pf_k0) * es + 63) / 64;
        for g0 in (0..d.groups).step_by(kern.mrv) {
            let gv = kern.mrv.min(d.groups - g0);
            let mut jt = 0;
            while jt < cols_pad {
                let nt = kern.tiles_per_call[gv].min((cols_pad - jt) / nr);
                let width = nt * nr;
                // the tiles of the first row group prefetch the next block of their rows
                let pf = if g0 == 0 && jt < pf_cols {
                    let base = w.ptr.wrapping_add(((pf_c0 + jt) * k + pf_k0) * es);
                    Prefetch { base, stride: k * es, rows: width.min(pf_cols - jt), lines: pf_lines }
                } else {
                    Prefetch::NONE
                };
                // SAFETY: the tile reads `gv` groups of `ap` (each `k * lanes` floats, from
                // `k0` on for `kc <= k - k0` steps), rows jt..jt + width of `wf` (`jt + width <=
                // cols_pad <= nc`, padding rows zeroed) and updates `width` columns × `gv *
                // lanes` rows of `ct` (`g0 + gv <= groups`), all in bounds.
                unsafe {
                    (kern.tile)(
                        gv,
                        nt,
                        ap.as_ptr().add((g0 * k + k0) * lanes),
                        k * lanes,
                        wf.as_ptr().add(jt * kcb),
                        kcb,
                        kc,
                        ct.as_mut_ptr().add(jt * d.m_pad + g0 * lanes),
                        d.m_pad,
                        k0 == 0,
                        pf,
                    )
                };
                jt += width;
            }
        }
    }
    for r in 0..d.m {
        for j in 0..cols {
            let b = bias.map_or(0.0, |b| b[c0 + j]);
            // SAFETY: r < m and c0 + j < n, inside `out` (m * n floats); columns c0..c0 + cols
            // belong to this task only.
            unsafe { out.write(r * d.n + c0 + j, ct[j * d.m_pad + r] + b) };
        }
    }
}

fn round_up(x: usize, to: usize) -> usize {
    x.div_ceil_(to) * to
}

/// `usize::div_ceil` is not stable on the pinned toolchain.
trait DivCeil {
    fn div_ceil_(self, d: Self) -> Self;
}

impl DivCeil for usize {
    fn div_ceil_(self, d: usize) -> usize {
        (self + d - 1) / d
    }
}
