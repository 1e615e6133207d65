//! What the grammar tests of this crate and of `qwen3-vl` (the call grammar of
//! `src/server/tool_grammar`) share: the fixture's Qwen tokenizer and its grammar compiler, built
//! once per test process, and seeded random logits over the sampled vocabulary. Compiled for
//! this crate's tests and with the `test-support` feature (the root's dev-dependencies turn it
//! on); not an interface.

use crate::generate::grammar::Grammars;
use crate::Tokenizer;
use std::sync::OnceLock;

/// Qwen3-VL's lm_head rows: the sampled vocabulary, past the tokenizer's 151,669 ids.
pub const SAMPLED_VOCAB: usize = 151_936;

/// The Qwen tokenizer of `tests/fixtures/tokenizer`.
pub fn tokenizer() -> &'static Tokenizer {
    static T: OnceLock<Tokenizer> = OnceLock::new();
    T.get_or_init(|| Tokenizer::from_file(&std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures/tokenizer/tokenizer.json")).unwrap())
}

/// The grammar compiler over [`tokenizer`].
pub fn grammars() -> &'static Grammars {
    static G: OnceLock<Grammars> = OnceLock::new();
    G.get_or_init(|| Grammars::new(tokenizer()).unwrap())
}

/// Logits drawn from a seeded xorshift (`state`, never 0), roughly uniform in [-4, 4).
pub fn random_logits(state: &mut u64) -> Vec<f32> {
    (0..SAMPLED_VOCAB)
        .map(|_| {
            *state ^= *state << 13;
            *state ^= *state >> 7;
            *state ^= *state << 17;
            (*state >> 40) as f32 / (1u64 << 24) as f32 * 8.0 - 4.0
        })
        .collect()
}
