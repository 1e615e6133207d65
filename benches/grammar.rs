//! Structured-output benchmark on the CPU: `cargo bench --bench grammar`.
//!
//! With the fixture's Qwen tokenizer (151,669 ids; masks over the 151,936 sampled ids): the
//! token trie's build, a nested JSON schema's compilation (first and cached), and the time of
//! one mask (llguidance's computation and the copy into our words) at each token of
//! generations drawn with random logits under the schema, as median, 90th percentile and
//! maximum over `GRAMMAR_BENCH_RUNS` (default 8) generations, on one thread; the same for
//! `json_object` (open-ended: most of its generations run to the 600-token cap).

use qwen3_vl::generate::grammar::{GrammarSpec, Grammars};
use qwen3_vl::generate::sampling::{mask_words, Constraint};
use qwen3_vl::generate::{Sampler, SamplingParams};
use qwen3_vl::Tokenizer;
use std::time::Instant;

const SAMPLED_VOCAB: usize = 151_936;

fn schema() -> serde_json::Value {
    serde_json::json!({
        "type": "object",
        "properties": {
            "invoice": {"type": "string", "maxLength": 16},
            "date": {"type": "string", "pattern": "^[0-9]{4}-[0-9]{2}-[0-9]{2}$"},
            "paid": {"type": "boolean"},
            "vendor": {
                "type": "object",
                "properties": {"name": {"type": "string", "maxLength": 24}, "country": {"enum": ["DE", "FR", "US", "CN"]}},
                "required": ["name", "country"], "additionalProperties": false
            },
            "items": {
                "type": "array", "maxItems": 4,
                "items": {
                    "type": "object",
                    "properties": {
                        "description": {"type": "string", "maxLength": 20},
                        "quantity": {"type": "integer", "minimum": 1, "maximum": 1000},
                        "price": {"type": "number"}
                    },
                    "required": ["description", "quantity", "price"], "additionalProperties": false
                }
            }
        },
        "required": ["invoice", "date", "paid", "vendor", "items"],
        "additionalProperties": false
    })
}

fn main() {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/tokenizer/tokenizer.json");
    let tok = Tokenizer::from_file(&path).unwrap();
    let t0 = Instant::now();
    let grammars = Grammars::new(&tok).unwrap();
    println!("token trie of {} ids: {:.1} ms", tok.vocab_size(), t0.elapsed().as_secs_f64() * 1e3);
    let spec = GrammarSpec::json_schema(&schema());
    let t0 = Instant::now();
    let g = grammars.compile(&spec).unwrap();
    println!("nested schema compiled: {:.2} ms (the grammar's own count: {:.2} ms)", t0.elapsed().as_secs_f64() * 1e3, g.compile_secs() * 1e3);
    let t0 = Instant::now();
    let _ = grammars.compile(&spec).unwrap().constraint();
    println!("cached schema to a new constraint: {:.1} µs", t0.elapsed().as_secs_f64() * 1e6);
    let runs: u64 = std::env::var("GRAMMAR_BENCH_RUNS").ok().and_then(|s| s.parse().ok()).unwrap_or(8);
    masks("nested schema", &grammars, &spec, runs);
    masks("json_object", &grammars, &GrammarSpec::JsonObject, runs);
}

/// Times each mask of `runs` generations (at most 600 tokens each) under `spec`.
fn masks(what: &str, grammars: &Grammars, spec: &GrammarSpec, runs: u64) {
    let g = grammars.compile(spec).unwrap();
    let mut times = Vec::new();
    let mut tokens = 0;
    let mut words = vec![0u32; mask_words(SAMPLED_VOCAB)];
    let mut logits = vec![0f32; SAMPLED_VOCAB];
    for seed in 1..=runs {
        let mut c = g.matcher();
        let mut s = Sampler::new(SamplingParams { temperature: 1.0, top_k: 0, top_p: 1.0, repetition_penalty: 1.0, seed });
        let mut x = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
        for _ in 0..600 {
            let t0 = Instant::now();
            c.fill_mask(&mut words).unwrap();
            times.push(t0.elapsed().as_secs_f64() * 1e6);
            for l in logits.iter_mut() {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                *l = (x >> 40) as f32 / (1u64 << 24) as f32 * 8.0 - 4.0;
            }
            qwen3_vl::generate::sampling::apply_mask(&mut logits, &words);
            let t = s.sample(&mut logits, &[]).unwrap();
            c.accept(t).unwrap();
            tokens += 1;
            if t == grammars.eos() {
                break;
            }
        }
    }
    times.sort_by(|a, b| a.partial_cmp(b).unwrap());
    let q = |p: f64| times[((times.len() - 1) as f64 * p) as usize];
    println!("{}: mask per token over {} tokens in {} generations: median {:.1} µs, p90 {:.1} µs, max {:.1} µs", what, tokens, runs, q(0.5), q(0.9), q(1.0));
}
