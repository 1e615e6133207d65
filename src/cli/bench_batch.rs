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
use qwen3_vl::generate::Sampler;
use qwen3_vl::model::Model;
use qwen3_vl::{Backend, DType};

/// What one batched run measured.
pub struct BatchResult {
    pub prefill_tokens_per_s: f64,
    pub decode_tokens_per_s: f64,
    pub steps: usize,
    /// Of the decode-only steps' wall time, the share the host did not wait on the device
    /// (its own work between two steps, during which the device idles; see
    /// [`qwen3_vl::engine::EngineStats::decode_wait_ns`]), and those steps' mean wall time (µs).
    pub host_share: f64,
    pub step_us: f64,
    /// Decode steps recorded in the run, and the wall time of those steps (ms).
    pub recordings: u64,
    pub record_ms: f64,
}

/// Runs `batch` sequences of `prompt_tokens` generating `gen_tokens` each; the prompts come
/// from `prompt(n, salt)`, each sequence's sampler from `sampler()` (greedy, constrained by
/// `bench --json-schema`).
#[allow(clippy::too_many_arguments)]
pub fn run_batch(model: &Model, b: &dyn Backend, kv: DType, batch: usize, prompt_tokens: usize, gen_tokens: usize, max_prefill: usize, prompt: &dyn Fn(usize, u64) -> Vec<u32>, sampler: &dyn Fn() -> Sampler) -> CliResult<BatchResult> {
    let mut cfg = EngineConfig::new(batch, batch * (prompt_tokens + gen_tokens), kv);
    cfg.max_prefill_tokens = max_prefill;
    let mut e = Engine::new(model, b, cfg)?;
    for i in 0..batch {
        e.add(Request { prompt: prompt(prompt_tokens, 11 + i as u64), images: None, max_new: gen_tokens, sampler: sampler(), stop_ids: vec![] })?;
    }
    let t0 = b.mark()?;
    let (mut firsts, mut tokens, mut steps) = (0usize, 0usize, 0usize);
    let mut t1 = None;
    let mut started = std::collections::HashSet::new();
    // decode steps to bracket for a profiler in this run (counted from the first decode step)
    let mut profile = ProfileWindow::new();
    let mut decode_steps = 0usize;
    while e.has_work() {
        if t1.is_some() {
            profile.before_step(b, decode_steps)?;
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
    profile.finish(b)?;
    let t2 = b.mark()?;
    let t1 = t1.ok_or("the batch produced no tokens")?;
    let prefill = b.seconds_between(&t0, &t1)?;
    let decode = b.seconds_between(&t1, &t2)?;
    let st = e.stats();
    let wall = st.decode_step_ns.max(1) as f64;
    let host_share = (1.0 - st.decode_wait_ns as f64 / wall).max(0.0);
    let step_us = wall / st.decode_steps.max(1) as f64 / 1e3;
    Ok(BatchResult { prefill_tokens_per_s: (batch * prompt_tokens) as f64 / prefill, decode_tokens_per_s: (tokens - firsts) as f64 / decode, steps, host_share, step_us, recordings: st.decode_recordings, record_ms: st.decode_record_ns as f64 / 1e6 })
}

/// The decode steps `2 .. 2 + n` of a run bracketed in the backend's profiler start and stop
/// (`n` from [`profile_steps`]; nothing when it is `None`). Shared by `bench` and `bench --batch`.
pub(super) struct ProfileWindow {
    n: Option<usize>,
    on: bool,
}

impl ProfileWindow {
    pub(super) fn new() -> ProfileWindow {
        ProfileWindow { n: profile_steps(), on: false }
    }

    /// Before decode step `i` of the run (counted from 0): starts or stops the profiler.
    pub(super) fn before_step(&mut self, b: &dyn Backend, i: usize) -> qwen3_vl::Result<()> {
        if let Some(n) = self.n {
            if i == 2 {
                b.profiler(true)?;
                self.on = true;
            } else if i == 2 + n && self.on {
                b.profiler(false)?;
                self.on = false;
            }
        }
        Ok(())
    }

    /// After the run's last step: stops a window the run ended inside.
    pub(super) fn finish(&mut self, b: &dyn Backend) -> qwen3_vl::Result<()> {
        if self.on {
            b.profiler(false)?;
            self.on = false;
        }
        Ok(())
    }
}

/// `QWEN3_VL_PROFILE_STEPS`: how many decode steps the second call (the first after the
/// warm-up) brackets for a profiler; `None` for every other call or when unset.
fn profile_steps() -> Option<usize> {
    use std::sync::atomic::{AtomicUsize, Ordering};
    static CALLS: AtomicUsize = AtomicUsize::new(0);
    let n = std::env::var("QWEN3_VL_PROFILE_STEPS").ok()?.parse::<usize>().ok()?;
    (CALLS.fetch_add(1, Ordering::Relaxed) == 1 && n > 0).then(|| n)
}
