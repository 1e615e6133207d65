//! llguidance's view of our tokenizer: a token trie over the bytes of every id.
//!
//! Each id becomes the bytes it decodes to. Added tokens marked special (`<|im_end|>`,
//! `<|image_pad|>`, ...) get llguidance's marker byte 0xFF in front, so no grammar produces
//! them as text (a grammar names them explicitly, as `<|im_end|>` in Lark); added tokens not
//! marked special (`<tool_call>`, `<think>`) stand for their text, as our encoder makes them
//! from it. Ids with no token (past the tokenizer's vocabulary) have no bytes and are never
//! allowed.
//!
//! The end of sequence is `<|im_end|>`, what ends a Qwen reply (`<|endoftext|>` when the
//! tokenizer has no `<|im_end|>`): a finished grammar allows only it.

use crate::{Error, Result, Tokenizer};
use std::sync::Arc;
use toktrie::{TokEnv, TokRxInfo, TokTrie, TokenId, TokenizerEnv};

/// The token environment: the trie and nothing else.
///
/// Its tokenization (which llguidance uses only to force a grammar's fixed text as tokens) is
/// the trie's greedy one and declared non-canonical, so llguidance never forces tokens: the
/// mask allows every token that keeps the text inside the grammar, and the model chooses
/// among them. That keeps the environment free of the tokenizer (it is `'static`) and the
/// output the model's own tokenization.
struct Env {
    trie: TokTrie,
}

impl TokenizerEnv for Env {
    fn tok_trie(&self) -> &TokTrie {
        &self.trie
    }

    fn tokenize_bytes(&self, s: &[u8]) -> Vec<TokenId> {
        self.trie.greedy_tokenize(s)
    }

    fn tokenize_is_canonical(&self) -> bool {
        false
    }
}

/// The id that ends a grammar's output: `<|im_end|>`, else `<|endoftext|>`.
pub fn end_of_sequence(tok: &Tokenizer) -> Result<u32> {
    ["<|im_end|>", "<|endoftext|>"].iter().find_map(|t| tok.token_to_id(t)).ok_or_else(|| Error::Grammar {
        msg: "the tokenizer has neither <|im_end|> nor <|endoftext|> to end a constrained reply".into(),
    })
}

/// Builds llguidance's token environment from `tok`. Costly (a trie over 151k ids; with the
/// parser factory's slices [`super::Grammars::new`] takes about half a second): build it once
/// per tokenizer and share it.
pub fn token_env(tok: &Tokenizer) -> Result<TokEnv> {
    let n = tok.vocab_size();
    let words: Vec<Vec<u8>> = (0..n as u32)
        .map(|id| match tok.id_to_bytes(id) {
            Some(b) if tok.is_special(id) => [&[TokTrie::SPECIAL_TOKEN_MARKER][..], b].concat(),
            Some(b) => b.to_vec(),
            None => Vec::new(),
        })
        .collect();
    let eos = end_of_sequence(tok)?;
    let mut info = TokRxInfo::new(n as u32, eos);
    info.tok_end_of_turn = Some(eos);
    info.tok_pad = tok.token_to_id("<|endoftext|>");
    let trie = TokTrie::from(&info, &words);
    Ok(Arc::new(Env { trie }))
}
