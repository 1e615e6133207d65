//! `Q4_K`: super-blocks of 256 values in 8 sub-blocks of 32 (144 bytes):
//!
//! ```text
//! [d: f16][dmin: f16][scales: 12 bytes][qs: 128 bytes]
//! ```
//!
//! Sub-block `j` has a 6-bit scale `sc_j` and a 6-bit min `m_j` packed in `scales`
//! ([`scale_min`]); its value `i` is `d · sc_j · q - dmin · m_j` with a 4-bit `q`. The values
//! are stored in four 32-byte chunks: chunk `c` holds sub-block `2c` in its low nibbles and
//! sub-block `2c + 1` in its high nibbles ([`unpack`] gives them in element order).
//! Quantization follows ggml's `quantize_row_q4_K_ref` (weighted least-squares scale and min
//! per sub-block, then 6-bit scales relative to the super-block's).

use super::{nearest_int, read_f16, write_f16, QK_K};

pub const BLOCK_BYTES: usize = 4 + 12 + QK_K / 2;
const SCALES: usize = 4;
const QS: usize = 16;

/// The super-block scale and min `(d, dmin)`.
#[inline(always)]
pub fn d_dmin(b: &[u8]) -> (f32, f32) {
    (read_f16(&b[0..2]), read_f16(&b[2..4]))
}

/// `(sc_j, m_j)` of sub-block `j < 8` from the 12 packed scale bytes (ggml's `get_scale_min_k4`;
/// the formula the GPU kernels share, `gpu::qmath::q4_k_scale_min`).
#[inline(always)]
pub fn scale_min(scales: &[u8], j: usize) -> (u8, u8) {
    let s: &[u8; 12] = scales[..12].try_into().expect("12 scale bytes");
    gpu::qmath::q4_k_scale_min(s, j)
}

/// The 12 scale bytes of a block.
#[inline(always)]
pub fn scales(b: &[u8]) -> &[u8] {
    &b[SCALES..SCALES + 12]
}

/// All eight `(sc_j, m_j)`.
pub fn all_scale_mins(b: &[u8]) -> ([u8; 8], [u8; 8]) {
    let (mut sc, mut m) = ([0u8; 8], [0u8; 8]);
    for j in 0..8 {
        let (s, mm) = scale_min(scales(b), j);
        sc[j] = s;
        m[j] = mm;
    }
    (sc, m)
}

/// The 256 4-bit values in element order.
pub fn unpack(b: &[u8], q: &mut [u8; QK_K]) {
    let qs = &b[QS..QS + QK_K / 2];
    for c in 0..4 {
        for l in 0..32 {
            let byte = qs[32 * c + l];
            q[64 * c + l] = byte & 0xF;
            q[64 * c + 32 + l] = byte >> 4;
        }
    }
}

pub fn dequantize_block(b: &[u8], out: &mut [f32]) {
    let (d, dmin) = d_dmin(b);
    let mut q = [0u8; QK_K];
    unpack(b, &mut q);
    for j in 0..8 {
        let (sc, m) = scale_min(scales(b), j);
        let (d1, m1) = (d * sc as f32, dmin * m as f32);
        for l in 0..32 {
            out[32 * j + l] = d1 * q[32 * j + l] as f32 - m1;
        }
    }
}

/// `(Σ_j sc_j · Σ_{i∈j} q_i a_i, Σ_j m_j · Σ_{i∈j} a_i)` against 256 int8 activations whose
/// 16-element sums are `bsums`: the block's dot product is `da · (d · first - dmin · second)`.
pub fn block_dot_i32(b: &[u8], a: &[i8], bsums: &[i16]) -> (i32, i32) {
    let mut q = [0u8; QK_K];
    unpack(b, &mut q);
    let (mut sumi, mut summ) = (0i32, 0i32);
    for j in 0..8 {
        let (sc, m) = scale_min(scales(b), j);
        let dot: i32 = (0..32).map(|l| q[32 * j + l] as i32 * a[32 * j + l] as i32).sum();
        sumi += sc as i32 * dot;
        summ += m as i32 * (bsums[2 * j] as i32 + bsums[2 * j + 1] as i32);
    }
    (sumi, summ)
}

/// ggml's `make_qkx2_quants` for `nmax = 15`: scale and (negated) min of 32 values minimizing
/// the weighted squared error, trying `nstep + 1` scales around the range.
fn make_qkx2_quants(x: &[f32], w: &[f32], l_out: &mut [u8], rmin: f32, rdelta: f32, nstep: i32) -> (f32, f32) {
    const NMAX: i32 = 15;
    let n = x.len();
    let (mut min, mut max) = (x[0], x[0]);
    let (mut sum_w, mut sum_x) = (w[0], w[0] * x[0]);
    for i in 1..n {
        min = min.min(x[i]);
        max = max.max(x[i]);
        sum_w += w[i];
        sum_x += w[i] * x[i];
    }
    if min > 0.0 {
        min = 0.0;
    }
    if max == min {
        l_out[..n].iter_mut().for_each(|l| *l = 0);
        return (0.0, -min);
    }
    let mut iscale = NMAX as f32 / (max - min);
    let mut scale = 1.0 / iscale;
    let mut best = 0.0f32;
    for i in 0..n {
        let l = nearest_int(iscale * (x[i] - min)).clamp(0, NMAX);
        l_out[i] = l as u8;
        let diff = scale * l as f32 + min - x[i];
        best += w[i] * diff * diff;
    }
    let mut aux = [0u8; 32];
    for is in 0..=nstep {
        iscale = (rmin + rdelta * is as f32 + NMAX as f32) / (max - min);
        let (mut sum_l, mut sum_l2, mut sum_xl) = (0.0f32, 0.0f32, 0.0f32);
        for i in 0..n {
            let l = nearest_int(iscale * (x[i] - min)).clamp(0, NMAX);
            aux[i] = l as u8;
            let lf = l as f32;
            sum_l += w[i] * lf;
            sum_l2 += w[i] * lf * lf;
            sum_xl += w[i] * lf * x[i];
        }
        let det = sum_w * sum_l2 - sum_l * sum_l;
        if det > 0.0 {
            let mut this_scale = (sum_w * sum_xl - sum_x * sum_l) / det;
            let mut this_min = (sum_l2 * sum_x - sum_l * sum_xl) / det;
            if this_min > 0.0 {
                this_min = 0.0;
                this_scale = sum_xl / sum_l2;
            }
            let mut err = 0.0f32;
            for i in 0..n {
                let diff = this_scale * aux[i] as f32 + this_min - x[i];
                err += w[i] * diff * diff;
            }
            if err < best {
                l_out[..n].copy_from_slice(&aux[..n]);
                best = err;
                scale = this_scale;
                min = this_min;
            }
        }
    }
    (scale, -min)
}

pub fn quantize_block(x: &[f32], out: &mut [u8]) {
    let x = &x[..QK_K];
    let mut l = [0u8; QK_K];
    let (mut scales_f, mut mins_f) = ([0.0f32; 8], [0.0f32; 8]);
    let (mut max_scale, mut max_min) = (0.0f32, 0.0f32);
    for j in 0..8 {
        let xs = &x[32 * j..32 * j + 32];
        let av_x = (xs.iter().map(|v| v * v).sum::<f32>() / 32.0).sqrt();
        let mut w = [0.0f32; 32];
        for (wi, v) in w.iter_mut().zip(xs) {
            *wi = av_x + v.abs();
        }
        let (s, m) = make_qkx2_quants(xs, &w, &mut l[32 * j..32 * j + 32], -1.0, 0.1, 20);
        scales_f[j] = s;
        mins_f[j] = m;
        max_scale = max_scale.max(s);
        max_min = max_min.max(m);
    }
    let inv_scale = if max_scale > 0.0 { 63.0 / max_scale } else { 0.0 };
    let inv_min = if max_min > 0.0 { 63.0 / max_min } else { 0.0 };
    let mut sb = [0u8; 12];
    for j in 0..8 {
        let ls = (nearest_int(inv_scale * scales_f[j]) as u8).min(63);
        let lm = (nearest_int(inv_min * mins_f[j]) as u8).min(63);
        if j < 4 {
            sb[j] = ls;
            sb[j + 4] = lm;
        } else {
            sb[j + 4] = (ls & 0xF) | ((lm & 0xF) << 4);
            sb[j - 4] |= (ls >> 4) << 6;
            sb[j] |= (lm >> 4) << 6;
        }
    }
    write_f16(&mut out[0..2], max_scale / 63.0);
    write_f16(&mut out[2..4], max_min / 63.0);
    out[SCALES..SCALES + 12].copy_from_slice(&sb);
    let (d, dmin) = d_dmin(out);
    for j in 0..8 {
        let (sc, m) = scale_min(&sb, j);
        let dj = d * sc as f32;
        if dj == 0.0 {
            continue;
        }
        let dm = dmin * m as f32;
        for ii in 0..32 {
            l[32 * j + ii] = nearest_int((x[32 * j + ii] + dm) / dj).clamp(0, 15) as u8;
        }
    }
    let qs = &mut out[QS..QS + QK_K / 2];
    for c in 0..4 {
        for i in 0..32 {
            qs[32 * c + i] = l[64 * c + i] | (l[64 * c + 32 + i] << 4);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip_error_is_within_a_step() {
        let x: Vec<f32> = (0..QK_K).map(|i| ((i * 7919 % 257) as f32 / 128.0 - 1.0) * (1.0 + (i / 32) as f32)).collect();
        let mut b = [0u8; BLOCK_BYTES];
        quantize_block(&x, &mut b);
        let mut y = [0.0f32; QK_K];
        dequantize_block(&b, &mut y);
        let (d, _) = d_dmin(&b);
        for j in 0..8 {
            let (sc, _) = scale_min(scales(&b), j);
            let step = d * sc as f32;
            for i in 32 * j..32 * j + 32 {
                // a step of rounding plus the 6-bit scale/min rounding
                assert!((x[i] - y[i]).abs() <= 1.5 * step + 1e-3, "{} vs {} (step {})", x[i], y[i], step);
            }
        }
    }

    #[test]
    fn scale_min_packing_round_trips_all_values() {
        for ls in 0..64u8 {
            let lm = 63 - ls;
            let mut sb = [0u8; 12];
            for j in 0..8 {
                if j < 4 {
                    sb[j] = ls;
                    sb[j + 4] = lm;
                } else {
                    sb[j + 4] = (ls & 0xF) | ((lm & 0xF) << 4);
                    sb[j - 4] |= (ls >> 4) << 6;
                    sb[j] |= (lm >> 4) << 6;
                }
            }
            for j in 0..8 {
                assert_eq!(scale_min(&sb, j), (ls, lm));
            }
        }
    }
}
