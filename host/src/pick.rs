//! The sampling rule that every backend applies the same way: the settings a sampling step
//! takes ([`DeviceSampling`]) and their host implementation ([`pick`], [`argmax`]), and the
//! packed masks of allowed ids a step may take ([`apply_mask`]). The GPU
//! kernels make the same choice from the same logits through `gpu::math`. A leaf below the
//! backend interface and the generation code, which both use it.

use gpu::params::sample_row;

/// How [`Backend::sample_step`] picks a token: greedy when `temperature <= 0` or `top_k == 1`,
/// else softmax at `temperature` over the `top_k` best logits, nucleus `top_p`, and the draw
/// `gpu::math::sample_uniform(seed, cache row)` (so the pick is reproducible and equal on every
/// backend for equal logits). The settings a backend can take are bounded by
/// [`Backend::max_device_top_k`]; others (repetition penalty, a larger or unbounded top-k) are
/// sampled on the host.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct DeviceSampling {
    pub temperature: f32,
    pub top_k: usize,
    pub top_p: f32,
    pub seed: u64,
}

impl DeviceSampling {
    pub fn greedy() -> DeviceSampling {
        DeviceSampling { temperature: 0.0, top_k: 1, top_p: 1.0, seed: 0 }
    }

    pub fn is_greedy(&self) -> bool {
        self.temperature <= 0.0 || self.top_k == 1
    }

    /// Candidates to rank (1 for greedy).
    pub fn candidates(&self) -> usize {
        if self.is_greedy() {
            1
        } else {
            self.top_k
        }
    }

    /// These settings as one row of [`Backend::sample_step_rows`]'s settings.
    pub fn row_words(&self) -> [u32; sample_row::WORDS] {
        let mut w = [0u32; sample_row::WORDS];
        w[sample_row::TEMPERATURE] = if self.is_greedy() { 0.0f32 } else { self.temperature }.to_bits();
        w[sample_row::TOP_P] = self.top_p.to_bits();
        w[sample_row::TOP_K] = self.candidates() as u32;
        w[sample_row::SEED_LO] = self.seed as u32;
        w[sample_row::SEED_HI] = (self.seed >> 32) as u32;
        w
    }

    /// The settings of one row of [`Backend::sample_step_rows`]'s settings.
    pub fn from_row_words(w: &[u32]) -> DeviceSampling {
        DeviceSampling {
            temperature: f32::from_bits(w[sample_row::TEMPERATURE]),
            top_p: f32::from_bits(w[sample_row::TOP_P]),
            top_k: w[sample_row::TOP_K] as usize,
            seed: w[sample_row::SEED_LO] as u64 | (w[sample_row::SEED_HI] as u64) << 32,
        }
    }
}

/// The device sampler's rule on the host: greedy is the first maximum; otherwise the `top_k`
/// best logits sorted (logit descending, id ascending on ties), then
/// `gpu::math::pick_sorted` with the draw `sample_uniform(seed, counter)`. The GPU kernels
/// make the same choice from the same logits.
pub fn pick(logits: &[f32], s: &DeviceSampling, counter: u64) -> u32 {
    if s.is_greedy() || logits.len() <= 1 {
        return argmax(logits);
    }
    let rank = |a: &u32, b: &u32| {
        let (x, y) = (logits[*a as usize], logits[*b as usize]);
        y.partial_cmp(&x).unwrap_or(std::cmp::Ordering::Equal).then(a.cmp(b))
    };
    let mut idx: Vec<u32> = (0..logits.len() as u32).collect();
    let k = s.top_k.clamp(1, idx.len());
    if k < idx.len() {
        idx.select_nth_unstable_by(k - 1, rank);
        idx.truncate(k);
    }
    idx.sort_unstable_by(rank);
    let sorted: Vec<f32> = idx.iter().map(|&i| logits[i as usize]).collect();
    idx[gpu::math::pick_sorted(&sorted, s.temperature, s.top_p, gpu::math::sample_uniform(s.seed, counter))]
}

/// The largest logit's index (the first on ties, as torch.argmax).
pub fn argmax(logits: &[f32]) -> u32 {
    let mut best = 0usize;
    for (i, &v) in logits.iter().enumerate() {
        if v > logits[best] {
            best = i;
        }
    }
    best as u32
}

/// Words of a mask over `n` token ids (one bit each).
pub fn mask_words(n: usize) -> usize {
    (n + 31) / 32
}

/// Whether `mask` allows token `t`: bit `t % 32` of word `t / 32` (ids past the mask are not
/// allowed).
pub fn mask_allows(mask: &[u32], t: usize) -> bool {
    mask.get(t / 32).map_or(false, |w| w >> (t % 32) & 1 == 1)
}

/// Lowers every logit `mask` does not allow to negative infinity (as the device sampler stages
/// them).
pub fn apply_mask(logits: &mut [f32], mask: &[u32]) {
    for (t, l) in logits.iter_mut().enumerate() {
        if !mask_allows(mask, t) {
            *l = f32::NEG_INFINITY;
        }
    }
}
