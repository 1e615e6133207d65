//! Routing one request and answering it. A chat request is checked in the order of its costs
//! (a place among the requests being read, its declared size, its body within limits, its
//! JSON, a place in the queue, then its images and tokens, on the blocking pool), queued for
//! the model thread, and answered from its events, whole or as server-sent events. A client
//! that goes away cancels its request (see `io` for how a departure is told apart from a
//! half-close).

use super::http::{self, Reply};
use super::io::Conn;
use super::openai::{self, ApiError};
use super::queue::{Event, Job, Refused};
use super::{prompt, Shared};
use crate::generate::sampling::OutputPenalties;
use bytes::Bytes;
use hyper::body::Incoming;
use hyper::header::AUTHORIZATION;
use hyper::{Request, Version};
use serde_json::json;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};
use tokio::sync::mpsc::{unbounded_channel, UnboundedReceiver};

/// How often a request waiting for the model checks that its client is still there.
const POLL: Duration = Duration::from_millis(100);

/// The client left before its reply was written (hyper then closes the connection).
#[derive(Debug)]
pub(crate) struct ClientGone;

impl std::fmt::Display for ClientGone {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("the client left")
    }
}

impl std::error::Error for ClientGone {}

/// Answers one request on `conn` (with `refused`, when the connection was over a limit).
pub(crate) async fn handle(req: Request<Incoming>, conn: Arc<Conn>, refused: Option<ApiError>) -> Result<Reply, ClientGone> {
    conn.request_started();
    let (method, path) = (req.method().clone(), req.uri().path().to_string());
    let t0 = Instant::now();
    let reply = match refused {
        Some(e) => Ok(http::error(&e)),
        None => route(req, &conn).await,
    };
    let status = reply.as_ref().map_or(499, |r| r.status().as_u16());
    conn.shared.metrics.response(&path, status);
    log::info!("{} {} {} in {:.3} s", method, path.chars().take(200).collect::<String>(), status, t0.elapsed().as_secs_f64());
    match reply {
        Ok(r) => Ok(r.map(|b| b.on_drop(move || conn.reply_done()))),
        Err(gone) => {
            conn.reply_done();
            Err(gone)
        }
    }
}

async fn route(req: Request<Incoming>, conn: &Arc<Conn>) -> Result<Reply, ClientGone> {
    let shared = &conn.shared;
    let (method, path) = (req.method().as_str(), req.uri().path());
    let method_not_allowed = |allow: &'static str| ApiError { allow: Some(allow), ..ApiError::new(405, "method_not_allowed", format!("{} is not allowed on {} (use {})", method, path, allow)) };
    // 1. the API key, for the API itself
    if let Some(key) = &shared.cfg.api_key {
        if path.starts_with("/v1/") && req.headers().get(AUTHORIZATION).and_then(|v| v.to_str().ok()).map(str::trim) != Some(&format!("Bearer {}", key)) {
            return Ok(http::error(&ApiError::new(401, "invalid_api_key", "missing or wrong API key (Authorization: Bearer ...)")));
        }
    }
    // 2. the routes
    Ok(match (method, path) {
        ("GET", "/health") => {
            if shared.is_shutting_down() {
                http::json(503, &json!({"status": "shutting down"}))
            } else if shared.ready.get().is_none() {
                http::json(503, &json!({"status": "loading", "message": "the model is loading"}))
            } else {
                http::json(200, &json!({"status": "ok"}))
            }
        }
        ("GET", "/metrics") => http::text(200, "text/plain; version=0.0.4", shared.metrics.render(shared.queue.len(), shared.queue.capacity())),
        ("GET", "/v1/models") => http::json(200, &json!({"object": "list", "data": [model_json(shared)]})),
        ("GET", p) if p.starts_with("/v1/models/") => {
            let id = &p["/v1/models/".len()..];
            if id == shared.cfg.model_id {
                http::json(200, &model_json(shared))
            } else {
                http::error(&ApiError::new(404, "model_not_found", format!("no model '{}' here (this server has '{}')", id.chars().take(200).collect::<String>(), shared.cfg.model_id)))
            }
        }
        ("POST", "/v1/chat/completions") => return chat(req, conn).await,
        (_, "/health") | (_, "/metrics") | (_, "/v1/models") => http::error(&method_not_allowed("GET")),
        (_, "/v1/chat/completions") => http::error(&method_not_allowed("POST")),
        _ => http::error(&ApiError::new(404, "not_found", format!("no route for {} {}", method, path.chars().take(200).collect::<String>()))),
    })
}

fn model_json(shared: &Shared) -> serde_json::Value {
    json!({"id": shared.cfg.model_id, "object": "model", "created": shared.created, "owned_by": "qwen3-vl"})
}

/// A fresh completion id.
fn completion_id() -> String {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let n = NEXT.fetch_add(1, Ordering::Relaxed);
    let t = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_nanos() as u64);
    format!("chatcmpl-{:x}{:06x}", t, n & 0xff_ffff)
}

/// Cancels a job when dropped unarmed: the reply was abandoned (the client left).
struct CancelOnDrop(Option<Arc<AtomicBool>>);

impl CancelOnDrop {
    /// The job ended: nothing to cancel.
    fn disarm(&mut self) {
        self.0 = None;
    }
}

impl Drop for CancelOnDrop {
    fn drop(&mut self) {
        if let Some(c) = self.0.take() {
            c.store(true, Ordering::SeqCst);
        }
    }
}

/// The next event of a job, while checking every [`POLL`] that its client is still there
/// (`None`: it left).
async fn next_event(rx: &mut UnboundedReceiver<Event>, conn: &Conn, http11: bool, tick: &mut tokio::time::Interval) -> Option<Event> {
    loop {
        tokio::select! {
            ev = rx.recv() => return Some(ev.unwrap_or_else(|| Event::Failed("the model thread dropped the request".into()))),
            _ = tick.tick() => {
                if conn.peer_left(http11) {
                    return None;
                }
            }
        }
    }
}

fn refuse(status: u16, code: &'static str, retry_after: u64, msg: impl Into<String>) -> Result<Reply, ClientGone> {
    Ok(http::error(&ApiError { retry_after: Some(retry_after), ..ApiError::new(status, code, msg) }))
}

/// Runs `f` on the blocking pool (JSON, images and tokens must not hold up the connections).
async fn blocking<T: Send + 'static>(f: impl FnOnce() -> Result<T, ApiError> + Send + 'static) -> Result<T, ApiError> {
    tokio::task::spawn_blocking(f).await.unwrap_or_else(|e| {
        log::error!("a request's check failed: {}", e);
        Err(ApiError::new(500, "internal_error", "internal error while checking the request"))
    })
}

/// `POST /v1/chat/completions`.
async fn chat(req: Request<Incoming>, conn: &Arc<Conn>) -> Result<Reply, ClientGone> {
    let received = Instant::now();
    let shared = Arc::clone(&conn.shared);
    let http11 = req.version() == Version::HTTP_11;
    if shared.is_shutting_down() {
        return refuse(503, "shutting_down", 5, "the server is shutting down");
    }
    if shared.ready.get().is_none() {
        return refuse(503, "loading", 5, "the model is still loading; try again shortly");
    }
    // 1. a place among the requests being read and checked, then the body within its limits
    let place = match Arc::clone(&shared.intake).try_acquire_owned() {
        Ok(p) => p,
        Err(_) => return refuse(503, "server_busy", 1, format!("{} requests are being received already; try again shortly", shared.cfg.max_active_requests)),
    };
    let deadline = tokio::time::Instant::now() + shared.cfg.read_timeout;
    let body = match http::read_body(req.into_body(), shared.cfg.http.max_body, deadline).await {
        Ok(b) => b,
        Err(e) => return Ok(http::error(&e)),
    };
    // 2. the JSON, then a place in the queue before any image is decoded or text tokenized
    let limits = shared.cfg.parse;
    let parsed = match blocking(move || openai::parse_chat_request(&body, &limits)).await {
        Ok(p) => Arc::new(p),
        Err(e) => return Ok(http::error(&e)),
    };
    let ticket = match shared.queue.reserve() {
        Ok(t) => t,
        Err(Refused::Full) => return refuse(429, "queue_full", shared.retry_after(), format!("{} requests are already waiting; try again later", shared.queue.capacity())),
        Err(Refused::Closed) => return refuse(503, "shutting_down", 5, "the server is shutting down"),
    };
    // 3. images and tokens (images decoded here, in parallel with the model)
    let p = {
        let (shared, parsed) = (Arc::clone(&shared), Arc::clone(&parsed));
        blocking(move || {
            let ready = shared.ready.get().expect("checked above");
            let s = &shared;
            prompt::build(&parsed, &ready.tokenizer, ready.image_token, &s.cfg.images, &s.cfg.tokens, Some(&s.image_slots), Some(&s.image_cache))
        })
        .await
    };
    drop(place);
    let p = match p {
        Ok(p) => p,
        Err(e) => return Ok(http::error(&e)),
    };
    // 4. queue it
    let d = shared.ready.get().expect("checked above").defaults;
    let params = crate::generate::SamplingParams {
        temperature: parsed.temperature.unwrap_or(d.temperature),
        top_k: parsed.top_k.unwrap_or(d.top_k),
        top_p: parsed.top_p.unwrap_or(d.top_p),
        repetition_penalty: parsed.repetition_penalty.unwrap_or(d.repetition_penalty),
        seed: parsed.seed.unwrap_or(d.seed),
    };
    log::debug!("sampling {:?}, {} prompt tokens, {} images, max_tokens {}", params, p.ids.len(), p.images.len(), p.max_tokens);
    let (tx, mut rx) = unbounded_channel();
    let cancel = Arc::new(AtomicBool::new(false));
    let job = Job {
        prompt: p.ids,
        images: p.images,
        max_tokens: p.max_tokens,
        params,
        penalties: OutputPenalties { presence: parsed.presence_penalty, frequency: parsed.frequency_penalty },
        stop: parsed.stop.clone(),
        cancel: Arc::clone(&cancel),
        events: tx,
        received,
    };
    match shared.queue.submit_reserved(ticket, job) {
        Ok(n) => log::debug!("queued: {} waiting", n),
        Err(_) => return refuse(503, "shutting_down", 5, "the server is shutting down"),
    }
    let mut guard = CancelOnDrop(Some(cancel));
    // 5. the answer, from the model's events
    let (id, model, created) = (completion_id(), shared.cfg.model_id.clone(), shared.created_now());
    let mut tick = tokio::time::interval(POLL);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    if parsed.stream {
        // a failure before the model takes the job is still a plain 500
        let first = match next_event(&mut rx, conn, http11, &mut tick).await {
            None => return Err(ClientGone),
            Some(Event::Failed(m)) => {
                guard.disarm();
                return Ok(http::error(&ApiError::new(500, "generation_failed", m)));
            }
            Some(e) => e,
        };
        let s = EventStream { rx, first: Some(first), guard, id, created, model, include_usage: parsed.include_usage, role_sent: false, done: false };
        return Ok(http::events(s));
    }
    let mut text = String::new();
    loop {
        match next_event(&mut rx, conn, http11, &mut tick).await {
            None => return Err(ClientGone),
            Some(Event::Started) => {}
            Some(Event::Text(t)) => text.push_str(&t),
            Some(Event::Failed(m)) => {
                guard.disarm();
                return Ok(http::error(&ApiError::new(500, "generation_failed", m)));
            }
            Some(Event::Done { finish_reason, prompt_tokens, cached_tokens, completion_tokens }) => {
                guard.disarm();
                return Ok(http::json(200, &openai::completion(&id, created, &model, &text, finish_reason, prompt_tokens, cached_tokens, completion_tokens)));
            }
        }
    }
}

impl Shared {
    /// Unix time now, for `created`.
    fn created_now(&self) -> u64 {
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(self.created, |d| d.as_secs())
    }
}

/// A reply as server-sent events: a role chunk, content chunks, a chunk with the finish reason,
/// the usage chunk when asked, and `data: [DONE]`. Dropped before the end (hyper could not
/// write to the client), it cancels the job.
struct EventStream {
    rx: UnboundedReceiver<Event>,
    first: Option<Event>,
    guard: CancelOnDrop,
    id: String,
    created: u64,
    model: String,
    include_usage: bool,
    role_sent: bool,
    done: bool,
}

impl EventStream {
    fn chunk(&self, delta: serde_json::Value, finish_reason: Option<&str>) -> String {
        event(&openai::chunk(&self.id, self.created, &self.model, delta, finish_reason))
    }
}

fn event(v: &serde_json::Value) -> String {
    format!("data: {}\n\n", v)
}

impl http::Stream for EventStream {
    fn poll_next(&mut self, cx: &mut Context<'_>) -> Poll<Option<Bytes>> {
        if self.done {
            return Poll::Ready(None);
        }
        if !self.role_sent {
            self.role_sent = true;
            return Poll::Ready(Some(self.chunk(json!({"role": "assistant", "content": ""}), None).into()));
        }
        loop {
            let ev = match self.first.take() {
                Some(e) => e,
                None => match self.rx.poll_recv(cx) {
                    Poll::Pending => return Poll::Pending,
                    Poll::Ready(e) => e.unwrap_or_else(|| Event::Failed("the model thread dropped the request".into())),
                },
            };
            let out = match ev {
                Event::Started => continue,
                Event::Text(t) => self.chunk(json!({"content": t}), None),
                Event::Failed(m) => {
                    self.done = true;
                    self.guard.disarm();
                    event(&ApiError::new(500, "generation_failed", m).to_json()) + "data: [DONE]\n\n"
                }
                Event::Done { finish_reason, prompt_tokens, cached_tokens, completion_tokens } => {
                    self.done = true;
                    self.guard.disarm();
                    let mut out = self.chunk(json!({}), Some(finish_reason));
                    if self.include_usage {
                        out += &event(&openai::usage_chunk(&self.id, self.created, &self.model, prompt_tokens, cached_tokens, completion_tokens));
                    }
                    out + "data: [DONE]\n\n"
                }
            };
            return Poll::Ready(Some(out.into()));
        }
    }
}
