//! Counters of the server, rendered in the Prometheus text format for `GET /metrics`.
//!
//! Two families side by side:
//! - `qwen3vl_*`: the server's own names, unlabeled, summed over the replicas (engines);
//! - `vllm:*`: vLLM's names for what dashboards and the Gateway API Inference Extension read
//!   (queue and KV-cache gauges, latency histograms with vLLM's bucket bounds, token and
//!   request counters), one series per replica, labeled `model_name` and `replica`.
//!
//! Per-engine calls name their replica (0 with one engine); the HTTP side's counters
//! (responses, connections) are the server's. The finishes also feed the drain rate behind
//! `Retry-After` ([`rate`](super::rate)).

use super::rate::DrainRate;
use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Mutex;
use std::time::Instant;

/// Upper bounds (seconds) of `qwen3vl_time_to_first_token_seconds`.
const TTFT_BUCKETS: [f64; 12] = [0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0];
/// vLLM's bounds of `vllm:time_to_first_token_seconds`.
const VLLM_TTFT_BUCKETS: [f64; 22] = [0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0];
/// vLLM's bounds of `vllm:inter_token_latency_seconds` (those of its time per output token).
const VLLM_ITL_BUCKETS: [f64; 19] = [0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0];
/// vLLM's bounds of `vllm:e2e_request_latency_seconds` (its request latency buckets).
const VLLM_E2E_BUCKETS: [f64; 21] = [0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0];
/// vLLM's finish reasons, each with a `vllm:request_success_total` series from the start.
const VLLM_REASONS: [&str; 4] = ["stop", "length", "abort", "error"];

/// A cumulative histogram over fixed bounds.
struct Histogram {
    bounds: &'static [f64],
    /// Observations at or below each bound.
    counts: Vec<u64>,
    sum: f64,
    count: u64,
}

impl Histogram {
    fn new(bounds: &'static [f64]) -> Histogram {
        Histogram { bounds, counts: vec![0; bounds.len()], sum: 0.0, count: 0 }
    }

    fn observe(&mut self, v: f64) {
        for (c, b) in self.counts.iter_mut().zip(self.bounds) {
            if v <= *b {
                *c += 1;
            }
        }
        self.sum += v;
        self.count += 1;
    }

    /// Adds `other`'s observations (same bounds).
    fn merge(&mut self, other: &Histogram) {
        for (c, o) in self.counts.iter_mut().zip(&other.counts) {
            *c += o;
        }
        self.sum += other.sum;
        self.count += other.count;
    }

    /// The `_bucket`, `_sum` and `_count` lines of `name` with `labels` (`k="v",` pairs, or
    /// empty).
    fn lines(&self, name: &str, labels: &str) -> Vec<String> {
        let mut out: Vec<String> = self.bounds.iter().zip(&self.counts).map(|(b, c)| format!("{}_bucket{{{}le=\"{}\"}} {}", name, labels, b, c)).collect();
        out.push(format!("{}_bucket{{{}le=\"+Inf\"}} {}", name, labels, self.count));
        let braces = |l: &str| if l.is_empty() { String::new() } else { format!("{{{}}}", l.trim_end_matches(',')) };
        out.push(format!("{}_sum{} {:.6}", name, braces(labels), self.sum));
        out.push(format!("{}_count{} {}", name, braces(labels), self.count));
        out
    }
}

/// What one engine reports.
struct Replica {
    /// The engine after its last step: running and waiting sequences, rows of the step, KV
    /// blocks used and free, preemptions so far.
    running: AtomicUsize,
    waiting: AtomicUsize,
    batch: AtomicUsize,
    blocks_used: AtomicUsize,
    blocks_free: AtomicUsize,
    preemptions: AtomicU64,
    /// Prefix cache: idle cached blocks, prompt tokens taken from it and prompt tokens admitted.
    blocks_cached: AtomicUsize,
    image_cache_bytes: AtomicUsize,
    prefix_hit_tokens: AtomicU64,
    prefix_prompt_tokens: AtomicU64,
    vision_runs: AtomicU64,
    vision_images: AtomicU64,
    vision_cache_hits: AtomicU64,
    host_samples: AtomicU64,
    decode_recordings: AtomicU64,
    steps: AtomicU64,
    step_us: AtomicU64,
    /// Finished generations by our finish reason (stop, length, cancelled, shutdown, error).
    finished: Mutex<BTreeMap<&'static str, u64>>,
    prompt_tokens: AtomicU64,
    completion_tokens: AtomicU64,
    /// Microseconds spent in prefill and in decode.
    prefill_us: AtomicU64,
    decode_us: AtomicU64,
    /// `qwen3vl_time_to_first_token_seconds`, and vLLM's three histograms.
    ttft: Mutex<Histogram>,
    vllm_ttft: Mutex<Histogram>,
    itl: Mutex<Histogram>,
    e2e: Mutex<Histogram>,
}

impl Replica {
    fn new() -> Replica {
        Replica {
            running: AtomicUsize::new(0),
            waiting: AtomicUsize::new(0),
            batch: AtomicUsize::new(0),
            blocks_used: AtomicUsize::new(0),
            blocks_free: AtomicUsize::new(0),
            preemptions: AtomicU64::new(0),
            blocks_cached: AtomicUsize::new(0),
            image_cache_bytes: AtomicUsize::new(0),
            prefix_hit_tokens: AtomicU64::new(0),
            prefix_prompt_tokens: AtomicU64::new(0),
            vision_runs: AtomicU64::new(0),
            vision_images: AtomicU64::new(0),
            vision_cache_hits: AtomicU64::new(0),
            host_samples: AtomicU64::new(0),
            decode_recordings: AtomicU64::new(0),
            steps: AtomicU64::new(0),
            step_us: AtomicU64::new(0),
            finished: Mutex::new(BTreeMap::new()),
            prompt_tokens: AtomicU64::new(0),
            completion_tokens: AtomicU64::new(0),
            prefill_us: AtomicU64::new(0),
            decode_us: AtomicU64::new(0),
            ttft: Mutex::new(Histogram::new(&TTFT_BUCKETS)),
            vllm_ttft: Mutex::new(Histogram::new(&VLLM_TTFT_BUCKETS)),
            itl: Mutex::new(Histogram::new(&VLLM_ITL_BUCKETS)),
            e2e: Mutex::new(Histogram::new(&VLLM_E2E_BUCKETS)),
        }
    }

    /// The fraction of KV-cache blocks held by sequences (0 to 1; cached idle blocks count free).
    fn kv_usage(&self) -> f64 {
        let (used, free) = (self.blocks_used.load(Ordering::Relaxed), self.blocks_free.load(Ordering::Relaxed));
        if used + free == 0 {
            0.0
        } else {
            used as f64 / (used + free) as f64
        }
    }
}

/// vLLM's finish reason for ours.
fn vllm_reason(reason: &str) -> &'static str {
    match reason {
        "stop" => "stop",
        "length" => "length",
        "error" => "error",
        _ => "abort", // cancelled (the client left), shutdown (ended by the drain's deadline)
    }
}

/// A label value escaped for the text format (backslash, quote, newline).
fn escape(v: &str) -> String {
    v.replace('\\', "\\\\").replace('"', "\\\"").replace('\n', "\\n")
}

/// Everything `/metrics` reports.
pub struct Metrics {
    /// The `model_name` label (the served model id), escaped.
    model_name: String,
    replicas: Vec<Replica>,
    /// HTTP responses by (path, status).
    responses: Mutex<BTreeMap<(String, u16), u64>>,
    pub connections: AtomicUsize,
    /// Connections closed unanswered (over a connection limit while many refusals were being
    /// answered already).
    pub dropped_connections: AtomicU64,
    /// Decode tokens/s of the last finished request (any replica), as f64 bits.
    last_tps: AtomicU64,
    drain: Mutex<DrainRate>,
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl Metrics {
    /// Metrics of a server of `replicas` engines (at least 1) serving `model_name`.
    pub fn new(model_name: String, replicas: usize) -> Metrics {
        Metrics {
            model_name: escape(&model_name),
            replicas: (0..replicas.max(1)).map(|_| Replica::new()).collect(),
            responses: Mutex::new(BTreeMap::new()),
            connections: AtomicUsize::new(0),
            dropped_connections: AtomicU64::new(0),
            last_tps: AtomicU64::new(0),
            drain: Mutex::new(DrainRate::default()),
        }
    }

    /// How many replicas the metrics have series for.
    pub fn replicas(&self) -> usize {
        self.replicas.len()
    }

    /// Replica `r` (an index past the replicas is a bug of the caller).
    fn rep(&self, r: usize) -> &Replica {
        self.replicas.get(r).unwrap_or_else(|| panic!("metrics for replica {} of a server of {}", r, self.replicas.len()))
    }

    /// Counts one HTTP response. Unknown paths are counted under "other" so that clients
    /// cannot grow the table.
    pub fn response(&self, path: &str, status: u16) {
        let path = match path {
            "/v1/chat/completions" | "/v1/completions" | "/v1/models" | "/health" | "/metrics" | "/tokenize" | "/detokenize" => path,
            p if p.starts_with("/v1/models/") => "/v1/models/{id}",
            _ => "other",
        };
        *lock(&self.responses).entry((path.to_string(), status)).or_insert(0) += 1;
    }

    /// Time from a request's arrival to its first generated token, on `replica`.
    pub fn time_to_first_token(&self, replica: usize, secs: f64) {
        let r = self.rep(replica);
        lock(&r.ttft).observe(secs);
        lock(&r.vllm_ttft).observe(secs);
    }

    /// Time between two consecutive tokens of one sequence, on `replica`.
    pub fn inter_token(&self, replica: usize, secs: f64) {
        lock(&self.rep(replica).itl).observe(secs);
    }

    /// A request ended on `replica` (whatever the reason) `secs` after it arrived: the e2e
    /// latency histogram, and the drain rate behind `Retry-After`. Once per request.
    pub fn request_latency(&self, replica: usize, secs: f64) {
        lock(&self.rep(replica).e2e).observe(secs);
        lock(&self.drain).finished(Instant::now(), secs);
    }

    /// Records the engine of `replica`'s state (after a step, or after sequences left it).
    pub fn engine(&self, replica: usize, st: &crate::engine::EngineStats) {
        let r = self.rep(replica);
        r.running.store(st.running, Ordering::Relaxed);
        r.waiting.store(st.waiting, Ordering::Relaxed);
        r.batch.store(st.last_batch, Ordering::Relaxed);
        r.blocks_used.store(st.blocks_used, Ordering::Relaxed);
        r.blocks_free.store(st.blocks_free, Ordering::Relaxed);
        r.preemptions.store(st.preemptions, Ordering::Relaxed);
        r.blocks_cached.store(st.blocks_cached, Ordering::Relaxed);
        r.image_cache_bytes.store(st.vision_cache_bytes, Ordering::Relaxed);
        r.prefix_hit_tokens.store(st.prefix_hit_tokens, Ordering::Relaxed);
        r.prefix_prompt_tokens.store(st.prompt_tokens, Ordering::Relaxed);
        r.vision_runs.store(st.vision_runs, Ordering::Relaxed);
        r.vision_images.store(st.vision_images, Ordering::Relaxed);
        r.vision_cache_hits.store(st.vision_cache_hits, Ordering::Relaxed);
        r.host_samples.store(st.host_samples, Ordering::Relaxed);
        r.decode_recordings.store(st.decode_recordings, Ordering::Relaxed);
        let busy = self.replicas.iter().any(|r| r.running.load(Ordering::Relaxed) + r.waiting.load(Ordering::Relaxed) > 0);
        lock(&self.drain).set_busy(Instant::now(), busy);
    }

    /// Counts one engine step of `secs` on `replica`.
    pub fn step(&self, replica: usize, secs: f64) {
        let r = self.rep(replica);
        r.steps.fetch_add(1, Ordering::Relaxed);
        r.step_us.fetch_add((secs * 1e6) as u64, Ordering::Relaxed);
    }

    /// Engine steps so far, the seconds spent in them, and the rows sampled on the host (over
    /// all replicas).
    pub fn step_totals(&self) -> (u64, f64, u64) {
        let sum = |f: fn(&Replica) -> u64| self.replicas.iter().map(f).sum::<u64>();
        (sum(|r| r.steps.load(Ordering::Relaxed)), sum(|r| r.step_us.load(Ordering::Relaxed)) as f64 * 1e-6, sum(|r| r.host_samples.load(Ordering::Relaxed)))
    }

    /// Counts one finished generation (one choice) on `replica`: `reason` is ours (stop,
    /// length, cancelled, shutdown, error).
    pub fn finished(&self, replica: usize, reason: &'static str, prompt: usize, completion: usize, prefill_secs: f64, decode_secs: f64) {
        let r = self.rep(replica);
        *lock(&r.finished).entry(reason).or_insert(0) += 1;
        r.prompt_tokens.fetch_add(prompt as u64, Ordering::Relaxed);
        r.completion_tokens.fetch_add(completion as u64, Ordering::Relaxed);
        r.prefill_us.fetch_add((prefill_secs * 1e6) as u64, Ordering::Relaxed);
        r.decode_us.fetch_add((decode_secs * 1e6) as u64, Ordering::Relaxed);
        if completion > 1 && decode_secs > 0.0 {
            self.last_tps.store(((completion - 1) as f64 / decode_secs).to_bits(), Ordering::Relaxed);
        }
    }

    /// Sequences running over all replicas.
    pub fn running(&self) -> usize {
        self.replicas.iter().map(|r| r.running.load(Ordering::Relaxed)).sum()
    }

    /// Seconds after which a client refused with `ahead` requests queued may try again (see
    /// [`DrainRate::retry_after`]).
    pub fn retry_after(&self, ahead: usize) -> u64 {
        lock(&self.drain).retry_after(Instant::now(), ahead)
    }

    /// The Prometheus text exposition. `queued[r]`: requests waiting for replica `r` that its
    /// engine has not taken yet (missing entries count 0); `queue_capacity`: the most that may
    /// wait in all.
    pub fn render(&self, queued: &[usize], queue_capacity: usize) -> String {
        let mut s = String::new();
        self.render_own(&mut s, queued.iter().sum(), queue_capacity);
        self.render_vllm(&mut s, queued);
        s
    }

    /// The `qwen3vl_` families, summed over the replicas.
    fn render_own(&self, s: &mut String, queue_depth: usize, queue_capacity: usize) {
        let mut metric = |name: &str, kind: &str, help: &str, lines: Vec<String>| {
            let _ = writeln!(s, "# HELP {} {}\n# TYPE {} {}", name, help, name, kind);
            for l in lines {
                s.push_str(&l);
                s.push('\n');
            }
        };
        let responses = lock(&self.responses).iter().map(|((p, c), n)| format!("qwen3vl_http_responses_total{{path=\"{}\",code=\"{}\"}} {}", p, c, n)).collect();
        metric("qwen3vl_http_responses_total", "counter", "HTTP responses by path and status code.", responses);
        let mut finished = BTreeMap::new();
        for r in &self.replicas {
            for (k, n) in lock(&r.finished).iter() {
                *finished.entry(*k).or_insert(0) += n;
            }
        }
        let finished = finished.iter().map(|(r, n)| format!("qwen3vl_requests_finished_total{{reason=\"{}\"}} {}", r, n)).collect();
        metric("qwen3vl_requests_finished_total", "counter", "Generations (choices) by finish reason (stop, length, cancelled, shutdown, error).", finished);
        let sum64 = |f: fn(&Replica) -> &AtomicU64| self.replicas.iter().map(|r| f(r).load(Ordering::Relaxed)).sum::<u64>();
        let sum = |f: fn(&Replica) -> &AtomicUsize| self.replicas.iter().map(|r| f(r).load(Ordering::Relaxed)).sum::<usize>();
        let c = |name: &str, help: &str, v: String, kind: &str, m: &mut dyn FnMut(&str, &str, &str, Vec<String>)| m(name, kind, help, vec![format!("{} {}", name, v)]);
        c("qwen3vl_prompt_tokens_total", "Prompt tokens processed.", sum64(|r| &r.prompt_tokens).to_string(), "counter", &mut metric);
        c("qwen3vl_completion_tokens_total", "Tokens generated.", sum64(|r| &r.completion_tokens).to_string(), "counter", &mut metric);
        c("qwen3vl_prefill_seconds_total", "Time spent on prompts.", format!("{:.6}", sum64(|r| &r.prefill_us) as f64 / 1e6), "counter", &mut metric);
        c("qwen3vl_decode_seconds_total", "Time spent generating tokens.", format!("{:.6}", sum64(|r| &r.decode_us) as f64 / 1e6), "counter", &mut metric);
        c("qwen3vl_decode_tokens_per_second", "Decode speed of the last finished request.", format!("{:.3}", f64::from_bits(self.last_tps.load(Ordering::Relaxed))), "gauge", &mut metric);
        c("qwen3vl_queue_depth", "Requests waiting for the model.", queue_depth.to_string(), "gauge", &mut metric);
        c("qwen3vl_queue_capacity", "Most requests that may wait.", queue_capacity.to_string(), "gauge", &mut metric);
        c("qwen3vl_requests_running", "Requests being generated.", sum(|r| &r.running).to_string(), "gauge", &mut metric);
        c("qwen3vl_sequences_waiting", "Sequences in the engine waiting for KV blocks or a batch slot.", sum(|r| &r.waiting).to_string(), "gauge", &mut metric);
        c("qwen3vl_batch_rows", "Rows (decode and prefill) of the engines' last steps.", sum(|r| &r.batch).to_string(), "gauge", &mut metric);
        c("qwen3vl_kv_blocks_used", "KV-cache blocks held by sequences.", sum(|r| &r.blocks_used).to_string(), "gauge", &mut metric);
        c("qwen3vl_kv_blocks_free", "KV-cache blocks free.", sum(|r| &r.blocks_free).to_string(), "gauge", &mut metric);
        c("qwen3vl_kv_blocks_cached", "KV-cache blocks no sequence holds, kept for the prefix cache (counted free too).", sum(|r| &r.blocks_cached).to_string(), "gauge", &mut metric);
        c("qwen3vl_image_cache_bytes", "Bytes of vision-tower outputs the image-embedding cache holds (--image-cache).", sum(|r| &r.image_cache_bytes).to_string(), "gauge", &mut metric);
        c("qwen3vl_prefix_cache_hit_tokens_total", "Prompt tokens whose keys and values came from the prefix cache.", sum64(|r| &r.prefix_hit_tokens).to_string(), "counter", &mut metric);
        c("qwen3vl_prefix_cache_prompt_tokens_total", "Prompt tokens the engine admitted (hits and misses).", sum64(|r| &r.prefix_prompt_tokens).to_string(), "counter", &mut metric);
        c("qwen3vl_vision_tower_runs_total", "Vision tower runs (each over the images of one or more prompts whose image tokens were not all in the prefix cache).", sum64(|r| &r.vision_runs).to_string(), "counter", &mut metric);
        c("qwen3vl_vision_tower_images_total", "Images (and videos) through the vision tower.", sum64(|r| &r.vision_images).to_string(), "counter", &mut metric);
        c("qwen3vl_image_cache_hits_total", "Images whose embeddings came from the image-embedding cache instead of the tower.", sum64(|r| &r.vision_cache_hits).to_string(), "counter", &mut metric);
        c("qwen3vl_host_sampled_tokens_total", "Tokens drawn on the host from downloaded logits (penalties, or a top-k the device does not take); the rest are drawn inside the step.", sum64(|r| &r.host_samples).to_string(), "counter", &mut metric);
        c("qwen3vl_decode_step_recordings_total", "Decode steps recorded as CUDA graphs (one per padded batch size, again when one least recently used was dropped); the others replayed a recording.", sum64(|r| &r.decode_recordings).to_string(), "counter", &mut metric);
        c("qwen3vl_preemptions_total", "Sequences preempted for KV blocks (re-read later).", sum64(|r| &r.preemptions).to_string(), "counter", &mut metric);
        c("qwen3vl_engine_steps_total", "Engine steps run.", sum64(|r| &r.steps).to_string(), "counter", &mut metric);
        c("qwen3vl_engine_step_seconds_total", "Time spent in engine steps.", format!("{:.6}", sum64(|r| &r.step_us) as f64 / 1e6), "counter", &mut metric);
        c("qwen3vl_open_connections", "Open client connections.", self.connections.load(Ordering::Relaxed).to_string(), "gauge", &mut metric);
        c("qwen3vl_connections_dropped_total", "Connections closed unanswered (over a connection limit during a flood of refusals).", self.dropped_connections.load(Ordering::Relaxed).to_string(), "counter", &mut metric);
        let mut ttft = Histogram::new(&TTFT_BUCKETS);
        for r in &self.replicas {
            ttft.merge(&lock(&r.ttft));
        }
        metric("qwen3vl_time_to_first_token_seconds", "histogram", "Time from a request's arrival to its first generated token.", ttft.lines("qwen3vl_time_to_first_token_seconds", ""));
    }

    /// The `vllm:` families, one series per replica.
    fn render_vllm(&self, s: &mut String, queued: &[usize]) {
        let labels = |r: usize| format!("model_name=\"{}\",replica=\"{}\"", self.model_name, r);
        let mut family = |name: &str, kind: &str, help: &str, lines: Vec<String>| {
            let _ = writeln!(s, "# HELP {} {}\n# TYPE {} {}", name, help, name, kind);
            for l in lines {
                s.push_str(&l);
                s.push('\n');
            }
        };
        // one sample per replica of `v`
        let each = |name: &str, v: &dyn Fn(usize, &Replica) -> String| -> Vec<String> { self.replicas.iter().enumerate().map(|(i, r)| format!("{}{{{}}} {}", name, labels(i), v(i, r))).collect() };
        let n = "vllm:num_requests_running";
        family(n, "gauge", "Number of requests in model execution batches.", each(n, &|_, r| r.running.load(Ordering::Relaxed).to_string()));
        let n = "vllm:num_requests_waiting";
        family(n, "gauge", "Number of requests waiting to be processed.", each(n, &|i, r| (queued.get(i).copied().unwrap_or(0) + r.waiting.load(Ordering::Relaxed)).to_string()));
        let n = "vllm:kv_cache_usage_perc";
        family(n, "gauge", "KV-cache usage. 1 means 100 percent usage.", each(n, &|_, r| format!("{:.6}", r.kv_usage())));
        let n = "vllm:prompt_tokens_total";
        family(n, "counter", "Number of prefill tokens processed.", each(n, &|_, r| r.prompt_tokens.load(Ordering::Relaxed).to_string()));
        let n = "vllm:generation_tokens_total";
        family(n, "counter", "Number of generation tokens processed.", each(n, &|_, r| r.completion_tokens.load(Ordering::Relaxed).to_string()));
        let n = "vllm:num_preemptions_total";
        family(n, "counter", "Cumulative number of preemption from the engine.", each(n, &|_, r| r.preemptions.load(Ordering::Relaxed).to_string()));
        let mut success = Vec::new();
        for (i, r) in self.replicas.iter().enumerate() {
            let mut by = BTreeMap::new();
            for (k, n) in lock(&r.finished).iter() {
                *by.entry(vllm_reason(k)).or_insert(0u64) += n;
            }
            success.extend(VLLM_REASONS.iter().map(|k| format!("vllm:request_success_total{{{},finished_reason=\"{}\"}} {}", labels(i), k, by.get(k).copied().unwrap_or(0))));
        }
        family("vllm:request_success_total", "counter", "Count of processed requests (choices) by finish reason.", success);
        let hist = |name: &str, h: fn(&Replica) -> &Mutex<Histogram>| -> Vec<String> { self.replicas.iter().enumerate().flat_map(|(i, r)| lock(h(r)).lines(name, &format!("{},", labels(i)))).collect() };
        let n = "vllm:time_to_first_token_seconds";
        family(n, "histogram", "Histogram of time to first token in seconds.", hist(n, |r| &r.vllm_ttft));
        let n = "vllm:inter_token_latency_seconds";
        family(n, "histogram", "Histogram of inter-token latency in seconds.", hist(n, |r| &r.itl));
        let n = "vllm:e2e_request_latency_seconds";
        family(n, "histogram", "Histogram of e2e request latency in seconds.", hist(n, |r| &r.e2e));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renders_prometheus_text() {
        let m = Metrics::new("tiny".into(), 1);
        m.response("/v1/chat/completions", 200);
        m.response("/../../etc", 404);
        m.time_to_first_token(0, 0.3);
        m.finished(0, "stop", 10, 5, 0.1, 0.4);
        let t = m.render(&[3], 16);
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

    /// A minimal check of the text format: every sample belongs to the family of the TYPE line
    /// before it, values are numbers, label values are quoted, histogram buckets count up and
    /// end at +Inf with the count.
    fn check_exposition(t: &str) -> Vec<(String, String, f64)> {
        let mut family = String::new();
        let mut kind = String::new();
        let mut samples = Vec::new();
        for line in t.lines() {
            if let Some(rest) = line.strip_prefix("# TYPE ") {
                let (n, k) = rest.split_once(' ').expect("TYPE name kind");
                (family, kind) = (n.to_string(), k.to_string());
                continue;
            }
            if line.starts_with("# HELP ") {
                continue;
            }
            let (series, value) = line.rsplit_once(' ').unwrap_or_else(|| panic!("no value: {}", line));
            let value: f64 = if value == "+Inf" { f64::INFINITY } else { value.parse().unwrap_or_else(|_| panic!("bad value: {}", line)) };
            let (name, labels) = match series.split_once('{') {
                Some((n, l)) => (n, l.strip_suffix('}').unwrap_or_else(|| panic!("unclosed labels: {}", line))),
                None => (series, ""),
            };
            let ok = match kind.as_str() {
                "histogram" => [&format!("{}_bucket", family), &format!("{}_sum", family), &format!("{}_count", family)].contains(&&name.to_string()),
                _ => name == family,
            };
            assert!(ok, "{} outside its family {} ({})", name, family, kind);
            for pair in labels.split(',').filter(|p| !p.is_empty()) {
                let (_, v) = pair.split_once('=').unwrap_or_else(|| panic!("bad label {}", pair));
                assert!(v.starts_with('"') && v.ends_with('"') && v.len() >= 2, "unquoted label {}", pair);
            }
            samples.push((name.to_string(), labels.to_string(), value));
        }
        samples
    }

    #[test]
    fn vllm_families_have_one_series_per_replica() {
        let m = Metrics::new("qwen \"3\"".into(), 2);
        let st = crate::engine::EngineStats { running: 2, waiting: 1, blocks_used: 3, blocks_free: 9, ..Default::default() };
        m.engine(1, &st);
        m.time_to_first_token(1, 0.07);
        m.inter_token(1, 0.02);
        m.inter_token(1, 0.2);
        m.request_latency(1, 1.2);
        m.finished(1, "length", 7, 4, 0.1, 0.2);
        m.finished(0, "cancelled", 3, 0, 0.0, 0.0);
        let t = m.render(&[0, 4], 16);
        let samples = check_exposition(&t);
        let get = |name: &str, labels: &str| samples.iter().find(|(n, l, _)| n == name && l == labels).map(|s| s.2).unwrap_or_else(|| panic!("no {}{{{}}} in\n{}", name, labels, t));
        let r = |i: u32| format!("model_name=\"qwen \\\"3\\\"\",replica=\"{}\"", i);
        assert_eq!(get("vllm:num_requests_running", &r(1)), 2.0);
        assert_eq!(get("vllm:num_requests_running", &r(0)), 0.0);
        assert_eq!(get("vllm:num_requests_waiting", &r(1)), 5.0, "queued plus the engine's waiting");
        assert_eq!(get("vllm:kv_cache_usage_perc", &r(1)), 0.25);
        assert_eq!(get("vllm:prompt_tokens_total", &r(1)), 7.0);
        assert_eq!(get("vllm:generation_tokens_total", &r(1)), 4.0);
        assert_eq!(get("vllm:request_success_total", &format!("{},finished_reason=\"length\"", r(1))), 1.0);
        assert_eq!(get("vllm:request_success_total", &format!("{},finished_reason=\"abort\"", r(0))), 1.0);
        assert_eq!(get("vllm:time_to_first_token_seconds_bucket", &format!("{},le=\"0.06\"", r(1))), 0.0);
        assert_eq!(get("vllm:time_to_first_token_seconds_bucket", &format!("{},le=\"0.08\"", r(1))), 1.0);
        assert_eq!(get("vllm:inter_token_latency_seconds_bucket", &format!("{},le=\"0.025\"", r(1))), 1.0);
        assert_eq!(get("vllm:inter_token_latency_seconds_count", &r(1)), 2.0);
        assert_eq!(get("vllm:e2e_request_latency_seconds_bucket", &format!("{},le=\"1.5\"", r(1))), 1.0);
        assert_eq!(get("vllm:e2e_request_latency_seconds_bucket", &format!("{},le=\"+Inf\"", r(0))), 0.0);
        // the own families sum the replicas
        assert_eq!(get("qwen3vl_prompt_tokens_total", ""), 10.0);
        assert_eq!(get("qwen3vl_queue_depth", ""), 4.0);
        // buckets count up to +Inf = count, per series
        for (name, labels, v) in &samples {
            if let Some(base) = name.strip_suffix("_count") {
                let series: Vec<f64> = samples.iter().filter(|(n, l, _)| n == &format!("{}_bucket", base) && l.starts_with(labels.as_str())).map(|s| s.2).collect();
                assert!(series.windows(2).all(|w| w[0] <= w[1]) && series.last() == Some(v), "{}{{{}}}: {:?} vs {}", base, labels, series, v);
            }
        }
    }
}
