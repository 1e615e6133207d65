//! Register-blocked kernels for several activation rows (prefill) on AVX-512 VNNI CPUs: the
//! weights of `PANEL` consecutive rows (output columns) are unpacked once per 256 values into an
//! interleaved panel, each 32-byte vector holding 4 consecutive values of 8 columns, so one
//! `vpdpbusd` against 4 activation bytes broadcast to every lane advances 8 outputs of one
//! activation row by 4 products. `MR` activation rows × `PANEL / 8` vectors of columns are
//! accumulated in registers; nothing is summed across lanes.
//!
//! Integer math per 256 values (a "chunk": one K-quant super-block, eight `Q8_0` blocks):
//!
//! * `Q4_K` / `Q6_K`: per scale group (8 sub-blocks of 32 / 16 of 16) a 32-bit sum of
//!   `q · a` over the group's `vpdpbusd` steps, times the group's scale (`vpmulld`, exact), added
//!   up over the chunk; the mins (`Q4_K`) or the `-32` offset (`Q6_K`) from the activations'
//!   16-value sums against the panel's min / scale words (`vpdpwssd`). One conversion to f32 per
//!   chunk, scaled by the weight's and the activation's super-block scales: the same integers
//!   and the same f32 steps as the vector kernels of `kernels.rs` (only the order of the f32
//!   sums over chunks differs).
//! * `Q8_0`: signed weights are made unsigned (`w + 128`, `vpdpbusd` takes unsigned × signed);
//!   the extra `128 · Σ a` per block comes from the activations' 16-value sums. Each block's
//!   exact integer is converted and scaled by both blocks' scales.
//!
//! Thread mapping: none here (the caller splits the columns over tasks, see `cpu/qlinear`).
//! Safety: the caller passes whole rows of `row_bytes` bytes and activations of `k` values.

macro_rules! panel_kernels {
    ($name:ident, $feat:literal, $dpbusd:item, $dpwssd:item) => {
        pub(crate) mod $name {
            use super::super::f16_at;
            use crate::quant::act::Q8Acts;
            use crate::quant::{q4_k, q6_k, q8_0, QK8_0, QK_K};
            use crate::DType;
            use core::arch::x86_64::*;

            $dpbusd
            $dpwssd

            /// Vectors of 8 columns per panel, columns per panel, activation rows per register tile.
            const NV: usize = 2;
            pub(crate) const PANEL: usize = 8 * NV;
            const MR: usize = 4;
            /// 4-value groups per chunk of 256 values.
            const KG: usize = 64;

            /// One chunk of a panel: `w[kg][v]` lane `i` = values `4kg .. 4kg + 4` of column
            /// `8v + i` (unsigned bytes); per scale group `g` the columns' integer scales
            /// (`sc`; `Q8_0`: unused), per 16-value pair `q` the min / scale words (`mw`: two
            /// i16 per lane), per column the f32 scales (`d[g]`: `Q8_0` per block, the K-quants
            /// in `d[0]`) and `Q4_K`'s min scale.
            struct Panel {
                w: [[__m256i; NV]; KG],
                sc: [[__m256i; NV]; 16],
                mw: [[__m256i; NV]; 8],
                d: [[__m256; NV]; 8],
                dmin: [__m256; NV],
            }

            /// 8 × 8 transpose of 32-bit lanes: `out[k]` lane `i` = `r[i]` lane `k`.
            #[inline]
            #[target_feature(enable = $feat)]
            unsafe fn transpose8(r: &[__m256i; 8]) -> [__m256i; 8] {
                let t = [
                    _mm256_unpacklo_epi32(r[0], r[1]),
                    _mm256_unpackhi_epi32(r[0], r[1]),
                    _mm256_unpacklo_epi32(r[2], r[3]),
                    _mm256_unpackhi_epi32(r[2], r[3]),
                    _mm256_unpacklo_epi32(r[4], r[5]),
                    _mm256_unpackhi_epi32(r[4], r[5]),
                    _mm256_unpacklo_epi32(r[6], r[7]),
                    _mm256_unpackhi_epi32(r[6], r[7]),
                ];
                let u = [
                    _mm256_unpacklo_epi64(t[0], t[2]),
                    _mm256_unpackhi_epi64(t[0], t[2]),
                    _mm256_unpacklo_epi64(t[1], t[3]),
                    _mm256_unpackhi_epi64(t[1], t[3]),
                    _mm256_unpacklo_epi64(t[4], t[6]),
                    _mm256_unpackhi_epi64(t[4], t[6]),
                    _mm256_unpacklo_epi64(t[5], t[7]),
                    _mm256_unpackhi_epi64(t[5], t[7]),
                ];
                [
                    _mm256_permute2x128_si256::<0x20>(u[0], u[4]),
                    _mm256_permute2x128_si256::<0x20>(u[1], u[5]),
                    _mm256_permute2x128_si256::<0x20>(u[2], u[6]),
                    _mm256_permute2x128_si256::<0x20>(u[3], u[7]),
                    _mm256_permute2x128_si256::<0x31>(u[0], u[4]),
                    _mm256_permute2x128_si256::<0x31>(u[1], u[5]),
                    _mm256_permute2x128_si256::<0x31>(u[2], u[6]),
                    _mm256_permute2x128_si256::<0x31>(u[3], u[7]),
                ]
            }

            /// Per-column scratch of [`unpack`], kept across chunks: 8 vectors of 32 values in
            /// element order, and the scale words (`Q4_K`: `[sc0..sc7 | m0..m7]`; `Q6_K`: the 16
            /// sub-block scales as i16).
            struct Scratch {
                vals: [[__m256i; 8]; PANEL],
                words: [__m256i; PANEL],
                d: [[f32; PANEL]; 8],
                dmin: [f32; PANEL],
            }

            /// Chunk `c` (values `256c ..`, `nblk` blocks of 32 of it for `Q8_0`) of weight rows
            /// `w + i · row_bytes`, `i < nr`, into `p` (columns past `nr` zero).
            #[target_feature(enable = $feat)]
            unsafe fn unpack(wt: DType, w: *const u8, row_bytes: usize, nr: usize, c: usize, nblk: usize, x: &mut Scratch, p: &mut Panel) {
                let z = _mm256_setzero_si256();
                // 1. per column: 8 vectors of 32 values in element order, scale words, f32 scales
                // bytes of one chunk of a row
                let bb = match wt {
                    DType::Q4K => q4_k::BLOCK_BYTES,
                    DType::Q6K => q6_k::BLOCK_BYTES,
                    _ => 8 * q8_0::BLOCK_BYTES,
                };
                for i in 0..PANEL {
                    if i >= nr {
                        x.vals[i] = [z; 8];
                        x.words[i] = z;
                        continue;
                    }
                    let row = w.add(i * row_bytes);
                    // the same bytes of the next panel's column (prefetch never faults)
                    let ahead = row.wrapping_add(PANEL * row_bytes + c * bb);
                    for l in (0..bb).step_by(64) {
                        _mm_prefetch::<_MM_HINT_T0>(ahead.wrapping_add(l) as *const i8);
                    }
                    let vals = &mut x.vals[i];
                    match wt {
                        DType::Q4K => {
                            let blk = row.add(c * q4_k::BLOCK_BYTES);
                            x.d[0][i] = f16_at(blk);
                            x.dmin[i] = f16_at(blk.add(2));
                            x.words[i] = super::super::q4_k_scale_words(blk);
                            super::super::q4_k_values(blk, vals);
                        }
                        DType::Q6K => {
                            let blk = row.add(c * q6_k::BLOCK_BYTES);
                            x.d[0][i] = f16_at(blk.add(208));
                            x.words[i] = _mm256_cvtepi8_epi16(_mm_loadu_si128(blk.add(192) as *const __m128i));
                            super::super::q6_k_values(blk, vals);
                        }
                        _ => {
                            let flip = _mm256_set1_epi8(-128);
                            for g in 0..8 {
                                if g < nblk {
                                    let blk = row.add((8 * c + g) * q8_0::BLOCK_BYTES);
                                    x.d[g][i] = f16_at(blk);
                                    vals[g] = _mm256_xor_si256(_mm256_loadu_si256(blk.add(2) as *const __m256i), flip);
                                } else {
                                    vals[g] = z;
                                }
                            }
                        }
                    }
                }
                // 2. interleave: vector t of 8 columns → 8 groups of 4 values; the scale words
                //    of 8 columns transposed so that dword q of every column is one vector
                let (lo16, q8) = (_mm256_set1_epi32(0xFFFF), wt == DType::Q8_0);
                for v in 0..NV {
                    let cols = |f: &dyn Fn(usize) -> __m256i| -> [__m256i; 8] { [f(8 * v), f(8 * v + 1), f(8 * v + 2), f(8 * v + 3), f(8 * v + 4), f(8 * v + 5), f(8 * v + 6), f(8 * v + 7)] };
                    for t in 0..8 {
                        let o = transpose8(&cols(&|i| x.vals[i][t]));
                        for (e, y) in o.iter().enumerate() {
                            p.w[8 * t + e][v] = *y;
                        }
                    }
                    if !q8 {
                        let t = transpose8(&cols(&|i| x.words[i]));
                        if wt == DType::Q4K {
                            // dwords 0..3: (sc_2k, sc_2k+1); 4..7: (m_2k, m_2k+1)
                            for kk in 0..4 {
                                p.sc[2 * kk][v] = _mm256_and_si256(t[kk], lo16);
                                p.sc[2 * kk + 1][v] = _mm256_srli_epi32::<16>(t[kk]);
                                let (m0, m1) = (_mm256_and_si256(t[4 + kk], lo16), _mm256_srli_epi32::<16>(t[4 + kk]));
                                p.mw[2 * kk][v] = _mm256_or_si256(m0, _mm256_slli_epi32::<16>(m0));
                                p.mw[2 * kk + 1][v] = _mm256_or_si256(m1, _mm256_slli_epi32::<16>(m1));
                            }
                        } else {
                            // dword q: (s_2q, s_2q+1), the min words as they are
                            for q in 0..8 {
                                p.mw[q][v] = t[q];
                                p.sc[2 * q][v] = _mm256_srai_epi32::<16>(_mm256_slli_epi32::<16>(t[q]));
                                p.sc[2 * q + 1][v] = _mm256_srai_epi32::<16>(t[q]);
                            }
                        }
                    }
                    for g in 0..8 {
                        p.d[g][v] = _mm256_loadu_ps(x.d[g].as_ptr().add(8 * v));
                    }
                    p.dmin[v] = _mm256_loadu_ps(x.dmin.as_ptr().add(8 * v));
                }
            }

            /// `Σ` over the `steps` 4-value groups from `kg0` of panel `p` against the bytes of
            /// activation rows `a` (each at its chunk's start): `[row][vector]` 32-bit sums.
            #[inline]
            #[target_feature(enable = $feat)]
            unsafe fn group<const R: usize>(p: &Panel, a: &[*const u8; R], kg0: usize, steps: usize) -> [[__m256i; NV]; R] {
                let mut s = [[_mm256_setzero_si256(); NV]; R];
                for kg in kg0..kg0 + steps {
                    let w = p.w[kg];
                    for r in 0..R {
                        let av = _mm256_set1_epi32((a[r].add(4 * kg) as *const i32).read_unaligned());
                        for v in 0..NV {
                            s[r][v] = dpbusd(s[r][v], w[v], av);
                        }
                    }
                }
                s
            }

            /// Rows `r0 .. r0 + R` of the activations against chunk `c` of panel `p`, added to
            /// `acc[r][8v ..]` (`[rows][PANEL]` f32).
            #[inline]
            #[target_feature(enable = $feat)]
            unsafe fn tile<const R: usize>(wt: DType, p: &Panel, acts: &Q8Acts, r0: usize, c: usize, nblk: usize, acc: &mut [f32]) {
                let z = _mm256_setzero_si256();
                let k = acts.k;
                let qs = acts.qs.as_ptr() as *const u8;
                let bsums = acts.bsums.as_ptr();
                // activation row r's bytes of this chunk, its 16-value sums
                let mut a = [qs; R];
                for (r, ar) in a.iter_mut().enumerate() {
                    *ar = qs.add((r0 + r) * k + c * QK_K);
                }
                let bs = |r: usize| bsums.add((r0 + r) * (k / 16) + c * 16) as *const i32;
                let mut f = [[_mm256_setzero_ps(); NV]; R];
                if let DType::Q8_0 = wt {
                    let nb = k / QK8_0;
                    let c128 = _mm256_set1_epi16(128);
                    for g in 0..nblk {
                        let s = group::<R>(p, &a, 8 * g, 8);
                        for r in 0..R {
                            // 128 · Σ a over the block, in every lane
                            let corr = _mm256_madd_epi16(_mm256_set1_epi32(bs(r).add(g).read_unaligned()), c128);
                            let da = _mm256_set1_ps(*acts.d.as_ptr().add((r0 + r) * nb + 8 * c + g));
                            for v in 0..NV {
                                let x = _mm256_cvtepi32_ps(_mm256_sub_epi32(s[r][v], corr));
                                f[r][v] = _mm256_fmadd_ps(x, _mm256_mul_ps(p.d[g][v], da), f[r][v]);
                            }
                        }
                    }
                } else {
                    let q6 = wt == DType::Q6K;
                    // scale groups and their 4-value steps
                    let (groups, steps) = if q6 { (16, 4) } else { (8, 8) };
                    let mut tot = [[z; NV]; R];
                    for g in 0..groups {
                        let s = group::<R>(p, &a, steps * g, steps);
                        for r in 0..R {
                            for v in 0..NV {
                                tot[r][v] = _mm256_add_epi32(tot[r][v], _mm256_mullo_epi32(s[r][v], p.sc[g][v]));
                            }
                        }
                    }
                    for r in 0..R {
                        let mut ms = [z; NV];
                        for q in 0..8 {
                            let pair = _mm256_set1_epi32(bs(r).add(q).read_unaligned());
                            for v in 0..NV {
                                ms[v] = dpwssd(ms[v], p.mw[q][v], pair);
                            }
                        }
                        let da = _mm256_set1_ps(*acts.d.as_ptr().add((r0 + r) * (k / QK_K) + c));
                        for v in 0..NV {
                            if q6 {
                                // Σ sc (q - 32) a = Σ sc q a - 32 Σ sc bsum
                                let t = _mm256_sub_epi32(tot[r][v], _mm256_slli_epi32::<5>(ms[v]));
                                f[r][v] = _mm256_mul_ps(_mm256_cvtepi32_ps(t), _mm256_mul_ps(p.d[0][v], da));
                            } else {
                                f[r][v] = _mm256_mul_ps(_mm256_cvtepi32_ps(tot[r][v]), _mm256_mul_ps(p.d[0][v], da));
                                f[r][v] = _mm256_fnmadd_ps(_mm256_cvtepi32_ps(ms[v]), _mm256_mul_ps(p.dmin[v], da), f[r][v]);
                            }
                        }
                    }
                }
                for r in 0..R {
                    for v in 0..NV {
                        let o = acc.as_mut_ptr().add((r0 + r) * PANEL + 8 * v);
                        _mm256_storeu_ps(o, _mm256_add_ps(_mm256_loadu_ps(o), f[r][v]));
                    }
                }
            }

            /// See `super::super::dots` (`Q8_0`, `Q4_K`, `Q6_K`; any number of rows).
            #[target_feature(enable = $feat)]
            pub(crate) unsafe fn dots(wt: DType, rows: &[u8], row_bytes: usize, acts: &Q8Acts, res: &mut [f32]) {
                let (m, k) = (acts.rows, acts.k);
                let n = rows.len() / row_bytes;
                let chunks = (k + QK_K - 1) / QK_K;
                let z = _mm256_setzero_si256();
                let zf = _mm256_setzero_ps();
                let mut p = Panel { w: [[z; NV]; KG], sc: [[z; NV]; 16], mw: [[z; NV]; 8], d: [[zf; NV]; 8], dmin: [zf; NV] };
                let mut x = Scratch { vals: [[z; 8]; PANEL], words: [z; PANEL], d: [[0.0; PANEL]; 8], dmin: [0.0; PANEL] };
                let mut acc = vec![0f32; m * PANEL];
                let mut j0 = 0;
                while j0 < n {
                    let nr = PANEL.min(n - j0);
                    acc.iter_mut().for_each(|a| *a = 0.0);
                    let w = rows.as_ptr().add(j0 * row_bytes);
                    for c in 0..chunks {
                        // Q8_0 blocks of this chunk (k need not be a whole number of chunks)
                        let nblk = if wt == DType::Q8_0 { ((k - c * QK_K) / QK8_0).min(8) } else { 8 };
                        unpack(wt, w, row_bytes, nr, c, nblk, &mut x, &mut p);
                        let mut r0 = 0;
                        while r0 + MR <= m {
                            tile::<MR>(wt, &p, acts, r0, c, nblk, &mut acc);
                            r0 += MR;
                        }
                        while r0 < m {
                            tile::<1>(wt, &p, acts, r0, c, nblk, &mut acc);
                            r0 += 1;
                        }
                    }
                    for r in 0..m {
                        res[r * n + j0..r * n + j0 + nr].copy_from_slice(&acc[r * PANEL..r * PANEL + nr]);
                    }
                    j0 += nr;
                }
            }
        }
    };
}

panel_kernels!(
    evex,
    "avx,avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni",
    use super::super::evex_dot::dpbusd;,
    use super::super::evex_dot::dpwssd;
);
