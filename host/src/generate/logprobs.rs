//! Log-probabilities of drawn tokens, for clients that ask for them (OpenAI's `logprobs` and
//! `top_logprobs`).
//!
//! The distribution is the one the token was drawn from: the logits after the repetition,
//! presence and frequency penalties, the logit bias and the constraint mask, divided by the
//! temperature (1 for greedy), before top-k / top-p truncation. At temperature 1 (or greedy)
//! with none of those adjustments these are the model's own log-probabilities: the
//! log-softmax of the raw logits.

/// What [`crate::generate::Sampler`] reports about one drawn token.
#[derive(Clone, Debug, PartialEq)]
pub struct TokenLogprobs {
    pub token: u32,
    /// The token's log-probability (negative infinity only if a mask excluded it, which a
    /// drawn token never is).
    pub logprob: f32,
    /// The most likely tokens and their log-probabilities, most likely first (equal ones by
    /// lower id), as many as asked (at most the vocabulary).
    pub top: Vec<(u32, f32)>,
}

/// The log-softmax of `logits / temperature` (`temperature <= 0`: 1) at `token`, and the `top`
/// most likely entries. Sums in f64 so the values hold to f32 precision over a 150k vocabulary.
pub fn token_logprobs(logits: &[f32], temperature: f32, token: u32, top: usize) -> TokenLogprobs {
    let t = if temperature > 0.0 { temperature as f64 } else { 1.0 };
    // 1. log of the normalizer, from the largest finite logit
    let max = logits.iter().copied().filter(|l| l.is_finite()).fold(f32::NEG_INFINITY, f32::max) as f64;
    let sum: f64 = logits.iter().filter(|l| l.is_finite()).map(|&l| ((l as f64 - max) / t).exp()).sum();
    let lse = max / t + sum.ln();
    let lp = |l: f32| if l.is_finite() { (l as f64 / t - lse) as f32 } else { f32::NEG_INFINITY };
    // 2. the top entries: a partial selection, then sorted
    let rank = |a: &u32, b: &u32| {
        let (x, y) = (logits[*a as usize], logits[*b as usize]);
        y.partial_cmp(&x).unwrap_or(std::cmp::Ordering::Equal).then(a.cmp(b))
    };
    let k = top.min(logits.len());
    let mut idx: Vec<u32> = (0..logits.len() as u32).collect();
    if k > 0 && k < idx.len() {
        idx.select_nth_unstable_by(k - 1, rank);
    }
    idx.truncate(k);
    idx.sort_unstable_by(rank);
    TokenLogprobs { token, logprob: logits.get(token as usize).map_or(f32::NEG_INFINITY, |&l| lp(l)), top: idx.into_iter().map(|i| (i, lp(logits[i as usize]))).collect() }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn log_softmax_with_temperature_and_sorted_top() {
        let logits = [1.0f32, 3.0, 2.0, f32::NEG_INFINITY, 3.0];
        let r = token_logprobs(&logits, 0.0, 2, 3);
        let z: f64 = [1.0f64, 3.0, 2.0, 3.0].iter().map(|l| l.exp()).sum();
        assert!((r.logprob as f64 - (2.0 - z.ln())).abs() < 1e-6);
        // equal logits: the lower id first; the masked token never among the top unless asked
        assert_eq!(r.top.iter().map(|t| t.0).collect::<Vec<_>>(), [1, 4, 2]);
        assert!(r.top.windows(2).all(|w| w[0].1 >= w[1].1));
        let all = token_logprobs(&logits, 1.0, 3, 9);
        assert_eq!(all.top.len(), 5);
        assert_eq!(all.logprob, f32::NEG_INFINITY);
        let total: f64 = all.top.iter().map(|t| (t.1 as f64).exp()).sum();
        assert!((total - 1.0).abs() < 1e-6);
        // temperature 2: the log-softmax of logits / 2
        let half = token_logprobs(&logits, 2.0, 1, 0);
        let z2: f64 = [0.5f64, 1.5, 1.0, 1.5].iter().map(|l| l.exp()).sum();
        assert!((half.logprob as f64 - (1.5 - z2.ln())).abs() < 1e-6 && half.top.is_empty());
    }
}
