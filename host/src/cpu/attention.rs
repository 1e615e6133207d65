//! Scaled dot-product attention on the CPU with grouped KV heads and an optional causal mask.
//!
//! One rayon task per (query row, head), one pass over the visible keys with the streaming
//! update `gpu::math::OnlineSoftmax::push_weighted`: the same arithmetic as the
//! `attention_f32` kernel.

use super::linear::dot;
use crate::backend::AttnParams;
use gpu::math::OnlineSoftmax;
use rayon::prelude::*;

/// Sizes of one call: `t` query rows of `heads` heads, keys of `kv_heads` heads, width `d`.
#[derive(Clone, Copy)]
pub struct Dims {
    pub t: usize,
    pub heads: usize,
    pub kv_heads: usize,
    pub d: usize,
}

/// `out [t, heads, d]` = softmax(q · kᵀ · scale, masked) · v, with `k`, `v` `[cap, kv_heads, d]`.
pub fn attention(q: &[f32], k: &[f32], v: &[f32], dims: Dims, p: AttnParams, out: &mut [f32]) {
    let Dims { heads, kv_heads, d, .. } = dims;
    if d == 0 || heads == 0 {
        return;
    }
    let group = heads / kv_heads;
    let kv_stride = kv_heads * d;
    out.par_chunks_mut(d).enumerate().for_each(|(idx, o)| {
        let (i, h) = (idx / heads, idx % heads);
        let kvh = h / group;
        let visible = if p.causal { (p.q_pos0 + i + 1).min(p.kv_len) } else { p.kv_len };
        let qv = &q[idx * d..(idx + 1) * d];
        let mut norm = OnlineSoftmax::EMPTY;
        o.iter_mut().for_each(|x| *x = 0.0);
        for j in 0..visible {
            let row = j * kv_stride + kvh * d;
            let (next, rescale, w) = norm.push_weighted(dot(qv, &k[row..row + d]) * p.scale);
            norm = next;
            for (x, &vv) in o.iter_mut().zip(&v[row..row + d]) {
                *x = *x * rescale + w * vv;
            }
        }
        let inv = if norm.sum > 0.0 { 1.0 / norm.sum } else { 0.0 };
        o.iter_mut().for_each(|x| *x *= inv);
    });
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
    fn matches_naive_with_gqa_causal_and_offset() {
        let dims = Dims { t: 3, heads: 4, kv_heads: 2, d: 5 };
        let cap = 9;
        let gen = |n: usize, s: f32| (0..n).map(|i| ((i as f32 * s).sin())).collect::<Vec<f32>>();
        let (q, k, v) = (gen(3 * 4 * 5, 0.7), gen(cap * 2 * 5, 1.3), gen(cap * 2 * 5, 0.4));
        for &(causal, q_pos0, kv_len) in &[(true, 0, 3), (true, 4, 7), (false, 0, 9)] {
            let p = AttnParams { kv_len, q_pos0, causal, scale: 0.45 };
            let mut out = vec![f32::NAN; 3 * 4 * 5];
            attention(&q, &k, &v, dims, p, &mut out);
            for (o, w) in out.iter().zip(naive(&q, &k, &v, dims, p)) {
                assert!((*o as f64 - w).abs() < 1e-5, "{} vs {}", o, w);
            }
        }
    }
}
