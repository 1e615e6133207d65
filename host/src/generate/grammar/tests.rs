//! The grammar constraint with the real Qwen tokenizer: random logits drawn under the mask
//! give text that matches, and a complete match allows only the end of sequence.

use super::*;
use crate::generate::sampling::{mask_allows, mask_words, Constraint};
use crate::generate::{Sampler, SamplingParams};
use crate::test_support::{grammars, random_logits, tokenizer, SAMPLED_VOCAB};
use serde_json::json;

/// Draws up to `max` tokens under `spec` with random logits at temperature 1 (seed `seed`),
/// until the end of sequence; returns the text before it (None when `max` ran out).
fn generate(spec: &GrammarSpec, seed: u64, max: usize) -> Option<String> {
    let g = grammars().compile(spec).unwrap();
    let params = SamplingParams { temperature: 1.0, top_k: 0, top_p: 1.0, repetition_penalty: 1.0, seed };
    let mut s = Sampler::new(params).with_constraint(g.constraint());
    let mut state = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    let mut ids = Vec::new();
    for _ in 0..max {
        let t = s.sample(&mut random_logits(&mut state), &[]).unwrap();
        s.accept(t).unwrap();
        if t == grammars().eos() {
            return Some(tokenizer().decode(&ids, false).unwrap());
        }
        ids.push(t);
    }
    None
}

/// An object with a nested object, an array of objects, enums, bounded numbers and strings.
fn nested_schema() -> Value {
    json!({
        "type": "object",
        "properties": {
            "title": {"type": "string", "maxLength": 12},
            "year": {"type": "integer", "minimum": 1900, "maximum": 2100},
            "ok": {"type": "boolean"},
            "author": {
                "type": "object",
                "properties": {
                    "name": {"type": "string", "maxLength": 10},
                    "role": {"enum": ["writer", "editor"]}
                },
                "required": ["name", "role"],
                "additionalProperties": false
            },
            "lines": {
                "type": "array",
                "maxItems": 3,
                "items": {
                    "type": "object",
                    "properties": {"n": {"type": "integer", "minimum": 0, "maximum": 99}, "text": {"type": "string", "maxLength": 8}},
                    "required": ["n", "text"],
                    "additionalProperties": false
                }
            }
        },
        "required": ["title", "year", "ok", "author", "lines"],
        "additionalProperties": false
    })
}

/// Checks `v` against [`nested_schema`] by hand (panics naming what is wrong).
fn check_nested(v: &Value) {
    let o = v.as_object().expect("an object");
    let keys: Vec<&str> = o.keys().map(|k| k.as_str()).collect();
    let mut sorted = keys.clone();
    sorted.sort_unstable();
    assert_eq!(sorted, ["author", "lines", "ok", "title", "year"], "{}", v);
    assert!(o["title"].as_str().unwrap().chars().count() <= 12);
    let y = o["year"].as_i64().unwrap();
    assert!((1900..=2100).contains(&y), "{}", v);
    assert!(o["ok"].is_boolean());
    let a = o["author"].as_object().unwrap();
    assert_eq!(a.len(), 2, "{}", v);
    assert!(a["name"].as_str().unwrap().chars().count() <= 10);
    assert!(["writer", "editor"].contains(&a["role"].as_str().unwrap()));
    let lines = o["lines"].as_array().unwrap();
    assert!(lines.len() <= 3);
    for l in lines {
        let l = l.as_object().unwrap();
        assert_eq!(l.len(), 2, "{}", v);
        assert!((0..=99).contains(&l["n"].as_i64().unwrap()));
        assert!(l["text"].as_str().unwrap().chars().count() <= 8);
    }
}

#[test]
fn random_draws_under_a_nested_schema_are_valid_json() {
    let spec = GrammarSpec::json_schema(&nested_schema());
    for seed in 1..=6 {
        let text = generate(&spec, seed, 400).expect("the grammar finishes within 400 tokens");
        let v: Value = serde_json::from_str(&text).unwrap_or_else(|e| panic!("seed {}: {:?} is not JSON: {}", seed, text, e));
        check_nested(&v);
        // compact, as json.dumps writes it: no whitespace outside strings but after , and :
        let outside: String = text.split('"').step_by(2).collect();
        assert!(!outside.contains("\n") && !outside.contains("  "), "{:?}", text);
    }
    // compiled once, then cached
    assert!(grammars().compile(&spec).unwrap().compile_secs() > 0.0);
    let a = grammars().compile(&spec).unwrap();
    let b = grammars().compile(&spec).unwrap();
    assert!(Arc::ptr_eq(&a, &b));
}

#[test]
fn json_object_regex_and_choice_hold() {
    for seed in 1..=4 {
        let t = generate(&GrammarSpec::Regex(r"[a-c]{2,4}-[0-9]{3}".into()), seed, 50).unwrap();
        let (l, r) = t.split_once('-').unwrap();
        assert!((2..=4).contains(&l.len()) && l.chars().all(|c| ('a'..='c').contains(&c)), "{:?}", t);
        assert!(r.len() == 3 && r.chars().all(|c| c.is_ascii_digit()), "{:?}", t);
        let choices = vec!["red".to_string(), "green \"quoted\"".to_string(), "blue\n".to_string()];
        let c = generate(&GrammarSpec::Choice(choices.clone()), seed, 50).unwrap();
        assert!(choices.contains(&c), "{:?}", c);
        let lark = "start: \"id=\" NUM (\",\" NUM)*\nNUM: /[1-9][0-9]?/";
        let l = generate(&GrammarSpec::Lark(lark.into()), seed, 80).unwrap();
        assert!(l.strip_prefix("id=").unwrap().split(',').all(|n| n.parse::<u32>().map_or(false, |n| (1..100).contains(&n))), "{:?}", l);
    }
    // any object: open-ended, so sampling may run long; a few seeds finish
    let finished: Vec<String> = (1..=8).filter_map(|seed| generate(&GrammarSpec::JsonObject, seed, 300)).collect();
    assert!(!finished.is_empty());
    for t in finished {
        assert!(serde_json::from_str::<Value>(&t).unwrap().is_object(), "{:?}", t);
    }
}

#[test]
fn a_complete_match_allows_only_the_end_of_sequence() {
    let tok = tokenizer();
    let g = grammars().compile(&GrammarSpec::Choice(vec!["yes".into(), "no".into()])).unwrap();
    let mut c = g.matcher();
    let mut w = vec![0u32; mask_words(SAMPLED_VOCAB)];
    c.fill_mask(&mut w).unwrap();
    let yes = tok.encode("yes");
    assert_eq!(yes.len(), 1);
    assert!(mask_allows(&w, yes[0] as usize) && !mask_allows(&w, grammars().eos() as usize));
    // special tokens are never text; ids past the vocabulary are never allowed
    for special in ["<|im_start|>", "<|image_pad|>", "<|endoftext|>"] {
        assert!(!mask_allows(&w, tok.token_to_id(special).unwrap() as usize), "{}", special);
    }
    assert!((tok.vocab_size()..SAMPLED_VOCAB).all(|t| !mask_allows(&w, t)));
    assert!(c.accept(tok.encode("maybe")[0]).is_err(), "a token outside the grammar is rejected");
    let mut c = g.matcher();
    c.accept(yes[0]).unwrap();
    assert!(c.is_accepting());
    c.fill_mask(&mut w).unwrap();
    let allowed: Vec<usize> = (0..SAMPLED_VOCAB).filter(|&t| mask_allows(&w, t)).collect();
    assert_eq!(allowed, [tok.token_to_id("<|im_end|>").unwrap() as usize]);
    c.accept(grammars().eos()).unwrap();
    assert!(c.accept(yes[0]).is_err(), "nothing after the end");
}

#[test]
fn bad_specs_name_the_problem() {
    let err = |spec: GrammarSpec| grammars().compile(&spec).err().expect("an error").to_string();
    let e = err(GrammarSpec::json_schema(&json!({"type": "strin"})));
    assert!(e.contains("JSON schema") && e.contains("strin"), "{}", e);
    let e = err(GrammarSpec::Regex("a(b".into()));
    assert!(e.contains("regex"), "{}", e);
    let e = err(GrammarSpec::Lark("start: foo".into()));
    assert!(e.contains("grammar") && e.contains("foo"), "{}", e);
    assert!(err(GrammarSpec::Choice(vec![])).contains("empty"));
    assert!(GrammarSpec::json_schema_text("{nope").unwrap_err().to_string().contains("not valid JSON"));
}

#[test]
fn the_cache_is_bounded() {
    // a compiler of its own: the shared one holds the other tests' grammars
    let g = Grammars::new(tokenizer()).unwrap();
    for i in 0..CACHE_GRAMMARS + 5 {
        g.compile(&GrammarSpec::Regex(format!("x{}", i))).unwrap();
    }
    assert_eq!(g.cached(), CACHE_GRAMMARS);
    // the most recently used stay
    assert!(g.compile(&GrammarSpec::Regex(format!("x{}", CACHE_GRAMMARS + 4))).unwrap().compile_secs() > 0.0);
    assert_eq!(g.cached(), CACHE_GRAMMARS);
}
