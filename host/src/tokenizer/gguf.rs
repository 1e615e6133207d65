//! The tokenizer in GGUF metadata, as llama.cpp's converter writes Qwen's:
//! `tokenizer.ggml.model = "gpt2"`, `tokenizer.ggml.pre = "qwen2"`, `tokenizer.ggml.tokens`
//! (every id, in the byte alphabet; ids the tokenizer does not use are `[PAD<id>]` entries of
//! type unused), `tokenizer.ggml.token_type` (1 normal: a BPE token; 3 control: an added token
//! marked special; 4 user-defined: an added token not marked special; 5 unused) and
//! `tokenizer.ggml.merges` (`"a b"` in rank order). The text is normalized to NFC as Qwen's
//! `tokenizer.json` says (GGUF does not record the normalizer).
//!
//! [`export`] gives the same arrays for a loaded tokenizer (the `quantize` command writes them).

use super::load::{build, merge_map_of, split_merge};
use super::Tokenizer;
use crate::gguf::{Array, Gguf, Value, Writer};
use crate::{Error, Result};
use std::collections::HashMap;

pub const NORMAL: i32 = 1;
pub const CONTROL: i32 = 3;
pub const USER_DEFINED: i32 = 4;
pub const UNUSED: i32 = 5;

/// Pre-tokenizers whose regex is the one implemented (`pretokenize.rs`).
const PRE: &[&str] = &["qwen2"];

fn err(g: &Gguf, msg: String) -> Error {
    Error::Tokenizer { msg: format!("{}: {}", g.file(), msg) }
}

/// Builds the tokenizer from a GGUF file's `tokenizer.ggml.*` metadata.
pub fn from_gguf(g: &Gguf) -> Result<Tokenizer> {
    // metadata errors already name the file
    let meta = |e: Error| Error::Tokenizer { msg: e.to_string() };
    let s = |k: &str| g.get_str(k).map_err(meta);
    match s("tokenizer.ggml.model")? {
        Some("gpt2") => {}
        Some(m) => return Err(err(g, format!("tokenizer.ggml.model '{}' is not supported (gpt2: byte-level BPE)", m))),
        None => return Err(err(g, "no tokenizer in the metadata (tokenizer.ggml.model is missing); pass --tokenizer tokenizer.json".into())),
    }
    match s("tokenizer.ggml.pre")? {
        Some(p) if PRE.contains(&p) => {}
        other => return Err(err(g, format!("tokenizer.ggml.pre {:?} is not supported ({:?})", other, PRE))),
    }
    let arr = |k: &str| g.get_array(k).map_err(meta)?.ok_or_else(|| err(g, format!("metadata key '{}' is missing", k)));
    let tokens = match arr("tokenizer.ggml.tokens")? {
        Array::String(t) => t,
        _ => return Err(err(g, "tokenizer.ggml.tokens must be an array of strings".into())),
    };
    let types: Vec<i32> = match arr("tokenizer.ggml.token_type")? {
        Array::I32(t) => t.clone(),
        Array::U32(t) => t.iter().map(|&x| x as i32).collect(),
        _ => return Err(err(g, "tokenizer.ggml.token_type must be an array of integers".into())),
    };
    if types.len() != tokens.len() {
        return Err(err(g, format!("{} token types for {} tokens", types.len(), tokens.len())));
    }
    // absent: no merges (writers leave an empty list out)
    let no_merges = Vec::new();
    let merges = match g.get_array("tokenizer.ggml.merges").map_err(meta)? {
        Some(Array::String(m)) => m,
        None => &no_merges,
        Some(_) => return Err(err(g, "tokenizer.ggml.merges must be an array of strings".into())),
    };
    let mut vocab = HashMap::new();
    let mut added = Vec::new();
    for (id, (tok, &ty)) in tokens.iter().zip(&types).enumerate() {
        let id = id as u32;
        match ty {
            NORMAL => {
                if vocab.insert(tok.clone(), id).is_some() {
                    return Err(err(g, format!("token {:?} appears twice", tok)));
                }
            }
            CONTROL | USER_DEFINED => added.push((tok.clone(), id, ty == CONTROL)),
            UNUSED => {}
            other => return Err(err(g, format!("token {} ({:?}) has type {}, which a byte-level BPE tokenizer does not use", id, tok, other))),
        }
    }
    let mut pairs = Vec::with_capacity(merges.len());
    for (rank, m) in merges.iter().enumerate() {
        pairs.push(split_merge(rank, m).map_err(|e| err(g, e.to_string()))?);
    }
    let merges = merge_map_of(&pairs, &vocab).map_err(|e| err(g, e.to_string()))?;
    build(vocab, merges, added, true).map_err(|e| err(g, e.to_string()))
}

/// Writes `tok` as `tokenizer.ggml.*` metadata, with `vocab_size` ids (unused ids become
/// `[PAD<id>]`), `<|endoftext|>` as bos and padding and `<|im_end|>` as eos (when present), and
/// `chat_template` when given.
pub fn export(tok: &Tokenizer, vocab_size: usize, chat_template: Option<&str>, w: &mut Writer) {
    let n = vocab_size.max(tok.vocab_size());
    let (mut tokens, mut types) = (Vec::with_capacity(n), Vec::with_capacity(n));
    for id in 0..n as u32 {
        match tok.entry(id) {
            Some(e) => {
                tokens.push(e.token.to_string());
                types.push(if tok.added.contains(id) {
                    if e.special {
                        CONTROL
                    } else {
                        USER_DEFINED
                    }
                } else {
                    NORMAL
                });
            }
            None => {
                tokens.push(format!("[PAD{}]", id));
                types.push(UNUSED);
            }
        }
    }
    let merges: Vec<String> = tok.bpe.merges().into_iter().filter_map(|(l, r)| Some(format!("{} {}", tok.id_to_token(l)?, tok.id_to_token(r)?))).collect();
    w.set("tokenizer.ggml.model", Value::String("gpt2".into()));
    w.set("tokenizer.ggml.pre", Value::String("qwen2".into()));
    w.set("tokenizer.ggml.tokens", Value::Array(Array::String(tokens)));
    w.set("tokenizer.ggml.token_type", Value::Array(Array::I32(types)));
    w.set("tokenizer.ggml.merges", Value::Array(Array::String(merges)));
    if let Some(id) = tok.token_to_id("<|endoftext|>") {
        w.set("tokenizer.ggml.bos_token_id", Value::U32(id));
        w.set("tokenizer.ggml.padding_token_id", Value::U32(id));
    }
    if let Some(id) = tok.token_to_id("<|im_end|>") {
        w.set("tokenizer.ggml.eos_token_id", Value::U32(id));
    }
    w.set("tokenizer.ggml.add_bos_token", Value::Bool(false));
    if let Some(t) = chat_template {
        w.set("tokenizer.chat_template", Value::String(t.into()));
    }
}
