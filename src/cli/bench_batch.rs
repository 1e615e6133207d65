//! `qwen3-vl bench --batch N`: N sequences of `--prompt-tokens` each generating `--gen-tokens`
//! through the engine at once, as llama.cpp's `llama-batched-bench` measures: prefill tok/s
//! (every prompt read), aggregate decode tok/s (the tokens after that point, over the time from
//! the step that gave the last sequence its first token to the end), per-sequence decode tok/s,
//! peak device bytes.
//! The median of `--runs` runs after a warm-up run.
//!
//! `QWEN3_VL_PROFILE_STEPS=N` brackets N decode steps of the first run after the warm-up (from
//! its third decode step on) in the backend's profiler start and stop, for `ncu
//! --profile-from-start off`; the single-stream `bench` does the same with its session.

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
    let mut started = std::collections::HashSet::new();
    // decode steps to bracket for a profiler in this run (counted from the first decode step)
    let profile = profile_steps();
    let mut decode_steps = 0usize;
    while e.has_work() {
        if let Some(n) = profile {
            if t1.is_some() && decode_steps == 2 {
                b.profiler(true)?;
            }
            if t1.is_some() && decode_steps == 2 + n {
                b.profiler(false)?;
            }
        }
        if t1.is_some() {
            decode_steps += 1;
        }
        for ev in e.step()? {
            if let Event::Token { id, .. } = ev {
                tokens += 1;
                started.insert(id);
            }
        }
        steps += 1;
        // decode is timed from the step that gave the last sequence its first token (with
        // chunked prefill, sequences prefilled early decode while later ones still prefill)
        if t1.is_none() && started.len() >= batch {
            firsts = tokens;
            t1 = Some(b.mark()?);
        }
    }
    if profile.map_or(false, |n| decode_steps >= 2 && decode_steps < 2 + n) {
        b.profiler(false)?;
    }
    let t2 = b.mark()?;
    let t1 = t1.ok_or("the batch produced no tokens")?;
    let prefill = b.seconds_between(&t0, &t1)?;
    let decode = b.seconds_between(&t1, &t2)?;
    Ok(BatchResult { prefill_tokens_per_s: (batch * prompt_tokens) as f64 / prefill, decode_tokens_per_s: (tokens - firsts) as f64 / decode, steps })
}

/// `QWEN3_VL_PROFILE_STEPS`: how many decode steps the second call (the first after the
/// warm-up) brackets for a profiler; `None` for every other call or when unset.
pub(super) fn profile_steps() -> Option<usize> {
    use std::sync::atomic::{AtomicUsize, Ordering};
    static CALLS: AtomicUsize = AtomicUsize::new(0);
    let n = std::env::var("QWEN3_VL_PROFILE_STEPS").ok()?.parse::<usize>().ok()?;
    (CALLS.fetch_add(1, Ordering::Relaxed) == 1 && n > 0).then(|| n)
}
