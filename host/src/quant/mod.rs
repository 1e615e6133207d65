//! Block-quantized weights in llama.cpp's GGUF layouts, bit for bit: `Q8_0`, `Q4_K`, `Q6_K`
//! (one module each, with the block layout, quantization, dequantization and the per-block math
//! a kernel needs), and the 8-bit activation blocks the integer dot products take (`act`).
//!
//! Everything here is pure and scalar: the reference the SIMD kernels (`cpu/simd/quant*`) and
//! the GPU kernels are tested against. Block bytes are read with explicit little-endian loads,
//! never by casting, so any byte slice of whole blocks is valid input.
//!
//! Summation: a quantized dot product is exact in integers within a (super-)block; the float
//! combination of blocks is the only rounding, so two implementations differ by float
//! reassociation only (see [`act`]).

pub mod act;
pub mod q4_k;
pub mod q6_k;
pub mod q8_0;

use crate::DType;
use gpu::math::{bf16_to_f32, f16_to_f32, f32_to_f16_bits};

/// Elements per `Q8_0` block.
pub const QK8_0: usize = gpu::qmath::QK8_0;
/// Elements per K-quant super-block.
pub const QK_K: usize = gpu::qmath::QK_K;

/// ggml's `nearest_int`: round to nearest, ties to even, for |x| < 2²² (the magic-number add).
#[inline(always)]
pub fn nearest_int(x: f32) -> i32 {
    let v = x + 12_582_912.0;
    (v.to_bits() & 0x007f_ffff) as i32 - 0x0040_0000
}

/// The f16 at `b[0..2]` (little-endian) widened to f32.
#[inline(always)]
pub fn read_f16(b: &[u8]) -> f32 {
    f16_to_f32(u16::from_le_bytes([b[0], b[1]]))
}

/// Writes `x` rounded to f16 (nearest even) at `b[0..2]`.
#[inline(always)]
pub fn write_f16(b: &mut [u8], x: f32) {
    b[..2].copy_from_slice(&f32_to_f16_bits(x).to_le_bytes());
}

/// Dequantizes `src` (whole blocks or elements of `dtype`, little-endian) into `dst`
/// (`dst.len()` elements). Returns `false` (writing nothing) when the sizes disagree or `dtype`
/// holds no numbers (`U32`).
pub fn dequantize(dtype: DType, src: &[u8], dst: &mut [f32]) -> bool {
    if dtype.row_bytes(dst.len()) != Some(src.len()) {
        return false;
    }
    match dtype {
        DType::F32 => dst.iter_mut().zip(src.chunks_exact(4)).for_each(|(d, c)| *d = f32::from_le_bytes([c[0], c[1], c[2], c[3]])),
        DType::F16 => dst.iter_mut().zip(src.chunks_exact(2)).for_each(|(d, c)| *d = f16_to_f32(u16::from_le_bytes([c[0], c[1]]))),
        DType::BF16 => dst.iter_mut().zip(src.chunks_exact(2)).for_each(|(d, c)| *d = bf16_to_f32(u16::from_le_bytes([c[0], c[1]]))),
        DType::Q8_0 => dst.chunks_exact_mut(QK8_0).zip(src.chunks_exact(q8_0::BLOCK_BYTES)).for_each(|(d, b)| q8_0::dequantize_block(b, d)),
        DType::Q4K => dst.chunks_exact_mut(QK_K).zip(src.chunks_exact(q4_k::BLOCK_BYTES)).for_each(|(d, b)| q4_k::dequantize_block(b, d)),
        DType::Q6K => dst.chunks_exact_mut(QK_K).zip(src.chunks_exact(q6_k::BLOCK_BYTES)).for_each(|(d, b)| q6_k::dequantize_block(b, d)),
        DType::U32 => return false,
    }
    true
}

/// Quantizes (or rounds) `src` into `dtype`'s bytes `dst` (`row_bytes(src.len())` long): llama.cpp's
/// reference quantizers for the block types, round-to-nearest-even for f16 / bf16. Returns
/// `false` (writing nothing) when the sizes disagree or `dtype` is `U32`.
pub fn quantize(dtype: DType, src: &[f32], dst: &mut [u8]) -> bool {
    if dtype.row_bytes(src.len()) != Some(dst.len()) {
        return false;
    }
    match dtype {
        DType::F32 => dst.chunks_exact_mut(4).zip(src).for_each(|(d, x)| d.copy_from_slice(&x.to_le_bytes())),
        DType::F16 => dst.chunks_exact_mut(2).zip(src).for_each(|(d, &x)| write_f16(d, x)),
        DType::BF16 => dst.chunks_exact_mut(2).zip(src).for_each(|(d, &x)| d.copy_from_slice(&half::bf16::from_f32(x).to_bits().to_le_bytes())),
        DType::Q8_0 => dst.chunks_exact_mut(q8_0::BLOCK_BYTES).zip(src.chunks_exact(QK8_0)).for_each(|(d, x)| q8_0::quantize_block(x, d)),
        DType::Q4K => dst.chunks_exact_mut(q4_k::BLOCK_BYTES).zip(src.chunks_exact(QK_K)).for_each(|(d, x)| q4_k::quantize_block(x, d)),
        DType::Q6K => dst.chunks_exact_mut(q6_k::BLOCK_BYTES).zip(src.chunks_exact(QK_K)).for_each(|(d, x)| q6_k::quantize_block(x, d)),
        DType::U32 => return false,
    }
    true
}

/// `src` (values of `dtype`) quantized to a new byte vector; `None` when `src.len()` is not a
/// whole number of blocks.
pub fn quantize_vec(dtype: DType, src: &[f32]) -> Option<Vec<u8>> {
    let mut out = vec![0u8; dtype.row_bytes(src.len())?];
    if quantize(dtype, src, &mut out) {
        Some(out)
    } else {
        None
    }
}

/// [`quantize_vec`] of `rows` rows in parallel (on the current rayon pool).
pub fn quantize_vec_par(dtype: DType, src: &[f32], rows: usize) -> Option<Vec<u8>> {
    use rayon::prelude::*;
    let cols = if rows == 0 { 0 } else { src.len() / rows };
    let rb = dtype.row_bytes(cols)?;
    if rows * cols != src.len() {
        return None;
    }
    let mut out = vec![0u8; rb * rows];
    if rb > 0 {
        out.par_chunks_mut(rb).zip(src.par_chunks(cols.max(1))).for_each(|(o, x)| {
            quantize(dtype, x, o);
        });
    }
    Some(out)
}

/// `src` (whole blocks of `dtype`) dequantized to a new f32 vector of `elems` values.
pub fn dequantize_vec(dtype: DType, src: &[u8], elems: usize) -> Option<Vec<f32>> {
    let mut out = vec![0.0f32; elems];
    if dequantize(dtype, src, &mut out) {
        Some(out)
    } else {
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nearest_int_rounds_ties_to_even() {
        assert_eq!([nearest_int(0.5), nearest_int(1.5), nearest_int(2.5), nearest_int(-0.5), nearest_int(-1.5)], [0, 2, 2, 0, -2]);
        assert_eq!([nearest_int(3.49), nearest_int(-3.51), nearest_int(126.6)], [3, -4, 127]);
    }

    #[test]
    fn sizes_are_checked() {
        assert_eq!(DType::Q4K.row_bytes(512), Some(288));
        assert_eq!(DType::Q4K.row_bytes(100), None);
        assert_eq!(DType::Q8_0.row_bytes(64), Some(68));
        assert_eq!(DType::Q6K.row_bytes(256), Some(210));
        assert!(!dequantize(DType::Q8_0, &[0; 33], &mut [0.0; 32]));
        assert!(quantize_vec(DType::Q6K, &[0.0; 255]).is_none());
    }
}
