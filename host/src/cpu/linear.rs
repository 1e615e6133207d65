//! CPU linear layer: `out[m, n] = a[m, k] · w[n, k]ᵀ (+ bias[n])`, f32 accumulation.
//!
//! Activations stay f32 and weights are read as stored (f32, f16 or bf16), widened to f32 on
//! the fly; each weight byte is read once however many rows `a` has.
//!
//! [`linear`] runs on the best instruction set of this CPU ([`Isa::detect`], decided once):
//! AVX-512F or AVX2+FMA kernels on x86-64 (`cpu/simd`, which documents their blocking), else
//! the portable scalar path below. [`linear_on`] forces a path (tests, benchmarks).
//!
//! Scalar path: work is split over blocks of `NB` weight rows (output columns), one pool task
//! each; a task widens its weight rows to f32 once and then takes the dot products with every
//! row of `a`.

#[cfg(target_arch = "x86_64")]
use super::simd;
use super::pool;
pub use super::weights::Weights;
use std::sync::atomic::{AtomicU8, Ordering};

/// Weight rows per task.
const NB: usize = 16;

/// Dot product with 8 independent accumulators (vectorizes; fixed summation order).
#[inline(always)]
pub fn dot(a: &[f32], b: &[f32]) -> f32 {
    let n = a.len().min(b.len());
    let (a, b) = (&a[..n], &b[..n]);
    let mut acc = [0.0f32; 8];
    let chunks = n / 8;
    for c in 0..chunks {
        let (x, y) = (&a[c * 8..c * 8 + 8], &b[c * 8..c * 8 + 8]);
        for l in 0..8 {
            acc[l] += x[l] * y[l];
        }
    }
    let mut tail = 0.0f32;
    for i in chunks * 8..n {
        tail += a[i] * b[i];
    }
    ((acc[0] + acc[4]) + (acc[1] + acc[5])) + ((acc[2] + acc[6]) + (acc[3] + acc[7])) + tail
}

/// An implementation of [`linear`]: the instruction set its kernels use.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Isa {
    /// AVX-512F kernels (x86-64).
    Avx512,
    /// AVX2 + FMA + F16C kernels (x86-64).
    Avx2,
    /// Portable Rust, auto-vectorised for the build target only.
    Scalar,
}

impl Isa {
    /// Every variant, fastest first.
    pub const ALL: [Isa; 3] = [Isa::Avx512, Isa::Avx2, Isa::Scalar];

    /// Short lowercase name ("avx512", "avx2", "scalar").
    pub fn name(self) -> &'static str {
        match self {
            Isa::Avx512 => "avx512",
            Isa::Avx2 => "avx2",
            Isa::Scalar => "scalar",
        }
    }

    /// Whether this CPU can run the path (runtime detection).
    pub fn is_available(self) -> bool {
        match self {
            Isa::Scalar => true,
            #[cfg(target_arch = "x86_64")]
            Isa::Avx512 => is_x86_feature_detected!("avx512f"),
            #[cfg(target_arch = "x86_64")]
            Isa::Avx2 => is_x86_feature_detected!("avx2") && is_x86_feature_detected!("fma") && is_x86_feature_detected!("f16c"),
            #[cfg(not(target_arch = "x86_64"))]
            _ => false,
        }
    }

    /// The paths this CPU can run, fastest first.
    pub fn available() -> Vec<Isa> {
        Isa::ALL.iter().copied().filter(|i| i.is_available()).collect()
    }

    /// The fastest available path, detected on first use and cached.
    pub fn detect() -> Isa {
        static CACHED: AtomicU8 = AtomicU8::new(u8::MAX);
        match CACHED.load(Ordering::Relaxed) {
            i if (i as usize) < Isa::ALL.len() => Isa::ALL[i as usize],
            _ => {
                let i = Isa::ALL.iter().position(|i| i.is_available()).unwrap_or(Isa::ALL.len() - 1);
                CACHED.store(i as u8, Ordering::Relaxed);
                Isa::ALL[i]
            }
        }
    }
}

/// `out = a · wᵀ + bias`; `a` is `[m, k]`, `w` holds `[n, k]`, `out` is `[m, n]`. Runs on
/// [`Isa::detect`]'s path, in the current [`pool`].
pub fn linear(a: &[f32], w: Weights<'_>, bias: Option<&[f32]>, m: usize, n: usize, k: usize, out: &mut [f32]) {
    linear_on(Isa::detect(), a, w, bias, m, n, k, out)
}

/// [`linear`] on a given path.
///
/// # Panics
/// If this CPU cannot run `isa`, or the slices are shorter than the shapes say.
#[allow(clippy::too_many_arguments)]
pub fn linear_on(isa: Isa, a: &[f32], w: Weights<'_>, bias: Option<&[f32]>, m: usize, n: usize, k: usize, out: &mut [f32]) {
    assert!(isa.is_available(), "linear: this CPU cannot run the {} path", isa.name());
    let w_len = match w {
        Weights::F32(s) => s.len(),
        Weights::F16(s) | Weights::Bf16(s) => s.len(),
    };
    assert!(a.len() >= m * k && out.len() >= m * n && w_len >= n * k, "linear: caller validated sizes");
    assert!(bias.map_or(true, |b| b.len() >= n), "linear: bias shorter than n");
    if m == 0 || n == 0 {
        return;
    }
    if k == 0 {
        // empty dot products: just the bias
        for row in out[..m * n].chunks_mut(n) {
            row.iter_mut().enumerate().for_each(|(c, o)| *o = bias.map_or(0.0, |b| b[c]));
        }
        return;
    }
    match isa {
        #[cfg(target_arch = "x86_64")]
        Isa::Avx512 => simd::linear(&simd::avx512::KERNELS, a, w, bias, m, n, k, out),
        #[cfg(target_arch = "x86_64")]
        Isa::Avx2 => simd::linear(&simd::avx2::KERNELS, a, w, bias, m, n, k, out),
        _ => scalar(a, w, bias, m, n, k, out),
    }
}

/// The portable path.
fn scalar(a: &[f32], w: Weights<'_>, bias: Option<&[f32]>, m: usize, n: usize, k: usize, out: &mut [f32]) {
    if m == 1 {
        // the transposed result of one row is the row itself
        columns(a, w, bias, 1, k, &mut out[..n]);
        return;
    }
    // Column-major scratch result [n, m], so that each task owns a contiguous chunk.
    let mut t = vec![0.0f32; n * m];
    columns(a, w, bias, m, k, &mut t);
    pool::chunks_mut(&mut out[..m * n], n, |r, row| {
        for (c, o) in row.iter_mut().enumerate() {
            *o = t[c * m + r];
        }
    });
}

/// Fills `t [n, m]` (column-major result) in parallel blocks of `NB` weight rows.
fn columns(a: &[f32], w: Weights<'_>, bias: Option<&[f32]>, m: usize, k: usize, t: &mut [f32]) {
    pool::chunks_mut_init(
        t,
        NB * m,
        || vec![0.0f32; NB * k],
        |scratch, blk, chunk| {
            let r0 = blk * NB;
            let rows = chunk.len() / m;
            w.widen_rows(r0, rows, k, scratch);
            for j in 0..rows {
                let wrow = &scratch[j * k..(j + 1) * k];
                let b = bias.map_or(0.0, |b| b[r0 + j]);
                for r in 0..m {
                    chunk[j * m + r] = dot(&a[r * k..(r + 1) * k], wrow) + b;
                }
            }
        },
    );
}

#[cfg(test)]
mod tests {
    use super::*;
    use gpu::math::{bf16_to_f32, f16_to_f32};

    fn naive(a: &[f32], w: &[f32], bias: Option<&[f32]>, m: usize, n: usize, k: usize) -> Vec<f64> {
        let mut out = vec![0.0f64; m * n];
        for r in 0..m {
            for c in 0..n {
                let mut s = bias.map_or(0.0, |b| b[c] as f64);
                for i in 0..k {
                    s += a[r * k + i] as f64 * w[c * k + i] as f64;
                }
                out[r * n + c] = s;
            }
        }
        out
    }

    fn pseudo(n: usize, seed: u32) -> Vec<f32> {
        let mut s = seed.wrapping_mul(2_654_435_761).wrapping_add(12345);
        (0..n)
            .map(|_| {
                s ^= s << 13;
                s ^= s >> 17;
                s ^= s << 5;
                (s % 2001) as f32 / 1000.0 - 1.0
            })
            .collect()
    }

    /// Shapes hitting every tail: m around the dot/GEMM switch and the 8/16-row vectors, n
    /// around the 6-column tiles and 48-column tasks, k around 8/16 lanes and the k blocks.
    fn shapes() -> Vec<(usize, usize, usize)> {
        let ms = [1, 2, 3, 4, 5, 7, 8, 16, 17, 24, 25, 32, 33, 63, 64, 65, 100, 129];
        let ns = [1, 3, 6, 17, 47, 48, 49, 63, 65, 100, 129];
        let ks = [1, 3, 15, 16, 17, 63, 64, 65, 100, 127, 128, 129, 255, 256, 257, 300];
        let mut v = Vec::new();
        for (i, &m) in ms.iter().enumerate() {
            for (j, &n) in ns.iter().enumerate() {
                v.push((m, n, ks[(i * 5 + j) % ks.len()]));
            }
        }
        v
    }

    /// Every available path against the f64 reference, all weight dtypes, with and without bias.
    #[test]
    fn every_path_matches_naive_for_all_weight_dtypes_and_odd_shapes() {
        let paths = Isa::available();
        assert!(paths.contains(&Isa::Scalar) && paths.contains(&Isa::detect()));
        for (m, n, k) in shapes() {
            let a = pseudo(m * k, 1);
            let w = pseudo(n * k, 2);
            let bias = pseudo(n, 3);
            // exactly representable in bf16/f16: round through the bit formats
            let w_bf: Vec<u16> = w.iter().map(|x| half::bf16::from_f32(*x).to_bits()).collect();
            let w_h: Vec<u16> = w.iter().map(|x| half::f16::from_f32(*x).to_bits()).collect();
            let cases: [(Weights<'_>, Vec<f32>); 3] = [
                (Weights::F32(&w), w.clone()),
                (Weights::Bf16(&w_bf), w_bf.iter().map(|&b| half::bf16::from_bits(b).to_f32()).collect()),
                (Weights::F16(&w_h), w_h.iter().map(|&b| half::f16::from_bits(b).to_f32()).collect()),
            ];
            for (wt, wf) in cases.iter() {
                for bias in [None, Some(&bias[..])] {
                    let want = naive(&a, wf, bias, m, n, k);
                    for &isa in &paths {
                        let mut out = vec![f32::NAN; m * n];
                        super::super::pool::in_test_pool(|| linear_on(isa, &a, *wt, bias, m, n, k, &mut out));
                        for (i, (o, e)) in out.iter().zip(&want).enumerate() {
                            let ok = (*o as f64 - e).abs() <= 1e-4 * (1.0 + e.abs());
                            assert!(ok, "{}: {} vs {} at [{}, {}] of {:?}", isa.name(), o, e, i / n, i % n, (m, n, k));
                        }
                    }
                }
            }
        }
    }

    /// Degenerate shapes: empty `k` gives the bias, empty `m` or `n` writes nothing.
    #[test]
    fn every_path_handles_empty_shapes() {
        let bias = [0.5f32, -1.0, 2.0];
        for isa in Isa::available() {
            let mut out = [f32::NAN; 6];
            linear_on(isa, &[], Weights::F32(&[]), Some(&bias), 2, 3, 0, &mut out);
            assert_eq!(out, [0.5, -1.0, 2.0, 0.5, -1.0, 2.0], "{}", isa.name());
            linear_on(isa, &[], Weights::Bf16(&[]), None, 2, 3, 0, &mut out);
            assert_eq!(out, [0.0; 6], "{}", isa.name());
            let mut none = [f32::NAN; 1];
            linear_on(isa, &[], Weights::F32(&[1.0; 12]), None, 0, 3, 4, &mut none);
            linear_on(isa, &[1.0; 4], Weights::F32(&[]), None, 1, 0, 4, &mut none);
            assert!(none[0].is_nan());
        }
    }

    /// The SIMD widening agrees with `gpu::math` on every f16 and bf16 bit pattern (NaN stays NaN).
    #[test]
    fn every_path_widens_all_half_bit_patterns_exactly() {
        let (n, k) = (1 << 16, 16);
        let mut a = vec![0.0f32; k];
        a[0] = 1.0;
        // row j = [pattern j, 0, ...]: the product with e₀ is the widened pattern itself
        let mut bits = vec![0u16; n * k];
        for j in 0..n {
            bits[j * k] = j as u16;
        }
        for isa in Isa::available() {
            for (wt, widen) in [(Weights::F16(&bits), f16_to_f32 as fn(u16) -> f32), (Weights::Bf16(&bits), bf16_to_f32)] {
                let mut out = vec![0.0f32; n];
                super::super::pool::in_test_pool(|| linear_on(isa, &a, wt, None, 1, n, k, &mut out));
                for (j, o) in out.iter().enumerate() {
                    let want = widen(j as u16);
                    assert!(*o == want || (o.is_nan() && want.is_nan()), "{}: pattern {:#06x}: {} vs {}", isa.name(), j, o, want);
                }
            }
        }
    }
}
