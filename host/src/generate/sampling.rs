//! Next-token choice: greedy, or sampling with temperature, top-k, top-p and a repetition
//! penalty (applied in that order, as transformers' logits processors do), from a seeded RNG.

/// Sampling settings. `temperature <= 0` means greedy.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct SamplingParams {
    pub temperature: f32,
    /// Keep the `top_k` most likely tokens (0: all).
    pub top_k: usize,
    /// Keep the smallest set whose probability reaches `top_p` (1: all).
    pub top_p: f32,
    /// > 1 discourages tokens already in the context (1: off).
    pub repetition_penalty: f32,
    pub seed: u64,
}

impl SamplingParams {
    pub fn greedy() -> SamplingParams {
        SamplingParams { temperature: 0.0, top_k: 0, top_p: 1.0, repetition_penalty: 1.0, seed: 0 }
    }
}

/// xoshiro256** seeded through splitmix64: small, fast, reproducible across platforms.
pub struct Rng([u64; 4]);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        let mut x = seed;
        let mut next = || {
            x = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
            let mut z = x;
            z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
            z ^ (z >> 31)
        };
        Rng([next(), next(), next(), next()])
    }

    pub fn next_u64(&mut self) -> u64 {
        let s = &mut self.0;
        let out = s[1].wrapping_mul(5).rotate_left(7).wrapping_mul(9);
        let t = s[1] << 17;
        s[2] ^= s[0];
        s[3] ^= s[1];
        s[1] ^= s[2];
        s[0] ^= s[3];
        s[2] ^= t;
        s[3] = s[3].rotate_left(45);
        out
    }

    /// Uniform in [0, 1).
    pub fn next_f64(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }
}

/// OpenAI-style penalties on the tokens a [`Sampler`] has produced so far (not the prompt's):
/// each such token's logit is lowered by `presence` once and by `frequency` per occurrence,
/// after the repetition penalty, as vLLM applies them. Both 0: off.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct OutputPenalties {
    pub presence: f32,
    pub frequency: f32,
}

pub struct Sampler {
    params: SamplingParams,
    rng: Rng,
    penalties: OutputPenalties,
    /// How often each token was produced (kept only while a penalty is on).
    produced: std::collections::HashMap<u32, u32>,
}

impl Sampler {
    pub fn new(params: SamplingParams) -> Sampler {
        Sampler { rng: Rng::new(params.seed), params, penalties: OutputPenalties::default(), produced: Default::default() }
    }

    /// This sampler with presence / frequency penalties on its own output.
    pub fn with_output_penalties(mut self, penalties: OutputPenalties) -> Sampler {
        self.penalties = penalties;
        self
    }

    pub fn params(&self) -> &SamplingParams {
        &self.params
    }

    /// Picks the next token from `logits` (modified in place); `context` holds the ids the
    /// repetition penalty applies to.
    pub fn sample(&mut self, logits: &mut [f32], context: &[u32]) -> u32 {
        let t = self.choose(logits, context);
        if self.penalties != OutputPenalties::default() {
            *self.produced.entry(t).or_insert(0) += 1;
        }
        t
    }

    fn choose(&mut self, logits: &mut [f32], context: &[u32]) -> u32 {
        let p = self.params;
        if p.repetition_penalty != 1.0 {
            apply_repetition_penalty(logits, context, p.repetition_penalty);
        }
        let pen = self.penalties;
        for (&t, &n) in &self.produced {
            if let Some(l) = logits.get_mut(t as usize) {
                *l -= pen.presence + pen.frequency * n as f32;
            }
        }
        if p.temperature <= 0.0 {
            return argmax(logits);
        }
        // candidates sorted by logit, descending (ties by id for determinism)
        let mut idx: Vec<u32> = (0..logits.len() as u32).collect();
        let key = |i: &u32| logits[*i as usize];
        idx.sort_unstable_by(|a, b| key(b).partial_cmp(&key(a)).unwrap_or(std::cmp::Ordering::Equal).then(a.cmp(b)));
        if p.top_k > 0 && p.top_k < idx.len() {
            idx.truncate(p.top_k);
        }
        let max = logits[idx[0] as usize] / p.temperature;
        let mut probs: Vec<f64> = idx.iter().map(|&i| ((logits[i as usize] / p.temperature - max) as f64).exp()).collect();
        let total: f64 = probs.iter().sum();
        probs.iter_mut().for_each(|x| *x /= total);
        if p.top_p < 1.0 {
            // keep the smallest prefix reaching top_p (at least one token)
            let mut acc = 0.0;
            let mut keep = probs.len();
            for (n, q) in probs.iter().enumerate() {
                acc += q;
                if acc >= p.top_p as f64 {
                    keep = n + 1;
                    break;
                }
            }
            probs.truncate(keep);
            idx.truncate(keep);
            let total: f64 = probs.iter().sum();
            probs.iter_mut().for_each(|x| *x /= total);
        }
        let mut u = self.rng.next_f64();
        for (q, &i) in probs.iter().zip(&idx) {
            if u < *q {
                return i;
            }
            u -= q;
        }
        *idx.last().expect("at least one candidate")
    }
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

/// transformers' RepetitionPenaltyLogitsProcessor: a seen token's logit is divided by the
/// penalty when positive and multiplied when negative.
pub fn apply_repetition_penalty(logits: &mut [f32], context: &[u32], penalty: f32) {
    let mut seen = vec![false; logits.len()];
    for &t in context {
        if let Some(s) = seen.get_mut(t as usize) {
            if !*s {
                *s = true;
                let l = &mut logits[t as usize];
                *l = if *l > 0.0 { *l / penalty } else { *l * penalty };
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn greedy_takes_the_first_maximum() {
        let mut s = Sampler::new(SamplingParams::greedy());
        assert_eq!(s.sample(&mut [0.1, 3.0, 3.0, -1.0], &[]), 1);
    }

    #[test]
    fn repetition_penalty_follows_transformers() {
        let mut l = [2.0, -2.0, 1.0];
        apply_repetition_penalty(&mut l, &[0, 1, 1], 2.0);
        assert_eq!(l, [1.0, -4.0, 1.0]);
    }

    #[test]
    fn top_k_one_is_greedy_and_sampling_is_seeded() {
        let logits: Vec<f32> = (0..50).map(|i| ((i * 37) % 11) as f32 * 0.3).collect();
        let mut s = Sampler::new(SamplingParams { temperature: 1.0, top_k: 1, top_p: 1.0, repetition_penalty: 1.0, seed: 1 });
        assert_eq!(s.sample(&mut logits.clone(), &[]), argmax(&logits));
        let p = SamplingParams { temperature: 0.8, top_k: 20, top_p: 0.9, repetition_penalty: 1.0, seed: 42 };
        let draw = |p| {
            let mut s = Sampler::new(p);
            (0..20).map(|_| s.sample(&mut logits.clone(), &[])).collect::<Vec<_>>()
        };
        assert_eq!(draw(p), draw(p));
        assert!(draw(p).iter().any(|&t| t != draw(p)[0]), "sampling should vary across steps");
    }

    #[test]
    fn output_penalties_lower_produced_tokens_only() {
        // token 0 leads by 1.5; a presence penalty of 2 moves greedy to token 1 once 0 was
        // produced, and the prompt's tokens (the context) are not penalized
        let logits = [3.0f32, 1.5, 0.0];
        let mut s = Sampler::new(SamplingParams::greedy()).with_output_penalties(OutputPenalties { presence: 2.0, frequency: 0.0 });
        assert_eq!(s.sample(&mut logits.clone(), &[0, 0, 0]), 0);
        assert_eq!(s.sample(&mut logits.clone(), &[0]), 1);
        // frequency 0.5 per occurrence: token 0 falls to 3.0 - 0.5 n; it ties with token 1 at
        // n = 3 (the first maximum wins) and loses at n = 4
        let mut f = Sampler::new(SamplingParams::greedy()).with_output_penalties(OutputPenalties { presence: 0.0, frequency: 0.5 });
        let seq: Vec<u32> = (0..5).map(|_| f.sample(&mut logits.clone(), &[])).collect();
        assert_eq!(seq, [0, 0, 0, 0, 1]);
    }

    #[test]
    fn top_p_keeps_only_the_nucleus() {
        // one token holds ~88% of the mass: top_p 0.5 keeps it alone
        let logits = [5.0f32, 3.0, 0.0, 0.0];
        let mut s = Sampler::new(SamplingParams { temperature: 1.0, top_k: 0, top_p: 0.5, repetition_penalty: 1.0, seed: 7 });
        for _ in 0..50 {
            assert_eq!(s.sample(&mut logits.clone(), &[]), 0);
        }
    }
}
