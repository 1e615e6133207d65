//! Structured output through the batching engine on every backend, and through `generate`,
//! with the tiny full-vocabulary checkpoint and the real Qwen tokenizer: constrained and free
//! sequences in one batch. The constrained ones (a nested JSON schema, greedy and sampled) end with
//! `<|im_end|>` and their text validates even on random weights; each gives the tokens it
//! gives alone, and so does the free one.

mod common;

use qwen3_vl::engine::{Engine, EngineConfig, Event, Request, SeqId};
use qwen3_vl::generate::grammar::{GrammarSpec, Grammars};
use qwen3_vl::generate::{Sampler, SamplingParams, Stop};
use qwen3_vl::model::Model;
use qwen3_vl::Tokenizer;
use serde_json::{json, Value};
use std::collections::HashMap;

fn schema() -> Value {
    json!({
        "type": "object",
        "properties": {
            "name": {"type": "string", "maxLength": 12},
            "age": {"type": "integer", "minimum": 0, "maximum": 130},
            "address": {
                "type": "object",
                "properties": {"city": {"type": "string", "maxLength": 10}, "zip": {"type": "string", "pattern": "^[0-9]{5}$"}},
                "required": ["city", "zip"],
                "additionalProperties": false
            },
            "tags": {"type": "array", "maxItems": 3, "items": {"enum": ["red", "green", "blue"]}}
        },
        "required": ["name", "age", "address", "tags"],
        "additionalProperties": false
    })
}

/// Checks `text` against [`schema`] by hand, naming what is wrong.
fn validate(text: &str) {
    let v: Value = serde_json::from_str(text).unwrap_or_else(|e| panic!("{:?} is not JSON: {}", text, e));
    let o = v.as_object().unwrap_or_else(|| panic!("{:?} is not an object", text));
    let mut keys: Vec<&str> = o.keys().map(|k| k.as_str()).collect();
    keys.sort_unstable();
    assert_eq!(keys, ["address", "age", "name", "tags"], "{}", text);
    assert!(o["name"].as_str().unwrap().chars().count() <= 12, "{}", text);
    assert!((0..=130).contains(&o["age"].as_i64().unwrap()), "{}", text);
    let a = o["address"].as_object().unwrap();
    assert_eq!(a.len(), 2, "{}", text);
    assert!(a["city"].as_str().unwrap().chars().count() <= 10, "{}", text);
    let zip = a["zip"].as_str().unwrap();
    assert!(zip.len() == 5 && zip.bytes().all(|b| b.is_ascii_digit()), "{}", text);
    let tags = o["tags"].as_array().unwrap();
    assert!(tags.len() <= 3 && tags.iter().all(|t| ["red", "green", "blue"].contains(&t.as_str().unwrap())), "{}", text);
}

/// Runs the requests together; each sequence's tokens and why it stopped.
fn run(e: &mut Engine<'_>, reqs: Vec<Request>) -> HashMap<SeqId, (Vec<u32>, Stop)> {
    let ids: Vec<SeqId> = reqs.into_iter().map(|r| e.add(r).unwrap()).collect();
    let mut out: HashMap<SeqId, (Vec<u32>, Option<Stop>)> = ids.iter().map(|&i| (i, (Vec::new(), None))).collect();
    let mut steps = 0;
    while e.has_work() {
        for ev in e.step().unwrap() {
            match ev {
                Event::Token { id, token, .. } => out.get_mut(&id).unwrap().0.push(token),
                Event::Finished { id, stop, .. } => out.get_mut(&id).unwrap().1 = Some(stop),
            }
        }
        steps += 1;
        assert!(steps < 5_000, "the engine does not finish");
    }
    assert_eq!(e.stats().blocks_used, 0, "every block free at the end");
    out.into_iter().map(|(id, (t, s))| (id, (t, s.expect("finished")))).collect()
}

#[test]
fn constrained_and_free_sequences_share_a_batch() {
    let root = common::repo_root();
    let tok = Tokenizer::from_file(&root.join("tests/fixtures/tokenizer/tokenizer.json")).unwrap();
    let grammars = Grammars::new(&tok).unwrap();
    let grammar = grammars.compile(&GrammarSpec::json_schema(&schema())).unwrap();
    let stops: Vec<u32> = ["<|im_end|>", "<|endoftext|>"].iter().map(|t| tok.token_to_id(t).unwrap()).collect();
    let im_end = stops[0];
    let prompt = tok.encode("<|im_start|>user\nDescribe a person as JSON.<|im_end|>\n<|im_start|>assistant\n");
    let sampled = |seed| SamplingParams { temperature: 1.0, top_k: 0, top_p: 1.0, repetition_penalty: 1.0, seed };
    // (constrained, sampling) per request; the free one is greedy
    let plan = [(true, SamplingParams::greedy()), (false, SamplingParams::greedy()), (true, sampled(5)), (true, sampled(6))];
    let request = |constrained: bool, params: SamplingParams, max_new: usize| {
        let s = Sampler::new(params);
        Request { prompt: prompt.clone(), images: None, max_new, sampler: if constrained { s.with_constraint(grammar.constraint()) } else { s }, stop_ids: stops.clone() }
    };
    for b in common::backends("structured output in a batch") {
        let mut model = Model::load(&root.join("tests/fixtures/vision/tiny"), &*b, &mut |_, _| {}).unwrap();
        model.limit_sampling(tok.vocab_size());
        let kv = b.default_kv_dtype();
        let engine = || {
            let mut cfg = EngineConfig::new(8, 4096, kv);
            cfg.block = 16;
            Engine::new(&model, &*b, cfg).unwrap()
        };
        let together = run(&mut engine(), plan.iter().map(|&(c, p)| request(c, p, 160)).collect());
        for (i, &(constrained, params)) in plan.iter().enumerate() {
            let what = format!("request {} (constrained {}, {:?}) on {}", i, constrained, params, b.describe());
            let (tokens, stop) = &together[&(i as u64)];
            if constrained {
                assert_eq!(*stop, Stop::StopToken(im_end), "{}: ends at <|im_end|>: {:?}", what, tok.decode(tokens, false));
                validate(&tok.decode(&tokens[..tokens.len() - 1], false).unwrap());
            } else {
                assert_eq!(tokens.len(), 160, "{}: the free one runs to its limit", what);
                let text = tok.decode(tokens, false).unwrap();
                assert!(serde_json::from_str::<Value>(&text).is_err(), "{}: free text on random weights is not JSON", what);
            }
            // the same tokens alone: exactly on the CPU; a GPU's batched and lone steps round
            // differently, so a near tie may go either way there (tests/engine_masks.rs checks
            // the device's masked picks against the host's from the same logits)
            if b.kind() == qwen3_vl::DeviceKind::Cpu {
                let alone = run(&mut engine(), vec![request(constrained, params, 160)]);
                assert_eq!(&alone[&0].0, tokens, "{}: in a batch against alone", what);
            }
        }
    }
}

/// `generate --json-schema / --regex / --grammar` on the tiny model: the printed reply matches,
/// sampled or greedy; a bad regex and two flags at once are refused naming the flag.
#[test]
fn generate_takes_a_schema_a_regex_or_a_grammar() {
    let dir = common::Scratch::dir(&format!("qwen3-vl-structured-{}", std::process::id()));
    let schema_file = dir.join("person.json");
    std::fs::write(&schema_file, schema().to_string()).unwrap();
    let lark_file = dir.join("sql.lark");
    std::fs::write(&lark_file, "start: \"SELECT \" COL (\", \" COL)* \" FROM t\"\nCOL: /[a-z]{1,6}/\n").unwrap();
    let run = |args: &[&str]| {
        let out = common::server::cli("generate", &[&["-q", "--max-tokens", "200", "-p", "Describe a person."][..], args].concat()).output().unwrap();
        (out.status.success(), String::from_utf8_lossy(&out.stdout).trim_end_matches('\n').to_string(), String::from_utf8_lossy(&out.stderr).into_owned())
    };
    let schema_arg = schema_file.to_str().unwrap();
    for sampling in [&["--greedy"][..], &["--temperature", "1", "--seed", "7"]] {
        let (ok, text, err) = run(&[sampling, &["--json-schema", schema_arg]].concat());
        assert!(ok, "{}", err);
        validate(&text);
        let (ok, text, err) = run(&[sampling, &["--regex", "[a-f]{3}-[0-9]{2,4}"]].concat());
        assert!(ok, "{}", err);
        let (l, r) = text.split_once('-').unwrap_or_else(|| panic!("{:?}", text));
        assert!(l.len() == 3 && l.bytes().all(|b| (b'a'..=b'f').contains(&b)) && (2..=4).contains(&r.len()) && r.bytes().all(|b| b.is_ascii_digit()), "{:?}", text);
        let (ok, text, err) = run(&[sampling, &["--grammar", lark_file.to_str().unwrap()]].concat());
        assert!(ok, "{}", err);
        let cols = text.strip_prefix("SELECT ").and_then(|t| t.strip_suffix(" FROM t")).unwrap_or_else(|| panic!("{:?}", text));
        assert!(cols.split(", ").all(|c| (1..=6).contains(&c.len()) && c.bytes().all(|b| b.is_ascii_lowercase())), "{:?}", text);
    }
    let (ok, _, err) = run(&["--regex", "(unclosed"]);
    assert!(!ok && err.contains("--regex") && err.contains("unclosed"), "{}", err);
    let (ok, _, err) = run(&["--regex", "a", "--json-schema", schema_arg]);
    assert!(!ok && err.contains("cannot be used with"), "{}", err);
}
