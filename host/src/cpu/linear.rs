//! CPU linear layer: `out[m, n] = a[m, k] · w[n, k]ᵀ (+ bias[n])`, f32 accumulation.
//!
//! Work is split over blocks of `NB` weight rows (output columns), one rayon task each; a
//! task widens its weight rows to f32 once (f16/bf16 are read as stored, never expanded as a
//! whole) and then takes the dot products with every row of `a`, so each weight byte is read
//! once however many rows `a` has.

use gpu::math::{bf16_to_f32, f16_to_f32};
use rayon::prelude::*;

/// Weight rows per task.
const NB: usize = 16;

/// The weight operand as stored.
#[derive(Clone, Copy)]
pub enum Weights<'a> {
    F32(&'a [f32]),
    F16(&'a [u16]),
    Bf16(&'a [u16]),
}

impl Weights<'_> {
    /// Writes rows `r0..r0 + rows` (each `k` long) widened to f32 into `dst`.
    fn widen_rows(&self, r0: usize, rows: usize, k: usize, dst: &mut [f32]) {
        let range = r0 * k..(r0 + rows) * k;
        let dst = &mut dst[..rows * k];
        match *self {
            Weights::F32(w) => dst.copy_from_slice(&w[range]),
            Weights::F16(w) => dst.iter_mut().zip(&w[range]).for_each(|(d, &b)| *d = f16_to_f32(b)),
            Weights::Bf16(w) => dst.iter_mut().zip(&w[range]).for_each(|(d, &b)| *d = bf16_to_f32(b)),
        }
    }
}

/// Dot product with 8 independent accumulators (vectorizes; fixed summation order).
#[inline]
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

/// `out = a · wᵀ + bias`; `a` is `[m, k]`, `w` holds `[n, k]`, `out` is `[m, n]`.
pub fn linear(a: &[f32], w: Weights<'_>, bias: Option<&[f32]>, m: usize, n: usize, k: usize, out: &mut [f32]) {
    assert!(a.len() >= m * k && out.len() >= m * n, "linear: caller validated sizes");
    if m == 0 || n == 0 {
        return;
    }
    if m == 1 {
        // the transposed result of one row is the row itself
        columns(a, w, bias, 1, k, &mut out[..n]);
        return;
    }
    // Column-major scratch result [n, m], so that each task owns a contiguous chunk.
    let mut t = vec![0.0f32; n * m];
    columns(a, w, bias, m, k, &mut t);
    out[..m * n].par_chunks_mut(n).enumerate().for_each(|(r, row)| {
        for (c, o) in row.iter_mut().enumerate() {
            *o = t[c * m + r];
        }
    });
}

/// Fills `t [n, m]` (column-major result) in parallel blocks of `NB` weight rows.
fn columns(a: &[f32], w: Weights<'_>, bias: Option<&[f32]>, m: usize, k: usize, t: &mut [f32]) {
    t.par_chunks_mut(NB * m).enumerate().for_each_init(
        || vec![0.0f32; NB * k],
        |scratch, (blk, chunk)| {
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

    #[test]
    fn matches_naive_for_all_weight_dtypes_and_odd_shapes() {
        for &(m, n, k) in &[(1, 1, 1), (1, 63, 17), (3, 17, 65), (7, 33, 100), (64, 65, 63)] {
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
                    let mut out = vec![f32::NAN; m * n];
                    linear(&a, *wt, bias, m, n, k, &mut out);
                    for (o, e) in out.iter().zip(&want) {
                        assert!((*o as f64 - e).abs() <= 1e-4 * (1.0 + e.abs()), "{} vs {} at {:?}", o, e, (m, n, k));
                    }
                }
            }
        }
    }
}
