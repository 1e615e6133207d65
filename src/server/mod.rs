//! An OpenAI-compatible HTTP server: `POST /v1/chat/completions` (text and images, tools,
//! streamed or not), `POST /v1/completions` (raw prompts), `POST /tokenize` and `/detokenize`
//! (vLLM's), `GET /v1/models`, `GET /health`, `GET /metrics`.
//!
//! Threads: a small tokio runtime runs the HTTP side (hyper): it accepts connections, reads
//! requests, checks them (JSON, then images and tokens on its blocking pool) and streams their
//! replies; the thread that calls [`Front::serve`] runs the model, up to `max_batch` requests at
//! once, from a bounded queue (full: 429 with Retry-After). The front starts before the model
//! is loaded ([`Front::start`]): until [`Front::serve`] is called, `/health` answers 503
//! "loading" and chat requests 503. A client that disconnects cancels its request, queued or
//! running.
//!
//! Shutdown (`shutdown()` turns true: SIGTERM) drains within `shutdown_timeout`: `/health`
//! answers 503 "draining" while connections are still accepted (a readiness probe sees it),
//! new generation requests get 503 with Retry-After, and the queued and running ones finish.
//! At the deadline the ones still running end with what they have (finish reason "length";
//! a stream gets its final chunk and `data: [DONE]`) and the queued ones get 503; then the
//! connections close (replies still being written get a second more) and [`Front::serve`]
//! returns.
//!
//! Modules: `net` (accepting, connection limits, time limits), `io` (a connection's socket
//! under hyper), `http` (bodies, responses, limits), `conn` (routing and answering), `openai`
//! (the JSON format), `fields` (which request fields are taken), `settings` (sampling, `n`,
//! logprobs, ...), `completions` (the legacy endpoint), `reply` and `logprobs` (response
//! objects), `images` (image URLs to patches), `prompt` (template, tokens, budgets), `tools`
//! (tool definitions, calls in the history and in the reply), `tokenize` (`/tokenize`,
//! `/detokenize`), `queue` (the queue and the model loop), `stop` (stop strings), `structured`
//! (response_format and structured_outputs to grammars), `metrics` (Prometheus text), `rate`
//! (the drain rate behind Retry-After).

pub mod completions;
mod conn;
pub mod fields;
pub mod http;
pub mod images;
mod io;
pub mod logprobs;
pub mod metrics;
mod net;
pub mod openai;
pub mod pipeline;
pub mod local;
pub mod prompt;
pub mod queue;
mod rate;
pub mod reply;
pub mod route;
pub mod settings;
pub mod stop;
pub mod structured;
mod tokenize;
pub mod tool_grammar;
pub mod tools;
mod trace;

use crate::generate::SamplingParams;
use crate::model::Model;
use crate::{Backend, Tokenizer};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

/// How many requests decode and preprocess images at once.
const IMAGE_SLOTS: usize = 2;
/// Bytes of prepared image patches kept for requests that send the same image again (a
/// 1024² image's patches take 25 MB).
const IMAGE_CACHE_BYTES: usize = 256 << 20;
/// After the model loop ends at shutdown, the most time replies still being written get (past
/// the shutdown's deadline when the loop ran to it).
const CLOSE_MARGIN: Duration = Duration::from_secs(1);
/// The deadline of a drain that has none (an in-process server's callers wait for their
/// replies).
const NO_DEADLINE: Duration = Duration::from_secs(10 * 365 * 86_400);

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
    /// Most requests waiting for the model.
    pub queue_capacity: usize,
    /// Most open connections, idle ones included; more are answered 503 and closed.
    pub max_connections: usize,
    /// Most open connections from one client address; more are answered 503 and closed.
    pub max_client_connections: usize,
    /// Most chat requests being received and checked at once (each holds its body); more wait
    /// for a place up to `read_timeout` from their arrival, then are answered 503. Requests
    /// queued or generating hold none.
    pub max_active_requests: usize,
    /// Time a client has to send a whole request once it started.
    pub read_timeout: Duration,
    /// Time an idle keep-alive connection stays open.
    pub idle_timeout: Duration,
    /// At shutdown, how long accepted requests may still run (then they are ended).
    pub shutdown_timeout: Duration,
    /// Requests generated at once (the engine's batch).
    pub max_batch: usize,
    /// The engine's KV cache in tokens (`None`: [`default_kv_tokens`]).
    pub kv_cache_tokens: Option<usize>,
    /// Rows of an engine step that reads prompts at most, decode rows included.
    pub max_prefill_tokens: usize,
    /// Bytes of each engine's image-embedding cache.
    pub image_cache_bytes: usize,
    /// Replicas of the model (`--data-parallel`), each with its own engine: the server is
    /// given this many [`Loaded`]s.
    pub replicas: usize,
    /// When a replica that ran a prompt's start gets it again despite its load.
    pub route: route::RoutePolicy,
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
            queue_capacity: 16,
            max_connections: 1024,
            max_client_connections: 64,
            max_active_requests: 64,
            read_timeout: Duration::from_secs(30),
            idle_timeout: Duration::from_secs(30),
            shutdown_timeout: Duration::from_secs(25),
            max_batch: 16,
            kv_cache_tokens: None,
            max_prefill_tokens: 2048,
            image_cache_bytes: 0,
            replicas: 1,
            route: route::RoutePolicy::default(),
        }
    }
}

/// What the server needs of the loaded model besides the model itself.
pub(crate) struct Ready {
    pub tokenizer: Arc<Tokenizer>,
    pub image_token: u32,
    /// Sampling defaults (the checkpoint's generation_config.json) for unset request fields.
    pub defaults: SamplingParams,
    /// How prompts are written (the model's chat template, else the built-in format).
    pub format: crate::template::PromptFormat,
    /// The grammar compiler for structured output (built on first use).
    pub grammars: structured::LazyGrammars,
}

/// State shared by all threads.
pub(crate) struct Shared {
    pub cfg: ServerConfig,
    /// Set once the model is loaded.
    pub ready: OnceLock<Ready>,
    pub queue: Arc<queue::JobQueue>,
    /// Places of chat requests being received and checked.
    pub intake: Arc<tokio::sync::Semaphore>,
    /// Open connections by client.
    pub clients: net::Clients,
    /// Requests decoding images at the same time.
    pub image_slots: images::Slots,
    /// Images prepared before, by their request bytes (a chat sends its images every turn).
    pub image_cache: images::Cache,
    pub metrics: metrics::Metrics,
    /// Draining since shutdown began (see the module docs).
    pub shutting_down: AtomicBool,
    /// When accepted requests must be done by, set when shutdown begins.
    pub deadline: OnceLock<Instant>,
    /// Turns true once the drain is over: the accept loop and the connections close.
    pub stop: tokio::sync::watch::Sender<bool>,
    pub created: u64,
}

impl Shared {
    pub fn is_shutting_down(&self) -> bool {
        self.shutting_down.load(Ordering::SeqCst)
    }

    /// Starts the drain: `/health` says "draining" and new requests get 503 from now on;
    /// accepted ones have until `shutdown_timeout` from now. Connections stay open.
    pub fn begin_shutdown(&self) {
        self.begin_drain(self.cfg.shutdown_timeout);
    }

    /// Starts the drain with `limit` for the accepted requests (see `begin_shutdown`).
    fn begin_drain(&self, limit: Duration) {
        let deadline = *self.deadline.get_or_init(|| Instant::now() + limit);
        if !self.shutting_down.swap(true, Ordering::SeqCst) && limit < NO_DEADLINE {
            log::info!("shutting down: draining; accepted requests have {:.1} s to finish", deadline.saturating_duration_since(Instant::now()).as_secs_f64());
        }
    }

    /// The drain's deadline, once shutdown began.
    pub fn drain_deadline(&self) -> Option<Instant> {
        self.is_shutting_down().then(|| self.deadline.get().copied()).flatten()
    }

    /// The drain is over: the listener closes, and each connection once its reply is written.
    pub fn close_connections(&self) {
        self.stop.send_replace(true);
    }

    /// The state of a server that has no model yet.
    pub fn new(cfg: ServerConfig) -> Shared {
        let (stop, _) = tokio::sync::watch::channel(false);
        // one line per replica; the router remembers about as many blocks as their KV caches hold
        let per_request = cfg.tokens.max_prompt + cfg.tokens.max_output;
        let kv_tokens = cfg.kv_cache_tokens.unwrap_or_else(|| default_kv_tokens(cfg.max_batch, per_request));
        let block = host::engine::DEFAULT_BLOCK;
        let router = route::Router::new(cfg.replicas.max(1), block, cfg.replicas * kv_tokens / block, cfg.route);
        Shared {
            queue: Arc::new(queue::JobQueue::with_router(cfg.queue_capacity, router, &[])),
            intake: Arc::new(tokio::sync::Semaphore::new(cfg.max_active_requests.max(1))),
            clients: net::Clients::default(),
            image_slots: images::Slots::new(IMAGE_SLOTS),
            image_cache: images::Cache::new(IMAGE_CACHE_BYTES),
            metrics: metrics::Metrics::new(cfg.model_id.clone(), cfg.replicas.max(1)),
            cfg,
            ready: OnceLock::new(),
            shutting_down: AtomicBool::new(false),
            deadline: OnceLock::new(),
            stop,
            created: std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs()),
        }
    }

    /// Takes the loaded replicas, as many as `cfg.replicas` (requests are taken from now on:
    /// `on_ready` is called), then runs them until `shutdown()` turns true and the accepted
    /// requests are done (or ended at the drain's deadline): one on the calling thread; several
    /// on a thread each (named `replica-N`), the calling thread waiting for them.
    pub fn run_models(self: &Arc<Self>, models: Vec<Loaded<'_>>, shutdown: &(dyn Fn() -> bool + Sync), on_ready: impl FnOnce()) -> std::io::Result<()> {
        if models.len() != self.queue.replicas() {
            return Err(std::io::Error::other(format!("the server was set up for {} replicas and given {}", self.queue.replicas(), models.len())));
        }
        let m = &models[0];
        let ready = Ready { tokenizer: Arc::clone(&m.tokenizer), image_token: m.model.config.image_token_id, defaults: m.defaults, format: m.format.clone(), grammars: Default::default() };
        self.queue.set_vision_tokens(&[m.model.config.image_token_id, m.model.config.video_token_id]);
        if self.ready.set(ready).is_err() {
            return Err(std::io::Error::other("the server was given a model twice"));
        }
        on_ready();
        let stop = || {
            if shutdown() {
                self.begin_shutdown();
            }
            self.drain_deadline()
        };
        if models.len() == 1 {
            let m = models.into_iter().next().expect("one model");
            self.run_replica(0, m, &stop);
            return Ok(());
        }
        std::thread::scope(|s| {
            for (i, m) in models.into_iter().enumerate() {
                let stop = &stop;
                let spawned = std::thread::Builder::new().name(format!("replica-{}", i)).spawn_scoped(s, move || self.run_replica(i, m, stop));
                if let Err(e) = spawned {
                    log::error!("cannot start the thread of replica {}: {}; shutting down", i, e);
                    self.begin_shutdown();
                }
            }
        });
        Ok(())
    }

    /// Runs replica `replica`'s model loop on the calling thread until the queue closes.
    fn run_replica(&self, replica: usize, m: Loaded<'_>, stop: &(dyn Fn() -> Option<Instant> + Sync)) {
        let kv_dtype = m.kv_dtype.unwrap_or_else(|| m.backend.default_kv_dtype());
        let per_request = self.cfg.tokens.max_prompt + self.cfg.tokens.max_output;
        let kv_tokens = self.cfg.kv_cache_tokens.unwrap_or_else(|| default_kv_tokens(self.cfg.max_batch, per_request));
        let mut ecfg = host::engine::EngineConfig::new(self.cfg.max_batch, kv_tokens, kv_dtype);
        ecfg.max_prefill_tokens = self.cfg.max_prefill_tokens;
        ecfg.vision_cache_bytes = self.cfg.image_cache_bytes;
        log::info!(
            "engine on {}: up to {} sequences at once, a KV cache of {} tokens ({}), prefill chunks of {} tokens, an image-embedding cache of {} MiB",
            m.backend.describe(),
            ecfg.max_batch,
            kv_tokens,
            kv_dtype,
            ecfg.max_prefill_tokens,
            ecfg.vision_cache_bytes >> 20
        );
        let engine = queue::Worker { replica, model: m.model, backend: m.backend, tokenizer: &m.tokenizer, stop_ids: m.stop_ids, engine: ecfg };
        engine.run(&self.queue, &self.metrics, stop);
    }

    /// Seconds after which a client refused for a full queue may try again: the queue ahead of
    /// it at the measured drain rate (over all replicas, which finish requests side by side),
    /// at least 1 ([`metrics::Metrics::retry_after`]).
    pub fn retry_after(&self) -> u64 {
        self.metrics.retry_after(self.queue.ahead())
    }
}

/// The KV cache's size when `--kv-cache-tokens` is not given: room for one request at its
/// largest, or 1,024 tokens per running sequence, whichever is more (at most 16,384 beyond the
/// one request).
pub fn default_kv_tokens(max_batch: usize, per_request: usize) -> usize {
    per_request.max((max_batch * 1024).min(16_384))
}

/// One loaded replica of the model, handed to [`Front::serve`] (one per replica, each on its
/// own device; the tokenizer, defaults and format are the same for all).
pub struct Loaded<'a> {
    pub model: &'a Model,
    pub backend: &'a dyn Backend,
    pub tokenizer: Arc<Tokenizer>,
    /// Token ids that end a reply.
    pub stop_ids: Vec<u32>,
    /// Sampling defaults for unset request fields.
    pub defaults: SamplingParams,
    /// KV-cache element type (`None`: the backend's default).
    pub kv_dtype: Option<host::DType>,
    /// How prompts are written.
    pub format: crate::template::PromptFormat,
}

/// The HTTP side of the server, running on its own threads from [`Front::start`] on.
pub struct Front {
    shared: Arc<Shared>,
    runtime: Option<tokio::runtime::Runtime>,
    shutdown: Arc<dyn Fn() -> bool + Send + Sync>,
}

impl Front {
    /// Starts answering on `listener` (the model still loading: `/health` says so) and watching
    /// `shutdown()`.
    pub fn start(listener: std::net::TcpListener, cfg: ServerConfig, shutdown: Arc<dyn Fn() -> bool + Send + Sync>) -> std::io::Result<Front> {
        raise_fd_limit(cfg.max_connections);
        let shared = Arc::new(Shared::new(cfg));
        let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(2).thread_name("http").enable_all().build()?;
        listener.set_nonblocking(true)?;
        let listener = {
            let _in = runtime.enter();
            tokio::net::TcpListener::from_std(listener)?
        };
        runtime.spawn(net::accept_loop(listener, Arc::clone(&shared)));
        let (s2, sd) = (Arc::clone(&shared), Arc::clone(&shutdown));
        runtime.spawn(async move {
            while !sd() && !s2.is_shutting_down() {
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            s2.begin_shutdown();
        });
        Ok(Front { shared, runtime: Some(runtime), shutdown })
    }

    /// Serves with the loaded replicas (as many as `cfg.replicas`; see [`Shared::run_models`])
    /// until `shutdown()` turns true and the accepted work is done; `on_ready` is called once
    /// requests are taken.
    pub fn serve(mut self, models: Vec<Loaded<'_>>, on_ready: impl FnOnce()) -> std::io::Result<()> {
        let shared = Arc::clone(&self.shared);
        // 1. the model loops until shut down and drained
        let shutdown = Arc::clone(&self.shutdown);
        shared.run_models(models, &*shutdown, on_ready)?;
        // 2. the replies still being written get until the deadline (or now) plus a margin;
        //    idle connections close at once
        log::info!("shutting down: the model is done, closing the connections");
        shared.close_connections();
        let until = shared.drain_deadline().unwrap_or_else(Instant::now).max(Instant::now()) + CLOSE_MARGIN;
        while shared.metrics.connections.load(Ordering::SeqCst) > 0 && Instant::now() < until {
            std::thread::sleep(Duration::from_millis(20));
        }
        if let Some(rt) = self.runtime.take() {
            rt.shutdown_timeout(Duration::from_millis(500));
        }
        log::info!("server stopped");
        Ok(())
    }
}

impl Drop for Front {
    fn drop(&mut self) {
        self.shared.begin_shutdown();
        self.shared.close_connections();
        if let Some(rt) = self.runtime.take() {
            rt.shutdown_background();
        }
    }
}

/// Raises the soft limit on open files to what `max_connections` needs (up to the hard limit),
/// warning when even that is too low.
fn raise_fd_limit(max_connections: usize) {
    let want = (max_connections + 256) as libc::rlim_t;
    let mut r = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
    // SAFETY: getrlimit/setrlimit with a valid rlimit.
    unsafe {
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut r) != 0 {
            return;
        }
        if r.rlim_cur < want {
            let raised = libc::rlimit { rlim_cur: want.min(r.rlim_max), rlim_max: r.rlim_max };
            if libc::setrlimit(libc::RLIMIT_NOFILE, &raised) == 0 {
                r = raised;
            }
        }
    }
    if r.rlim_cur < want {
        log::warn!("open files are limited to {}: fewer than --max-connections {} may be served (raise ulimit -n)", r.rlim_cur, max_connections);
    }
}
