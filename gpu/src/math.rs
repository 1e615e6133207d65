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

/// The PTX instruction `<op>.approx.ftz.f32` applied to `x` (GPU only).
#[cfg(target_os = "cuda")]
macro_rules! approx_f32 {
    ($op:literal, $x:expr) => {{
        let y: u32;
        unsafe {
            core::arch::asm!(concat!($op, ".approx.ftz.f32 {}, {};"), out(reg32) y, in(reg32) ($x).to_bits(), options(pure, nomem, nostack));
        }
        f32::from_bits(y)
    }};
}

/// `2^x`. On the GPU `ex2.approx.ftz.f32` (relative error about 2^-22, one instruction where
/// libdevice's `expf` takes about ten); on the CPU `f32::exp2`.
#[inline(always)]
pub fn exp2_fast(x: f32) -> f32 {
    #[cfg(target_os = "cuda")]
    return approx_f32!("ex2", x);
    #[cfg(not(target_os = "cuda"))]
    return x.exp2();
}

/// `1 / x`. On the GPU `rcp.approx.ftz.f32` (at most 1 ulp off; `inf` gives 0), one instruction
/// where an IEEE division is a sequence with a slow path; on the CPU the division.
#[inline(always)]
pub fn recip_fast(x: f32) -> f32 {
    #[cfg(target_os = "cuda")]
    return approx_f32!("rcp", x);
    #[cfg(not(target_os = "cuda"))]
    return 1.0 / x;
}

/// `log2(e)`: `e^x = 2^(x · LOG2_E)`.
const LOG2_E: f32 = core::f32::consts::LOG2_E;

/// SiLU (swish): `x · sigmoid(x) = x / (1 + e^-x)`, with [`exp2_fast`] and [`recip_fast`] (a
/// few ulp of f32 on the GPU, under every rounding to 16 bits that follows it; `x` far below
/// zero gives -0, as the limit).
#[inline(always)]
pub fn silu(x: f32) -> f32 {
    x * recip_fast(1.0 + exp2_fast(-x * LOG2_E))
}

/// The SwiGLU gate: silu(gate) * up.
#[inline(always)]
pub fn silu_mul(gate: f32, up: f32) -> f32 {
    silu(gate) * up
}

/// GELU with the tanh approximation (PyTorch's `approximate="tanh"`): `0.5 x (1 + tanh(u))`,
/// `u = sqrt(2/pi) (x + 0.044715 x^3)`, computed as the equal `x · sigmoid(2u) = x / (1 +
/// 2^(-2u · log2 e))` with [`exp2_fast`] and [`recip_fast`]: seven instructions on the GPU where
/// libdevice's `tanhf` took about twenty (the vision MLP's `fc1` epilogue was bound by it).
/// `x` far below zero gives -0 and far above gives `x`, as the limits.
#[inline(always)]
pub fn gelu_tanh(x: f32) -> f32 {
    // 2 · sqrt(2 / pi) · log2(e), and that times 0.044715
    const K: f32 = 2.0 * 0.797_884_6 * LOG2_E;
    const KC: f32 = K * 0.044_715;
    let z = x * (KC * x * x + K);
    x * recip_fast(1.0 + exp2_fast(-z))
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

/// Narrows f32 to IEEE binary16 bits, rounding to nearest even (overflow to infinity, NaN kept
/// quiet): what `cvt.rn.f16.f32` does on the GPU, so a KV cache written by either backend holds
/// the same bits.
#[inline(always)]
pub fn f32_to_f16_bits(x: f32) -> u16 {
    let b = x.to_bits();
    let sign = ((b >> 16) & 0x8000) as u16;
    let exp = ((b >> 23) & 0xff) as i32;
    let man = b & 0x7f_ffff;
    if exp == 0xff {
        // inf / NaN (a NaN keeps a quiet payload bit)
        return sign | 0x7c00 | if man != 0 { 0x200 | (man >> 13) as u16 } else { 0 };
    }
    let e = exp - 127 + 15;
    if e >= 0x1f {
        return sign | 0x7c00;
    }
    if e <= 0 {
        // subnormal half (or zero): shift the full mantissa with its implicit bit
        if e < -10 {
            return sign;
        }
        let full = man | 0x80_0000;
        let shift = (14 - e) as u32;
        let half = full >> shift;
        let rem = full & ((1 << shift) - 1);
        let mid = 1 << (shift - 1);
        let round = (rem > mid || (rem == mid && (half & 1) == 1)) as u32;
        return sign | (half + round) as u16;
    }
    let half = ((e as u32) << 10) | (man >> 13);
    let rem = man & 0x1fff;
    let round = (rem > 0x1000 || (rem == 0x1000 && (half & 1) == 1)) as u32;
    // a carry out of the mantissa correctly bumps the exponent (up to infinity)
    sign | (half + round) as u16
}

/// Largest power-of-two exponent [`f16_row_scale`] brings a row's largest magnitude to:
/// scaled rows lie in `[2^14, 2^15)`, so a value and its f16 remainder both stay finite (f16's
/// largest is 65504) and the remainder keeps f16's precision far below the row's largest value.
pub const F16_ROW_EXP: i32 = 14;

/// The exact power of two `2^-e` that the tensor-core f16 GEMM multiplies a row of activations
/// by before splitting it into f16 parts (and divides the row's sums by afterwards), for a row
/// whose largest magnitude is `max_abs`: `e = exponent(max_abs) - F16_ROW_EXP`, at least -100
/// (so `2^-e` is a normal f32; it is at most 113 anyway); 1 for a row of zeros or f32
/// subnormals, and for one that holds an infinity or NaN (which the product then carries as
/// f32 would). Shared by the `row_scale_f32` kernel and the CPU tests.
#[inline(always)]
pub fn f16_row_scale(max_abs: f32) -> f32 {
    let exp = ((max_abs.to_bits() >> 23) & 0xff) as i32;
    if exp == 0 || exp == 0xff {
        return 1.0;
    }
    let e = (exp - 127 - F16_ROW_EXP).max(-100);
    f32::from_bits(((127 - e) as u32) << 23)
}

/// The power of two `s` an f16 value row (one KV head's `d` values of one token) is stored
/// divided by, for a row whose largest magnitude is `max_abs`: 1 while the row is below `2^15`
/// (what an f16 cache always held; such rows are stored exactly as before), else
/// `2^(exponent(max_abs) - F16_ROW_EXP)`, which brings the row into `[2^14, 2^15)`, so a value of
/// any f32 magnitude is stored with f16's relative precision instead of overflowing. Never below
/// 1: the tensor-core attention folds `s / max s` into the probabilities it rounds to f16, where
/// a row scaled up would lose its precision. The reader multiplies by `s` (exact). 1 for
/// infinities and NaN (carried as f32 would carry them). Shared by the cache writers
/// (`qkv_rope_append_f16`, `rope_cast_f16`) and the CPU backend.
#[inline(always)]
pub fn f16_value_scale(max_abs: f32) -> f32 {
    if !(max_abs >= 32768.0) || max_abs == f32::INFINITY {
        return 1.0;
    }
    1.0 / f16_row_scale(max_abs)
}

/// [`f16_value_scale`] for keys and queries, whose scales multiply scores (f32), so rows are
/// also scaled up: a row whose largest magnitude is below `2^-4` is brought into `[2^14, 2^15)`
/// too, and its small elements keep f16's relative precision instead of becoming f16
/// subnormals (a tiny key against a huge query).
#[inline(always)]
pub fn f16_key_scale(max_abs: f32) -> f32 {
    if max_abs < 0.0625 && max_abs > 0.0 {
        return 1.0 / f16_row_scale(max_abs);
    }
    f16_value_scale(max_abs)
}

/// The rotary axis (0 = t, 1 = h, 2 = w) whose position drives frequency `j` of interleaved
/// MRoPE with sections `section` (t, h, w): `j % 3 == 1` takes h while `j < 3 · section[1]`,
/// `j % 3 == 2` takes w while `j < 3 · section[2]`, everything else t.
#[inline(always)]
pub fn mrope_axis(j: usize, section: [u32; 3]) -> usize {
    if j % 3 == 1 && j < 3 * section[1] as usize {
        1
    } else if j % 3 == 2 && j < 3 * section[2] as usize {
        2
    } else {
        0
    }
}

/// The uniform draw in [0, 1) of sampling step `counter` under `seed` (splitmix64 of the pair):
/// counter-based, so the CPU sampler and the GPU sampling kernel draw the same number for the
/// same step without sharing any generator state.
#[inline(always)]
pub fn sample_uniform(seed: u64, counter: u64) -> f32 {
    let mut z = seed ^ counter.wrapping_mul(0x9E37_79B9_7F4A_7C15);
    z = z.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^= z >> 31;
    // the top 24 bits: exactly representable, strictly below 1
    (z >> 40) as f32 * (1.0 / 16_777_216.0)
}

/// Picks a candidate from logits sorted in descending order (ties broken by id before this is
/// called): softmax at `temperature`, then the smallest prefix whose probability reaches
/// `top_p` (at least one), renormalized, then the draw `u` in [0, 1). Returns the index into
/// `sorted`. `temperature` must be positive (greedy never gets here). Shared by the CPU sampler
/// and the GPU sampling kernel, so both pick the same token from the same logits and draw.
#[inline(always)]
pub fn pick_sorted(sorted: &[f32], temperature: f32, top_p: f32, u: f32) -> usize {
    let n = sorted.len();
    if n <= 1 {
        return 0;
    }
    let inv_t = 1.0 / temperature;
    let top = sorted[0] * inv_t;
    let mut total = 0.0f32;
    let mut i = 0;
    while i < n {
        total += (sorted[i] * inv_t - top).exp();
        i += 1;
    }
    // nucleus: the prefix whose mass reaches top_p of the total
    let mut keep = n;
    if top_p < 1.0 {
        let mut acc = 0.0f32;
        let mut i = 0;
        while i < n {
            acc += (sorted[i] * inv_t - top).exp();
            if acc >= top_p * total {
                keep = i + 1;
                break;
            }
            i += 1;
        }
    }
    let mut mass = 0.0f32;
    let mut i = 0;
    while i < keep {
        mass += (sorted[i] * inv_t - top).exp();
        i += 1;
    }
    let mut target = u * mass;
    // past the loop only by rounding: the last candidate with weight (never a masked one at
    // negative infinity; the first when none has any)
    let mut last = 0;
    let mut i = 0;
    while i < keep {
        let w = (sorted[i] * inv_t - top).exp();
        if target < w {
            return i;
        }
        if w > 0.0 {
            last = i;
        }
        target -= w;
        i += 1;
    }
    last
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
        for &x in &[-120.0f32, -30.0, -8.0, -3.0, -1.5, -1e-3, 0.0, 1e-3, 0.3, 2.0, 9.0, 50.0, 1e30] {
            let xd = x as f64;
            let silu_ref = xd / (1.0 + (-xd).exp());
            assert!((silu(x) as f64 - silu_ref).abs() <= 1e-6 * (1.0 + silu_ref.abs()), "silu({})", x);
            let g = 0.5 * xd * (1.0 + ((2.0 / std::f64::consts::PI).sqrt() * (xd + 0.044715 * xd.powi(3))).tanh());
            assert!((gelu_tanh(x) as f64 - g).abs() <= 1e-6 * (1.0 + g.abs()), "gelu_tanh({}) = {} against {}", x, gelu_tanh(x), g);
        }
        // the limits: far below zero both give (negative) zero, never NaN
        assert_eq!(gelu_tanh(-1e30), 0.0);
        assert_eq!(silu(-1e30), 0.0);
    }

    #[test]
    fn f16_narrowing_rounds_to_nearest_even_like_the_half_crate() {
        // every f16 value and the midpoints between neighbours, plus overflow, underflow, NaN
        let mut xs = vec![0.0f32, -0.0, 1e-10, -1e-10, 65520.0, 65519.0, 1e6, -1e6, f32::INFINITY, f32::NEG_INFINITY, 5.9604645e-8, 2.9802322e-8, 2.98023224e-8 * 1.5];
        for bits in (0u16..0x7c00).step_by(7) {
            let v = f16_to_f32(bits);
            let next = f16_to_f32(bits + 1);
            xs.extend_from_slice(&[v, -v, (v + next) / 2.0, v + (next - v) * 0.3]);
        }
        for x in xs {
            let want = half::f16::from_f32(x).to_bits();
            assert_eq!(f32_to_f16_bits(x), want, "{:e}", x);
        }
        assert!(f16_to_f32(f32_to_f16_bits(f32::NAN)).is_nan());
    }

    #[test]
    fn sampling_draws_are_uniform_and_repeatable() {
        let n = 20_000;
        let draws: Vec<f32> = (0..n).map(|c| sample_uniform(42, c)).collect();
        assert!(draws.iter().all(|&u| (0.0..1.0).contains(&u)));
        let mean = draws.iter().sum::<f32>() / n as f32;
        assert!((mean - 0.5).abs() < 0.01, "mean {}", mean);
        assert_eq!(sample_uniform(42, 7), draws[7]);
        assert_ne!(sample_uniform(43, 7), draws[7]);
    }

    #[test]
    fn pick_follows_temperature_top_p_and_the_draw() {
        let sorted = [3.0f32, 2.0, 1.0, -1.0];
        // u near 0 takes the best, near 1 the last kept
        assert_eq!(pick_sorted(&sorted, 1.0, 1.0, 0.0), 0);
        assert_eq!(pick_sorted(&sorted, 1.0, 1.0, 0.999_999), 3);
        // top_p 0.5: the best alone holds 0.66 of the mass
        assert_eq!(pick_sorted(&sorted, 1.0, 0.5, 0.999_999), 0);
        // frequencies follow softmax(x / T)
        let t = 0.7f32;
        let p: Vec<f64> = sorted.iter().map(|&x| ((x - 3.0) / t) as f64).map(f64::exp).collect();
        let z: f64 = p.iter().sum();
        let mut count = [0usize; 4];
        let n = 40_000;
        for c in 0..n {
            count[pick_sorted(&sorted, t, 1.0, sample_uniform(9, c))] += 1;
        }
        for i in 0..4 {
            assert!((count[i] as f64 / n as f64 - p[i] / z).abs() < 0.01, "{} {:?}", i, count);
        }
    }

    #[test]
    fn masked_candidates_are_never_picked() {
        // candidates a mask lowered to negative infinity have no weight: even the largest draw
        // (and the rounding fallback) takes the last one with weight
        let inf = f32::NEG_INFINITY;
        let sorted = [3.0f32, 2.5, inf, inf];
        for c in 0..2000 {
            assert!(pick_sorted(&sorted, 1.3, 1.0, sample_uniform(5, c)) < 2);
        }
        assert_eq!(pick_sorted(&sorted, 1.0, 1.0, 1.0), 1, "past the mass: the last with weight");
        assert_eq!(pick_sorted(&[2.0, inf], 0.5, 1.0, 0.999_999), 0);
        // nothing allowed at all: the first
        assert_eq!(pick_sorted(&[inf, inf, inf], 1.0, 1.0, 0.5), 0);
    }

    #[test]
    fn f16_row_scales_bring_rows_into_range_exactly() {
        for &m in &[3.0e5f32, 65504.0, 65505.0, 1.0, 1e-3, 3.4e38, 1.5e-20, 16384.0, 32767.9, f32::MAX] {
            let s = f16_row_scale(m);
            assert_eq!(s.to_bits() & 0x7f_ffff, 0, "{}: a power of two", m);
            let scaled = m * s;
            assert!((16384.0..32768.0).contains(&scaled), "{} scaled by {} is {}", m, s, scaled);
            assert_eq!(scaled / s, m, "{}: undone exactly", m);
            assert!(f16_to_f32(f32_to_f16_bits(scaled)).is_finite());
        }
        // beyond the clamp, zeros, subnormals, inf and NaN
        assert_eq!(f16_row_scale(0.0), 1.0);
        assert_eq!(f16_row_scale(1e-40), 1.0);
        assert_eq!(f16_row_scale(f32::INFINITY), 1.0);
        assert_eq!(f16_row_scale(f32::NAN), 1.0);
        assert_eq!(f16_row_scale(1e-36), 2f32.powi(100));
    }

    #[test]
    fn f16_kv_scales_leave_f16_rows_alone_and_bring_others_into_range() {
        for &m in &[0.0f32, 0.0625, 1.0, 1000.0, 32767.0, f32::INFINITY, f32::NAN] {
            assert_eq!(f16_value_scale(m), 1.0, "{}", m);
            assert_eq!(f16_key_scale(m), 1.0, "{}", m);
        }
        for &m in &[1e-30f32, 1e-6, 0.01, 0.06] {
            assert_eq!(f16_value_scale(m), 1.0, "{}: values are never scaled up", m);
        }
        for &m in &[32768.0f32, 65504.0, 65505.0, 3.0e5, 1e20, f32::MAX, 1e-20, 1e-6, 0.01, 0.06] {
            let s = f16_key_scale(m);
            assert!(s != 1.0 && s.to_bits() & 0x7f_ffff == 0, "{}: a power of two: {}", m, s);
            let stored = m / s;
            assert!((16384.0..32768.0).contains(&stored), "{} stored as {}", m, stored);
            assert_eq!(stored * s, m, "{}: undone exactly", m);
            if m >= 32768.0 {
                assert_eq!(f16_value_scale(m), s, "{}", m);
            }
        }
    }

    #[test]
    fn mrope_axes_interleave() {
        let sec = [24, 20, 20];
        let axes: Vec<usize> = (0..64).map(|j| mrope_axis(j, sec)).collect();
        assert_eq!(&axes[..7], &[0, 1, 2, 0, 1, 2, 0]);
        assert_eq!(axes.iter().filter(|&&a| a == 1).count(), 20);
        assert!(axes[60..].iter().all(|&a| a == 0));
    }
}
