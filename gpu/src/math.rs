//! Pure scalar math shared by the GPU kernels and the CPU backend, so that every formula
//! exists once. Everything here compiles for the host (std) and for `nvptx64-nvidia-cuda`
//! (no_std, where `cuda_std::GpuFloat` maps `exp`/`sqrt`/`tanh` to libdevice).

#[cfg(target_os = "cuda")]
#[allow(unused_imports)]
use cuda_std::GpuFloat;

/// A weight element as stored in a checkpoint, widened to f32 for arithmetic.
pub trait WeightElem: Copy {
    fn to_f32(self) -> f32;
}

impl WeightElem for f32 {
    #[inline(always)]
    fn to_f32(self) -> f32 {
        self
    }
}

/// IEEE 754 binary16, as its raw bits.
#[repr(transparent)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct F16(pub u16);

/// bfloat16 (the top half of an f32), as its raw bits.
#[repr(transparent)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct Bf16(pub u16);

impl WeightElem for F16 {
    #[inline(always)]
    fn to_f32(self) -> f32 {
        f16_to_f32(self.0)
    }
}

impl WeightElem for Bf16 {
    #[inline(always)]
    fn to_f32(self) -> f32 {
        bf16_to_f32(self.0)
    }
}

/// Widens bfloat16 bits to f32 (exact).
#[inline(always)]
pub fn bf16_to_f32(bits: u16) -> f32 {
    f32::from_bits((bits as u32) << 16)
}

/// Widens IEEE binary16 bits to f32 (exact, subnormals, infinities and NaN included).
#[inline(always)]
pub fn f16_to_f32(bits: u16) -> f32 {
    let sign = ((bits as u32) & 0x8000) << 16;
    let exp = ((bits >> 10) & 0x1f) as u32;
    let man = (bits & 0x3ff) as u32;
    let out = if exp == 0x1f {
        // inf / NaN
        sign | 0x7f80_0000 | (man << 13)
    } else if exp != 0 {
        sign | ((exp + 112) << 23) | (man << 13)
    } else if man == 0 {
        sign
    } else {
        // subnormal: value = man * 2^-24, exact in f32
        let mag = (man as f32) * (1.0 / 16_777_216.0);
        sign | mag.to_bits()
    };
    f32::from_bits(out)
}

/// SiLU (swish): x * sigmoid(x).
#[inline(always)]
pub fn silu(x: f32) -> f32 {
    x / (1.0 + (-x).exp())
}

/// The SwiGLU gate: silu(gate) * up.
#[inline(always)]
pub fn silu_mul(gate: f32, up: f32) -> f32 {
    silu(gate) * up
}

/// GELU with the tanh approximation (PyTorch's `approximate="tanh"`).
#[inline(always)]
pub fn gelu_tanh(x: f32) -> f32 {
    const SQRT_2_OVER_PI: f32 = 0.797_884_6;
    0.5 * x * (1.0 + (SQRT_2_OVER_PI * (x + 0.044_715 * x * x * x)).tanh())
}

/// The error function, Abramowitz & Stegun 7.1.26 (absolute error below 1.5e-7, far under the
/// f32 resolution that matters for GELU).
#[inline(always)]
pub fn erf(x: f32) -> f32 {
    let a = if x < 0.0 { -x } else { x };
    let t = 1.0 / (1.0 + 0.327_591_1 * a);
    let poly = t * (0.254_829_6 + t * (-0.284_496_72 + t * (1.421_413_8 + t * (-1.453_152 + t * 1.061_405_4))));
    let y = 1.0 - poly * (-a * a).exp();
    if x < 0.0 {
        -y
    } else {
        y
    }
}

/// Exact GELU, `x · Φ(x)` (PyTorch's default `nn.GELU()`).
#[inline(always)]
pub fn gelu_erf(x: f32) -> f32 {
    0.5 * x * (1.0 + erf(x * core::f32::consts::FRAC_1_SQRT_2))
}

/// LayerNorm of one element given its row's mean and `1 / sqrt(var + eps)`.
#[inline(always)]
pub fn layer_norm_elem(x: f32, mean: f32, inv_std: f32, w: f32, b: f32) -> f32 {
    (x - mean) * inv_std * w + b
}

/// 1 / sqrt(mean + eps), the RMSNorm scale of a row whose mean square is `mean_sq`.
#[inline(always)]
pub fn rms_scale(mean_sq: f32, eps: f32) -> f32 {
    1.0 / (mean_sq + eps).sqrt()
}

/// Rotary embedding of one pair in the rotate-half layout: `(x[i], x[i + d/2])` rotated by the
/// angle whose cosine and sine are `c`, `s` (`x·cos + rotate_half(x)·sin`).
#[inline(always)]
pub fn rope_pair(x1: f32, x2: f32, c: f32, s: f32) -> (f32, f32) {
    (x1 * c - x2 * s, x2 * c + x1 * s)
}

/// A running softmax normaliser: the maximum seen so far and the sum of `exp(x - max)`.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct OnlineSoftmax {
    pub max: f32,
    pub sum: f32,
}

impl OnlineSoftmax {
    /// The state before any element: max = -inf, sum = 0.
    pub const EMPTY: OnlineSoftmax = OnlineSoftmax { max: f32::NEG_INFINITY, sum: 0.0 };

    /// Adds one element (one step of the online softmax).
    #[inline(always)]
    pub fn push(self, x: f32) -> OnlineSoftmax {
        if x > self.max {
            OnlineSoftmax { max: x, sum: self.sum * (self.max - x).exp() + 1.0 }
        } else if x == f32::NEG_INFINITY {
            self
        } else {
            OnlineSoftmax { max: self.max, sum: self.sum + (x - self.max).exp() }
        }
    }

    /// Adds one element and returns, with the new state, the factor that rescales sums made
    /// under the old maximum and the weight `exp(x - new max)` of `x`: the streaming update of
    /// flash attention (`acc = acc * rescale + weight * v`, output `acc / sum`).
    #[inline(always)]
    pub fn push_weighted(self, x: f32) -> (OnlineSoftmax, f32, f32) {
        if x == f32::NEG_INFINITY {
            return (self, 1.0, 0.0);
        }
        if x > self.max {
            let rescale = (self.max - x).exp();
            (OnlineSoftmax { max: x, sum: self.sum * rescale + 1.0 }, rescale, 1.0)
        } else {
            let w = (x - self.max).exp();
            (OnlineSoftmax { max: self.max, sum: self.sum + w }, 1.0, w)
        }
    }

    /// Merges two partial states (order-independent up to rounding).
    #[inline(always)]
    pub fn merge(self, other: OnlineSoftmax) -> OnlineSoftmax {
        if other.max == f32::NEG_INFINITY {
            return self;
        }
        if self.max == f32::NEG_INFINITY {
            return other;
        }
        let max = if self.max > other.max { self.max } else { other.max };
        OnlineSoftmax {
            max,
            sum: self.sum * (self.max - max).exp() + other.sum * (other.max - max).exp(),
        }
    }

    /// The softmax probability of `x` under this normaliser (0 for an all -inf row).
    #[inline(always)]
    pub fn prob(self, x: f32) -> f32 {
        if self.sum == 0.0 {
            0.0
        } else {
            (x - self.max).exp() / self.sum
        }
    }
}

#[cfg(all(test, not(target_os = "cuda")))]
mod tests {
    use super::*;

    #[test]
    fn f16_conversion_matches_reference_values() {
        assert_eq!(f16_to_f32(0x3c00), 1.0);
        assert_eq!(f16_to_f32(0xc000), -2.0);
        assert_eq!(f16_to_f32(0x7bff), 65504.0);
        assert_eq!(f16_to_f32(0x0001), 5.960_464_5e-8);
        assert_eq!(f16_to_f32(0x03ff), 6.097_555e-5);
        assert_eq!(f16_to_f32(0x7c00), f32::INFINITY);
        assert!(f16_to_f32(0x7e00).is_nan());
        assert_eq!(f16_to_f32(0x8000).to_bits(), (-0.0f32).to_bits());
    }

    #[test]
    fn bf16_conversion_is_the_top_half() {
        assert_eq!(bf16_to_f32(0x3f80), 1.0);
        assert_eq!(bf16_to_f32(0xc040), -3.0);
    }

    #[test]
    fn online_softmax_matches_two_pass() {
        let xs = [1.0f32, -3.0, 7.5, 0.25, 7.5, f32::NEG_INFINITY, -20.0];
        let m = xs.iter().cloned().fold(f32::NEG_INFINITY, f32::max);
        let s: f64 = xs.iter().map(|&x| ((x - m) as f64).exp()).sum();
        let one = xs.iter().fold(OnlineSoftmax::EMPTY, |st, &x| st.push(x));
        let (a, b) = xs.split_at(3);
        let split = a
            .iter()
            .fold(OnlineSoftmax::EMPTY, |st, &x| st.push(x))
            .merge(b.iter().fold(OnlineSoftmax::EMPTY, |st, &x| st.push(x)));
        for st in [one, split] {
            assert_eq!(st.max, m);
            assert!(((st.sum as f64) - s).abs() < 1e-5 * s);
        }
        assert_eq!(OnlineSoftmax::EMPTY.merge(OnlineSoftmax::EMPTY).prob(1.0), 0.0);
    }

    #[test]
    fn erf_and_gelu_match_f64_references() {
        // erf reference values (from tables) and gelu via the f64 identity
        for &(x, e) in &[(0.0f64, 0.0f64), (0.5, 0.520_499_877_8), (1.0, 0.842_700_792_9), (-2.0, -0.995_322_265), (3.5, 0.999_999_256_9)] {
            assert!((erf(x as f32) as f64 - e).abs() < 3e-7, "erf({})", x);
        }
        for &x in &[-6.0f32, -1.0, -0.1, 0.0, 0.7, 2.5, 8.0] {
            let want = 0.5 * x as f64 * (1.0 + libm_erf(x as f64 / 2f64.sqrt()));
            assert!((gelu_erf(x) as f64 - want).abs() < 1e-6, "gelu({})", x);
        }
    }

    /// erf by its Taylor series / continued fraction in f64, for the test only.
    fn libm_erf(x: f64) -> f64 {
        if x.abs() > 4.0 {
            return x.signum();
        }
        let (mut sum, mut term, mut n) = (x, x, 0.0);
        while term.abs() > 1e-17 {
            n += 1.0;
            term *= -x * x / n;
            sum += term / (2.0 * n + 1.0);
        }
        sum * 2.0 / std::f64::consts::PI.sqrt()
    }

    #[test]
    fn activations_match_f64_formulas() {
        for &x in &[-8.0f32, -1.5, 0.0, 0.3, 2.0, 9.0] {
            let xd = x as f64;
            let silu_ref = xd / (1.0 + (-xd).exp());
            assert!((silu(x) as f64 - silu_ref).abs() < 1e-6);
            let g = 0.5 * xd * (1.0 + ((2.0 / std::f64::consts::PI).sqrt() * (xd + 0.044715 * xd.powi(3))).tanh());
            assert!((gelu_tanh(x) as f64 - g).abs() < 1e-5);
        }
    }
}
