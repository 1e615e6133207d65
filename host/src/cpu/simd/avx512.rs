//! AVX-512F kernels (16 f32 lanes, 32 vector registers). bf16 is widened with a zero-extend
//! and a 16-bit shift, f16 with `vcvtph2ps`; all accumulation is f32 FMA.
//!
//! * dot path: `R` weight rows (8 when `m = 1`, else 6) × chunks of up to 4 rows of `a` per
//!   register block, `≤ 24` accumulators of 16 k-lanes each, reduced once per row; the weight
//!   group stays in L1 while further chunks of `a` reuse it. Reading `R` rows side by side
//!   gives the hardware prefetchers `R` streams (measured faster than one row at a time), and
//!   each row is also software-prefetched `PF_DIST` bytes ahead.
//! * GEMM tile: 4 vectors (64 rows of `a`) × 6 weight rows = 24 accumulators; per `kk` it
//!   loads 4 vectors of packed `a` and broadcasts 6 widened weights (24 FMAs). Fewer rows of
//!   `a` (m tails, short prompts) take more columns: 2 × 12, 1 × 24.

use super::{elem_size, widen_at, Kernels, OutPtr, Prefetch, RawW, DT_BF16, DT_F16, DT_F32};
use core::arch::x86_64::*;

/// f32 lanes per vector.
const L: usize = 16;
/// GEMM tile columns (weight rows).
const NR: usize = 6;
/// Dot path register block for `m ≥ 2`: chunks of up to `DOT_MR` rows of `a` × `DOT_R` weight rows.
const DOT_MR: usize = 4;
const DOT_R: usize = 6;
/// Dot path software prefetch distance along each weight row, in bytes (tuned: 512 beat 1024).
const PF_DIST: usize = 512;

/// GEMM tiles per call by row vectors: narrow row blocks take wider column blocks, so that
/// every tile keeps 24 accumulators (enough independent FMAs, fewer loads per FMA).
const TILES_PER_CALL: [usize; 5] = [0, 4, 2, 1, 1];

pub(crate) static KERNELS: Kernels =
    Kernels { lanes: L, mrv: 4, nr: NR, kc: 64, small_m: 24, tiles_per_call: &TILES_PER_CALL, dot_rows, widen, tile };

/// Weights `i..i + 16` of `w` (dtype `DT`) widened to f32.
#[inline]
#[target_feature(enable = "avx512f")]
unsafe fn load_w<const DT: u8>(w: *const u8, i: usize) -> __m512 {
    match DT {
        DT_F32 => _mm512_loadu_ps((w as *const f32).add(i)),
        DT_F16 => _mm512_cvtph_ps(_mm256_loadu_si256((w as *const u16).add(i) as *const __m256i)),
        _ => {
            let h = _mm256_loadu_si256((w as *const u16).add(i) as *const __m256i);
            _mm512_castsi512_ps(_mm512_slli_epi32::<16>(_mm512_cvtepu16_epi32(h)))
        }
    }
}

/// Weights `i..i + len` (`len < 16`) widened, zero-padded to a vector.
#[inline]
#[target_feature(enable = "avx512f")]
unsafe fn load_w_tail<const DT: u8>(w: *const u8, i: usize, len: usize) -> __m512 {
    let mut t = [0.0f32; L];
    for (e, d) in t.iter_mut().enumerate().take(len) {
        *d = widen_at::<DT>(w, i + e);
    }
    _mm512_loadu_ps(t.as_ptr())
}

/// Floats `p[0..len]` (`len < 16`), zero-padded to a vector.
#[inline]
#[target_feature(enable = "avx512f")]
unsafe fn load_tail(p: *const f32, len: usize) -> __m512 {
    let mut t = [0.0f32; L];
    t[..len].copy_from_slice(std::slice::from_raw_parts(p, len));
    _mm512_loadu_ps(t.as_ptr())
}

/// Dot-path entry: picks the monomorphised kernel for the dtype and `m`.
///
/// # Safety
/// The CPU supports AVX-512F; `a` holds `m * k` floats, `w` `n * k` weights, `out` `m * n`
/// floats, `c0 + cols <= n`, and no other task touches columns `c0..c0 + cols` of `out`.
unsafe fn dot_rows(a: &[f32], m: usize, k: usize, w: RawW, c0: usize, cols: usize, bias: Option<&[f32]>, out: OutPtr, n: usize) {
    match w.dt {
        DT_F32 => dot_rows_dt::<DT_F32>(a, m, k, w.ptr, c0, cols, bias, out, n),
        DT_F16 => dot_rows_dt::<DT_F16>(a, m, k, w.ptr, c0, cols, bias, out, n),
        _ => dot_rows_dt::<DT_BF16>(a, m, k, w.ptr, c0, cols, bias, out, n),
    }
}

#[target_feature(enable = "avx512f")]
unsafe fn dot_rows_dt<const DT: u8>(
    a: &[f32],
    m: usize,
    k: usize,
    w: *const u8,
    c0: usize,
    cols: usize,
    bias: Option<&[f32]>,
    out: OutPtr,
    n: usize,
) {
    let a = a.as_ptr();
    if m == 1 {
        dot_block::<DT, 8>(a, 1, k, w, c0, cols, bias, out, n);
    } else {
        dot_block::<DT, DOT_R>(a, m, k, w, c0, cols, bias, out, n);
    }
}

/// Columns `c0..c0 + cols` for all `m` rows of `a`: groups of `R` weight rows (then single
/// rows), each group taken against chunks of at most `DOT_MR` rows of `a` while it is in cache.
#[target_feature(enable = "avx512f")]
unsafe fn dot_block<const DT: u8, const R: usize>(
    a: *const f32,
    m: usize,
    k: usize,
    w: *const u8,
    c0: usize,
    cols: usize,
    bias: Option<&[f32]>,
    out: OutPtr,
    n: usize,
) {
    let row_bytes = k * elem_size(DT);
    let end = c0 + cols;
    let mut c = c0;
    while c + R <= end {
        dot_chunks::<DT, R>(a, m, k, w.add(c * row_bytes), c, bias, out, n);
        c += R;
    }
    while c < end {
        dot_chunks::<DT, 1>(a, m, k, w.add(c * row_bytes), c, bias, out, n);
        c += 1;
    }
}

/// `out[r, c + j]` for all rows `r` of `a` and the `R` weight rows at `w`, in chunks of rows.
#[inline]
#[target_feature(enable = "avx512f")]
unsafe fn dot_chunks<const DT: u8, const R: usize>(
    a: *const f32,
    m: usize,
    k: usize,
    w: *const u8,
    c: usize,
    bias: Option<&[f32]>,
    out: OutPtr,
    n: usize,
) {
    let mut r0 = 0;
    while r0 < m {
        let mr = DOT_MR.min(m - r0);
        // prefetch while the group is first read from memory
        let pf = r0 == 0;
        let ar = a.add(r0 * k);
        match mr {
            1 => store_dot(&dot_group::<DT, 1, R>(ar, k, w, pf), r0, c, bias, out, n),
            2 => store_dot(&dot_group::<DT, 2, R>(ar, k, w, pf), r0, c, bias, out, n),
            3 => store_dot(&dot_group::<DT, 3, R>(ar, k, w, pf), r0, c, bias, out, n),
            _ => {
                assert_eq!(mr, DOT_MR, "a chunk has at most DOT_MR rows");
                store_dot(&dot_group::<DT, DOT_MR, R>(ar, k, w, pf), r0, c, bias, out, n)
            }
        }
        r0 += mr;
    }
}

/// `out[r0 + r, c + j] = res[r][j] + bias[c + j]`.
#[inline(always)]
unsafe fn store_dot<const MR: usize, const R: usize>(
    res: &[[f32; R]; MR],
    r0: usize,
    c: usize,
    bias: Option<&[f32]>,
    out: OutPtr,
    n: usize,
) {
    for (r, row) in res.iter().enumerate() {
        for (j, &v) in row.iter().enumerate() {
            out.write((r0 + r) * n + c + j, v + bias.map_or(0.0, |b| b[c + j]));
        }
    }
}

/// `res[r][j] = a[r] · w[j]` for `MR` rows of `a` (stride `k`) and `R` contiguous weight rows
/// at `w`, widened in registers. Each main-loop step covers one 64-byte cache line of every
/// weight row; with `pf` it also prefetches, per row, the line `PF_DIST` bytes ahead.
#[inline]
#[target_feature(enable = "avx512f")]
unsafe fn dot_group<const DT: u8, const MR: usize, const R: usize>(a: *const f32, k: usize, w: *const u8, pf: bool) -> [[f32; R]; MR] {
    let es = elem_size(DT);
    let step = 64 / es; // weights per cache line: a whole number of vectors
    let mut acc = [[_mm512_setzero_ps(); R]; MR];
    let mut x = [_mm512_setzero_ps(); MR];
    let mut i = 0;
    while i + step <= k {
        if pf {
            for j in 0..R {
                _mm_prefetch::<_MM_HINT_T0>(w.wrapping_add((j * k + i) * es + PF_DIST) as *const i8);
            }
        }
        for v in 0..step / L {
            let u = i + v * L;
            for (r, xr) in x.iter_mut().enumerate() {
                *xr = _mm512_loadu_ps(a.add(r * k + u));
            }
            for j in 0..R {
                let wv = load_w::<DT>(w, j * k + u);
                for r in 0..MR {
                    acc[r][j] = _mm512_fmadd_ps(x[r], wv, acc[r][j]);
                }
            }
        }
        i += step;
    }
    while i < k {
        let len = L.min(k - i);
        for (r, xr) in x.iter_mut().enumerate() {
            *xr = if len == L { _mm512_loadu_ps(a.add(r * k + i)) } else { load_tail(a.add(r * k + i), len) };
        }
        for j in 0..R {
            let wv = if len == L { load_w::<DT>(w, j * k + i) } else { load_w_tail::<DT>(w, j * k + i, len) };
            for r in 0..MR {
                acc[r][j] = _mm512_fmadd_ps(x[r], wv, acc[r][j]);
            }
        }
        i += len;
    }
    let mut res = [[0.0f32; R]; MR];
    for r in 0..MR {
        for j in 0..R {
            res[r][j] = _mm512_reduce_add_ps(acc[r][j]);
        }
    }
    res
}

/// GEMM widen entry (see [`Kernels::widen`]).
///
/// # Safety
/// AVX-512F present; rows `c0..c0 + cols` × elements `k0..k0 + kc` inside the `n × k` weights;
/// `dst` holds `cols` rows of `ld >= kc` floats.
unsafe fn widen(w: RawW, c0: usize, cols: usize, k: usize, k0: usize, kc: usize, dst: *mut f32, ld: usize) {
    match w.dt {
        DT_F32 => widen_dt::<DT_F32>(w.ptr, c0, cols, k, k0, kc, dst, ld),
        DT_F16 => widen_dt::<DT_F16>(w.ptr, c0, cols, k, k0, kc, dst, ld),
        _ => widen_dt::<DT_BF16>(w.ptr, c0, cols, k, k0, kc, dst, ld),
    }
}

#[target_feature(enable = "avx512f")]
unsafe fn widen_dt<const DT: u8>(w: *const u8, c0: usize, cols: usize, k: usize, k0: usize, kc: usize, dst: *mut f32, ld: usize) {
    for j in 0..cols {
        let src = (c0 + j) * k + k0;
        let d = dst.add(j * ld);
        let mut i = 0;
        while i + L <= kc {
            _mm512_storeu_ps(d.add(i), load_w::<DT>(w, src + i));
            i += L;
        }
        for t in i..kc {
            *d.add(t) = widen_at::<DT>(w, src + t);
        }
    }
}

/// GEMM tile entry (see [`Kernels::tile`]): `gv` vectors of rows × `nt · NR` columns.
///
/// # Safety
/// AVX-512F present; `1 <= gv <= 4`, `1 <= nt <= TILES_PER_CALL[gv]`; `ap`, `wf`, `ct` valid for
/// the extents described there.
#[allow(clippy::too_many_arguments)]
unsafe fn tile(
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
) {
    match (gv, nt) {
        (4, _) => tile_g::<4, NR>(ap, ap_stride, wf, ld_w, kc, ct, ld_c, first, pf),
        (3, _) => tile_g::<3, NR>(ap, ap_stride, wf, ld_w, kc, ct, ld_c, first, pf),
        (2, 1) => tile_g::<2, NR>(ap, ap_stride, wf, ld_w, kc, ct, ld_c, first, pf),
        (2, _) => tile_g::<2, { 2 * NR }>(ap, ap_stride, wf, ld_w, kc, ct, ld_c, first, pf),
        (_, 1) => tile_g::<1, NR>(ap, ap_stride, wf, ld_w, kc, ct, ld_c, first, pf),
        (_, 2) => tile_g::<1, { 2 * NR }>(ap, ap_stride, wf, ld_w, kc, ct, ld_c, first, pf),
        (_, 3) => tile_g::<1, { 3 * NR }>(ap, ap_stride, wf, ld_w, kc, ct, ld_c, first, pf),
        _ => tile_g::<1, { 4 * NR }>(ap, ap_stride, wf, ld_w, kc, ct, ld_c, first, pf),
    }
}

/// `G` vectors of 16 rows × `C` columns, accumulated in registers over `kc` steps.
#[allow(clippy::too_many_arguments)]
#[target_feature(enable = "avx512f")]
unsafe fn tile_g<const G: usize, const C: usize>(
    ap: *const f32,
    ap_stride: usize,
    wf: *const f32,
    ld_w: usize,
    kc: usize,
    ct: *mut f32,
    ld_c: usize,
    first: bool,
    pf: Prefetch,
) {
    let mut acc = [[_mm512_setzero_ps(); G]; C];
    if !first {
        for (j, accj) in acc.iter_mut().enumerate() {
            for (v, a) in accj.iter_mut().enumerate() {
                *a = _mm512_loadu_ps(ct.add(j * ld_c + v * L));
            }
        }
    }
    let mut x = [_mm512_setzero_ps(); G];
    let (every, mut next, mut issued) = (pf.every(kc), 0, 0);
    for kk in 0..kc {
        if kk == next {
            pf.issue(issued);
            issued += 1;
            next += every;
        }
        for (v, xv) in x.iter_mut().enumerate() {
            *xv = _mm512_loadu_ps(ap.add(v * ap_stride + kk * L));
        }
        for (j, accj) in acc.iter_mut().enumerate() {
            let b = _mm512_set1_ps(*wf.add(j * ld_w + kk));
            for (v, a) in accj.iter_mut().enumerate() {
                *a = _mm512_fmadd_ps(x[v], b, *a);
            }
        }
    }
    for (j, accj) in acc.iter().enumerate() {
        for (v, a) in accj.iter().enumerate() {
            _mm512_storeu_ps(ct.add(j * ld_c + v * L), *a);
        }
    }
}
