//! `Q6_K`: super-blocks of 256 values in 16 sub-blocks of 16 (210 bytes):
//!
//! ```text
//! [ql: 128 bytes (low 4 bits)][qh: 64 bytes (high 2 bits)][scales: 16 × i8][d: f16]
//! ```
//!
//! Value `e` is `d · sc[e / 16] · (q - 32)` with a 6-bit `q`. Each half `h` of 128 values uses
//! `ql[64h .. 64h + 64]` and `qh[32h .. 32h + 32]`: for `l < 32` and quarter `t < 4`, element
//! `128h + 32t + l` has its low 4 bits in `ql[64h + l + 32 (t & 1)]` (low nibble for `t < 2`,
//! high for `t ≥ 2`) and its high 2 bits at bit `2t` of `qh[32h + l]` ([`unpack`]).
//! Quantization follows ggml's `quantize_row_q6_K_ref` (`make_qx_quants` per sub-block, int8
//! sub-block scales relative to the largest).

use super::{nearest_int, read_f16, write_f16, QK_K};

pub const BLOCK_BYTES: usize = QK_K / 2 + QK_K / 4 + QK_K / 16 + 2;
const QH: usize = QK_K / 2;
const SC: usize = QH + QK_K / 4;
const D: usize = SC + QK_K / 16;

/// The super-block scale.
#[inline(always)]
pub fn d(b: &[u8]) -> f32 {
    read_f16(&b[D..D + 2])
}

/// The 16 sub-block scales.
#[inline(always)]
pub fn scales(b: &[u8]) -> [i8; 16] {
    let mut s = [0i8; 16];
    for (o, &v) in s.iter_mut().zip(&b[SC..SC + 16]) {
        *o = v as i8;
    }
    s
}

/// The 256 6-bit values (0 ..= 63, before the -32 offset) in element order.
pub fn unpack(b: &[u8], q: &mut [u8; QK_K]) {
    for h in 0..2 {
        let (ql, qh) = (&b[64 * h..64 * h + 64], &b[QH + 32 * h..QH + 32 * h + 32]);
        for l in 0..32 {
            q[128 * h + l] = (ql[l] & 0xF) | ((qh[l] & 3) << 4);
            q[128 * h + 32 + l] = (ql[l + 32] & 0xF) | (((qh[l] >> 2) & 3) << 4);
            q[128 * h + 64 + l] = (ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4);
            q[128 * h + 96 + l] = (ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4);
        }
    }
}

pub fn dequantize_block(b: &[u8], out: &mut [f32]) {
    let dd = d(b);
    let sc = scales(b);
    let mut q = [0u8; QK_K];
    unpack(b, &mut q);
    for (e, o) in out[..QK_K].iter_mut().enumerate() {
        *o = dd * sc[e / 16] as f32 * (q[e] as i32 - 32) as f32;
    }
}

/// `Σ_j sc_j · Σ_{i∈j} (q_i - 32) a_i` against 256 int8 activations whose 16-element sums are
/// `bsums`: the block's dot product is `da · d · result`.
pub fn block_dot_i32(b: &[u8], a: &[i8], bsums: &[i16]) -> i32 {
    let sc = scales(b);
    let mut q = [0u8; QK_K];
    unpack(b, &mut q);
    let mut sum = 0i32;
    for j in 0..16 {
        let dot: i32 = (0..16).map(|l| q[16 * j + l] as i32 * a[16 * j + l] as i32).sum();
        sum += sc[j] as i32 * (dot - 32 * bsums[j] as i32);
    }
    sum
}

/// ggml's `make_qx_quants` with `rmse_type = 1` and no weights, for `nmax = 32`: a signed
/// scale for 16 values, `l_out` the levels + 32.
fn make_qx_quants(x: &[f32], l_out: &mut [u8]) -> f32 {
    const NMAX: i32 = 32;
    let (mut max, mut amax) = (0.0f32, 0.0f32);
    for &v in x {
        if v.abs() > amax {
            amax = v.abs();
            max = v;
        }
    }
    if amax < 1e-15 {
        l_out.iter_mut().for_each(|l| *l = 0);
        return 0.0;
    }
    let mut iscale = -(NMAX as f32) / max;
    let (mut sumlx, mut suml2) = (0.0f32, 0.0f32);
    for (i, &v) in x.iter().enumerate() {
        let l = nearest_int(iscale * v).clamp(-NMAX, NMAX - 1);
        l_out[i] = (l + NMAX) as u8;
        let w = v * v;
        sumlx += w * v * l as f32;
        suml2 += w * (l * l) as f32;
    }
    let mut scale = sumlx / suml2;
    let mut best = scale * sumlx;
    for is in -9..=9 {
        if is == 0 {
            continue;
        }
        iscale = -(NMAX as f32 + 0.1 * is as f32) / max;
        sumlx = 0.0;
        suml2 = 0.0;
        for &v in x {
            let l = nearest_int(iscale * v).clamp(-NMAX, NMAX - 1);
            let w = v * v;
            sumlx += w * v * l as f32;
            suml2 += w * (l * l) as f32;
        }
        if suml2 > 0.0 && sumlx * sumlx > best * suml2 {
            for (i, &v) in x.iter().enumerate() {
                l_out[i] = (NMAX + nearest_int(iscale * v).clamp(-NMAX, NMAX - 1)) as u8;
            }
            scale = sumlx / suml2;
            best = scale * sumlx;
        }
    }
    scale
}

pub fn quantize_block(x: &[f32], out: &mut [u8]) {
    let x = &x[..QK_K];
    let mut l = [0u8; QK_K];
    let mut scales_f = [0.0f32; 16];
    let (mut max_scale, mut max_abs) = (0.0f32, 0.0f32);
    for j in 0..16 {
        let s = make_qx_quants(&x[16 * j..16 * j + 16], &mut l[16 * j..16 * j + 16]);
        scales_f[j] = s;
        if s.abs() > max_abs {
            max_abs = s.abs();
            max_scale = s;
        }
    }
    out[..BLOCK_BYTES].iter_mut().for_each(|b| *b = 0);
    if max_abs == 0.0 {
        write_f16(&mut out[D..D + 2], 0.0);
        return;
    }
    let iscale = -128.0 / max_scale;
    write_f16(&mut out[D..D + 2], 1.0 / iscale);
    for j in 0..16 {
        out[SC + j] = nearest_int(iscale * scales_f[j]).min(127) as i8 as u8;
    }
    let dd = d(out);
    for j in 0..16 {
        let dj = dd * out[SC + j] as i8 as f32;
        if dj == 0.0 {
            continue;
        }
        for ii in 0..16 {
            l[16 * j + ii] = (nearest_int(x[16 * j + ii] / dj).clamp(-32, 31) + 32) as u8;
        }
    }
    for h in 0..2 {
        for i in 0..32 {
            let base = 128 * h;
            let (q1, q2, q3, q4) = (l[base + i], l[base + 32 + i], l[base + 64 + i], l[base + 96 + i]);
            out[64 * h + i] = (q1 & 0xF) | ((q3 & 0xF) << 4);
            out[64 * h + 32 + i] = (q2 & 0xF) | ((q4 & 0xF) << 4);
            out[QH + 32 * h + i] = (q1 >> 4) | ((q2 >> 4) << 2) | ((q3 >> 4) << 4) | ((q4 >> 4) << 6);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The GPU's per-byte `q - 32` (`gpu::qmath::q6_k_center`) and bit positions
    /// (`q6_k_bits_at`) agree with [`unpack`].
    #[test]
    fn gpu_bit_helpers_match_unpack() {
        for q in 0..64u32 {
            let w = q | (63 - q) << 8 | (q / 2) << 16 | 31u32 << 24;
            let c = gpu::qmath::q6_k_center(w).to_le_bytes();
            assert_eq!([c[0] as i8 as i32, c[1] as i8 as i32, c[2] as i8 as i32, c[3] as i8 as i32], [q as i32 - 32, 31 - q as i32, (q / 2) as i32 - 32, -1]);
        }
        let x: Vec<f32> = (0..QK_K).map(|i| (i * 7919 % 257) as f32 / 128.0 - 1.0).collect();
        let mut b = [0u8; BLOCK_BYTES];
        quantize_block(&x, &mut b);
        let mut q = [0u8; QK_K];
        unpack(&b, &mut q);
        for (e, &want) in q.iter().enumerate() {
            let (ql, high, qh, shift) = gpu::qmath::q6_k_bits_at(e);
            let lo = if high { b[ql] >> 4 } else { b[ql] & 0xF };
            assert_eq!(lo | ((b[QH + qh] >> shift) & 3) << 4, want, "element {}", e);
        }
    }

    #[test]
    fn round_trip_error_is_within_a_step() {
        let x: Vec<f32> = (0..QK_K).map(|i| ((i * 7919 % 257) as f32 / 128.0 - 1.0) * (1.0 + (i / 16) as f32 * 0.3)).collect();
        let mut b = [0u8; BLOCK_BYTES];
        quantize_block(&x, &mut b);
        let mut y = [0.0f32; QK_K];
        dequantize_block(&b, &mut y);
        let (dd, sc) = (d(&b), scales(&b));
        for i in 0..QK_K {
            let step = (dd * sc[i / 16] as f32).abs();
            assert!((x[i] - y[i]).abs() <= 0.5 * step + 1e-3, "{}: {} vs {} (step {})", i, x[i], y[i], step);
        }
    }
}
