//! The tokenizer against Hugging Face `tokenizers`: exact ids and decodings for the corpus in
//! tests/fixtures/tokenizer/reference.json (made by tools/tokenizer_reference.py from the same
//! tokenizer.json), streaming decoding, special tokens, and errors.

mod common;

use qwen3_vl::{Error, Tokenizer};
use serde_json::Value;
use std::path::PathBuf;

fn fixture(name: &str) -> PathBuf {
    common::repo_root().join("tests/fixtures/tokenizer").join(name)
}

fn qwen() -> Tokenizer {
    Tokenizer::from_file(&fixture("tokenizer.json")).expect("the Qwen tokenizer loads")
}

/// One case of reference.json: `text` is absent for the decode-only cases.
struct Case {
    text: Option<String>,
    ids: Vec<u32>,
    decoded: String,
    decoded_skip: String,
}

/// The cases of one list of reference.json ("encode", "fuzz" or "decode").
fn reference(list: &str) -> Vec<Case> {
    let text = std::fs::read_to_string(fixture("reference.json")).expect("reference.json is readable");
    let root: Value = serde_json::from_str(&text).expect("reference.json is JSON");
    let string = |v: &Value| v.as_str().expect("a string").to_string();
    root[list]
        .as_array()
        .unwrap_or_else(|| panic!("reference.json has no list {:?}", list))
        .iter()
        .map(|case| Case {
            text: case.get("text").map(string),
            ids: case["ids"].as_array().expect("ids").iter().map(|v| v.as_u64().expect("an id") as u32).collect(),
            decoded: string(&case["decoded"]),
            decoded_skip: string(&case["decoded_skip"]),
        })
        .collect()
}

/// Checks every case and reports all mismatches at once.
fn check_cases(tokenizer: &Tokenizer, cases: &[Case]) {
    assert!(!cases.is_empty());
    let mut failures = Vec::new();
    for case in cases {
        if let Some(text) = &case.text {
            let ids = tokenizer.encode(text);
            if ids != case.ids {
                failures.push(format!("encode({:?}) = {:?}, Hugging Face: {:?}", text, ids, case.ids));
            }
        }
        for (skip, expected) in [(false, &case.decoded), (true, &case.decoded_skip)] {
            let decoded = tokenizer.decode(&case.ids, skip).expect("known ids");
            if &decoded != expected {
                let ids = &case.ids;
                failures.push(format!("decode({:?}, {}) = {:?}, Hugging Face: {:?}", ids, skip, decoded, expected));
            }
        }
    }
    assert!(failures.is_empty(), "{} of {} cases differ:\n{}", failures.len(), cases.len(), failures.join("\n"));
}

#[test]
fn corpus_matches_hugging_face() {
    check_cases(&qwen(), &reference("encode"));
}

#[test]
fn random_strings_match_hugging_face() {
    check_cases(&qwen(), &reference("fuzz"));
}

#[test]
fn decoding_cut_characters_matches_hugging_face() {
    check_cases(&qwen(), &reference("decode"));
}

/// Feeds `ids` one at a time; returns what each push gave and what finish gave.
fn stream(tokenizer: &Tokenizer, ids: &[u32], skip: bool) -> (Vec<String>, String) {
    let mut decoder = tokenizer.stream_decoder(skip);
    let pushed = ids.iter().map(|&id| decoder.push(id).expect("known id")).collect();
    (pushed, decoder.finish())
}

#[test]
fn stream_decoder_holds_back_incomplete_characters() {
    let tok = qwen();
    // 🫠 and 龘 are split across byte-level tokens.
    let ids = tok.encode("a🫠龘b");
    assert!(ids.len() >= 7, "{:?}", ids);
    let (pushed, rest) = stream(&tok, &ids, false);
    assert_eq!(pushed.concat() + &rest, "a🫠龘b");
    assert_eq!(rest, "");
    assert!(pushed.iter().all(|s| !s.contains(char::REPLACEMENT_CHARACTER)), "{:?}", pushed);
    assert!(pushed.iter().filter(|s| s.is_empty()).count() >= 3, "{:?}", pushed);

    // A cut character comes out of finish as U+FFFD, like decode.
    let (pushed, rest) = stream(&tok, &ids[..2], false);
    assert_eq!(pushed, ["a", ""]);
    assert_eq!(rest, "\u{fffd}");
}

#[test]
fn stream_decoder_adds_up_to_decode() {
    let tok = qwen();
    for case in reference("encode").iter().chain(&reference("decode")) {
        for skip in [false, true] {
            let (pushed, rest) = stream(&tok, &case.ids, skip);
            let whole = tok.decode(&case.ids, skip).unwrap();
            assert_eq!(pushed.concat() + &rest, whole, "ids {:?}", case.ids);
            if !whole.contains(char::REPLACEMENT_CHARACTER) {
                assert!(pushed.iter().all(|s| !s.contains(char::REPLACEMENT_CHARACTER)), "{:?}", pushed);
            }
        }
    }
}

#[test]
fn special_tokens() {
    let tok = qwen();
    let specials = [
        ("<|endoftext|>", 151643),
        ("<|im_start|>", 151644),
        ("<|im_end|>", 151645),
        ("<|vision_start|>", 151652),
        ("<|vision_end|>", 151653),
        ("<|image_pad|>", 151655),
    ];
    for &(token, id) in &specials {
        assert_eq!(tok.token_to_id(token), Some(id), "{}", token);
        assert_eq!(tok.id_to_token(id), Some(token));
        assert!(tok.is_special(id), "{}", token);
        assert_eq!(tok.encode(token), [id]);
    }
    // Added but not special: recognized in text, kept when special tokens are skipped.
    let think = tok.token_to_id("<think>").expect("<think> is an added token");
    assert_eq!(think, 151667);
    assert!(!tok.is_special(think));
    assert_eq!(tok.decode(&[think, 151645], true).unwrap(), "<think>");
    assert_eq!(tok.vocab_size(), 151669);
    assert_eq!(tok.id_to_token(151669), None);
    assert_eq!(tok.token_to_id("<|not_a_token|>"), None);
    // BPE tokens are written in the byte alphabet: " hello" is "Ġhello".
    let hello = tok.encode(" hello");
    assert_eq!(hello.len(), 1);
    assert_eq!(tok.id_to_token(hello[0]), Some("Ġhello"));
    assert_eq!(tok.token_to_id("Ġhello"), Some(hello[0]));
    assert!(!tok.is_special(hello[0]));
}

#[test]
fn unknown_ids_are_errors() {
    let tok = qwen();
    for ids in [&[151669u32][..], &[14990u32, 999_999][..]] {
        match tok.decode(ids, false) {
            Err(Error::Tokenizer { msg }) => assert!(msg.contains("unknown token id"), "{}", msg),
            other => panic!("decode({:?}) gave {:?}", ids, other),
        }
    }
    let mut decoder = tok.stream_decoder(false);
    assert!(decoder.push(u32::MAX).is_err());
    assert_eq!(decoder.push(14990).unwrap(), "hello");
}

#[test]
fn missing_file_is_an_io_error() {
    let path = fixture("no_such_tokenizer.json");
    match Tokenizer::from_file(&path) {
        Err(e @ Error::Io { .. }) => assert!(e.to_string().contains("no_such_tokenizer.json"), "{}", e),
        Err(e) => panic!("wrong error: {}", e),
        Ok(_) => panic!("loaded a missing file"),
    }
}

#[test]
fn malformed_files_are_named_in_the_error() {
    let whole = std::fs::read_to_string(fixture("tokenizer.json")).unwrap();
    let unsupported = whole.replacen(r#""type": "NFC""#, r#""type": "NFKC""#, 1);
    let no_merge_token = whole.replacen(r#""merges": ["#, r#""merges": [["Ġ", "not-a-token"],"#, 1);
    assert!(unsupported != whole && no_merge_token != whole);
    let cases = [
        ("truncated", whole[..whole.len() / 2].to_string(), "invalid tokenizer JSON"),
        ("garbage", "not json".to_string(), "invalid tokenizer JSON"),
        ("empty object", "{}".to_string(), "missing field `model`"),
        ("normalizer", unsupported, "unsupported normalizer"),
        ("merge", no_merge_token, "is not in the vocabulary"),
    ];
    for (name, json, expected) in cases.iter() {
        let path = common::Scratch::path(&format!("qwen3-vl-tokenizer-{}-{}.json", std::process::id(), name));
        std::fs::write(&path, json).unwrap();
        let result = Tokenizer::from_file(&path);
        match result {
            Err(Error::Tokenizer { msg }) => {
                assert!(msg.contains(&path.display().to_string()), "{}: {}", name, msg);
                assert!(msg.contains(expected), "{}: {}", name, msg);
            }
            Err(e) => panic!("{}: wrong error {}", name, e),
            Ok(_) => panic!("{}: loaded", name),
        }
    }
}

#[test]
fn encode_within_stops_at_the_limit_and_otherwise_equals_encode() {
    let t = qwen();
    for case in reference("encode").iter().filter_map(|c| c.text.as_ref()) {
        let ids = t.encode(case);
        assert_eq!(t.encode_within(case, ids.len()).as_ref(), Some(&ids), "{:?}", case);
        if !ids.is_empty() {
            assert_eq!(t.encode_within(case, ids.len() - 1), None, "{:?}", case);
        }
    }
    // a single 8 MiB run of letters is one piece: refused by its length, without BPE over it
    let t0 = std::time::Instant::now();
    assert_eq!(t.encode_within(&"a".repeat(8 << 20), 8192), None);
    assert!(t0.elapsed() < std::time::Duration::from_secs(5), "{:?}", t0.elapsed());
    assert!(t.longest_token_bytes() >= "<|image_pad|>".len());
}
