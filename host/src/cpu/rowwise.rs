//! Row-wise CPU ops (one pool task per block of rows): RMSNorm and softmax. The scalar math
//! (`rms_scale`, the online-softmax step) is `gpu::math`'s, shared with the kernels.

use gpu::math::{layer_norm_elem, rms_scale, OnlineSoftmax};
use super::pool;

/// Rows per pool task, so small rows do not drown in scheduling.
fn rows_per_task(cols: usize) -> usize {
    (16_384 / cols.max(1)).max(1)
}

/// `y = x · rsqrt(mean(x²) + eps) · w` for each row of `x` (`cols` wide).
pub fn rms_norm(x: &[f32], w: &[f32], eps: f32, cols: usize, y: &mut [f32]) {
    if cols == 0 {
        return;
    }
    let per = rows_per_task(cols) * cols;
    pool::chunks_mut(y, per, |i, yb| {
        let xb = &x[i * per..];
        for (yr, xr) in yb.chunks_mut(cols).zip(xb.chunks(cols)) {
            let ss: f32 = xr.iter().map(|v| v * v).sum();
            let scale = rms_scale(ss / cols as f32, eps);
            for ((o, &v), &g) in yr.iter_mut().zip(xr).zip(w) {
                *o = v * scale * g;
            }
        }
    });
}

/// `y = (x - mean) / sqrt(var + eps) · w + b` for each row of `x` (`cols` wide); mean and
/// (biased) variance in f32 over the row, as PyTorch computes them.
pub fn layer_norm(x: &[f32], w: &[f32], b: &[f32], eps: f32, cols: usize, y: &mut [f32]) {
    if cols == 0 {
        return;
    }
    let per = rows_per_task(cols) * cols;
    pool::chunks_mut(y, per, |i, yb| {
        let xb = &x[i * per..];
        for (yr, xr) in yb.chunks_mut(cols).zip(xb.chunks(cols)) {
            let mean = xr.iter().sum::<f32>() / cols as f32;
            let var = xr.iter().map(|v| (v - mean) * (v - mean)).sum::<f32>() / cols as f32;
            let inv = rms_scale(var, eps);
            for (((o, &v), &g), &bb) in yr.iter_mut().zip(xr).zip(w).zip(b) {
                *o = layer_norm_elem(v, mean, inv, g, bb);
            }
        }
    });
}

/// Softmax of each row of `x` (`cols` wide): one pass for the normaliser, one to write.
pub fn softmax(x: &[f32], cols: usize, y: &mut [f32]) {
    if cols == 0 {
        return;
    }
    let per = rows_per_task(cols) * cols;
    pool::chunks_mut(y, per, |i, yb| {
        let xb = &x[i * per..];
        for (yr, xr) in yb.chunks_mut(cols).zip(xb.chunks(cols)) {
            let st = xr.iter().fold(OnlineSoftmax::EMPTY, |s, &v| s.push(v));
            for (o, &v) in yr.iter_mut().zip(xr) {
                *o = st.prob(v);
            }
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rms_norm_matches_f64() {
        let cols = 37;
        let x: Vec<f32> = (0..3 * cols).map(|i| ((i * 7919) % 101) as f32 / 50.0 - 1.0).collect();
        let w: Vec<f32> = (0..cols).map(|i| 0.5 + i as f32 / cols as f32).collect();
        let mut y = vec![f32::NAN; x.len()];
        rms_norm(&x, &w, 1e-6, cols, &mut y);
        for r in 0..3 {
            let row = &x[r * cols..(r + 1) * cols];
            let ms: f64 = row.iter().map(|&v| (v as f64) * (v as f64)).sum::<f64>() / cols as f64;
            let s = 1.0 / (ms + 1e-6).sqrt();
            for c in 0..cols {
                let want = row[c] as f64 * s * w[c] as f64;
                assert!((y[r * cols + c] as f64 - want).abs() < 1e-5, "{} {}", y[r * cols + c], want);
            }
        }
    }

    #[test]
    fn layer_norm_matches_f64() {
        let cols = 29;
        let x: Vec<f32> = (0..2 * cols).map(|i| ((i * 37) % 17) as f32 / 3.0 - 2.0).collect();
        let w: Vec<f32> = (0..cols).map(|i| 1.0 + i as f32 / 50.0).collect();
        let b: Vec<f32> = (0..cols).map(|i| i as f32 / 10.0 - 1.0).collect();
        let mut y = vec![f32::NAN; x.len()];
        layer_norm(&x, &w, &b, 1e-6, cols, &mut y);
        for r in 0..2 {
            let row: Vec<f64> = x[r * cols..(r + 1) * cols].iter().map(|&v| v as f64).collect();
            let m = row.iter().sum::<f64>() / cols as f64;
            let var = row.iter().map(|v| (v - m).powi(2)).sum::<f64>() / cols as f64;
            for c in 0..cols {
                let want = (row[c] - m) / (var + 1e-6).sqrt() * w[c] as f64 + b[c] as f64;
                assert!((y[r * cols + c] as f64 - want).abs() < 1e-5);
            }
        }
    }

    #[test]
    fn softmax_matches_f64_and_handles_masked_rows() {
        let cols = 5;
        let x = vec![1.0f32, 2.0, -1.0, 30.0, f32::NEG_INFINITY, f32::NEG_INFINITY, f32::NEG_INFINITY, f32::NEG_INFINITY, f32::NEG_INFINITY, f32::NEG_INFINITY];
        let mut y = vec![f32::NAN; x.len()];
        softmax(&x, cols, &mut y);
        let m = 30.0f64;
        let s: f64 = x[..5].iter().map(|&v| (v as f64 - m).exp()).sum();
        for c in 0..cols {
            assert!((y[c] as f64 - (x[c] as f64 - m).exp() / s).abs() < 1e-7);
            assert_eq!(y[cols + c], 0.0);
        }
    }
}
