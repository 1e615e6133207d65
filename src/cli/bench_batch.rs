//! `qwen3-vl bench --batch N`: N sequences of `--prompt-tokens` each generating `--gen-tokens`
//! through the engine at once, as llama.cpp's `llama-batched-bench` measures: prefill tok/s
//! (every prompt read), aggregate decode tok/s (the tokens after each sequence's first, over
//! the time from the last first token to the end), per-sequence decode tok/s, peak device bytes.
//! The median of `--runs` runs after a warm-up run.

use super::load::CliResult;
use qwen3_vl::engine::{Engine, EngineConfig, Event, Request};
use qwen3_vl::generate::{Sampler, SamplingParams};
use qwen3_vl::model::Model;
use qwen3_vl::{Backend, DType};

/// What one batched run measured.
pub struct BatchResult {
    pub prefill_tokens_per_s: f64,
    pub decode_tokens_per_s: f64,
    pub steps: usize,
}

/// Runs `batch` greedy sequences of `prompt_tokens` generating `gen_tokens` each; the prompts
/// come from `prompt(n, salt)`.
pub fn run_batch(model: &Model, b: &dyn Backend, kv: DType, batch: usize, prompt_tokens: usize, gen_tokens: usize, max_prefill: usize, prompt: &dyn Fn(usize, u64) -> Vec<u32>) -> CliResult<BatchResult> {
    let mut cfg = EngineConfig::new(batch, batch * (prompt_tokens + gen_tokens), kv);
    cfg.max_prefill_tokens = max_prefill;
    let mut e = Engine::new(model, b, cfg)?;
    for i in 0..batch {
        e.add(Request { prompt: prompt(prompt_tokens, 11 + i as u64), images: None, max_new: gen_tokens, sampler: Sampler::new(SamplingParams::greedy()), stop_ids: vec![] })?;
    }
    let t0 = b.mark()?;
    let (mut firsts, mut tokens, mut steps) = (0usize, 0usize, 0usize);
    let mut t1 = None;
    while e.has_work() {
        for ev in e.step()? {
            if let Event::Token { .. } = ev {
                tokens += 1;
            }
        }
        steps += 1;
        if t1.is_none() && tokens >= batch {
            firsts = tokens;
            t1 = Some(b.mark()?);
        }
    }
    let t2 = b.mark()?;
    let t1 = t1.ok_or("the batch produced no tokens")?;
    let prefill = b.seconds_between(&t0, &t1)?;
    let decode = b.seconds_between(&t1, &t2)?;
    Ok(BatchResult { prefill_tokens_per_s: (batch * prompt_tokens) as f64 / prefill, decode_tokens_per_s: (tokens - firsts) as f64 / decode, steps })
}
