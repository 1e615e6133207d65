//! Reading `tokenizer.json`. Each component it names is checked against what [`Tokenizer`]
//! implements; anything else is refused with an error that names it, never approximated.

use super::added::AddedTokens;
use super::bpe::{pair_key, Bpe, ByteAlphabet, MergeMap};
use super::pretokenize::PATTERN;
use super::{Entry, Tokenizer};
use crate::{Error, Result};
use serde::Deserialize;
use serde_json::Value;
use std::collections::HashMap;

#[derive(Deserialize)]
struct TokenizerJson {
    #[serde(default)]
    added_tokens: Vec<AddedTokenJson>,
    normalizer: Option<Value>,
    pre_tokenizer: Option<Value>,
    decoder: Option<Value>,
    truncation: Option<Value>,
    padding: Option<Value>,
    model: ModelJson,
}

#[derive(Deserialize)]
struct AddedTokenJson {
    id: u32,
    content: String,
    single_word: bool,
    lstrip: bool,
    rstrip: bool,
    normalized: bool,
    special: bool,
}

#[derive(Deserialize)]
struct ModelJson {
    #[serde(rename = "type")]
    kind: Option<String>,
    dropout: Option<f64>,
    continuing_subword_prefix: Option<String>,
    end_of_word_suffix: Option<String>,
    #[serde(default)]
    byte_fallback: bool,
    #[serde(default)]
    ignore_merges: bool,
    vocab: HashMap<String, u32>,
    merges: Vec<MergeJson>,
}

/// A merge as older files write it (`"a b"`) or as newer ones do (`["a", "b"]`).
#[derive(Deserialize)]
#[serde(untagged)]
enum MergeJson {
    Joined(String),
    Pair(String, String),
}

/// A bound on token ids, so that a corrupt file cannot make the id table huge.
const MAX_IDS: usize = 1 << 24;

fn error(msg: String) -> Error {
    Error::Tokenizer { msg }
}

/// `what`'s JSON, shortened for an error message.
fn describe(what: &Value) -> String {
    let json = what.to_string();
    match json.char_indices().nth(300) {
        Some((cut, _)) => format!("{}...", &json[..cut]),
        None => json,
    }
}

fn unsupported(component: &str, found: &Option<Value>, supported: &str) -> Error {
    let found = found.as_ref().map_or_else(|| "none".to_string(), describe);
    error(format!("unsupported {} {}: only {} is implemented", component, found, supported))
}

/// Whether the normalizer is NFC (`true`) or absent (`false`).
fn nfc_normalizer(normalizer: &Option<Value>) -> Result<bool> {
    match normalizer {
        None => Ok(false),
        Some(n) if n["type"] == "NFC" => Ok(true),
        _ => Err(unsupported("normalizer", normalizer, "NFC (or none)")),
    }
}

fn check_pre_tokenizer(pre_tokenizer: &Option<Value>) -> Result<()> {
    let is_split = |p: &Value| {
        p["type"] == "Split" && p["pattern"]["Regex"] == PATTERN && p["behavior"] == "Isolated" && p["invert"] == false
    };
    let is_byte_level =
        |p: &Value| p["type"] == "ByteLevel" && p["add_prefix_space"] == false && p["use_regex"] == false;
    let supported = pre_tokenizer.as_ref().map_or(false, |p| {
        let parts = p["pretokenizers"].as_array().map_or(&[][..], |parts| &parts[..]);
        p["type"] == "Sequence" && parts.len() == 2 && is_split(&parts[0]) && is_byte_level(&parts[1])
    });
    if supported {
        Ok(())
    } else {
        let expected = format!(
            "Sequence[Split(Regex {:?}, Isolated), ByteLevel(add_prefix_space=false, use_regex=false)]",
            PATTERN
        );
        Err(unsupported("pre_tokenizer", pre_tokenizer, &expected))
    }
}

fn check_model(model: &ModelJson) -> Result<()> {
    let plain = |affix: &Option<String>| affix.as_deref().map_or(true, str::is_empty);
    if model.kind.as_deref().map_or(false, |kind| kind != "BPE") {
        return Err(error(format!("unsupported model type {:?}: only BPE is implemented", model.kind)));
    }
    if model.dropout.is_some()
        || !plain(&model.continuing_subword_prefix)
        || !plain(&model.end_of_word_suffix)
        || model.byte_fallback
        || model.ignore_merges
    {
        return Err(error(
            "unsupported BPE options: dropout, continuing_subword_prefix, end_of_word_suffix, byte_fallback \
             and ignore_merges must be unset"
                .to_string(),
        ));
    }
    Ok(())
}

/// The merge table: for each pair of token ids, the merge's rank (its index in the list; a
/// repeated pair keeps its last rank) and the id of the merged token.
fn merge_map(merges: &[MergeJson], vocab: &HashMap<String, u32>) -> Result<MergeMap> {
    let mut pairs = Vec::with_capacity(merges.len());
    for (rank, merge) in merges.iter().enumerate() {
        pairs.push(match merge {
            MergeJson::Joined(joined) => split_merge(rank, joined)?,
            MergeJson::Pair(a, b) => (a.as_str(), b.as_str()),
        });
    }
    merge_map_of(&pairs, vocab)
}

/// A merge written `"a b"` as its two tokens.
pub(super) fn split_merge(rank: usize, joined: &str) -> Result<(&str, &str)> {
    joined.split_once(' ').filter(|(_, b)| !b.contains(' ')).ok_or_else(|| error(format!("merge #{} {:?} is not two tokens separated by a space", rank, joined)))
}

/// [`merge_map`] of merges given as token pairs, in rank order.
pub(super) fn merge_map_of(pairs: &[(&str, &str)], vocab: &HashMap<String, u32>) -> Result<MergeMap> {
    let mut map = MergeMap::default();
    map.reserve(pairs.len());
    for (rank, &(a, b)) in pairs.iter().enumerate() {
        let id = |token: &str| vocab.get(token).copied().ok_or_else(|| error(format!("merge #{} ({:?}, {:?}): {:?} is not in the vocabulary", rank, a, b, token)));
        map.insert(pair_key(id(a)?, id(b)?), (rank as u32, id(&format!("{}{}", a, b))?));
    }
    Ok(map)
}

/// Builds a [`Tokenizer`] from the text of a `tokenizer.json`.
pub(super) fn from_json(json: &str) -> Result<Tokenizer> {
    let file: TokenizerJson =
        serde_json::from_str(json).map_err(|e| error(format!("invalid tokenizer JSON: {}", e)))?;
    let nfc = nfc_normalizer(&file.normalizer)?;
    check_pre_tokenizer(&file.pre_tokenizer)?;
    if !file.decoder.as_ref().map_or(false, |d| d["type"] == "ByteLevel") {
        return Err(unsupported("decoder", &file.decoder, "ByteLevel"));
    }
    if file.truncation.is_some() || file.padding.is_some() {
        return Err(error("truncation and padding are not supported; they must be null".to_string()));
    }
    check_model(&file.model)?;

    let vocab = file.model.vocab;
    let merges = merge_map(&file.model.merges, &vocab)?;
    let mut added = Vec::with_capacity(file.added_tokens.len());
    for t in file.added_tokens {
        if t.single_word || t.lstrip || t.rstrip || t.normalized || t.content.is_empty() {
            return Err(error(format!(
                "added token {:?} (id {}): only non-empty tokens with single_word, lstrip, rstrip and \
                 normalized all false are supported",
                t.content, t.id
            )));
        }
        added.push((t.content, t.id, t.special));
    }
    build(vocab, merges, added, nfc)
}

/// A [`Tokenizer`] from its parts: the BPE vocabulary (token in the byte alphabet → id), the
/// merge table, the added tokens (text, id, special) and whether the normalizer is NFC.
pub(super) fn build(vocab: HashMap<String, u32>, merges: MergeMap, added_tokens: Vec<(String, u32, bool)>, nfc: bool) -> Result<Tokenizer> {
    let alphabet = ByteAlphabet::new();
    let mut byte_ids = [0u32; 256];
    for b in 0..=255u8 {
        let token = alphabet.char_of(b).to_string();
        byte_ids[b as usize] = *vocab.get(&token).ok_or_else(|| {
            error(format!("the vocabulary lacks the byte-level token {:?} (byte 0x{:02x})", token, b))
        })?;
    }

    let all_ids = vocab.values().chain(added_tokens.iter().map(|t| &t.1));
    let size = all_ids.max().map_or(0, |&id| id as usize + 1);
    if size > MAX_IDS {
        return Err(error(format!("token id {} is beyond the supported {} ids", size - 1, MAX_IDS)));
    }
    let mut entries: Vec<Option<Entry>> = Vec::new();
    entries.resize_with(size, || None);
    for (token, &id) in &vocab {
        let slot = &mut entries[id as usize];
        if let Some(other) = slot {
            return Err(error(format!("id {} is used by both {:?} and {:?}", id, other.token, token)));
        }
        // Like Hugging Face, a token with characters outside the byte alphabet decodes to its UTF-8.
        let bytes = alphabet.token_bytes(token).unwrap_or_else(|| token.as_bytes().to_vec());
        *slot = Some(Entry { token: token.as_str().into(), bytes: bytes.into(), special: false });
    }

    let mut ids = vocab;
    let mut added = Vec::with_capacity(added_tokens.len());
    for (content, id, special) in added_tokens {
        if content.is_empty() {
            return Err(error(format!("added token {} is empty", id)));
        }
        let bytes = content.as_bytes().into();
        entries[id as usize] = Some(Entry { token: content.as_str().into(), bytes, special });
        ids.insert(content.clone(), id);
        added.push((content, id));
    }

    let longest = entries.iter().flatten().map(|e| e.bytes.len().max(e.token.len())).max().unwrap_or(1).max(1);
    Ok(Tokenizer { entries, ids, added: AddedTokens::new(added), bpe: Bpe::new(byte_ids, merges), nfc, longest })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    /// A small tokenizer in the Qwen format: the 256 byte tokens, "ab", "abc", "Ġab" and one
    /// added token, with the given merges.
    fn file(merges: Value) -> Value {
        let alphabet = ByteAlphabet::new();
        let mut vocab: serde_json::Map<String, Value> =
            (0..=255u8).map(|b| (alphabet.char_of(b).to_string(), json!(b))).collect();
        for (id, token) in ["ab", "abc", "Ġab"].iter().enumerate() {
            vocab.insert(token.to_string(), json!(256 + id));
        }
        json!({
            "version": "1.0", "truncation": null, "padding": null,
            "added_tokens": [{"id": 259, "content": "<|end|>", "single_word": false, "lstrip": false,
                              "rstrip": false, "normalized": false, "special": true}],
            "normalizer": {"type": "NFC"},
            "pre_tokenizer": {"type": "Sequence", "pretokenizers": [
                {"type": "Split", "pattern": {"Regex": PATTERN}, "behavior": "Isolated", "invert": false},
                {"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": false, "use_regex": false}]},
            "post_processor": null,
            "decoder": {"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": false, "use_regex": false},
            "model": {"type": "BPE", "dropout": null, "unk_token": null, "continuing_subword_prefix": "",
                      "end_of_word_suffix": "", "fuse_unk": false, "byte_fallback": false,
                      "ignore_merges": false, "vocab": vocab, "merges": merges}
        })
    }

    fn load(file: &Value) -> Result<Tokenizer> {
        from_json(&file.to_string())
    }

    fn error_of(file: &Value) -> String {
        match load(file) {
            Err(Error::Tokenizer { msg }) => msg,
            Err(e) => panic!("wrong error {}", e),
            Ok(_) => panic!("loaded"),
        }
    }

    #[test]
    fn merges_as_strings_or_pairs() {
        let pairs = load(&file(json!([["a", "b"], ["ab", "c"], ["Ġ", "ab"]]))).unwrap();
        let strings = load(&file(json!(["a b", "ab c", "Ġ ab"]))).unwrap();
        for tok in [&pairs, &strings] {
            assert_eq!(tok.encode("abc ab<|end|>abd"), [257, 258, 259, 256, b'd' as u32]);
            assert_eq!(tok.vocab_size(), 260);
            assert_eq!(tok.decode(&[257, 258, 259], true).unwrap(), "abc ab");
        }
        assert!(error_of(&file(json!(["a b c"]))).contains("not two tokens"));
        assert!(error_of(&file(json!(["ab"]))).contains("not two tokens"));
        assert!(error_of(&file(json!([["a", "x"]]))).contains("\"ax\" is not in the vocabulary"));
    }

    #[test]
    fn unsupported_components_are_refused() {
        let merges = json!([["a", "b"]]);
        let with = |pointer: &str, value: Value| {
            let mut f = file(merges.clone());
            *f.pointer_mut(pointer).unwrap_or_else(|| panic!("{}", pointer)) = value;
            error_of(&f)
        };
        assert!(with("/normalizer", json!({"type": "NFKC"})).contains("unsupported normalizer"));
        let other_regex = with("/pre_tokenizer/pretokenizers/0/pattern/Regex", json!("\\s+"));
        assert!(other_regex.contains("unsupported pre_tokenizer"));
        assert!(with("/pre_tokenizer/pretokenizers/1/use_regex", json!(true)).contains("unsupported pre_tokenizer"));
        assert!(with("/pre_tokenizer", Value::Null).contains("unsupported pre_tokenizer none"));
        assert!(with("/decoder", json!({"type": "WordPiece"})).contains("unsupported decoder"));
        assert!(with("/truncation", json!({"max_length": 8})).contains("truncation"));
        assert!(with("/model/type", json!("WordPiece")).contains("only BPE"));
        assert!(with("/model/byte_fallback", json!(true)).contains("unsupported BPE options"));
        assert!(with("/model/dropout", json!(0.1)).contains("unsupported BPE options"));
        assert!(with("/added_tokens/0/lstrip", json!(true)).contains("added token \"<|end|>\""));
        assert!(with("/model/vocab/ab", json!(0)).contains("id 0 is used by both"));
        assert!(with("/model/vocab/ab", json!(u32::MAX)).contains("beyond the supported"));
        let mut no_byte = file(merges);
        no_byte["model"]["vocab"].as_object_mut().unwrap().remove("d");
        assert!(error_of(&no_byte).contains("lacks the byte-level token \"d\""));
    }
}
