//! Scaled dot-product attention on the CPU with grouped KV heads and an optional causal mask.
//!
//! Two paths:
//! - short query blocks (decode, small prompts): one pool task per (query row, KV head) for the
//!   query heads of its group: scores, softmax, then the weighted values;
//! - long blocks (prefill, the vision tower's thousands of patches): per head, scores for
//!   `QB` queries at a time as one matrix product against the head's keys, masked, softmaxed,
//!   then one product with the head's values, all through the SIMD linear kernels.

use super::linear::{dot, linear, Weights};
use crate::backend::AttnParams;
use super::pool;

/// Sizes of one call: `t` query rows of `heads` heads, keys of `kv_heads` heads, width `d`.
#[derive(Clone, Copy)]
pub struct Dims {
    pub t: usize,
    pub heads: usize,
    pub kv_heads: usize,
    pub d: usize,
}

/// Query rows per score block of the matrix-product path.
const QB: usize = 256;
/// The matrix-product path is used from this many query rows on.
const BLOCKED_FROM: usize = 32;

/// `out [t, heads, d]` = softmax(q · kᵀ · scale, masked) · v, with `k`, `v` `[cap, kv_heads, d]`.
pub fn attention(q: &[f32], k: &[f32], v: &[f32], dims: Dims, p: AttnParams, out: &mut [f32]) {
    let Dims { t, heads, d, .. } = dims;
    if d == 0 || heads == 0 || t == 0 {
        return;
    }
    if t >= BLOCKED_FROM && p.kv_len >= BLOCKED_FROM {
        blocked(q, k, v, dims, p, out)
    } else {
        streaming(q, k, v, dims, p, out)
    }
}

/// Per head: `S = Q_h · K_hᵀ · scale` for blocks of `QB` queries, masked rows softmaxed, then
/// `O = P · V_h` (with `V_h` transposed once per head so both products are `linear` calls).
fn blocked(q: &[f32], k: &[f32], v: &[f32], dims: Dims, p: AttnParams, out: &mut [f32]) {
    let Dims { t, heads, kv_heads, d } = dims;
    let (group, n) = (heads / kv_heads, p.kv_len);
    let (mut kh, mut vt) = (vec![0.0f32; n * d], vec![0.0f32; d * n]);
    let mut qh = vec![0.0f32; QB * d];
    let mut scores = vec![0.0f32; QB * n];
    let mut oh = vec![0.0f32; QB * d];
    for kvh in 0..kv_heads {
        for j in 0..n {
            let src = &k[(j * kv_heads + kvh) * d..(j * kv_heads + kvh + 1) * d];
            kh[j * d..(j + 1) * d].copy_from_slice(src);
            for (x, &val) in v[(j * kv_heads + kvh) * d..(j * kv_heads + kvh + 1) * d].iter().enumerate() {
                vt[x * n + j] = val;
            }
        }
        for h in kvh * group..(kvh + 1) * group {
            let mut i0 = 0;
            while i0 < t {
                let rows = QB.min(t - i0);
                for r in 0..rows {
                    qh[r * d..(r + 1) * d].copy_from_slice(&q[((i0 + r) * heads + h) * d..((i0 + r) * heads + h + 1) * d]);
                }
                let s = &mut scores[..rows * n];
                linear(&qh[..rows * d], Weights::F32(&kh), None, rows, n, d, s);
                pool::chunks_mut(&mut *s, n, |r, row| {
                    let visible = if p.causal { (p.q_pos0 + i0 + r + 1).min(n) } else { n };
                    softmax_row(&mut row[..visible], p.scale);
                    row[visible..].iter_mut().for_each(|x| *x = 0.0);
                });
                linear(s, Weights::F32(&vt), None, rows, d, n, &mut oh[..rows * d]);
                for r in 0..rows {
                    out[((i0 + r) * heads + h) * d..((i0 + r) * heads + h + 1) * d].copy_from_slice(&oh[r * d..(r + 1) * d]);
                }
                i0 += rows;
            }
        }
    }
}

/// `row = softmax(row · scale)` in branch-free passes the compiler vectorizes (max, exp,
/// sum, normalise; reductions over 8 lanes); the exponential is [`exp_fast`].
#[inline(always)]
fn softmax_row(row: &mut [f32], scale: f32) {
    let mut lanes = [f32::NEG_INFINITY; 8];
    let mut chunks = row.chunks_exact(8);
    for c in &mut chunks {
        for l in 0..8 {
            lanes[l] = if c[l] > lanes[l] { c[l] } else { lanes[l] };
        }
    }
    let max = chunks.remainder().iter().chain(lanes.iter()).fold(f32::NEG_INFINITY, |m, &x| if x > m { x } else { m }) * scale;
    row.iter_mut().for_each(|x| *x = exp_fast(*x * scale - max));
    let mut acc = [0.0f32; 8];
    let mut chunks = row.chunks_exact(8);
    for c in &mut chunks {
        for l in 0..8 {
            acc[l] += c[l];
        }
    }
    let sum: f32 = acc.iter().sum::<f32>() + chunks.remainder().iter().sum::<f32>();
    let inv = if sum > 0.0 { 1.0 / sum } else { 0.0 };
    row.iter_mut().for_each(|x| *x *= inv);
}

/// `e^x` for the scores of a softmax (x <= 0 in practice): Cody–Waite reduction to
/// `r in [-ln2/2, ln2/2]`, Cephes' degree-6 polynomial (relative error ~1e-7), and the power
/// of two built in the exponent bits. No branches or library calls, so loops over it vectorize.
#[inline(always)]
fn exp_fast(x: f32) -> f32 {
    const LOG2E: f32 = std::f32::consts::LOG2_E;
    const ROUND: f32 = 12_582_912.0; // 1.5 · 2^23: adding it rounds to an integer
    let x = if x < -87.0 { -87.0 } else if x > 88.0 { 88.0 } else { x };
    let t = x * LOG2E + ROUND;
    // t's low mantissa bits hold k = round(x · log2 e) as an integer
    let ki = (t.to_bits() as i32).wrapping_sub(0x4B40_0000);
    let k = t - ROUND;
    let r = x - k * 0.693_359_4 - k * -2.121_944_4e-4;
    let mut p = 1.987_569_1e-4f32;
    p = p * r + 1.398_199_9e-3;
    p = p * r + 8.333_452e-3;
    p = p * r + 4.166_579_6e-2;
    p = p * r + 1.666_666_5e-1;
    p = p * r + 5.000_000_1e-1;
    let e = p * r * r + r + 1.0;
    e * f32::from_bits(((ki + 127) as u32) << 23)
}

/// Keys per task of the streaming path, at least (fewer keys run in one task).
const KEYS_PER_TASK: usize = 32;

/// Short query blocks: the keys split into chunks, one task each, that walk their cache rows
/// in order (a row holds every KV head, so the reads are one forward stream; a walk over one
/// head's keys jumped a whole cache row per key and waited on memory for each):
/// 1. scores `S [t · heads, n]` (`n` the keys visible to the last query row), chunks in
///    parallel;
/// 2. a softmax per row over its visible keys (the rest zeroed);
/// 3. partial outputs `S[:, chunk] · V[chunk]` per chunk, summed in chunk order.
fn streaming(q: &[f32], k: &[f32], v: &[f32], dims: Dims, p: AttnParams, out: &mut [f32]) {
    let Dims { t, heads, d, .. } = dims;
    let n = if p.causal { (p.q_pos0 + t).min(p.kv_len) } else { p.kv_len };
    let rows = t * heads;
    let out = &mut out[..rows * d];
    if n == 0 {
        out.iter_mut().for_each(|x| *x = 0.0);
        return;
    }
    let tasks = ((n + KEYS_PER_TASK - 1) / KEYS_PER_TASK).min(2 * pool::threads()).max(1);
    let per = (n + tasks - 1) / tasks;
    let chunks: Vec<(usize, usize)> = (0..n).step_by(per).map(|j0| (j0, (j0 + per).min(n))).collect();
    // 1. scores, per chunk [rows, len]
    let parts: Vec<Vec<f32>> = pool::map(chunks.len(), |c| {
        let (j0, j1) = chunks[c];
        let mut sc = vec![0.0f32; rows * (j1 - j0)];
        simd_dispatch!(scores_chunk(q, k, dims, j0, j1, &mut sc));
        sc
    });
    // 2. S [rows, n], softmax per row over its visible keys
    let mut s = vec![0.0f32; rows * n];
    for (&(j0, j1), part) in chunks.iter().zip(&parts) {
        for (r, src) in part.chunks(j1 - j0).enumerate() {
            s[r * n + j0..r * n + j1].copy_from_slice(src);
        }
    }
    for (r, row) in s.chunks_mut(n).enumerate() {
        let visible = if p.causal { (p.q_pos0 + r / heads + 1).min(n) } else { n };
        softmax_row(&mut row[..visible], p.scale);
        row[visible..].iter_mut().for_each(|x| *x = 0.0);
    }
    // 3. O = Σ_chunks S[:, chunk] · V[chunk], summed in chunk order
    let s = &s;
    let partial: Vec<Vec<f32>> = pool::map(chunks.len(), |c| {
        let (j0, j1) = chunks[c];
        let mut o = vec![0.0f32; rows * d];
        simd_dispatch!(values_chunk(s, n, v, dims, j0, j1, &mut o));
        o
    });
    out.copy_from_slice(&partial[0]);
    for o in &partial[1..] {
        out.iter_mut().zip(o).for_each(|(x, &y)| *x += y);
    }
}

/// Calls `$f(args)`: its AVX2 instance (`avx2::$f`) when this CPU has AVX2, else the
/// baseline one (both compiled from the same body).
macro_rules! simd_dispatch {
    ($f:ident($($a:expr),*)) => {{
        #[cfg(target_arch = "x86_64")]
        let done = if is_x86_feature_detected!("avx2") {
            // SAFETY: AVX2 is detected on this CPU.
            unsafe { avx2::$f($($a),*) };
            true
        } else {
            false
        };
        #[cfg(not(target_arch = "x86_64"))]
        let done = false;
        if !done {
            $f($($a),*)
        }
    }};
}
use simd_dispatch;

/// `sc [t · heads, j1 - j0]`: the scores `q · k` (unscaled) of every query row and head
/// against keys `j0..j1`, walking the key rows in order.
#[inline(always)]
fn scores_chunk(q: &[f32], k: &[f32], dims: Dims, j0: usize, j1: usize, sc: &mut [f32]) {
    let Dims { t, heads, kv_heads, d } = dims;
    let (group, len) = (heads / kv_heads, j1 - j0);
    for j in j0..j1 {
        let krow = &k[j * kv_heads * d..(j + 1) * kv_heads * d];
        for r in 0..t * heads {
            let kvh = (r % heads) / group;
            sc[r * len + j - j0] = dot(&q[r * d..(r + 1) * d], &krow[kvh * d..(kvh + 1) * d]);
        }
    }
}

/// `o [t · heads, d]` = `S[:, j0..j1] · V[j0..j1]` (`s [t · heads, n]`), walking the value
/// rows in order.
#[inline(always)]
fn values_chunk(s: &[f32], n: usize, v: &[f32], dims: Dims, j0: usize, j1: usize, o: &mut [f32]) {
    let Dims { heads, kv_heads, d, .. } = dims;
    let group = heads / kv_heads;
    for j in j0..j1 {
        let vrow = &v[j * kv_heads * d..(j + 1) * kv_heads * d];
        for (r, orow) in o.chunks_mut(d).enumerate() {
            let w = s[r * n + j];
            let vh = &vrow[((r % heads) / group) * d..((r % heads) / group + 1) * d];
            orow.iter_mut().zip(vh).for_each(|(x, &y)| *x += w * y);
        }
    }
}

/// The AVX2 instances of the streaming loops.
#[cfg(target_arch = "x86_64")]
mod avx2 {
    use super::Dims;

    #[target_feature(enable = "avx2")]
    pub(super) unsafe fn scores_chunk(q: &[f32], k: &[f32], dims: Dims, j0: usize, j1: usize, sc: &mut [f32]) {
        super::scores_chunk(q, k, dims, j0, j1, sc)
    }

    #[target_feature(enable = "avx2")]
    pub(super) unsafe fn values_chunk(s: &[f32], n: usize, v: &[f32], dims: Dims, j0: usize, j1: usize, o: &mut [f32]) {
        super::values_chunk(s, n, v, dims, j0, j1, o)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// f64 reference with explicit GQA head mapping and causal mask.
    fn naive(q: &[f32], k: &[f32], v: &[f32], dims: Dims, p: AttnParams) -> Vec<f64> {
        let Dims { t, heads, kv_heads, d } = dims;
        let mut out = vec![0.0f64; t * heads * d];
        for i in 0..t {
            for h in 0..heads {
                let kvh = h * kv_heads / heads;
                let visible = if p.causal { p.q_pos0 + i + 1 } else { p.kv_len };
                let s: Vec<f64> = (0..visible)
                    .map(|j| (0..d).map(|x| q[(i * heads + h) * d + x] as f64 * k[(j * kv_heads + kvh) * d + x] as f64).sum::<f64>() * p.scale as f64)
                    .collect();
                let m = s.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
                let z: f64 = s.iter().map(|x| (x - m).exp()).sum();
                for j in 0..visible {
                    for x in 0..d {
                        out[(i * heads + h) * d + x] += (s[j] - m).exp() / z * v[(j * kv_heads + kvh) * d + x] as f64;
                    }
                }
            }
        }
        out
    }

    #[test]
    fn exp_fast_is_accurate_over_the_softmax_range() {
        let mut worst = 0.0f64;
        let mut x = -87.0f32;
        while x < 10.0 {
            let want = (x as f64).exp();
            worst = worst.max(((exp_fast(x) as f64) - want).abs() / want);
            x += 0.0137;
        }
        assert!(worst < 3e-7, "relative error {:e}", worst);
        assert_eq!(exp_fast(0.0), 1.0);
        assert!(exp_fast(-200.0) < 1e-37);
    }

    #[test]
    fn blocked_path_matches_naive_for_long_blocks() {
        let dims = Dims { t: 300, heads: 4, kv_heads: 2, d: 8 };
        let cap = 330;
        let gen = |n: usize, s: f32| (0..n).map(|i| (i as f32 * s).sin()).collect::<Vec<f32>>();
        let (q, k, v) = (gen(300 * 4 * 8, 0.37), gen(cap * 2 * 8, 1.1), gen(cap * 2 * 8, 0.23));
        for &(causal, q_pos0, kv_len) in &[(true, 0, 300), (true, 30, 330), (false, 0, 330)] {
            let p = AttnParams { kv_len, q_pos0, causal, scale: 0.35 };
            let mut out = vec![f32::NAN; 300 * 4 * 8];
            super::super::pool::in_test_pool(|| attention(&q, &k, &v, dims, p, &mut out));
            for (o, w) in out.iter().zip(naive(&q, &k, &v, dims, p)) {
                assert!((*o as f64 - w).abs() < 1e-5, "{} vs {}", o, w);
            }
        }
    }

    /// Decode-sized query blocks over enough keys for several key chunks (uneven last chunk),
    /// causal with an offset or not, and a block whose rows see different numbers of keys.
    #[test]
    fn streaming_key_chunks_match_naive() {
        let dims = Dims { t: 2, heads: 6, kv_heads: 2, d: 16 };
        let cap = 260;
        let gen = |n: usize, s: f32| (0..n).map(|i| ((i as f32 * s).sin()) * 2.0).collect::<Vec<f32>>();
        let (q, k, v) = (gen(2 * 6 * 16, 0.71), gen(cap * 2 * 16, 1.37), gen(cap * 2 * 16, 0.29));
        for &(causal, q_pos0, kv_len) in &[(true, 201, 203), (true, 0, 2), (false, 0, 257), (true, 40, 250)] {
            assert!(kv_len <= cap && 2 < BLOCKED_FROM);
            let p = AttnParams { kv_len, q_pos0, causal, scale: 0.3 };
            let mut out = vec![f32::NAN; 2 * 6 * 16];
            super::super::pool::in_test_pool(|| attention(&q, &k, &v, dims, p, &mut out));
            for (o, w) in out.iter().zip(naive(&q, &k, &v, dims, p)) {
                assert!((*o as f64 - w).abs() < 1e-5, "{:?}: {} vs {}", (causal, q_pos0, kv_len), o, w);
            }
        }
    }

    #[test]
    fn matches_naive_with_gqa_causal_and_offset() {
        let dims = Dims { t: 3, heads: 4, kv_heads: 2, d: 5 };
        let cap = 9;
        let gen = |n: usize, s: f32| (0..n).map(|i| (i as f32 * s).sin()).collect::<Vec<f32>>();
        let (q, k, v) = (gen(3 * 4 * 5, 0.7), gen(cap * 2 * 5, 1.3), gen(cap * 2 * 5, 0.4));
        for &(causal, q_pos0, kv_len) in &[(true, 0, 3), (true, 4, 7), (false, 0, 9)] {
            let p = AttnParams { kv_len, q_pos0, causal, scale: 0.45 };
            let mut out = vec![f32::NAN; 3 * 4 * 5];
            super::super::pool::in_test_pool(|| attention(&q, &k, &v, dims, p, &mut out));
            for (o, w) in out.iter().zip(naive(&q, &k, &v, dims, p)) {
                assert!((*o as f64 - w).abs() < 1e-5, "{} vs {}", o, w);
            }
        }
    }
}
