//! x86-64 kernels for block-quantized weights against 8-bit activations (see `cpu/qlinear`).
//!
//! One kernel body (`kernels!`) is instantiated per instruction set, differing only in the two
//! integer dot-product primitives it is given:
//!
//! * `dpbusd(acc, u, s)`: `acc[i] += Σ_{4 bytes} u8 · i8` (AVX-512 VNNI's and AVX-VNNI's
//!   `vpdpbusd`; on plain AVX2 `vpmaddubsw` + `vpmaddwd` with ones + `vpaddd`);
//! * `dpwssd(acc, a, b)`: `acc[i] += Σ_{2 words} i16 · i16` (`vpdpwssd`; AVX2: `vpmaddwd` +
//!   `vpaddd`).
//!
//! The vectors are 256 bits on every path: a 32-byte vector is one `Q8_0` block or one `Q4_K`
//! sub-block, so the sub-block scales apply per vector without shuffles. On AVX-512 VNNI CPUs the
//! EVEX forms run with 32 vector registers.
//!
//! Per weight row and block the weights are unpacked once (4-bit / 6-bit values to bytes in
//! element order, scales to 16-bit lanes) into a small buffer, then taken against every row of
//! activations: `vpmaddubsw` (unsigned weight bytes × signed activations → 16-bit pair sums,
//! which cannot saturate: 63 · 127 · 2 < 2¹⁵) then `dpwssd` with the sub-block scales. The
//! K-quants' min / offset terms come from the activations' 16-value sums (one `vpmaddwd`). A
//! block's integer result is converted once and accumulated in f32 lanes per activation row.
//! `Q8_0` (signed weights) uses `dpbusd(|w|, sign(a, w))`.
//!
//! From [`PANEL_MIN_ROWS`] activation rows on, AVX-512 VNNI CPUs take `panel.rs` instead: 16
//! weight rows unpacked per 256 values into an interleaved panel (4 values of 8 columns per
//! vector), `vpdpbusd` against broadcast activation bytes, 4 activation rows × 16 columns in
//! registers, no sums across lanes (prefill at about twice the multiply-adds per second).

mod kernels;
mod panel;

/// Activation rows from which AVX-512 VNNI CPUs take the interleaved panels of `panel.rs`
/// (fewer rows take the vector kernels of `kernels.rs`; measured on the 2-core AMD machine, the
/// panels are ahead from 4 rows for `Q4_K` and `Q8_0` and from 8 for every type).
pub(crate) const PANEL_MIN_ROWS: usize = 4;

/// Whether the panels are used (`QWEN3_VL_CPU_PANELS=0` turns them off: an A/B aid for
/// benchmarks).
static PANELS: crate::switch::Switch = crate::switch::Switch::new("QWEN3_VL_CPU_PANELS");

/// How far ahead (bytes) the one-row GEMVs prefetch their weights: 2 KiB on Intel CPUs, whose
/// hardware prefetchers left the 2-core machine's decode at about half its read bandwidth
/// (the machine of 2026-11-25, Q4_K_M decode by distance: 0 → 10.1, 1 KiB → 14.4, 2 KiB → 15.4,
/// 4 KiB → 14.6 tok/s; Q8_0 7.2 → 11.1–11.5 at 2 KiB); none elsewhere (on the 2-core AMD
/// machine a 2 KiB prefetch made the Q8_0 GEMV 7% slower). `QWEN3_VL_GEMV_PREFETCH=BYTES`
/// overrides it (0: off; read once; an A/B aid for benchmarks).
pub(crate) fn gemv_prefetch() -> usize {
    static CACHED: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(usize::MAX);
    let c = CACHED.load(std::sync::atomic::Ordering::Relaxed);
    if c != usize::MAX {
        return c;
    }
    let by_vendor = if intel() { 2048 } else { 0 };
    let v = match std::env::var("QWEN3_VL_GEMV_PREFETCH") {
        Ok(s) => match s.trim().parse::<usize>() {
            Ok(n) if n <= 1 << 20 => n,
            _ => {
                log::warn!("QWEN3_VL_GEMV_PREFETCH={:?} is not a byte count up to 1048576: using {}", s, by_vendor);
                by_vendor
            }
        },
        Err(_) => by_vendor,
    };
    CACHED.store(v, std::sync::atomic::Ordering::Relaxed);
    v
}

/// Whether the CPU's vendor string (CPUID leaf 0) is "GenuineIntel".
fn intel() -> bool {
    // CPUID leaf 0 exists on every x86-64 CPU.
    let r = __cpuid(0);
    let mut v = [0u8; 12];
    v[..4].copy_from_slice(&r.ebx.to_le_bytes());
    v[4..8].copy_from_slice(&r.edx.to_le_bytes());
    v[8..].copy_from_slice(&r.ecx.to_le_bytes());
    &v == b"GenuineIntel"
}

use crate::cpu::qisa::QIsa;
use crate::quant::act::Q8Acts;
use crate::DType;
use core::arch::x86_64::*;

/// Quantizes one activation row (see [`crate::quant::act::quantize_row`]; same bits).
pub(crate) fn quantize_row(x: &[f32], block: usize, qs: &mut [i8], d: &mut [f32], bs: &mut [i16]) {
    // SAFETY: every x86 quantized path requires AVX2 (checked by `QIsa::is_available`); the
    // slices hold `x.len()` values, `x.len() / block` scales and `x.len() / 16` sums.
    unsafe { quantize_row_avx2(x, block, qs, d, bs) }
}

#[target_feature(enable = "avx2")]
unsafe fn quantize_row_avx2(x: &[f32], block: usize, qs: &mut [i8], d: &mut [f32], bs: &mut [i16]) {
    let n = x.len();
    assert!(n % block == 0 && block % 32 == 0 && qs.len() >= n && d.len() >= n / block && bs.len() >= n / 16);
    let sign = _mm256_set1_ps(-0.0);
    for b in 0..n / block {
        let xs = x.as_ptr().add(b * block);
        let mut mx = _mm256_setzero_ps();
        for i in (0..block).step_by(8) {
            mx = _mm256_max_ps(mx, _mm256_andnot_ps(sign, _mm256_loadu_ps(xs.add(i))));
        }
        let mut lanes = [0.0f32; 8];
        _mm256_storeu_ps(lanes.as_mut_ptr(), mx);
        let amax = lanes.iter().fold(0.0f32, |m, &v| m.max(v));
        let id = if amax > 0.0 { 127.0 / amax } else { 0.0 };
        d[b] = amax / 127.0;
        let idv = _mm256_set1_ps(id);
        let (lo, hi) = (_mm256_set1_epi32(-127), _mm256_set1_epi32(127));
        let q = qs.as_mut_ptr().add(b * block);
        for i in (0..block).step_by(32) {
            let mut v = [_mm256_setzero_si256(); 4];
            for (t, vt) in v.iter_mut().enumerate() {
                let r = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(xs.add(i + 8 * t)), idv));
                *vt = _mm256_min_epi32(_mm256_max_epi32(r, lo), hi);
            }
            // pack 32 i32 → 32 i8 in order (packs work per 128-bit lane: fix with a permute)
            let p16a = _mm256_packs_epi32(v[0], v[1]);
            let p16b = _mm256_packs_epi32(v[2], v[3]);
            let p8 = _mm256_packs_epi16(p16a, p16b);
            let p8 = _mm256_permutevar8x32_epi32(p8, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
            _mm256_storeu_si256(q.add(i) as *mut __m256i, p8);
            // 16-value sums
            let s16 = _mm256_maddubs_epi16(_mm256_set1_epi8(1), p8);
            let s32 = _mm256_madd_epi16(s16, _mm256_set1_epi16(1)); // 8 sums of 4
            let mut t = [0i32; 8];
            _mm256_storeu_si256(t.as_mut_ptr() as *mut __m256i, s32);
            let g = (b * block + i) / 16;
            bs[g] = (t[0] + t[1] + t[2] + t[3]) as i16;
            bs[g + 1] = (t[4] + t[5] + t[6] + t[7]) as i16;
        }
    }
}

/// `res[r · cols + j]` = dot of weight row `j` of `rows` (`cols` rows of block type `wt`) with
/// activation row `r`.
pub(crate) fn dots(isa: QIsa, wt: DType, rows: &[u8], row_bytes: usize, acts: &Q8Acts, res: &mut [f32]) {
    assert!(isa.is_available() && rows.len() % row_bytes.max(1) == 0 && res.len() >= rows.len() / row_bytes.max(1) * acts.rows);
    // SAFETY: the CPU supports `isa` (asserted); the kernels read whole blocks of `rows` and
    // rows of `acts` (all `k` long), and write `res` as sized above.
    unsafe {
        match isa {
            QIsa::Avx512Vnni if acts.rows >= PANEL_MIN_ROWS && PANELS.on() => panel::evex::dots(wt, rows, row_bytes, acts, res),
            QIsa::Avx512Vnni => kernels::evex::dots(wt, rows, row_bytes, acts, res),
            QIsa::AvxVnni => kernels::vex::dots(wt, rows, row_bytes, acts, res),
            _ => kernels::avx2::dots(wt, rows, row_bytes, acts, res),
        }
    }
}

/// AVX-512 VNNI's dot-product primitives on 256-bit vectors (EVEX forms: 32 registers), shared
/// by the vector kernels and the panels.
mod evex_dot {
    use core::arch::x86_64::*;

    /// `acc[i] += Σ_{4 bytes} u8 · i8`.
    #[inline]
    #[target_feature(enable = "avx,avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
    pub(crate) unsafe fn dpbusd(acc: __m256i, u: __m256i, s: __m256i) -> __m256i {
        _mm256_dpbusd_epi32(acc, u, s)
    }

    /// `acc[i] += Σ_{2 words} i16 · i16`.
    #[inline]
    #[target_feature(enable = "avx,avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
    pub(crate) unsafe fn dpwssd(acc: __m256i, a: __m256i, b: __m256i) -> __m256i {
        _mm256_dpwssd_epi32(acc, a, b)
    }
}

/// The 256 4-bit values of the `Q4_K` block at `blk` as 8 vectors of 32 bytes in element order.
#[inline]
#[target_feature(enable = "avx2")]
pub(crate) unsafe fn q4_k_values(blk: *const u8, out: &mut [__m256i; 8]) {
    let low = _mm256_set1_epi8(0x0F);
    for c in 0..4 {
        let v = _mm256_loadu_si256(blk.add(16 + 32 * c) as *const __m256i);
        out[2 * c] = _mm256_and_si256(v, low);
        out[2 * c + 1] = _mm256_and_si256(_mm256_srli_epi16::<4>(v), low);
    }
}

/// The 256 6-bit values (0 ..= 63, before the -32 offset) of the `Q6_K` block at `blk` as 8
/// vectors of 32 bytes in element order.
#[inline]
#[target_feature(enable = "avx2")]
pub(crate) unsafe fn q6_k_values(blk: *const u8, out: &mut [__m256i; 8]) {
    let (low, two) = (_mm256_set1_epi8(0x0F), _mm256_set1_epi8(3));
    for h in 0..2 {
        let ql0 = _mm256_loadu_si256(blk.add(64 * h) as *const __m256i);
        let ql1 = _mm256_loadu_si256(blk.add(64 * h + 32) as *const __m256i);
        let qh = _mm256_loadu_si256(blk.add(128 + 32 * h) as *const __m256i);
        let h0 = _mm256_slli_epi16::<4>(_mm256_and_si256(qh, two));
        let h1 = _mm256_slli_epi16::<2>(_mm256_and_si256(qh, _mm256_set1_epi8(12)));
        let h2 = _mm256_and_si256(qh, _mm256_set1_epi8(48));
        let h3 = _mm256_and_si256(_mm256_srli_epi16::<2>(qh), _mm256_set1_epi8(48));
        out[4 * h] = _mm256_or_si256(_mm256_and_si256(ql0, low), h0);
        out[4 * h + 1] = _mm256_or_si256(_mm256_and_si256(ql1, low), h1);
        out[4 * h + 2] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16::<4>(ql0), low), h2);
        out[4 * h + 3] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16::<4>(ql1), low), h3);
    }
}

/// The 8 scales and 8 mins of the `Q4_K` block at `blk` as 16-bit words `[sc0..sc7 | m0..m7]`
/// (the packed 6-bit fields rearranged with 32-bit masks, as in ggml's x86 code).
#[inline]
#[target_feature(enable = "avx2")]
pub(crate) unsafe fn q4_k_scale_words(blk: *const u8) -> __m256i {
    let p = blk.add(4) as *const u32;
    let (u0, u1, u2) = (p.read_unaligned(), p.add(1).read_unaligned(), p.add(2).read_unaligned());
    const K1: u32 = 0x3f3f_3f3f;
    const K2: u32 = 0x0f0f_0f0f;
    const K3: u32 = 0x0303_0303;
    let sc_lo = u0 & K1; // sc0..sc3
    let sc_hi = (u2 & K2) | (((u0 >> 6) & K3) << 4); // sc4..sc7
    let m_lo = u1 & K1; // m0..m3
    let m_hi = ((u2 >> 4) & K2) | (((u1 >> 6) & K3) << 4); // m4..m7
    _mm256_cvtepu8_epi16(_mm_setr_epi32(sc_lo as i32, sc_hi as i32, m_lo as i32, m_hi as i32))
}

/// The f16 at `p` widened with F16C.
#[inline(always)]
pub(crate) unsafe fn f16_at(p: *const u8) -> f32 {
    let bits = (p as *const u16).read_unaligned();
    _mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtsi32_si128(bits as i32)))
}
