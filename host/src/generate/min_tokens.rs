//! `min_tokens`: no stop token before a sequence has generated that many tokens, as a sampler
//! [`Constraint`] that masks the stop ids until then.

use super::sampling::Constraint;
use crate::{Error, Result};

/// Masks `stop_ids` for the first `min` tokens a sequence generates.
pub struct MinTokens {
    stop_ids: Vec<u32>,
    /// Tokens still to come before a stop token may.
    left: usize,
}

impl MinTokens {
    pub fn new(min: usize, stop_ids: Vec<u32>) -> MinTokens {
        MinTokens { stop_ids, left: min }
    }
}

impl Constraint for MinTokens {
    fn fill_mask(&mut self, words: &mut [u32]) -> Result<()> {
        if self.left > 0 {
            for &t in &self.stop_ids {
                if let Some(w) = words.get_mut(t as usize / 32) {
                    *w &= !(1 << (t % 32));
                }
            }
        }
        Ok(())
    }

    fn accept(&mut self, token: u32) -> Result<()> {
        if self.left > 0 && self.stop_ids.contains(&token) {
            return Err(Error::Limit { op: "min_tokens", msg: format!("stop token {} before the minimum number of tokens ({} still to come)", token, self.left) });
        }
        self.left = self.left.saturating_sub(1);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::generate::{Sampler, SamplingParams};

    #[test]
    fn stop_ids_are_masked_until_the_minimum() {
        // token 2 (a stop id) leads: greedy takes token 0 twice, then 2
        let logits = [1.0f32, 0.5, 3.0, 0.0];
        let mut s = Sampler::new(SamplingParams::greedy()).with_constraint(Box::new(MinTokens::new(2, vec![2, 3])));
        let mut out = Vec::new();
        for _ in 0..3 {
            let t = s.sample(&mut logits.to_vec(), &[]).unwrap();
            s.accept(t).unwrap();
            out.push(t);
        }
        assert_eq!(out, [0, 0, 2]);
        let mut early = MinTokens::new(1, vec![2]);
        assert!(early.accept(2).is_err());
    }
}
