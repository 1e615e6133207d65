//! Rotary position embedding (rotate-half layout) on the CPU; the rotation itself is
//! `gpu::math::rope_pair`, shared with the kernel.

use gpu::math::rope_pair;
use super::pool;

/// `x [rows, heads, d]` rotated with per-row `cos`, `sin` `[rows, d / 2]` into `out`.
pub fn rope(x: &[f32], cos: &[f32], sin: &[f32], heads: usize, d: usize, out: &mut [f32]) {
    let half = d / 2;
    let row_len = heads * d;
    if row_len == 0 {
        return;
    }
    let rows = (x.len() / row_len).min(out.len() / row_len);
    pool::chunks_mut(&mut out[..rows * row_len], row_len, |r, o| {
        let xr = &x[r * row_len..(r + 1) * row_len];
        let (c, s) = (&cos[r * half..(r + 1) * half], &sin[r * half..(r + 1) * half]);
        for (oh, xh) in o.chunks_mut(d).zip(xr.chunks(d)) {
            for i in 0..half {
                let (a, b) = rope_pair(xh[i], xh[i + half], c[i], s[i]);
                oh[i] = a;
                oh[i + half] = b;
            }
        }
    });
}

#[cfg(test)]
mod tests {
    #[test]
    fn rope_matches_rotate_half_formula() {
        let (heads, d) = (2, 4);
        let x: Vec<f32> = (0..heads * d).map(|i| i as f32 + 1.0).collect();
        let ang = [0.3f32, -1.1];
        let cos: Vec<f32> = ang.iter().map(|a| a.cos()).collect();
        let sin: Vec<f32> = ang.iter().map(|a| a.sin()).collect();
        let mut out = vec![f32::NAN; x.len()];
        super::rope(&x, &cos, &sin, heads, d, &mut out);
        for h in 0..heads {
            let xh = &x[h * d..(h + 1) * d];
            // x * cos + cat(-x2, x1) * sin with cos/sin duplicated over both halves
            let want = [
                xh[0] * cos[0] - xh[2] * sin[0],
                xh[1] * cos[1] - xh[3] * sin[1],
                xh[2] * cos[0] + xh[0] * sin[0],
                xh[3] * cos[1] + xh[1] * sin[1],
            ];
            for i in 0..d {
                assert!((out[h * d + i] - want[i]).abs() < 1e-6);
            }
        }
    }
}
