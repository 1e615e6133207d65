//! Elementwise CPU ops, in parallel chunks; the scalar math is `gpu::math`'s.

use super::pool;

const CHUNK: usize = 16_384;

/// `out = silu(gate) * up`.
pub fn silu_mul(gate: &[f32], up: &[f32], out: &mut [f32]) {
    pool::chunks_mut(out, CHUNK, |i, o| {
        let (g, u) = (&gate[i * CHUNK..], &up[i * CHUNK..]);
        for ((o, &g), &u) in o.iter_mut().zip(g).zip(u) {
            *o = gpu::math::silu_mul(g, u);
        }
    });
}

#[cfg(test)]
mod tests {
    #[test]
    fn silu_mul_matches_f64() {
        let g: Vec<f32> = (0..40_000).map(|i| (i as f32 - 20_000.0) / 2_000.0).collect();
        let u: Vec<f32> = (0..40_000).map(|i| ((i % 13) as f32) - 6.0).collect();
        let mut o = vec![f32::NAN; g.len()];
        super::silu_mul(&g, &u, &mut o);
        for i in 0..g.len() {
            let gd = g[i] as f64;
            let want = gd / (1.0 + (-gd).exp()) * u[i] as f64;
            assert!((o[i] as f64 - want).abs() < 1e-5 * (1.0 + want.abs()), "{}: {} {}", i, o[i], want);
        }
    }
}

/// `out = gelu(x)` in the given form.
pub fn gelu(x: &[f32], kind: crate::Gelu, out: &mut [f32]) {
    let f = match kind {
        crate::Gelu::Tanh => gpu::math::gelu_tanh,
        crate::Gelu::Erf => gpu::math::gelu_erf,
    };
    pool::chunks_mut(out, CHUNK, |i, o| {
        for (o, &v) in o.iter_mut().zip(&x[i * CHUNK..]) {
            *o = f(v);
        }
    });
}

/// `out = a + b`.
pub fn add(a: &[f32], b: &[f32], out: &mut [f32]) {
    pool::chunks_mut(out, CHUNK, |i, o| {
        for ((o, &x), &y) in o.iter_mut().zip(&a[i * CHUNK..]).zip(&b[i * CHUNK..]) {
            *o = x + y;
        }
    });
}
