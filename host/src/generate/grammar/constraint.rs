//! A grammar as a sampler [`Constraint`]: llguidance's matcher, one per sequence.

use crate::generate::sampling::Constraint;
use crate::{Error, Result};
use llguidance::{Matcher, TokenParser};

/// The tokens a grammar allows next, for one sequence. Made by
/// [`super::Grammar::constraint`]; its state moves with every token the sequence takes.
pub struct GrammarConstraint {
    matcher: Matcher,
    /// The end-of-sequence id: the only token allowed once the grammar is complete.
    eos: u32,
    /// Ids the trie knows (the tokenizer's vocabulary); the mask allows none past them.
    vocab: usize,
}

impl GrammarConstraint {
    /// A matcher at the start of the grammar that `parser` (fresh, as compiled) holds.
    pub(super) fn new(parser: TokenParser, eos: u32) -> GrammarConstraint {
        let vocab = parser.token_env.tok_trie().vocab_size();
        GrammarConstraint { matcher: Matcher::new(Ok(parser)), eos, vocab }
    }

    /// Whether the text so far is a complete match (the end of sequence is allowed).
    pub fn is_accepting(&mut self) -> bool {
        self.matcher.is_stopped() || self.matcher.is_accepting().unwrap_or(false)
    }

    fn error(&self, what: &str, e: impl std::fmt::Display) -> Error {
        Error::Grammar { msg: format!("{}: {}", what, e) }
    }
}

impl Constraint for GrammarConstraint {
    /// llguidance's mask words, copied as they are (its bit vector has our layout: bit `t % 32`
    /// of word `t / 32`); words past the vocabulary are cleared. A complete grammar allows only
    /// the end of sequence.
    fn fill_mask(&mut self, words: &mut [u32]) -> Result<()> {
        let mask = self.matcher.compute_mask_or_eos().map_err(|e| self.error("no token can continue the grammar", e))?;
        let src = mask.as_slice();
        let n = src.len().min(words.len()).min(self.vocab.div_ceil(32));
        words[..n].copy_from_slice(&src[..n]);
        words[n..].fill(0);
        let tail = self.vocab % 32; // bits of the last word past the vocabulary
        if tail != 0 && n == self.vocab / 32 + 1 {
            words[n - 1] &= (1u32 << tail) - 1;
        }
        Ok(())
    }

    /// Moves the matcher past `token`; a token the grammar does not allow is an error (the
    /// sequence then ends with [`crate::generate::Stop::Constraint`]). The end of sequence
    /// after a complete match is accepted as is.
    fn accept(&mut self, token: u32) -> Result<()> {
        if self.matcher.is_stopped() {
            return if token == self.eos { Ok(()) } else { Err(self.error("the grammar is complete", format!("token {} after its end", token))) };
        }
        self.matcher.consume_token(token).map_err(|e| self.error(&format!("token {} rejected", token), e))
    }
}
