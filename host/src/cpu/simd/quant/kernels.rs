//! The kernel body, instantiated once per instruction set with its dot-product primitives (see
//! the parent module).

macro_rules! kernels {
    ($name:ident, $feat:literal, $dpbusd:item, $dpwssd:item) => {
        pub(crate) mod $name {
            use super::super::f16_at;
            use crate::quant::act::Q8Acts;
            use crate::quant::{q4_k, q6_k, q8_0, QK8_0, QK_K};
            use crate::DType;
            use core::arch::x86_64::*;

            $dpbusd
            $dpwssd

            /// Sum of the 8 f32 lanes.
            #[inline]
            #[target_feature(enable = $feat)]
            unsafe fn hsum(v: __m256) -> f32 {
                let s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps::<1>(v));
                let s = _mm_add_ps(s, _mm_movehl_ps(s, s));
                let s = _mm_add_ss(s, _mm_movehdup_ps(s));
                _mm_cvtss_f32(s)
            }

            /// See `super::super::dots`.
            #[target_feature(enable = $feat)]
            pub(crate) unsafe fn dots(wt: DType, rows: &[u8], row_bytes: usize, acts: &Q8Acts, res: &mut [f32]) {
                let m = acts.rows;
                let mut acc = vec![_mm256_setzero_ps(); m];
                for (j, row) in rows.chunks_exact(row_bytes).enumerate() {
                    acc.iter_mut().for_each(|a| *a = _mm256_setzero_ps());
                    match wt {
                        DType::Q8_0 => row_q8_0(row, acts, &mut acc),
                        DType::Q4K => row_q4_k(row, acts, &mut acc),
                        _ => row_q6_k(row, acts, &mut acc),
                    }
                    for r in 0..m {
                        res[j * m + r] = hsum(acc[r]);
                    }
                }
            }

            /// One `Q8_0` weight row against every activation row.
            #[target_feature(enable = $feat)]
            unsafe fn row_q8_0(row: &[u8], acts: &Q8Acts, acc: &mut [__m256]) {
                let (k, nb) = (acts.k, acts.k / QK8_0);
                let (qs, ds) = (acts.qs.as_ptr(), acts.d.as_ptr());
                for b in 0..nb {
                    let blk = row.as_ptr().add(b * q8_0::BLOCK_BYTES);
                    _mm_prefetch::<_MM_HINT_T0>(blk.add(512) as *const i8);
                    let dw = f16_at(blk);
                    let w = _mm256_loadu_si256(blk.add(2) as *const __m256i);
                    let wabs = _mm256_sign_epi8(w, w);
                    for (r, a) in acc.iter_mut().enumerate() {
                        let av = _mm256_loadu_si256(qs.add(r * k + b * QK8_0) as *const __m256i);
                        let dot = dpbusd(_mm256_setzero_si256(), wabs, _mm256_sign_epi8(av, w));
                        let scale = _mm256_set1_ps(dw * *ds.add(r * nb + b));
                        *a = _mm256_fmadd_ps(_mm256_cvtepi32_ps(dot), scale, *a);
                    }
                }
            }

            /// One `Q4_K` weight row against every activation row.
            #[target_feature(enable = $feat)]
            unsafe fn row_q4_k(row: &[u8], acts: &Q8Acts, acc: &mut [__m256]) {
                let (k, nb) = (acts.k, acts.k / QK_K);
                let (qs, ds, bsums) = (acts.qs.as_ptr(), acts.d.as_ptr(), acts.bsums.as_ptr());
                let mut w = [_mm256_setzero_si256(); 8];
                let mut sc = [_mm256_setzero_si256(); 8];
                let low = _mm256_set1_epi8(0x0F);
                for b in 0..nb {
                    let blk = row.as_ptr().add(b * q4_k::BLOCK_BYTES);
                    _mm_prefetch::<_MM_HINT_T0>(blk.add(576) as *const i8);
                    _mm_prefetch::<_MM_HINT_T0>(blk.add(640) as *const i8);
                    let (d, dmin) = (f16_at(blk), f16_at(blk.add(2)));
                    let scales = core::slice::from_raw_parts(blk.add(4), 12);
                    let mut mins = [0i16; 16];
                    for jj in 0..8 {
                        let (s, mm) = q4_k::scale_min(scales, jj);
                        sc[jj] = _mm256_set1_epi16(s as i16);
                        mins[2 * jj] = mm as i16;
                        mins[2 * jj + 1] = mm as i16;
                    }
                    let minv = _mm256_loadu_si256(mins.as_ptr() as *const __m256i);
                    for c in 0..4 {
                        let v = _mm256_loadu_si256(blk.add(16 + 32 * c) as *const __m256i);
                        w[2 * c] = _mm256_and_si256(v, low);
                        w[2 * c + 1] = _mm256_and_si256(_mm256_srli_epi16::<4>(v), low);
                    }
                    for (r, a) in acc.iter_mut().enumerate() {
                        let ap = qs.add(r * k + b * QK_K);
                        let mut isum = _mm256_setzero_si256();
                        for jj in 0..8 {
                            let av = _mm256_loadu_si256(ap.add(32 * jj) as *const __m256i);
                            isum = dpwssd(isum, _mm256_maddubs_epi16(w[jj], av), sc[jj]);
                        }
                        let bs = _mm256_loadu_si256(bsums.add(r * k / 16 + b * 16) as *const __m256i);
                        let msum = _mm256_madd_epi16(bs, minv);
                        let da = *ds.add(r * nb + b);
                        *a = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum), _mm256_set1_ps(da * d), *a);
                        *a = _mm256_fnmadd_ps(_mm256_cvtepi32_ps(msum), _mm256_set1_ps(da * dmin), *a);
                    }
                }
            }

            /// One `Q6_K` weight row against every activation row.
            #[target_feature(enable = $feat)]
            unsafe fn row_q6_k(row: &[u8], acts: &Q8Acts, acc: &mut [__m256]) {
                let (k, nb) = (acts.k, acts.k / QK_K);
                let (qs, ds, bsums) = (acts.qs.as_ptr(), acts.d.as_ptr(), acts.bsums.as_ptr());
                let mut w = [_mm256_setzero_si256(); 8];
                let mut sc = [_mm256_setzero_si256(); 8];
                let (low, two) = (_mm256_set1_epi8(0x0F), _mm256_set1_epi8(3));
                for b in 0..nb {
                    let blk = row.as_ptr().add(b * q6_k::BLOCK_BYTES);
                    _mm_prefetch::<_MM_HINT_T0>(blk.add(840) as *const i8);
                    _mm_prefetch::<_MM_HINT_T0>(blk.add(904) as *const i8);
                    _mm_prefetch::<_MM_HINT_T0>(blk.add(968) as *const i8);
                    let d = f16_at(blk.add(208));
                    let s8 = _mm_loadu_si128(blk.add(192) as *const __m128i);
                    let s16 = _mm256_cvtepi8_epi16(s8); // 16 scales as i16
                    // sub-blocks 2t, 2t + 1 → [sc_2t × 8 | sc_2t+1 × 8] words
                    let mut sarr = [0i16; 16];
                    _mm256_storeu_si256(sarr.as_mut_ptr() as *mut __m256i, s16);
                    for t in 0..8 {
                        sc[t] = _mm256_setr_m128i(_mm_set1_epi16(sarr[2 * t]), _mm_set1_epi16(sarr[2 * t + 1]));
                    }
                    for h in 0..2 {
                        let ql0 = _mm256_loadu_si256(blk.add(64 * h) as *const __m256i);
                        let ql1 = _mm256_loadu_si256(blk.add(64 * h + 32) as *const __m256i);
                        let qh = _mm256_loadu_si256(blk.add(128 + 32 * h) as *const __m256i);
                        let hb = |s: i32| -> __m256i {
                            let v = match s {
                                0 => qh,
                                2 => _mm256_srli_epi16::<2>(qh),
                                4 => _mm256_srli_epi16::<4>(qh),
                                _ => _mm256_srli_epi16::<6>(qh),
                            };
                            _mm256_slli_epi16::<4>(_mm256_and_si256(v, two))
                        };
                        w[4 * h] = _mm256_or_si256(_mm256_and_si256(ql0, low), hb(0));
                        w[4 * h + 1] = _mm256_or_si256(_mm256_and_si256(ql1, low), hb(2));
                        w[4 * h + 2] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16::<4>(ql0), low), hb(4));
                        w[4 * h + 3] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16::<4>(ql1), low), hb(6));
                    }
                    for (r, a) in acc.iter_mut().enumerate() {
                        let ap = qs.add(r * k + b * QK_K);
                        let mut isum = _mm256_setzero_si256();
                        for t in 0..8 {
                            let av = _mm256_loadu_si256(ap.add(32 * t) as *const __m256i);
                            isum = dpwssd(isum, _mm256_maddubs_epi16(w[t], av), sc[t]);
                        }
                        // - 32 · Σ_j sc_j · bsum_j
                        let bs = _mm256_loadu_si256(bsums.add(r * k / 16 + b * 16) as *const __m256i);
                        let off = _mm256_slli_epi32::<5>(_mm256_madd_epi16(bs, s16));
                        isum = _mm256_sub_epi32(isum, off);
                        let da = *ds.add(r * nb + b);
                        *a = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum), _mm256_set1_ps(da * d), *a);
                    }
                }
            }
        }
    };
}

kernels!(
    avx2,
    "avx,avx2,fma,f16c",
    #[inline]
    #[target_feature(enable = "avx,avx2,fma,f16c")]
    unsafe fn dpbusd(acc: __m256i, u: __m256i, s: __m256i) -> __m256i {
        _mm256_add_epi32(acc, _mm256_madd_epi16(_mm256_maddubs_epi16(u, s), _mm256_set1_epi16(1)))
    },
    #[inline]
    #[target_feature(enable = "avx,avx2,fma,f16c")]
    unsafe fn dpwssd(acc: __m256i, a: __m256i, b: __m256i) -> __m256i {
        _mm256_add_epi32(acc, _mm256_madd_epi16(a, b))
    }
);

kernels!(
    vex,
    "avx,avx2,fma,f16c",
    #[inline]
    #[target_feature(enable = "avx,avx2,fma,f16c")]
    unsafe fn dpbusd(mut acc: __m256i, u: __m256i, s: __m256i) -> __m256i {
        // AVX-VNNI (VEX encoding); the pinned toolchain has no intrinsic for it
        core::arch::asm!("{{vex}} vpdpbusd {0}, {1}, {2}", inout(ymm_reg) acc, in(ymm_reg) u, in(ymm_reg) s, options(pure, nomem, nostack));
        acc
    },
    #[inline]
    #[target_feature(enable = "avx,avx2,fma,f16c")]
    unsafe fn dpwssd(mut acc: __m256i, a: __m256i, b: __m256i) -> __m256i {
        core::arch::asm!("{{vex}} vpdpwssd {0}, {1}, {2}", inout(ymm_reg) acc, in(ymm_reg) a, in(ymm_reg) b, options(pure, nomem, nostack));
        acc
    }
);

kernels!(
    evex,
    "avx,avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni",
    #[inline]
    #[target_feature(enable = "avx,avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
    unsafe fn dpbusd(acc: __m256i, u: __m256i, s: __m256i) -> __m256i {
        _mm256_dpbusd_epi32(acc, u, s)
    },
    #[inline]
    #[target_feature(enable = "avx,avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
    unsafe fn dpwssd(acc: __m256i, a: __m256i, b: __m256i) -> __m256i {
        _mm256_dpwssd_epi32(acc, a, b)
    }
);
