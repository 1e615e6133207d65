//! Counters of the server, rendered in the Prometheus text format for `GET /metrics`.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Mutex;

/// Upper bounds (seconds) of the time-to-first-token histogram.
const TTFT_BUCKETS: [f64; 12] = [0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0];

/// A cumulative histogram.
#[derive(Default)]
struct Histogram {
    counts: Vec<u64>,
    sum: f64,
    count: u64,
}

impl Histogram {
    fn observe(&mut self, v: f64, bounds: &[f64]) {
        if self.counts.len() != bounds.len() {
            self.counts = vec![0; bounds.len()];
        }
        for (c, b) in self.counts.iter_mut().zip(bounds) {
            if v <= *b {
                *c += 1;
            }
        }
        self.sum += v;
        self.count += 1;
    }
}

/// Everything `/metrics` reports.
#[derive(Default)]
pub struct Metrics {
    /// HTTP responses by (path, status).
    responses: Mutex<BTreeMap<(String, u16), u64>>,
    /// Completed generations by finish reason (stop, length, cancelled, error).
    finished: Mutex<BTreeMap<&'static str, u64>>,
    prompt_tokens: AtomicU64,
    completion_tokens: AtomicU64,
    /// Microseconds spent in prefill and in decode.
    prefill_us: AtomicU64,
    decode_us: AtomicU64,
    pub running: AtomicUsize,
    pub connections: AtomicUsize,
    /// Connections closed unanswered (over a connection limit while many refusals were being
    /// answered already).
    pub dropped_connections: AtomicU64,
    /// The engine after its last step: waiting sequences, rows of the step, KV blocks used and
    /// free, preemptions so far, and steps and their seconds.
    waiting: AtomicUsize,
    batch: AtomicUsize,
    blocks_used: AtomicUsize,
    blocks_free: AtomicUsize,
    preemptions: AtomicU64,
    /// Prefix cache: idle cached blocks, prompt tokens taken from it and prompt tokens admitted.
    blocks_cached: AtomicUsize,
    prefix_hit_tokens: AtomicU64,
    prefix_prompt_tokens: AtomicU64,
    vision_runs: AtomicU64,
    host_samples: AtomicU64,
    steps: AtomicU64,
    step_us: AtomicU64,
    ttft: Mutex<Histogram>,
    /// Decode tokens/s of the last finished request, as f64 bits.
    last_tps: AtomicU64,
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl Metrics {
    /// Counts one HTTP response. Unknown paths are counted under "other" so that clients
    /// cannot grow the table.
    pub fn response(&self, path: &str, status: u16) {
        let path = match path {
            "/v1/chat/completions" | "/v1/models" | "/health" | "/metrics" => path,
            p if p.starts_with("/v1/models/") => "/v1/models/{id}",
            _ => "other",
        };
        *lock(&self.responses).entry((path.to_string(), status)).or_insert(0) += 1;
    }

    pub fn time_to_first_token(&self, secs: f64) {
        lock(&self.ttft).observe(secs, &TTFT_BUCKETS);
    }

    /// Records the engine's state (after a step, or after sequences left it).
    pub fn engine(&self, st: &crate::engine::EngineStats) {
        self.running.store(st.running, Ordering::Relaxed);
        self.waiting.store(st.waiting, Ordering::Relaxed);
        self.batch.store(st.last_batch, Ordering::Relaxed);
        self.blocks_used.store(st.blocks_used, Ordering::Relaxed);
        self.blocks_free.store(st.blocks_free, Ordering::Relaxed);
        self.preemptions.store(st.preemptions, Ordering::Relaxed);
        self.blocks_cached.store(st.blocks_cached, Ordering::Relaxed);
        self.prefix_hit_tokens.store(st.prefix_hit_tokens, Ordering::Relaxed);
        self.prefix_prompt_tokens.store(st.prompt_tokens, Ordering::Relaxed);
        self.vision_runs.store(st.vision_runs, Ordering::Relaxed);
        self.host_samples.store(st.host_samples, Ordering::Relaxed);
    }

    /// Counts one engine step of `secs`.
    pub fn step(&self, secs: f64) {
        self.steps.fetch_add(1, Ordering::Relaxed);
        self.step_us.fetch_add((secs * 1e6) as u64, Ordering::Relaxed);
    }

    /// Engine steps so far, the seconds spent in them, and the rows sampled on the host.
    pub fn step_totals(&self) -> (u64, f64, u64) {
        (self.steps.load(Ordering::Relaxed), self.step_us.load(Ordering::Relaxed) as f64 * 1e-6, self.host_samples.load(Ordering::Relaxed))
    }

    /// Counts one finished generation.
    pub fn finished(&self, reason: &'static str, prompt: usize, completion: usize, prefill_secs: f64, decode_secs: f64) {
        *lock(&self.finished).entry(reason).or_insert(0) += 1;
        self.prompt_tokens.fetch_add(prompt as u64, Ordering::Relaxed);
        self.completion_tokens.fetch_add(completion as u64, Ordering::Relaxed);
        self.prefill_us.fetch_add((prefill_secs * 1e6) as u64, Ordering::Relaxed);
        self.decode_us.fetch_add((decode_secs * 1e6) as u64, Ordering::Relaxed);
        if completion > 1 && decode_secs > 0.0 {
            self.last_tps.store(((completion - 1) as f64 / decode_secs).to_bits(), Ordering::Relaxed);
        }
    }

    /// The Prometheus text exposition.
    pub fn render(&self, queue_depth: usize, queue_capacity: usize) -> String {
        let mut s = String::new();
        let mut metric = |name: &str, kind: &str, help: &str, lines: Vec<String>| {
            s.push_str(&format!("# HELP {} {}\n# TYPE {} {}\n", name, help, name, kind));
            for l in lines {
                s.push_str(&l);
                s.push('\n');
            }
        };
        let responses = lock(&self.responses).iter().map(|((p, c), n)| format!("qwen3vl_http_responses_total{{path=\"{}\",code=\"{}\"}} {}", p, c, n)).collect();
        metric("qwen3vl_http_responses_total", "counter", "HTTP responses by path and status code.", responses);
        let finished = lock(&self.finished).iter().map(|(r, n)| format!("qwen3vl_requests_finished_total{{reason=\"{}\"}} {}", r, n)).collect();
        metric("qwen3vl_requests_finished_total", "counter", "Chat completions by finish reason (stop, length, cancelled, error).", finished);
        let c = |name: &str, help: &str, v: String, kind: &str, m: &mut dyn FnMut(&str, &str, &str, Vec<String>)| m(name, kind, help, vec![format!("{} {}", name, v)]);
        c("qwen3vl_prompt_tokens_total", "Prompt tokens processed.", self.prompt_tokens.load(Ordering::Relaxed).to_string(), "counter", &mut metric);
        c("qwen3vl_completion_tokens_total", "Tokens generated.", self.completion_tokens.load(Ordering::Relaxed).to_string(), "counter", &mut metric);
        c("qwen3vl_prefill_seconds_total", "Time spent on prompts.", format!("{:.6}", self.prefill_us.load(Ordering::Relaxed) as f64 / 1e6), "counter", &mut metric);
        c("qwen3vl_decode_seconds_total", "Time spent generating tokens.", format!("{:.6}", self.decode_us.load(Ordering::Relaxed) as f64 / 1e6), "counter", &mut metric);
        c("qwen3vl_decode_tokens_per_second", "Decode speed of the last finished request.", format!("{:.3}", f64::from_bits(self.last_tps.load(Ordering::Relaxed))), "gauge", &mut metric);
        c("qwen3vl_queue_depth", "Requests waiting for the model.", queue_depth.to_string(), "gauge", &mut metric);
        c("qwen3vl_queue_capacity", "Most requests that may wait.", queue_capacity.to_string(), "gauge", &mut metric);
        c("qwen3vl_requests_running", "Requests being generated.", self.running.load(Ordering::Relaxed).to_string(), "gauge", &mut metric);
        c("qwen3vl_sequences_waiting", "Sequences in the engine waiting for KV blocks or a batch slot.", self.waiting.load(Ordering::Relaxed).to_string(), "gauge", &mut metric);
        c("qwen3vl_batch_rows", "Rows (decode and prefill) of the engine's last step.", self.batch.load(Ordering::Relaxed).to_string(), "gauge", &mut metric);
        c("qwen3vl_kv_blocks_used", "KV-cache blocks held by sequences.", self.blocks_used.load(Ordering::Relaxed).to_string(), "gauge", &mut metric);
        c("qwen3vl_kv_blocks_free", "KV-cache blocks free.", self.blocks_free.load(Ordering::Relaxed).to_string(), "gauge", &mut metric);
        c("qwen3vl_kv_blocks_cached", "KV-cache blocks no sequence holds, kept for the prefix cache (counted free too).", self.blocks_cached.load(Ordering::Relaxed).to_string(), "gauge", &mut metric);
        c("qwen3vl_prefix_cache_hit_tokens_total", "Prompt tokens whose keys and values came from the prefix cache.", self.prefix_hit_tokens.load(Ordering::Relaxed).to_string(), "counter", &mut metric);
        c("qwen3vl_prefix_cache_prompt_tokens_total", "Prompt tokens the engine admitted (hits and misses).", self.prefix_prompt_tokens.load(Ordering::Relaxed).to_string(), "counter", &mut metric);
        c("qwen3vl_vision_tower_runs_total", "Vision tower passes (prompts whose image tokens were not all in the prefix cache).", self.vision_runs.load(Ordering::Relaxed).to_string(), "counter", &mut metric);
        c("qwen3vl_host_sampled_tokens_total", "Tokens drawn on the host from downloaded logits (penalties, or a top-k the device does not take); the rest are drawn inside the step.", self.host_samples.load(Ordering::Relaxed).to_string(), "counter", &mut metric);
        c("qwen3vl_preemptions_total", "Sequences preempted for KV blocks (re-read later).", self.preemptions.load(Ordering::Relaxed).to_string(), "counter", &mut metric);
        c("qwen3vl_engine_steps_total", "Engine steps run.", self.steps.load(Ordering::Relaxed).to_string(), "counter", &mut metric);
        c("qwen3vl_engine_step_seconds_total", "Time spent in engine steps.", format!("{:.6}", self.step_us.load(Ordering::Relaxed) as f64 / 1e6), "counter", &mut metric);
        c("qwen3vl_open_connections", "Open client connections.", self.connections.load(Ordering::Relaxed).to_string(), "gauge", &mut metric);
        c("qwen3vl_connections_dropped_total", "Connections closed unanswered (over a connection limit during a flood of refusals).", self.dropped_connections.load(Ordering::Relaxed).to_string(), "counter", &mut metric);
        let h = lock(&self.ttft);
        let mut lines: Vec<String> = TTFT_BUCKETS
            .iter()
            .enumerate()
            .map(|(i, b)| format!("qwen3vl_time_to_first_token_seconds_bucket{{le=\"{}\"}} {}", b, h.counts.get(i).copied().unwrap_or(0)))
            .collect();
        lines.push(format!("qwen3vl_time_to_first_token_seconds_bucket{{le=\"+Inf\"}} {}", h.count));
        lines.push(format!("qwen3vl_time_to_first_token_seconds_sum {:.6}", h.sum));
        lines.push(format!("qwen3vl_time_to_first_token_seconds_count {}", h.count));
        metric("qwen3vl_time_to_first_token_seconds", "histogram", "Time from a request's arrival to its first generated token.", lines);
        s
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renders_prometheus_text() {
        let m = Metrics::default();
        m.response("/v1/chat/completions", 200);
        m.response("/../../etc", 404);
        m.time_to_first_token(0.3);
        m.finished("stop", 10, 5, 0.1, 0.4);
        let t = m.render(3, 16);
        for want in [
            "qwen3vl_http_responses_total{path=\"/v1/chat/completions\",code=\"200\"} 1",
            "qwen3vl_http_responses_total{path=\"other\",code=\"404\"} 1",
            "qwen3vl_requests_finished_total{reason=\"stop\"} 1",
            "qwen3vl_prompt_tokens_total 10",
            "qwen3vl_completion_tokens_total 5",
            "qwen3vl_decode_tokens_per_second 10.000",
            "qwen3vl_time_to_first_token_seconds_bucket{le=\"0.25\"} 0",
            "qwen3vl_time_to_first_token_seconds_bucket{le=\"0.5\"} 1",
            "qwen3vl_time_to_first_token_seconds_count 1",
            "# TYPE qwen3vl_queue_depth gauge",
            "qwen3vl_queue_depth 3",
        ] {
            assert!(t.contains(want), "missing {:?} in\n{}", want, t);
        }
    }
}
