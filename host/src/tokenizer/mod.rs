//! The Qwen tokenizer, read from a Hugging Face `tokenizer.json`, in pure Rust.
//!
//! It implements exactly the components that Qwen's tokenizer files use, with the results of
//! Hugging Face `tokenizers` (checked id for id by `tests/tokenizer.rs`):
//! - added tokens (`<|im_start|>`, `<|image_pad|>`, `<think>`, ...) are found in the raw text
//!   first, leftmost-longest, and become their ids whether they are special or not;
//! - the text between them is normalized to NFC (`normalize.rs`), cut by the Qwen pre-tokenizer
//!   regex (`pretokenize.rs`), and each piece is encoded by byte-level BPE (`bpe.rs`);
//! - decoding maps tokens back to bytes and replaces invalid UTF-8 with U+FFFD.
//!
//! A file that asks for anything else (another normalizer, pre-tokenizer pattern, decoder, BPE
//! options, or added-token flags) is refused with [`Error::Tokenizer`].
//!
//! Why not Hugging Face's `tokenizers` crate: measured beside it in one run
//! (`cargo bench --features hf-tokenizers --bench tokenizer`, BENCHMARKS.md "Tokenizer"),
//! `tokenizers` 0.22 gives the same ids but encodes about 20 times slower (1.6 against 38 MB/s
//! on a 2-core EPYC, one thread) and decodes 14 times slower; 1.0.0-rc.3 encodes faster than
//! this one but differs from the Python reference on 2 of `reference.json`'s cases. Neither
//! bounds its work by a number of ids as [`Tokenizer::encode_within`] does (truncation cuts
//! after encoding everything). Measure again when `tokenizers` 1.0 is released.

mod added;
mod bpe;
mod class;
pub mod gguf;
mod load;
mod normalize;
mod pretokenize;
mod unicode_tables;

use crate::{Error, Result};
use added::{AddedTokens, Segment};
use bpe::Bpe;
use std::borrow::Cow;
use std::collections::HashMap;
use std::path::Path;

/// A byte-level BPE tokenizer as described by a Hugging Face `tokenizer.json`. It is `Send` and
/// `Sync`: one instance can serve several threads.
pub struct Tokenizer {
    /// Every token by id: the model's vocabulary and the added tokens.
    entries: Vec<Option<Entry>>,
    /// Token text to id; for an added token whose text is also in the vocabulary, the added id.
    ids: HashMap<String, u32>,
    added: AddedTokens,
    bpe: Bpe,
    /// Whether the normalizer is NFC (otherwise there is none).
    nfc: bool,
    /// Bytes of the longest token (its decoded bytes or, for an added token, its text): no id
    /// stands for more text than this.
    longest: usize,
}

/// One token of the vocabulary.
struct Entry {
    /// The token as written in `tokenizer.json` (in the byte alphabet for BPE tokens).
    token: Box<str>,
    /// The bytes it decodes to.
    bytes: Box<[u8]>,
    /// Whether it is an added token marked `special`, which decoding may skip.
    special: bool,
}

impl Tokenizer {
    /// Reads a `tokenizer.json`. Errors are [`Error::Io`] when the file cannot be read and
    /// [`Error::Tokenizer`] (naming the file) when it is malformed or unsupported.
    pub fn from_file(path: &Path) -> Result<Tokenizer> {
        let json = std::fs::read_to_string(path).map_err(|e| Error::io(path, e))?;
        Tokenizer::from_json_str(&json).map_err(|e| match e {
            Error::Tokenizer { msg } => Error::Tokenizer { msg: format!("{}: {}", path.display(), msg) },
            other => other,
        })
    }

    /// Builds a tokenizer from the `tokenizer.ggml.*` metadata of a GGUF file.
    pub fn from_gguf(g: &crate::gguf::Gguf) -> Result<Tokenizer> {
        gguf::from_gguf(g)
    }

    /// Builds a tokenizer from the text of a `tokenizer.json`.
    pub fn from_json_str(json: &str) -> Result<Tokenizer> {
        load::from_json(json)
    }

    /// The token ids of `text`, as Hugging Face's `encode(text, add_special_tokens=False)`:
    /// nothing is added around the text, but added tokens written in it (`<|im_start|>`, ...)
    /// become their ids.
    pub fn encode(&self, text: &str) -> Vec<u32> {
        let mut ids = Vec::with_capacity(text.len() / 3 + 1);
        for segment in self.added.split(text) {
            match segment {
                Segment::Added(id) => ids.push(id),
                Segment::Text(text) => self.encode_plain(text, &mut ids),
            }
        }
        ids
    }

    /// Encodes text that holds no added token: normalization, pre-tokenization, BPE.
    fn encode_plain(&self, text: &str, ids: &mut Vec<u32>) {
        let text = if self.nfc { normalize::nfc(text) } else { Cow::Borrowed(text) };
        for piece in pretokenize::split(&text) {
            self.bpe.encode(piece, ids);
        }
    }

    /// [`encode`](Self::encode) for at most `max` ids: `None` as soon as the text is known to
    /// take more. The work is bounded by `max`, not by the text's length (past normalization,
    /// which is linear): BPE runs on a piece only while the piece can still fit, since a piece of
    /// `n` bytes takes at least `n / longest_token_bytes()` ids, and encoding stops once the ids
    /// pass `max`. When it returns `Some`, the ids are exactly `encode`'s.
    pub fn encode_within(&self, text: &str, max: usize) -> Option<Vec<u32>> {
        let mut ids = Vec::new();
        for segment in self.added.split(text) {
            match segment {
                Segment::Added(id) => ids.push(id),
                Segment::Text(text) => {
                    let text = if self.nfc { normalize::nfc(text) } else { Cow::Borrowed(text) };
                    for piece in pretokenize::split(&text) {
                        let room = max.saturating_sub(ids.len());
                        if piece.len() > room.saturating_mul(self.longest) {
                            return None;
                        }
                        self.bpe.encode(piece, &mut ids);
                        if ids.len() > max {
                            return None;
                        }
                    }
                }
            }
            if ids.len() > max {
                return None;
            }
        }
        Some(ids)
    }

    /// Bytes of text that one id stands for at most (the longest token's; an added token's
    /// text counts as written). Text of more than `n` times this many bytes, after
    /// normalization, takes more than `n` ids.
    pub fn longest_token_bytes(&self) -> usize {
        self.longest
    }

    /// The text of `ids`, as Hugging Face's `decode`: the tokens' bytes joined, with each invalid
    /// or incomplete UTF-8 sequence replaced by U+FFFD. With `skip_special_tokens`, added tokens
    /// marked special (`<|im_end|>`, `<|image_pad|>`, ...) are left out. An id outside the
    /// vocabulary is an error.
    pub fn decode(&self, ids: &[u32], skip_special_tokens: bool) -> Result<String> {
        let mut bytes = Vec::with_capacity(ids.len() * 4);
        for &id in ids {
            bytes.extend_from_slice(self.token_bytes(id, skip_special_tokens)?);
        }
        Ok(String::from_utf8_lossy(&bytes).into_owned())
    }

    /// The bytes that `id` decodes to (none for a skipped special token).
    pub fn token_bytes(&self, id: u32, skip_special_tokens: bool) -> Result<&[u8]> {
        let entry = self.entry(id).ok_or_else(|| Error::Tokenizer {
            msg: format!("unknown token id {} (the vocabulary has {} ids)", id, self.vocab_size()),
        })?;
        Ok(if skip_special_tokens && entry.special { &[] } else { &entry.bytes })
    }

    fn entry(&self, id: u32) -> Option<&Entry> {
        self.entries.get(id as usize).and_then(Option::as_ref)
    }

    /// The id of a token, given as written in `tokenizer.json`: an added token's text
    /// (`"<|im_end|>"`) or a BPE token in the byte alphabet (`"Ġhello"` for `" hello"`).
    pub fn token_to_id(&self, token: &str) -> Option<u32> {
        self.ids.get(token).copied()
    }

    /// The token of `id`, as written in `tokenizer.json`.
    pub fn id_to_token(&self, id: u32) -> Option<&str> {
        self.entry(id).map(|e| &*e.token)
    }

    /// The number of ids, added tokens included (the largest id plus one).
    pub fn vocab_size(&self) -> usize {
        self.entries.len()
    }

    /// The bytes that `id` stands for (an added token's text as written), or `None` for an id
    /// outside the vocabulary. Grammars read the vocabulary through this
    /// ([`crate::generate::grammar`]).
    pub fn id_to_bytes(&self, id: u32) -> Option<&[u8]> {
        self.entry(id).map(|e| &*e.bytes)
    }

    /// Whether `id` is an added token marked special, such as `<|im_end|>`.
    pub fn is_special(&self, id: u32) -> bool {
        self.entry(id).map_or(false, |e| e.special)
    }

    /// A decoder for ids that arrive one at a time, as during generation.
    pub fn stream_decoder(&self, skip_special_tokens: bool) -> StreamDecoder<'_> {
        StreamDecoder { tokenizer: self, skip_special_tokens, pending: Vec::new() }
    }
}

/// Decodes ids one at a time. The texts that [`push`](StreamDecoder::push) returns, followed by
/// that of [`finish`](StreamDecoder::finish), add up to [`Tokenizer::decode`] of all the ids.
pub struct StreamDecoder<'a> {
    tokenizer: &'a Tokenizer,
    skip_special_tokens: bool,
    /// Bytes of a character that is not complete yet.
    pending: Vec<u8>,
}

impl StreamDecoder<'_> {
    /// Feeds one generated id; returns the text that became complete (never a broken UTF-8
    /// sequence; bytes of an incomplete character are held back until it completes). Bytes that
    /// cannot start or continue a character become U+FFFD at once. An unknown id is an error
    /// and changes nothing.
    pub fn push(&mut self, id: u32) -> Result<String> {
        let bytes = self.tokenizer.token_bytes(id, self.skip_special_tokens)?;
        self.pending.extend_from_slice(bytes);
        let mut text = String::new();
        let mut done = 0;
        while done < self.pending.len() {
            match std::str::from_utf8(&self.pending[done..]) {
                Ok(valid) => {
                    text.push_str(valid);
                    done = self.pending.len();
                }
                Err(e) => {
                    let valid = &self.pending[done..done + e.valid_up_to()];
                    text.push_str(&String::from_utf8_lossy(valid));
                    done += e.valid_up_to();
                    match e.error_len() {
                        Some(invalid) => {
                            text.push(char::REPLACEMENT_CHARACTER);
                            done += invalid;
                        }
                        None => break,
                    }
                }
            }
        }
        self.pending.drain(..done);
        Ok(text)
    }

    /// Flushes what is held back: the bytes of an incomplete character become U+FFFD.
    pub fn finish(&mut self) -> String {
        let text = String::from_utf8_lossy(&self.pending).into_owned();
        self.pending.clear();
        text
    }
}
