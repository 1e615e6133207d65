//! 8-bit activations for the integer dot products: each row of `x [m, k]` is cut into blocks of
//! `block` values (32 against `Q8_0` weights, 256 against K-quants, as llama.cpp's `Q8_0` /
//! `Q8_K`), each with an f32 scale `d = max|x| / 127` and values `round(x · 127 / max|x|)`
//! (nearest, ties to even: exactly what `cvtps2dq` does, so SIMD quantizers give the same
//! bits), plus the sums of every 16 values (the K-quants' min and offset terms).
//!
//! Accuracy: rounding an activation moves it by at most `d / 2 = max|x| / 254` of its block;
//! that relative error (≤ 0.4 % of the block's largest value) is what the int8 paths cost over
//! dequantizing the weights to f32.

use super::{nearest_int, QK8_0, QK_K};
use crate::DType;

/// Quantized activations of `rows` rows of `k` values.
#[derive(Clone, Debug, Default)]
pub struct Q8Acts {
    pub rows: usize,
    pub k: usize,
    /// Values per scale: 32 or 256.
    pub block: usize,
    /// `[rows, k]` int8 values.
    pub qs: Vec<i8>,
    /// `[rows, k / block]` scales.
    pub d: Vec<f32>,
    /// `[rows, k / 16]` sums of 16 consecutive values.
    pub bsums: Vec<i16>,
}

impl Q8Acts {
    /// The activation block size that weights of `w` take (`None`: not a block type).
    pub fn block_for(w: DType) -> Option<usize> {
        match w {
            DType::Q8_0 => Some(QK8_0),
            DType::Q4K | DType::Q6K => Some(QK_K),
            _ => None,
        }
    }

    /// Room for `rows × k` values in blocks of `block` (`k` a multiple of `block`).
    pub fn zeroed(rows: usize, k: usize, block: usize) -> Q8Acts {
        Q8Acts { rows, k, block, qs: vec![0; rows * k], d: vec![0.0; rows * k / block], bsums: vec![0; rows * k / 16] }
    }

    /// Quantizes `x [rows, k]` (`k` a multiple of `block`, `block` a multiple of 16).
    pub fn quantize(x: &[f32], rows: usize, k: usize, block: usize) -> Q8Acts {
        let mut a = Q8Acts::zeroed(rows, k, block);
        for r in 0..rows {
            let (qs, d, bs) = a.row_mut(r);
            quantize_row(&x[r * k..(r + 1) * k], block, qs, d, bs);
        }
        a
    }

    /// Row `r`'s values, scales and 16-sums.
    pub fn row(&self, r: usize) -> (&[i8], &[f32], &[i16]) {
        let (k, nb) = (self.k, self.k / self.block);
        (&self.qs[r * k..(r + 1) * k], &self.d[r * nb..(r + 1) * nb], &self.bsums[r * k / 16..(r + 1) * k / 16])
    }

    /// Row `r`'s values, scales and 16-sums, mutable.
    pub fn row_mut(&mut self, r: usize) -> (&mut [i8], &mut [f32], &mut [i16]) {
        let (k, nb) = (self.k, self.k / self.block);
        (&mut self.qs[r * k..(r + 1) * k], &mut self.d[r * nb..(r + 1) * nb], &mut self.bsums[r * k / 16..(r + 1) * k / 16])
    }
}

/// Quantizes one row `x` into `qs` (same length), `d` (one per `block`) and `bsums` (one per 16).
pub fn quantize_row(x: &[f32], block: usize, qs: &mut [i8], d: &mut [f32], bsums: &mut [i16]) {
    for (b, xs) in x.chunks_exact(block).enumerate() {
        let amax = xs.iter().fold(0.0f32, |m, v| m.max(v.abs()));
        let id = if amax > 0.0 { 127.0 / amax } else { 0.0 };
        d[b] = amax / 127.0;
        for (q, &v) in qs[b * block..(b + 1) * block].iter_mut().zip(xs) {
            *q = nearest_int(v * id).clamp(-127, 127) as i8;
        }
    }
    for (s, q) in bsums.iter_mut().zip(qs.chunks_exact(16)) {
        *s = q.iter().map(|&v| v as i16).sum();
    }
}

/// Reference dot product of one weight row (`k` values of block type `w`, as bytes) with row
/// `r` of `a` (quantized for `w`): the scalar math every kernel reproduces.
pub fn dot_row(w: DType, row: &[u8], a: &Q8Acts, r: usize) -> f32 {
    let (qs, d, bs) = a.row(r);
    let mut sum = 0.0f32;
    match w {
        DType::Q8_0 => {
            for (b, blk) in row.chunks_exact(super::q8_0::BLOCK_BYTES).enumerate() {
                sum += super::q8_0::scale(blk) * d[b] * super::q8_0::block_dot_i32(blk, &qs[b * QK8_0..]) as f32;
            }
        }
        DType::Q4K => {
            for (b, blk) in row.chunks_exact(super::q4_k::BLOCK_BYTES).enumerate() {
                let (dw, dmin) = super::q4_k::d_dmin(blk);
                let (si, sm) = super::q4_k::block_dot_i32(blk, &qs[b * QK_K..], &bs[b * 16..]);
                sum += d[b] * (dw * si as f32 - dmin * sm as f32);
            }
        }
        DType::Q6K => {
            for (b, blk) in row.chunks_exact(super::q6_k::BLOCK_BYTES).enumerate() {
                sum += d[b] * super::q6_k::d(blk) * super::q6_k::block_dot_i32(blk, &qs[b * QK_K..], &bs[b * 16..]) as f32;
            }
        }
        _ => {}
    }
    sum
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quantized_dot_is_close_to_the_dequantized_one() {
        let k = 512;
        let x: Vec<f32> = (0..k).map(|i| (i * 31 % 97) as f32 / 48.0 - 1.0).collect();
        let w: Vec<f32> = (0..k).map(|i| (i * 7919 % 257) as f32 / 128.0 - 1.0).collect();
        for dt in [DType::Q8_0, DType::Q4K, DType::Q6K] {
            let bytes = crate::quant::quantize_vec(dt, &w).unwrap();
            let wd = crate::quant::dequantize_vec(dt, &bytes, k).unwrap();
            let exact: f32 = wd.iter().zip(&x).map(|(a, b)| a * b).sum();
            let a = Q8Acts::quantize(&x, 1, k, Q8Acts::block_for(dt).unwrap());
            let got = dot_row(dt, &bytes, &a, 0);
            let norm: f32 = wd.iter().map(|v| v.abs()).sum::<f32>() / 127.0;
            assert!((got - exact).abs() <= norm, "{}: {} vs {}", dt, got, exact);
        }
    }
}
