//! `Q8_0`: blocks of 32 values, `[d: f16][qs: 32 × i8]` (34 bytes); value `i` is `d · qs[i]`.
//! Quantization as ggml's `quantize_row_q8_0_ref`: `d = max|x| / 127`, `qs = round(x / d)`
//! (half away from zero), `d` stored as f16.

use super::{read_f16, write_f16, QK8_0};

pub const BLOCK_BYTES: usize = 2 + QK8_0;

/// The block's scale.
#[inline(always)]
pub fn scale(b: &[u8]) -> f32 {
    read_f16(b)
}

/// The block's 32 values as int8.
#[inline(always)]
pub fn values(b: &[u8]) -> &[u8] {
    &b[2..BLOCK_BYTES]
}

pub fn quantize_block(x: &[f32], out: &mut [u8]) {
    let amax = x[..QK8_0].iter().fold(0.0f32, |m, v| m.max(v.abs()));
    let d = amax / 127.0;
    let id = if d != 0.0 { 1.0 / d } else { 0.0 };
    write_f16(out, d);
    for (q, &v) in out[2..BLOCK_BYTES].iter_mut().zip(&x[..QK8_0]) {
        *q = ((v * id).round() as i32).clamp(-128, 127) as i8 as u8;
    }
}

pub fn dequantize_block(b: &[u8], out: &mut [f32]) {
    let d = scale(b);
    for (o, &q) in out[..QK8_0].iter_mut().zip(values(b)) {
        *o = d * q as i8 as f32;
    }
}

/// Σ qs[i] · a[i] over one block against 32 int8 activations (exact).
#[inline(always)]
pub fn block_dot_i32(b: &[u8], a: &[i8]) -> i32 {
    values(b).iter().zip(&a[..QK8_0]).map(|(&q, &x)| q as i8 as i32 * x as i32).sum()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quantizes_as_ggml() {
        let x: Vec<f32> = (0..32).map(|i| (i as f32 - 15.5) * 0.1).collect();
        let mut b = [0u8; BLOCK_BYTES];
        quantize_block(&x, &mut b);
        let d = scale(&b);
        assert!((d - 1.55 / 127.0).abs() < 1e-5, "{}", d); // max |x| / 127, rounded to f16
        assert_eq!(values(&b)[0] as i8, -127);
        assert_eq!(values(&b)[31] as i8, 127);
        assert_eq!(values(&b)[15] as i8, (-0.05f32 / (1.55 / 127.0)).round() as i8); // -4
        let mut y = [0.0f32; 32];
        dequantize_block(&b, &mut y);
        for (a, b) in x.iter().zip(&y) {
            assert!((a - b).abs() <= d * 0.5 + 1e-6);
        }
    }
}
