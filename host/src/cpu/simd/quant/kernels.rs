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

            /// Weight rows per tile, activation rows per tile.
            const NR: usize = 4;
            const MR: usize = 2;
            /// Software prefetch distance along each weight row of a tile, in bytes (measured on
            /// the 2-core machine when decode still took the tiles: 512 → 13.3, 4096 → 14.8,
            /// 8192 → 14.9 tok/s Q4_K_M decode; the one-row GEMVs leave it to the hardware).
            const PF: usize = 8192;

            /// See `super::super::dots`. One activation row (decode) takes the rows one after
            /// another ([`gemv_q8_0`], [`gemv_q4_k`], [`gemv_q6_k`]): a single forward stream per
            /// thread, which the hardware prefetchers follow at the full memory bandwidth on the
            /// 2-core AMD machine (interleaving 4 rows reached about 65% of it there); where they
            /// do not, each block also prefetches the bytes `super::super::gemv_prefetch()` ahead
            /// of it (the 2-core Intel machine: Q4_K_M decode 10.1 → 15.4 tok/s). Several
            /// rows take tiles of `NR` weight rows (one for `Q8_0` below 4 rows, where it
            /// measured faster); for each block the weights are unpacked once and taken against
            /// all activation rows, `MR` at a time, with integer sums in registers and f32 sums
            /// per (weight row, activation row).
            #[target_feature(enable = $feat)]
            pub(crate) unsafe fn dots(wt: DType, rows: &[u8], row_bytes: usize, acts: &Q8Acts, res: &mut [f32]) {
                let m = acts.rows;
                let n = rows.len() / row_bytes;
                if m == 1 {
                    let pf = super::super::gemv_prefetch();
                    for (j, o) in res[..n].iter_mut().enumerate() {
                        let w = rows.as_ptr().add(j * row_bytes);
                        *o = match wt {
                            DType::Q8_0 => gemv_q8_0(w, acts, pf),
                            DType::Q4K => gemv_q4_k(w, acts, pf),
                            _ => gemv_q6_k(w, acts, pf),
                        };
                    }
                    return;
                }
                let tile = if wt == DType::Q8_0 && m < super::super::PANEL_MIN_ROWS { 1 } else { NR };
                let mut acc = vec![_mm256_setzero_ps(); NR * m];
                let mut j0 = 0;
                while j0 < n {
                    let nr = tile.min(n - j0);
                    acc.iter_mut().for_each(|a| *a = _mm256_setzero_ps());
                    let w = rows.as_ptr().add(j0 * row_bytes);
                    match wt {
                        DType::Q8_0 => tile_q8_0(w, row_bytes, nr, acts, &mut acc),
                        DType::Q4K => tile_k::<false>(w, row_bytes, nr, acts, &mut acc),
                        _ => tile_k::<true>(w, row_bytes, nr, acts, &mut acc),
                    }
                    for i in 0..nr {
                        for r in 0..m {
                            res[r * n + j0 + i] = hsum(acc[i * m + r]);
                        }
                    }
                    j0 += nr;
                }
            }

            /// Prefetches the `bytes` (a block's size) that start `pf` bytes after `blk`, one
            /// 64-byte line at a time; nothing when `pf` is 0. The addresses may lie past the
            /// weights (the next rows, or nothing: a prefetch never faults), hence the wrapping
            /// arithmetic.
            #[inline(always)]
            unsafe fn prefetch_ahead(blk: *const u8, pf: usize, bytes: usize) {
                if pf == 0 {
                    return;
                }
                let mut off = 0;
                while off < bytes {
                    _mm_prefetch::<_MM_HINT_T0>(blk.wrapping_add(pf + off) as *const i8);
                    off += 64;
                }
            }

            /// `Q8_0` weight row at `w` against activation row 0: two f32 accumulators (even
            /// and odd blocks, two named registers: indexed by `b & 1` the compiler kept them on
            /// the stack, and every block waited on a store and reload of its accumulator), so
            /// consecutive blocks do not wait on one another's FMA.
            #[target_feature(enable = $feat)]
            unsafe fn gemv_q8_0(w: *const u8, acts: &Q8Acts, pf: usize) -> f32 {
                let nb = acts.k / QK8_0;
                let (qs, ds) = (acts.qs.as_ptr(), acts.d.as_ptr());
                // block `b`'s f32 product, accumulated into `f`
                let block = |b: usize, f: __m256| {
                    let blk = w.add(b * q8_0::BLOCK_BYTES);
                    prefetch_ahead(blk, pf, q8_0::BLOCK_BYTES);
                    let wv = _mm256_loadu_si256(blk.add(2) as *const __m256i);
                    let av = _mm256_loadu_si256(qs.add(b * QK8_0) as *const __m256i);
                    let dot = dpbusd(_mm256_setzero_si256(), _mm256_sign_epi8(wv, wv), _mm256_sign_epi8(av, wv));
                    _mm256_fmadd_ps(_mm256_cvtepi32_ps(dot), _mm256_set1_ps(f16_at(blk) * *ds.add(b)), f)
                };
                let (mut f0, mut f1) = (_mm256_setzero_ps(), _mm256_setzero_ps());
                let mut b = 0;
                while b + 2 <= nb {
                    f0 = block(b, f0);
                    f1 = block(b + 1, f1);
                    b += 2;
                }
                if b < nb {
                    f0 = block(b, f0);
                }
                hsum(_mm256_add_ps(f0, f1))
            }

            /// `Q8_0`: `nr ≤ NR` weight rows against every activation row, accumulators in
            /// registers across the blocks of a row pair.
            #[target_feature(enable = $feat)]
            unsafe fn tile_q8_0(w: *const u8, row_bytes: usize, nr: usize, acts: &Q8Acts, acc: &mut [__m256]) {
                let (m, k, nb) = (acts.rows, acts.k, acts.k / QK8_0);
                let (qs, ds) = (acts.qs.as_ptr(), acts.d.as_ptr());
                let mut r0 = 0;
                while r0 < m {
                    let mr = MR.min(m - r0);
                    let mut f = [[_mm256_setzero_ps(); MR]; NR];
                    for b in 0..nb {
                        let mut av = [_mm256_setzero_si256(); MR];
                        let mut da = [0.0f32; MR];
                        for r in 0..mr {
                            av[r] = _mm256_loadu_si256(qs.add((r0 + r) * k + b * QK8_0) as *const __m256i);
                            da[r] = *ds.add((r0 + r) * nb + b);
                        }
                        for i in 0..nr {
                            let blk = w.add(i * row_bytes + b * q8_0::BLOCK_BYTES);
                            if r0 == 0 {
                                _mm_prefetch::<_MM_HINT_T0>(blk.add(PF) as *const i8);
                            }
                            let dw = f16_at(blk);
                            let wv = _mm256_loadu_si256(blk.add(2) as *const __m256i);
                            let wabs = _mm256_sign_epi8(wv, wv);
                            for r in 0..mr {
                                let dot = dpbusd(_mm256_setzero_si256(), wabs, _mm256_sign_epi8(av[r], wv));
                                f[i][r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(dot), _mm256_set1_ps(dw * da[r]), f[i][r]);
                            }
                        }
                    }
                    for i in 0..nr {
                        for r in 0..mr {
                            acc[i * m + r0 + r] = f[i][r];
                        }
                    }
                    r0 += mr;
                }
            }

            /// Word `j` of both 128-bit halves' first 8 words broadcast: the shuffle masks.
            #[inline]
            #[target_feature(enable = $feat)]
            unsafe fn word_mask(j: usize) -> __m256i {
                let (a, b) = ((2 * j) as i8, (2 * j + 1) as i8);
                _mm256_setr_epi8(a, b, a, b, a, b, a, b, a, b, a, b, a, b, a, b, a, b, a, b, a, b, a, b, a, b, a, b, a, b, a, b)
            }

            /// `Q4_K` weight row at `w` against activation row 0, each block unpacked in
            /// registers; the 8 sub-block products go to 4 integer accumulators (a single chain
            /// of 8 `dpwssd` per block bound the loop by their latency).
            #[target_feature(enable = $feat)]
            unsafe fn gemv_q4_k(w: *const u8, acts: &Q8Acts, pf: usize) -> f32 {
                let nb = acts.k / QK_K;
                let (qs, ds, bsums) = (acts.qs.as_ptr(), acts.d.as_ptr(), acts.bsums.as_ptr());
                let low = _mm256_set1_epi8(0x0F);
                let masks = [word_mask(0), word_mask(1), word_mask(2), word_mask(3), word_mask(4), word_mask(5), word_mask(6), word_mask(7)];
                let mut f = _mm256_setzero_ps();
                let mut fm = _mm_setzero_ps();
                for b in 0..nb {
                    let ap = qs.add(b * QK_K);
                    let blk = w.add(b * q4_k::BLOCK_BYTES);
                    prefetch_ahead(blk, pf, q4_k::BLOCK_BYTES);
                    let sm = super::super::q4_k_scale_words(blk);
                    let sc = _mm256_permute2x128_si256::<0x00>(sm, sm); // [sc0..sc7 | sc0..sc7]
                    let mins = _mm256_castsi256_si128(_mm256_permute2x128_si256::<0x11>(sm, sm));
                    let mut isum = [_mm256_setzero_si256(); 4];
                    for c in 0..4 {
                        let v = _mm256_loadu_si256(blk.add(16 + 32 * c) as *const __m256i);
                        let (lo, hi) = (_mm256_and_si256(v, low), _mm256_and_si256(_mm256_srli_epi16::<4>(v), low));
                        let a0 = _mm256_loadu_si256(ap.add(64 * c) as *const __m256i);
                        let a1 = _mm256_loadu_si256(ap.add(64 * c + 32) as *const __m256i);
                        let (e, o) = (2 * (c & 1), 2 * (c & 1) + 1);
                        isum[e] = dpwssd(isum[e], _mm256_maddubs_epi16(lo, a0), _mm256_shuffle_epi8(sc, masks[2 * c]));
                        isum[o] = dpwssd(isum[o], _mm256_maddubs_epi16(hi, a1), _mm256_shuffle_epi8(sc, masks[2 * c + 1]));
                    }
                    let isum = _mm256_add_epi32(_mm256_add_epi32(isum[0], isum[1]), _mm256_add_epi32(isum[2], isum[3]));
                    // Σ_j m_j (bsum_2j + bsum_2j+1)
                    let bs = _mm256_loadu_si256(bsums.add(b * 16) as *const __m256i);
                    let pairs = _mm_hadd_epi16(_mm256_castsi256_si128(bs), _mm256_extracti128_si256::<1>(bs));
                    let msum = _mm_madd_epi16(pairs, mins);
                    let da = *ds.add(b);
                    f = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum), _mm256_set1_ps(da * f16_at(blk)), f);
                    fm = _mm_fmadd_ps(_mm_cvtepi32_ps(msum), _mm_set1_ps(da * f16_at(blk.add(2))), fm);
                }
                hsum(_mm256_sub_ps(f, _mm256_set_m128(_mm_setzero_ps(), fm)))
            }

            /// `Q6_K` weight row at `w` against activation row 0, as [`gemv_q4_k`].
            #[target_feature(enable = $feat)]
            unsafe fn gemv_q6_k(w: *const u8, acts: &Q8Acts, pf: usize) -> f32 {
                let nb = acts.k / QK_K;
                let (qs, ds, bsums) = (acts.qs.as_ptr(), acts.d.as_ptr(), acts.bsums.as_ptr());
                let (low, two) = (_mm256_set1_epi8(0x0F), _mm256_set1_epi8(3));
                // pair t: [s_2t × 8 | s_2t+1 × 8] from the 16 scale words: dword t everywhere,
                // then word 0 in the low half and word 1 in the high half
                let half = _mm256_setr_epi8(0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 2, 3, 2, 3, 2, 3, 2, 3, 2, 3, 2, 3, 2, 3, 2, 3);
                let mut f = _mm256_setzero_ps();
                for b in 0..nb {
                    let ap = qs.add(b * QK_K);
                    let blk = w.add(b * q6_k::BLOCK_BYTES);
                    prefetch_ahead(blk, pf, q6_k::BLOCK_BYTES);
                    let s16 = _mm256_cvtepi8_epi16(_mm_loadu_si128(blk.add(192) as *const __m128i));
                    let mut isum = [_mm256_setzero_si256(); 4];
                    for h in 0..2 {
                        let ql0 = _mm256_loadu_si256(blk.add(64 * h) as *const __m256i);
                        let ql1 = _mm256_loadu_si256(blk.add(64 * h + 32) as *const __m256i);
                        let qh = _mm256_loadu_si256(blk.add(128 + 32 * h) as *const __m256i);
                        let q = [
                            _mm256_or_si256(_mm256_and_si256(ql0, low), _mm256_slli_epi16::<4>(_mm256_and_si256(qh, two))),
                            _mm256_or_si256(_mm256_and_si256(ql1, low), _mm256_slli_epi16::<2>(_mm256_and_si256(qh, _mm256_set1_epi8(12)))),
                            _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16::<4>(ql0), low), _mm256_and_si256(qh, _mm256_set1_epi8(48))),
                            _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16::<4>(ql1), low), _mm256_and_si256(_mm256_srli_epi16::<2>(qh), _mm256_set1_epi8(48))),
                        ];
                        for (t4, qv) in q.iter().enumerate() {
                            let t = 4 * h + t4;
                            let sv = _mm256_shuffle_epi8(_mm256_permutevar8x32_epi32(s16, _mm256_set1_epi32(t as i32)), half);
                            let av = _mm256_loadu_si256(ap.add(32 * t) as *const __m256i);
                            isum[t4] = dpwssd(isum[t4], _mm256_maddubs_epi16(*qv, av), sv);
                        }
                    }
                    let isum = _mm256_add_epi32(_mm256_add_epi32(isum[0], isum[1]), _mm256_add_epi32(isum[2], isum[3]));
                    let bs = _mm256_loadu_si256(bsums.add(b * 16) as *const __m256i);
                    let off = _mm256_slli_epi32::<5>(_mm256_madd_epi16(bs, s16));
                    f = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_sub_epi32(isum, off)), _mm256_set1_ps(*ds.add(b) * f16_at(blk.add(208))), f);
                }
                hsum(f)
            }

            /// One K-quant super-block of `nr` weight rows, unpacked: 8 vectors of 32 unsigned
            /// values per row in element order, 8 scale vectors (16-bit words), and per row the
            /// f32 scale, min scale and 16-bit min / scale words for the 16-value sums.
            struct Unpacked {
                w: [[__m256i; 8]; NR],
                sc: [[__m256i; 8]; NR],
                sums: [__m256i; NR],
                d: [f32; NR],
                dmin: [f32; NR],
            }

            /// `Q4_K` super-block at `blk` into row `i` of `u`.
            #[inline]
            #[target_feature(enable = $feat)]
            unsafe fn unpack_q4_k(blk: *const u8, u: &mut Unpacked, i: usize) {
                u.d[i] = f16_at(blk);
                u.dmin[i] = f16_at(blk.add(2));
                let scales = core::slice::from_raw_parts(blk.add(4), 12);
                let mut mins = [0i16; 16];
                for jj in 0..8 {
                    let (sc, mm) = q4_k::scale_min(scales, jj);
                    u.sc[i][jj] = _mm256_set1_epi16(sc as i16);
                    mins[2 * jj] = mm as i16;
                    mins[2 * jj + 1] = mm as i16;
                }
                u.sums[i] = _mm256_loadu_si256(mins.as_ptr() as *const __m256i);
                super::super::q4_k_values(blk, &mut u.w[i]);
            }

            /// `Q6_K` super-block at `blk` into row `i` of `u` (its `sums` words are the 16
            /// sub-block scales, for the `-32` offset).
            #[inline]
            #[target_feature(enable = $feat)]
            unsafe fn unpack_q6_k(blk: *const u8, u: &mut Unpacked, i: usize) {
                u.d[i] = f16_at(blk.add(208));
                let s16 = _mm256_cvtepi8_epi16(_mm_loadu_si128(blk.add(192) as *const __m128i));
                u.sums[i] = s16;
                let mut sarr = [0i16; 16];
                _mm256_storeu_si256(sarr.as_mut_ptr() as *mut __m256i, s16);
                for t in 0..8 {
                    u.sc[i][t] = _mm256_setr_m128i(_mm_set1_epi16(sarr[2 * t]), _mm_set1_epi16(sarr[2 * t + 1]));
                }
                super::super::q6_k_values(blk, &mut u.w[i]);
            }

            /// K-quants (`Q6 = false`: `Q4_K`; `true`: `Q6_K`): `nr ≤ NR` weight rows against
            /// every activation row. Per super-block the weights are unpacked once; each pair of
            /// activation rows then takes `vpmaddubsw` + `dpwssd` per 32 values into integer sums
            /// in registers, folded into the f32 sums once per super-block.
            #[target_feature(enable = $feat)]
            unsafe fn tile_k<const Q6: bool>(w: *const u8, row_bytes: usize, nr: usize, acts: &Q8Acts, acc: &mut [__m256]) {
                let (m, k, nb) = (acts.rows, acts.k, acts.k / QK_K);
                let (qs, ds, bsums) = (acts.qs.as_ptr(), acts.d.as_ptr(), acts.bsums.as_ptr());
                let z = _mm256_setzero_si256();
                let mut u = Unpacked { w: [[z; 8]; NR], sc: [[z; 8]; NR], sums: [z; NR], d: [0.0; NR], dmin: [0.0; NR] };
                let bb = if Q6 { q6_k::BLOCK_BYTES } else { q4_k::BLOCK_BYTES };
                for b in 0..nb {
                    for i in 0..nr {
                        let blk = w.add(i * row_bytes + b * bb);
                        _mm_prefetch::<_MM_HINT_T0>(blk.add(PF) as *const i8);
                        _mm_prefetch::<_MM_HINT_T0>(blk.add(PF + 64) as *const i8);
                        _mm_prefetch::<_MM_HINT_T0>(blk.add(PF + 128) as *const i8);
                        if Q6 {
                            _mm_prefetch::<_MM_HINT_T0>(blk.add(PF + 192) as *const i8);
                            unpack_q6_k(blk, &mut u, i);
                        } else {
                            unpack_q4_k(blk, &mut u, i);
                        }
                    }
                    let mut r0 = 0;
                    while r0 < m {
                        let mr = MR.min(m - r0);
                        let mut isum = [[z; MR]; NR];
                        for jj in 0..8 {
                            let mut av = [z; MR];
                            for r in 0..mr {
                                av[r] = _mm256_loadu_si256(qs.add((r0 + r) * k + b * QK_K + 32 * jj) as *const __m256i);
                            }
                            for i in 0..nr {
                                for r in 0..mr {
                                    isum[i][r] = dpwssd(isum[i][r], _mm256_maddubs_epi16(u.w[i][jj], av[r]), u.sc[i][jj]);
                                }
                            }
                        }
                        for r in 0..mr {
                            let row = r0 + r;
                            let bs = _mm256_loadu_si256(bsums.add(row * k / 16 + b * 16) as *const __m256i);
                            let da = *ds.add(row * nb + b);
                            for i in 0..nr {
                                let a = &mut acc[i * m + row];
                                let extra = _mm256_madd_epi16(bs, u.sums[i]);
                                if Q6 {
                                    // Σ sc (q - 32) a = Σ sc q a - 32 Σ sc bsum
                                    let t = _mm256_sub_epi32(isum[i][r], _mm256_slli_epi32::<5>(extra));
                                    *a = _mm256_fmadd_ps(_mm256_cvtepi32_ps(t), _mm256_set1_ps(da * u.d[i]), *a);
                                } else {
                                    *a = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum[i][r]), _mm256_set1_ps(da * u.d[i]), *a);
                                    *a = _mm256_fnmadd_ps(_mm256_cvtepi32_ps(extra), _mm256_set1_ps(da * u.dmin[i]), *a);
                                }
                            }
                        }
                        r0 += mr;
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
    use super::super::evex_dot::dpbusd;,
    use super::super::evex_dot::dpwssd;
);
