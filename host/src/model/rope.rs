//! Multimodal rotary position tables of the text decoder (interleaved MRoPE).
//!
//! Every token has a (t, h, w) position. Frequency `j` of the `head_dim / 2` takes the h position
//! when `j % 3 == 1 && j < 3 · section[1]`, the w position when `j % 3 == 2 && j < 3 · section[2]`,
//! and the t position otherwise. Text tokens have equal positions on all axes, so a text-only
//! prompt reduces to ordinary 1-D RoPE.

/// A token's (t, h, w) rotary position.
pub type Pos3 = [u32; 3];

/// `1 / theta^(2j / head_dim)` for `j < head_dim / 2`, rounded to f32 as transformers does.
pub fn inv_freq(theta: f64, head_dim: usize) -> Vec<f32> {
    (0..head_dim / 2).map(|j| (1.0 / theta.powf((2 * j) as f64 / head_dim as f64)) as f32).collect()
}

/// The axis (0 = t, 1 = h, 2 = w) whose position drives frequency `j` (`gpu::math::mrope_axis`,
/// which the GPU's fused rotary kernel uses too).
pub fn mrope_axis(j: usize, section: &[usize; 3]) -> usize {
    gpu::math::mrope_axis(j, [section[0] as u32, section[1] as u32, section[2] as u32])
}

/// `(cos, sin)`, each `[positions.len(), head_dim / 2]` row-major, for the given positions.
pub fn mrope_tables(inv_freq: &[f32], section: &[usize; 3], positions: &[Pos3]) -> (Vec<f32>, Vec<f32>) {
    let half = inv_freq.len();
    let axes: Vec<usize> = (0..half).map(|j| mrope_axis(j, section)).collect();
    let mut cos = Vec::with_capacity(positions.len() * half);
    let mut sin = Vec::with_capacity(positions.len() * half);
    for p in positions {
        for j in 0..half {
            // f32 product, as transformers computes `inv_freq @ position_ids` in float32
            let angle = p[axes[j]] as f32 * inv_freq[j];
            cos.push(angle.cos());
            sin.push(angle.sin());
        }
    }
    (cos, sin)
}

/// Positions of `n` text tokens starting at `start`: equal on all three axes.
pub fn text_positions(start: u32, n: usize) -> Vec<Pos3> {
    (0..n as u32).map(|i| [start + i; 3]).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn interleaving_follows_the_section_layout() {
        let sec = [24, 20, 20];
        let axes: Vec<usize> = (0..64).map(|j| mrope_axis(j, &sec)).collect();
        assert_eq!(&axes[..7], &[0, 1, 2, 0, 1, 2, 0]);
        assert_eq!(axes[58], 1);
        assert_eq!(axes[59], 2);
        assert!(axes[60..].iter().all(|&a| a == 0));
        assert_eq!(axes.iter().filter(|&&a| a == 1).count(), 20);
        assert_eq!(axes.iter().filter(|&&a| a == 2).count(), 20);
    }

    #[test]
    fn text_positions_reduce_to_1d_rope() {
        let f = inv_freq(10_000.0, 8);
        let (c, s) = mrope_tables(&f, &[2, 1, 1], &text_positions(5, 2));
        for (i, pos) in [5.0f32, 6.0].iter().enumerate() {
            for j in 0..4 {
                assert_eq!(c[i * 4 + j], (pos * f[j]).cos());
                assert_eq!(s[i * 4 + j], (pos * f[j]).sin());
            }
        }
    }
}
