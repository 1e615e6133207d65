//! Next-token choice: greedy, or sampling with a repetition penalty, temperature, top-k and
//! top-p (applied in that order, as transformers' logits processors do), with counter-based
//! draws (`gpu::math::sample_uniform`) shared with the GPU sampling kernels. Output penalties,
//! a logit bias and constraint masks adjust the logits before the draw; the log-probabilities
//! of the drawn tokens are reported when asked ([`super::logprobs`]).

pub use crate::pick::{apply_mask, argmax, mask_allows, mask_words, pick, DeviceSampling};
use super::logprobs::{token_logprobs, TokenLogprobs};

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

/// OpenAI-style penalties on the tokens a [`Sampler`] has produced so far (not the prompt's):
/// each such token's logit is lowered by `presence` once and by `frequency` per occurrence,
/// after the repetition penalty, as vLLM applies them. Both 0: off.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct OutputPenalties {
    pub presence: f32,
    pub frequency: f32,
}

/// What restricts a sequence's next token beyond the sampling settings: a grammar (structured
/// output), `min_tokens` (no stop token yet), ... A [`Sampler`] holds any number; a token is
/// allowed when every one allows it.
pub trait Constraint: Send {
    /// Writes the tokens allowed next: bit `t % 32` of `words[t / 32]` set when token `t` may
    /// come next (`words.len() == ceil(n / 32)` for the `n` sampled ids). Words come in all ones.
    fn fill_mask(&mut self, words: &mut [u32]) -> crate::Result<()>;
    /// Moves past `token`, which the sequence took (however it was drawn).
    fn accept(&mut self, token: u32) -> crate::Result<()>;
}

pub struct Sampler {
    params: SamplingParams,
    /// What restricts the next token (see [`Constraint`]); the host applies the mask in
    /// [`Sampler::sample_at`], the device in its sampling step.
    constraints: Vec<Box<dyn Constraint>>,
    /// Draw counter of [`Sampler::sample`] (the session passes token positions instead).
    step: u64,
    penalties: OutputPenalties,
    /// How often each token was produced (kept only while a penalty is on).
    produced: std::collections::HashMap<u32, u32>,
    /// Added to the logits of these tokens before every draw (OpenAI's `logit_bias`).
    logit_bias: Vec<(u32, f32)>,
    /// Report the drawn token's log-probability and this many top ones (`None`: off).
    logprobs: Option<usize>,
    /// The last draw's log-probabilities, until [`Sampler::take_logprobs`].
    last_logprobs: Option<TokenLogprobs>,
    /// A token taken but not yet told to the constraints ([`Sampler::accept_later`]).
    pending: Option<u32>,
}

impl Sampler {
    pub fn new(params: SamplingParams) -> Sampler {
        Sampler { params, constraints: Vec::new(), step: 0, penalties: OutputPenalties::default(), produced: Default::default(), logit_bias: Vec::new(), logprobs: None, last_logprobs: None, pending: None }
    }

    /// This sampler with `bias` added to those tokens' logits before every draw (after the
    /// penalties; ids past the logits are ignored).
    pub fn with_logit_bias(mut self, bias: Vec<(u32, f32)>) -> Sampler {
        self.logit_bias = bias;
        self
    }

    /// This sampler reporting each drawn token's log-probability and the `top` most likely
    /// ones ([`Sampler::take_logprobs`]); its draws then happen on the host.
    pub fn with_logprobs(mut self, top: usize) -> Sampler {
        self.logprobs = Some(top);
        self
    }

    /// Whether draws report log-probabilities.
    pub fn wants_logprobs(&self) -> bool {
        self.logprobs.is_some()
    }

    /// The log-probabilities of the last token drawn (when asked for with
    /// [`Sampler::with_logprobs`]); taken once.
    pub fn take_logprobs(&mut self) -> Option<TokenLogprobs> {
        self.last_logprobs.take()
    }

    /// This sampler with `c` restricting its tokens too.
    pub fn with_constraint(mut self, c: Box<dyn Constraint>) -> Sampler {
        self.constraints.push(c);
        self
    }

    /// Whether the next token is drawn under a mask ([`Sampler::fill_mask`]).
    pub fn masks(&self) -> bool {
        !self.constraints.is_empty()
    }

    /// The tokens allowed next, over `words.len() * 32` ids (see [`Constraint::fill_mask`]):
    /// all ones without constraints.
    pub fn fill_mask(&mut self, words: &mut [u32]) -> crate::Result<()> {
        words.fill(u32::MAX);
        self.flush()?;
        if self.constraints.len() == 1 {
            return self.constraints[0].fill_mask(words);
        }
        let mut each = vec![u32::MAX; words.len()];
        for c in &mut self.constraints {
            each.fill(u32::MAX);
            c.fill_mask(&mut each)?;
            for (w, e) in words.iter_mut().zip(&each) {
                *w &= e;
            }
        }
        Ok(())
    }

    /// Tells the constraints the token the sequence took. Every caller that feeds a drawn token
    /// on (the engine, the session) calls this once per token, drawn on the host or the device.
    pub fn accept(&mut self, token: u32) -> crate::Result<()> {
        self.flush()?;
        self.tell(token)
    }

    /// Tells every constraint `token`.
    fn tell(&mut self, token: u32) -> crate::Result<()> {
        for c in &mut self.constraints {
            c.accept(token)?;
        }
        Ok(())
    }

    /// [`Sampler::accept`], deferred to the next mask ([`Sampler::fill_mask`]) or accept: the
    /// engine tells a step's tokens this way, so the grammars move past them while the device
    /// runs the next step's forward (beside that step's masks) rather than between steps. A
    /// constraint that rejects the token then fails that next mask.
    pub fn accept_later(&mut self, token: u32) -> crate::Result<()> {
        self.flush()?;
        if self.masks() {
            self.pending = Some(token);
        }
        Ok(())
    }

    /// Tells the constraints the deferred token, if any.
    fn flush(&mut self) -> crate::Result<()> {
        match self.pending.take() {
            Some(t) => self.tell(t),
            None => Ok(()),
        }
    }

    /// This sampler with presence / frequency penalties on its own output.
    pub fn with_output_penalties(mut self, penalties: OutputPenalties) -> Sampler {
        self.penalties = penalties;
        self
    }

    pub fn params(&self) -> &SamplingParams {
        &self.params
    }

    /// The same choice as a device sampling kernel can make (no repetition penalty, a top-k the
    /// device takes), or `None` when these settings need the host. Constraints do not: the
    /// device step takes their mask ([`Sampler::fill_mask`], with `Backend::sample_step`'s
    /// `mask`) when [`Sampler::masks`].
    pub fn device_sampling(&self, max_top_k: usize) -> Option<DeviceSampling> {
        let p = &self.params;
        if p.repetition_penalty != 1.0 || self.penalties != OutputPenalties::default() || !self.logit_bias.is_empty() || self.logprobs.is_some() {
            return None; // the penalties need the context and the logits on the host, as do the bias and log-probabilities
        }
        let s = DeviceSampling { temperature: p.temperature, top_k: p.top_k, top_p: p.top_p, seed: p.seed };
        if s.is_greedy() {
            return Some(DeviceSampling::greedy());
        }
        if p.top_k == 0 || p.top_k > max_top_k || !(p.top_p > 0.0 && p.top_p <= 1.0) {
            return None;
        }
        Some(s)
    }

    /// Picks the next token from `logits` (modified in place); `context` holds the ids the
    /// repetition penalty applies to. Draws are numbered by an internal counter.
    pub fn sample(&mut self, logits: &mut [f32], context: &[u32]) -> crate::Result<u32> {
        let c = self.step;
        self.step += 1;
        self.sample_at(logits, context, c)
    }

    /// [`Sampler::sample`] with draw number `counter` (the session uses the cache row of the
    /// token whose logits these are, as the device sampler does).
    /// With constraints, the logits they do not allow are lowered to negative infinity first
    /// (a constraint that cannot give its mask fails the draw).
    pub fn sample_at(&mut self, logits: &mut [f32], context: &[u32], counter: u64) -> crate::Result<u32> {
        if self.masks() {
            let mut words = vec![0u32; mask_words(logits.len())];
            self.fill_mask(&mut words)?;
            apply_mask(logits, &words);
        }
        self.adjust(logits, context);
        let t = self.choose(logits, counter);
        if let Some(top) = self.logprobs {
            self.last_logprobs = Some(token_logprobs(logits, self.params.temperature, t, top));
        }
        if self.penalties != OutputPenalties::default() {
            *self.produced.entry(t).or_insert(0) += 1;
        }
        Ok(t)
    }

    /// The penalties and the logit bias, applied to `logits` in place.
    fn adjust(&self, logits: &mut [f32], context: &[u32]) {
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
        for &(t, b) in &self.logit_bias {
            if let Some(l) = logits.get_mut(t as usize) {
                *l += b;
            }
        }
    }

    /// The draw from adjusted logits.
    fn choose(&self, logits: &[f32], counter: u64) -> u32 {
        let p = self.params;
        if p.temperature <= 0.0 || p.top_k == 1 {
            return argmax(logits);
        }
        let k = if p.top_k == 0 || p.top_k > logits.len() { logits.len() } else { p.top_k };
        pick(logits, &DeviceSampling { temperature: p.temperature, top_k: k, top_p: p.top_p, seed: p.seed }, counter)
    }
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
    fn penalties_keep_even_greedy_sampling_on_the_host() {
        assert_eq!(Sampler::new(SamplingParams::greedy()).device_sampling(64), Some(DeviceSampling::greedy()));
        let rep = SamplingParams { repetition_penalty: 1.1, ..SamplingParams::greedy() };
        assert_eq!(Sampler::new(rep).device_sampling(64), None);
        let pen = Sampler::new(SamplingParams::greedy()).with_output_penalties(OutputPenalties { presence: 1.0, frequency: 0.0 });
        assert_eq!(pen.device_sampling(64), None);
        let topk = SamplingParams { temperature: 0.7, top_k: 20, top_p: 0.8, repetition_penalty: 1.0, seed: 3 };
        assert!(Sampler::new(topk).device_sampling(64).is_some());
        assert_eq!(Sampler::new(SamplingParams { top_k: 0, ..topk }).device_sampling(64), None);
        assert_eq!(Sampler::new(SamplingParams { top_k: 65, ..topk }).device_sampling(64), None);
    }

    /// Allows only its ids; counts the tokens it was told of.
    struct Only(Vec<u32>, std::sync::Arc<std::sync::atomic::AtomicUsize>);

    impl Constraint for Only {
        fn fill_mask(&mut self, words: &mut [u32]) -> crate::Result<()> {
            words.fill(0);
            for &t in &self.0 {
                words[t as usize / 32] |= 1 << (t % 32);
            }
            Ok(())
        }
        fn accept(&mut self, token: u32) -> crate::Result<()> {
            self.1.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            if self.0.contains(&token) {
                Ok(())
            } else {
                Err(crate::Error::Tokenizer { msg: format!("token {} is not allowed", token) })
            }
        }
    }

    #[test]
    fn constraints_mask_the_host_draw_and_intersect() {
        let seen = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let logits: Vec<f32> = (0..70).map(|i| i as f32).collect();
        let mut s = Sampler::new(SamplingParams::greedy()).with_constraint(Box::new(Only(vec![3, 40, 65], seen.clone())));
        assert!(s.masks());
        assert_eq!(s.device_sampling(64), Some(DeviceSampling::greedy()), "masked draws go to the device with their mask");
        assert_eq!(s.sample(&mut logits.clone(), &[]).unwrap(), 65);
        s = s.with_constraint(Box::new(Only(vec![3, 40], seen.clone())));
        assert_eq!(s.sample(&mut logits.clone(), &[]).unwrap(), 40);
        let mut w = vec![0; mask_words(70)];
        s.fill_mask(&mut w).unwrap();
        assert_eq!(w, [1 << 3, 1 << 8, 0]);
        assert!(mask_allows(&w, 40) && !mask_allows(&w, 65) && !mask_allows(&w, 9999));
        s.accept(3).unwrap();
        assert_eq!(seen.load(std::sync::atomic::Ordering::Relaxed), 2);
        assert!(s.accept(65).is_err());
        // sampled draws stay inside the mask too
        let mut t = Sampler::new(SamplingParams { temperature: 5.0, top_k: 0, top_p: 1.0, repetition_penalty: 1.0, seed: 9 }).with_constraint(Box::new(Only(vec![1, 2], seen)));
        for _ in 0..40 {
            assert!([1, 2].contains(&t.sample(&mut logits.clone(), &[]).unwrap()));
        }
    }

    #[test]
    fn logit_bias_moves_the_draw_and_logprobs_follow_the_drawn_distribution() {
        let logits = [2.0f32, 1.0, 0.0, -1.0];
        // +100 on token 3 makes greedy pick it; the log-probabilities are those of the biased
        // logits (temperature 1 for greedy)
        let mut s = Sampler::new(SamplingParams::greedy()).with_logit_bias(vec![(3, 100.0), (99, 5.0)]).with_logprobs(2);
        assert_eq!(s.device_sampling(64), None, "biased and logprob draws stay on the host");
        assert_eq!(s.sample(&mut logits.to_vec(), &[]).unwrap(), 3);
        let lp = s.take_logprobs().unwrap();
        assert_eq!((lp.token, lp.top[0].0, lp.top[1].0), (3, 3, 0));
        assert!(lp.logprob > -1e-6 && lp.logprob <= 0.0);
        assert!(s.take_logprobs().is_none(), "taken once");
        // at temperature 0.5 the values are the log-softmax of logits / 0.5, whatever is drawn
        let p = SamplingParams { temperature: 0.5, top_k: 2, top_p: 1.0, repetition_penalty: 1.0, seed: 4 };
        let mut t = Sampler::new(p).with_logprobs(0);
        let tok = t.sample(&mut logits.to_vec(), &[]).unwrap();
        let z: f64 = logits.iter().map(|&l| (l as f64 / 0.5).exp()).sum();
        let lp = t.take_logprobs().unwrap();
        assert!(tok < 2 && lp.top.is_empty());
        assert!((lp.logprob as f64 - (logits[tok as usize] as f64 / 0.5 - z.ln())).abs() < 1e-5);
        // a -100 bias removes the leader from greedy's choice
        let mut u = Sampler::new(SamplingParams::greedy()).with_logit_bias(vec![(0, -100.0)]);
        assert_eq!(u.sample(&mut logits.to_vec(), &[]).unwrap(), 1);
    }

    #[test]
    fn greedy_takes_the_first_maximum() {
        let mut s = Sampler::new(SamplingParams::greedy());
        assert_eq!(s.sample(&mut [0.1, 3.0, 3.0, -1.0], &[]).unwrap(), 1);
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
        assert_eq!(s.sample(&mut logits.clone(), &[]).unwrap(), argmax(&logits));
        let p = SamplingParams { temperature: 0.8, top_k: 20, top_p: 0.9, repetition_penalty: 1.0, seed: 42 };
        let draw = |p| {
            let mut s = Sampler::new(p);
            (0..20).map(|_| s.sample(&mut logits.clone(), &[]).unwrap()).collect::<Vec<_>>()
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
        assert_eq!(s.sample(&mut logits.clone(), &[0, 0, 0]).unwrap(), 0);
        assert_eq!(s.sample(&mut logits.clone(), &[0]).unwrap(), 1);
        // frequency 0.5 per occurrence: token 0 falls to 3.0 - 0.5 n; it ties with token 1 at
        // n = 3 (the first maximum wins) and loses at n = 4
        let mut f = Sampler::new(SamplingParams::greedy()).with_output_penalties(OutputPenalties { presence: 0.0, frequency: 0.5 });
        let seq: Vec<u32> = (0..5).map(|_| f.sample(&mut logits.clone(), &[]).unwrap()).collect();
        assert_eq!(seq, [0, 0, 0, 0, 1]);
    }

    #[test]
    fn top_p_keeps_only_the_nucleus() {
        // one token holds ~88% of the mass: top_p 0.5 keeps it alone
        let logits = [5.0f32, 3.0, 0.0, 0.0];
        let mut s = Sampler::new(SamplingParams { temperature: 1.0, top_k: 0, top_p: 0.5, repetition_penalty: 1.0, seed: 7 });
        for _ in 0..50 {
            assert_eq!(s.sample(&mut logits.clone(), &[]).unwrap(), 0);
        }
    }

    /// A token told with `accept_later` reaches the constraints with the next mask (or the
    /// next accept), once; one they reject fails that mask.
    #[test]
    fn deferred_tokens_reach_the_constraints_with_the_next_mask() {
        let seen = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let told = || seen.load(std::sync::atomic::Ordering::Relaxed);
        let mut s = Sampler::new(SamplingParams::greedy()).with_constraint(Box::new(Only(vec![3, 40], seen.clone())));
        let mut words = vec![0u32; 2];
        s.accept_later(3).unwrap();
        assert_eq!(told(), 0);
        s.fill_mask(&mut words).unwrap();
        assert_eq!(told(), 1);
        s.fill_mask(&mut words).unwrap();
        assert_eq!(told(), 1, "told once");
        s.accept_later(40).unwrap();
        s.accept(3).unwrap();
        assert_eq!(told(), 3, "the deferred token first, then the new one");
        s.accept_later(7).unwrap();
        assert!(s.fill_mask(&mut words).is_err(), "a rejected token fails the next mask");
        // without constraints nothing is kept
        let mut free = Sampler::new(SamplingParams::greedy());
        free.accept_later(5).unwrap();
        assert!(free.pending.is_none());
    }
}
