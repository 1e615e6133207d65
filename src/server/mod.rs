//! An OpenAI-compatible HTTP server: `POST /v1/chat/completions` (text and images, streamed or
//! not), `GET /v1/models`, `GET /health`, `GET /metrics`.
//!
//! Threads: one accepts connections; one per connection reads requests, checks them (JSON,
//! images, token limits) and waits for its reply; the thread that calls [`serve`] runs the
//! model, one request at a time, from a bounded queue (full: 429 with Retry-After). A client
//! that disconnects cancels its request, queued or running. When `shutdown()` turns true,
//! new requests get 503, queued and running ones finish, then [`serve`] returns.
//!
//! Modules: `http` (requests and responses on the socket), `openai` (the JSON format),
//! `images` (image URLs to patches), `prompt` (template, tokens, budgets), `queue` (the queue
//! and the model loop), `stop` (stop strings), `metrics` (Prometheus text), `conn` (routing
//! and the per-connection loop).

mod conn;
pub mod http;
pub mod images;
pub mod metrics;
pub mod openai;
pub mod prompt;
pub mod queue;
pub mod stop;

use crate::generate::SamplingParams;
use crate::model::Model;
use crate::{Backend, Tokenizer};
use std::io::{self, Write};
use std::net::TcpListener;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// How many requests decode and preprocess images at once.
const IMAGE_SLOTS: usize = 2;
/// Bytes of prepared image patches kept for requests that send the same image again (a
/// 1024² image's patches take 25 MB).
const IMAGE_CACHE_BYTES: usize = 256 << 20;

/// Everything about the server that is not the model.
#[derive(Clone, Debug)]
pub struct ServerConfig {
    /// The model id reported by `/v1/models` and in responses.
    pub model_id: String,
    /// When set, `/v1/*` requests need `Authorization: Bearer <key>`.
    pub api_key: Option<String>,
    pub http: http::Limits,
    pub parse: openai::ParseLimits,
    pub images: images::ImagePolicy,
    pub tokens: prompt::TokenLimits,
    /// Sampling defaults (the checkpoint's generation_config.json) for unset request fields.
    pub defaults: SamplingParams,
    /// Most requests waiting for the model.
    pub queue_capacity: usize,
    /// Most open connections; more are answered 503 and closed.
    pub max_connections: usize,
    /// Time a client has to send a whole request once it started.
    pub read_timeout: Duration,
    /// Time an idle keep-alive connection stays open.
    pub idle_timeout: Duration,
    /// After shutdown, how long to wait for responses still being written.
    pub drain_timeout: Duration,
    /// KV-cache element type of the sessions (`None`: the backend's default).
    pub kv_dtype: Option<host::DType>,
    /// Requests generated at once (the engine's batch).
    pub max_batch: usize,
    /// The engine's KV cache in tokens (`None`: [`default_kv_tokens`]).
    pub kv_cache_tokens: Option<usize>,
    /// Prompt tokens the engine reads per step at most.
    pub max_prefill_tokens: usize,
}

impl ServerConfig {
    /// Defaults for a model of `context` positions.
    pub fn new(model_id: String, context: usize, preprocess: crate::image::PreprocessConfig) -> ServerConfig {
        ServerConfig {
            model_id,
            api_key: None,
            http: http::Limits::default(),
            parse: openai::ParseLimits::default(),
            images: images::ImagePolicy::new(preprocess, crate::video::VideoConfig::qwen3_vl_default(), None, 4096 * 4096, 20 << 20),
            tokens: prompt::TokenLimits { max_prompt: 8192.min(context), max_output: 2048.min(context), context },
            defaults: SamplingParams::greedy(),
            queue_capacity: 16,
            max_connections: 64,
            read_timeout: Duration::from_secs(30),
            idle_timeout: Duration::from_secs(30),
            drain_timeout: Duration::from_secs(30),
            kv_dtype: None,
            max_batch: 16,
            kv_cache_tokens: None,
            max_prefill_tokens: 2048,
        }
    }
}

/// State shared by all threads.
pub(crate) struct Shared {
    pub cfg: ServerConfig,
    pub tokenizer: Arc<Tokenizer>,
    pub image_token: u32,
    pub queue: queue::JobQueue,
    /// Requests decoding images at the same time.
    pub image_slots: images::Slots,
    /// Images prepared before, by their request bytes (a chat sends its images every turn).
    pub image_cache: images::Cache,
    pub metrics: metrics::Metrics,
    pub shutting_down: AtomicBool,
    /// Seconds per finished request, smoothed (f64 bits): for Retry-After.
    pub avg_job_secs: AtomicU64,
    pub created: u64,
}

impl Shared {
    pub fn is_shutting_down(&self) -> bool {
        self.shutting_down.load(Ordering::SeqCst)
    }

    /// Seconds after which a refused client may try again: the expected time for the queue
    /// ahead of it, at least 1.
    pub fn retry_after(&self) -> u64 {
        let avg = f64::from_bits(self.avg_job_secs.load(Ordering::Relaxed));
        ((avg * (self.queue.len() + 1) as f64).ceil() as u64).clamp(1, 3600)
    }
}

/// The KV cache's size when `--kv-cache-tokens` is not given: room for one request at its
/// largest, or 1,024 tokens per running sequence, whichever is more (at most 16,384 beyond the
/// one request).
pub fn default_kv_tokens(max_batch: usize, per_request: usize) -> usize {
    per_request.max((max_batch * 1024).min(16_384))
}

/// Serves on `listener` until `shutdown()` turns true and the accepted work is done. The
/// model runs on the calling thread.
pub fn serve(
    listener: TcpListener,
    cfg: ServerConfig,
    model: &Model,
    backend: &dyn Backend,
    tokenizer: Arc<Tokenizer>,
    stop_ids: Vec<u32>,
    shutdown: Arc<dyn Fn() -> bool + Send + Sync>,
) -> io::Result<()> {
    let shared = Arc::new(Shared {
        queue: queue::JobQueue::new(cfg.queue_capacity),
        image_slots: images::Slots::new(IMAGE_SLOTS),
        image_cache: images::Cache::new(IMAGE_CACHE_BYTES),
        cfg,
        tokenizer: Arc::clone(&tokenizer),
        image_token: model.config.image_token_id,
        metrics: metrics::Metrics::default(),
        shutting_down: AtomicBool::new(false),
        avg_job_secs: AtomicU64::new(1f64.to_bits()),
        created: std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs()),
    });
    // 1. the acceptor thread
    listener.set_nonblocking(true)?;
    let acceptor = {
        let (shared, shutdown) = (Arc::clone(&shared), Arc::clone(&shutdown));
        std::thread::Builder::new().name("accept".into()).spawn(move || accept_loop(listener, shared, shutdown))?
    };
    // 2. the model loop, on this thread, until shut down and drained
    let kv_dtype = shared.cfg.kv_dtype.unwrap_or_else(|| backend.default_kv_dtype());
    let per_request = shared.cfg.tokens.max_prompt + shared.cfg.tokens.max_output;
    let kv_tokens = shared.cfg.kv_cache_tokens.unwrap_or_else(|| default_kv_tokens(shared.cfg.max_batch, per_request));
    let mut ecfg = host::engine::EngineConfig::new(shared.cfg.max_batch, kv_tokens, kv_dtype);
    ecfg.max_prefill_tokens = shared.cfg.max_prefill_tokens;
    log::info!("engine: up to {} sequences at once, a KV cache of {} tokens ({}), prefill chunks of {} tokens", ecfg.max_batch, kv_tokens, kv_dtype, ecfg.max_prefill_tokens);
    let engine = queue::Worker { model, backend, tokenizer: &tokenizer, stop_ids, engine: ecfg };
    let stopping = || {
        if shutdown() {
            shared.shutting_down.store(true, Ordering::SeqCst);
        }
        shared.is_shutting_down()
    };
    engine.run(&shared.queue, &shared.metrics, &stopping, |secs| {
        let old = f64::from_bits(shared.avg_job_secs.load(Ordering::Relaxed));
        shared.avg_job_secs.store((0.8 * old + 0.2 * secs).to_bits(), Ordering::Relaxed);
    });
    // 3. wait for the responses still being written
    log::info!("shutting down: the queue is drained, waiting for open responses");
    let t0 = Instant::now();
    while shared.metrics.connections.load(Ordering::SeqCst) > 0 && t0.elapsed() < shared.cfg.drain_timeout {
        std::thread::sleep(Duration::from_millis(20));
    }
    let _ = acceptor.join();
    log::info!("server stopped");
    Ok(())
}

/// Waits until `listener` has a connection to accept or `timeout` passes (so the loop still
/// sees a shutdown request in time, while a new connection is taken at once).
fn wait_readable(listener: &TcpListener, timeout: Duration) {
    use std::os::unix::io::AsRawFd;
    let mut fd = libc::pollfd { fd: listener.as_raw_fd(), events: libc::POLLIN, revents: 0 };
    // SAFETY: one valid pollfd for the duration of the call; the listener outlives it.
    let n = unsafe { libc::poll(&mut fd, 1, timeout.as_millis() as libc::c_int) };
    if n < 0 && io::Error::last_os_error().kind() != io::ErrorKind::Interrupted {
        std::thread::sleep(timeout); // poll itself failed: fall back to the old pace
    }
}

/// Accepts connections (polling, so that shutdown is noticed) and gives each a thread.
fn accept_loop(listener: TcpListener, shared: Arc<Shared>, shutdown: Arc<dyn Fn() -> bool + Send + Sync>) {
    loop {
        if shutdown() {
            shared.shutting_down.store(true, Ordering::SeqCst);
        }
        if shared.is_shutting_down() {
            return; // dropping the listener refuses new connections
        }
        match listener.accept() {
            Ok((stream, peer)) => {
                let _ = stream.set_nonblocking(false);
                if shared.metrics.connections.load(Ordering::SeqCst) >= shared.cfg.max_connections {
                    log::warn!("refusing a connection from {}: {} connections are open", peer, shared.cfg.max_connections);
                    let e = openai::ApiError::new(503, "too_many_connections", "too many open connections; try again later");
                    let mut s = stream;
                    let _ = s.set_write_timeout(Some(Duration::from_secs(1)));
                    let _ = http::Response::error(&openai::ApiError { retry_after: Some(1), ..e }).write_to(&mut s, false);
                    let _ = s.flush();
                    continue;
                }
                shared.metrics.connections.fetch_add(1, Ordering::SeqCst);
                let s2 = Arc::clone(&shared);
                let spawned = std::thread::Builder::new().name("conn".into()).spawn(move || {
                    conn::handle(stream, &s2);
                    s2.metrics.connections.fetch_sub(1, Ordering::SeqCst);
                });
                if let Err(e) = spawned {
                    log::error!("cannot start a connection thread: {}", e);
                    shared.metrics.connections.fetch_sub(1, Ordering::SeqCst);
                }
            }
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => wait_readable(&listener, Duration::from_millis(20)),
            Err(e) => {
                log::warn!("accept failed: {}", e);
                std::thread::sleep(Duration::from_millis(50));
            }
        }
    }
}
