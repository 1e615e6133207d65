//! Routing one request and answering it. A chat or completions request is checked in the
//! order of its costs (a place among the requests being read, its declared size, its body
//! within limits, its JSON, a place in the queue, then its images and tokens, on the blocking
//! pool), queued for the model thread, and answered from its events, whole or as server-sent
//! events ([`reply`](super::reply)). A client that goes away cancels its request (see `io` for
//! how a departure is told apart from a half-close).
//!
//! Every request has an id ([`RequestId`]): the client's `X-Request-Id` when it sends a sane
//! one, else the response's id (`chatcmpl-...`, `cmpl-...`; `req-...` for other routes). It
//! comes back as the `X-Request-Id` response header and is on the request's log lines
//! (received, refused, finished, and the model's line) with the client's address.

use super::http::{self, Reply};
use super::io::Conn;
use super::openai::ApiError;
use super::pipeline::{self, Endpoint, Pending, RequestId, Step};
use super::queue::{Event, Refused, Ticket};
use super::Shared;
use bytes::Bytes;
use hyper::body::Incoming;
use hyper::header::{HeaderValue, AUTHORIZATION, CONNECTION};
use hyper::{Request, Version};
use serde_json::json;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};
use tokio::sync::mpsc::UnboundedReceiver;

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
pub(crate) async fn handle(mut req: Request<Incoming>, conn: Arc<Conn>, refused: Option<ApiError>) -> Result<Reply, ClientGone> {
    conn.request_started();
    let (method, path) = (req.method().clone(), req.uri().path().to_string());
    let shown = path.chars().take(200).collect::<String>();
    let t0 = Instant::now();
    // 1. the request's id; probes (health, metrics) log at debug level only
    let sent = req.headers().get("x-request-id").map(|v| v.to_str().unwrap_or("\u{fffd}"));
    let id = RequestId::new(sent, Endpoint::from_path(&path).map_or("req", Endpoint::id_prefix));
    req.extensions_mut().insert(id.clone());
    let level = if matches!(path.as_str(), "/health" | "/metrics") { log::Level::Debug } else { log::Level::Info };
    log::log!(level, "[{}] {} {} {} received", id.log, conn.peer, method, shown);
    // 2. the answer
    let reply = match refused {
        Some(e) => Ok(http::error(&e)),
        None => route(req, &conn).await,
    };
    let status = reply.as_ref().map_or(499, |r| r.status().as_u16());
    conn.shared.metrics.response(&path, status);
    // 3. the id back, the connection closed after the reply while draining, the log line
    match reply {
        Ok(mut r) => {
            if let Ok(v) = HeaderValue::from_str(&id.log) {
                r.headers_mut().insert("x-request-id", v);
            }
            if conn.shared.is_shutting_down() {
                r.headers_mut().insert(CONNECTION, HeaderValue::from_static("close"));
            }
            if status >= 400 {
                log::log!(level, "[{}] {} {} {} refused: {} in {:.3} s", id.log, conn.peer, method, shown, status, t0.elapsed().as_secs_f64());
            }
            let peer = conn.peer;
            Ok(r.map(move |b| {
                b.on_drop(move || {
                    if status < 400 {
                        log::log!(level, "[{}] {} {} {} finished: {} in {:.3} s", id.log, peer, method, shown, status, t0.elapsed().as_secs_f64());
                    }
                    conn.reply_done()
                })
            }))
        }
        Err(gone) => {
            log::info!("[{}] {} {} {} ended: the client left after {:.3} s", id.log, conn.peer, method, shown, t0.elapsed().as_secs_f64());
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
        if (path.starts_with("/v1/") || path == "/tokenize" || path == "/detokenize") && req.headers().get(AUTHORIZATION).and_then(|v| v.to_str().ok()).map(str::trim) != Some(&format!("Bearer {}", key)) {
            return Ok(http::error(&ApiError::new(401, "invalid_api_key", "missing or wrong API key (Authorization: Bearer ...)")));
        }
    }
    // 2. the routes
    Ok(match (method, path) {
        ("GET", "/health") => {
            if shared.is_shutting_down() {
                http::json(503, &json!({"status": "draining", "message": "the server is shutting down"}))
            } else if shared.ready.get().is_none() {
                http::json(503, &json!({"status": "loading", "message": "the model is loading"}))
            } else {
                http::json(200, &json!({"status": "ok"}))
            }
        }
        ("GET", "/metrics") => http::text(200, "text/plain; version=0.0.4", shared.metrics.render(&shared.queue.lines(), shared.queue.capacity())),
        ("GET", "/v1/models") => http::json(200, &json!({"object": "list", "data": [model_json(shared)]})),
        ("GET", p) if p.starts_with("/v1/models/") => {
            let id = &p["/v1/models/".len()..];
            if id == shared.cfg.model_id {
                http::json(200, &model_json(shared))
            } else {
                http::error(&ApiError::new(404, "model_not_found", format!("no model '{}' here (this server has '{}')", id.chars().take(200).collect::<String>(), shared.cfg.model_id)))
            }
        }
        ("POST", "/v1/chat/completions") => return generate(req, conn, Endpoint::Chat).await,
        ("POST", "/v1/completions") => return generate(req, conn, Endpoint::Completions).await,
        ("POST", "/tokenize") => return super::tokenize::tokenize(req, conn).await,
        ("POST", "/detokenize") => return super::tokenize::detokenize(req, conn).await,
        (_, "/health") | (_, "/metrics") | (_, "/v1/models") => http::error(&method_not_allowed("GET")),
        (_, "/v1/chat/completions") | (_, "/v1/completions") | (_, "/tokenize") | (_, "/detokenize") => http::error(&method_not_allowed("POST")),
        _ => http::error(&ApiError::new(404, "not_found", format!("no route for {} {}", method, path.chars().take(200).collect::<String>()))),
    })
}

fn model_json(shared: &Shared) -> serde_json::Value {
    json!({"id": shared.cfg.model_id, "object": "model", "created": shared.created, "owned_by": "qwen3-vl"})
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

pub(crate) fn refuse(status: u16, code: &'static str, retry_after: u64, msg: impl Into<String>) -> Result<Reply, ClientGone> {
    Ok(http::error(&ApiError { retry_after: Some(retry_after), ..ApiError::new(status, code, msg) }))
}

/// Runs `f` on the blocking pool (JSON, images and tokens must not hold up the connections).
pub(crate) async fn blocking<T: Send + 'static>(f: impl FnOnce() -> Result<T, ApiError> + Send + 'static) -> Result<T, ApiError> {
    tokio::task::spawn_blocking(f).await.unwrap_or_else(|e| {
        log::error!("a request's check failed: {}", e);
        Err(ApiError::new(500, "internal_error", "internal error while checking the request"))
    })
}

/// A request body read within the limits, with its place among the requests being checked
/// (held until its images and tokens are done).
pub(crate) struct Intake {
    pub body: Vec<u8>,
    pub place: tokio::sync::OwnedSemaphorePermit,
    pub http11: bool,
    pub received: Instant,
    pub id: RequestId,
}

/// The checks every generation request passes first: not shutting down, the model loaded, a
/// place among the requests being read, and the body within its limits.
pub(crate) async fn intake(req: Request<Incoming>, shared: &Arc<Shared>) -> Result<Intake, Result<Reply, ClientGone>> {
    let received = Instant::now();
    let http11 = req.version() == Version::HTTP_11;
    let id = req.extensions().get::<RequestId>().cloned().unwrap_or_else(|| RequestId::new(None, "req"));
    if shared.is_shutting_down() {
        return Err(Ok(http::error(&pipeline::draining())));
    }
    if shared.ready.get().is_none() {
        return Err(refuse(503, "loading", 5, "the model is still loading; try again shortly"));
    }
    // a burst waits for a place (its body stays in the socket meanwhile), for as long as a
    // client has to send a request; only then is it refused
    let place = match Arc::clone(&shared.intake).try_acquire_owned() {
        Ok(p) => p,
        Err(_) => {
            let until = tokio::time::Instant::from_std(received) + shared.cfg.read_timeout;
            match tokio::time::timeout_at(until, Arc::clone(&shared.intake).acquire_owned()).await {
                Ok(Ok(p)) if !shared.is_shutting_down() => p,
                Ok(Ok(_)) => return Err(Ok(http::error(&pipeline::draining()))),
                _ => {
                    let msg = format!("all {} places for requests being received stayed taken for {} s; try again shortly", shared.cfg.max_active_requests, shared.cfg.read_timeout.as_secs());
                    return Err(refuse(503, "server_busy", 1, msg));
                }
            }
        }
    };
    let deadline = tokio::time::Instant::now() + shared.cfg.read_timeout;
    match http::read_body(req.into_body(), shared.cfg.http.max_body, deadline).await {
        Ok(body) => Ok(Intake { body, place, http11, received, id }),
        Err(e) => Err(Ok(http::error(&e))),
    }
}

/// A place in the queue before any image is decoded or text tokenized.
pub(crate) fn reserve(shared: &Shared) -> Result<Ticket, Result<Reply, ClientGone>> {
    match shared.queue.reserve() {
        Ok(t) => Ok(t),
        Err(Refused::Full) => Err(refuse(429, "queue_full", shared.retry_after(), format!("{} requests are already waiting; try again later", shared.queue.capacity()))),
        Err(Refused::Closed) => Err(Ok(http::error(&pipeline::draining()))),
    }
}

/// `POST /v1/chat/completions` and `POST /v1/completions`: the checks of `intake`, then the
/// request pipeline (see `pipeline`), its blocking steps on the blocking pool.
pub(crate) async fn generate(req: Request<Incoming>, conn: &Arc<Conn>, endpoint: Endpoint) -> Result<Reply, ClientGone> {
    let shared = Arc::clone(&conn.shared);
    // 1. a place among the requests being read and checked, then the body within its limits
    let Intake { body, place, http11, received, id } = match intake(req, &shared).await {
        Ok(i) => i,
        Err(reply) => return reply,
    };
    // 2. the JSON, then a place in the queue before any image is decoded or text tokenized
    let limits = shared.cfg.parse;
    let parsed = match blocking(move || pipeline::parse(endpoint, &body, &limits)).await {
        Ok(p) => Arc::new(p),
        Err(e) => return Ok(http::error(&e)),
    };
    let ticket = match reserve(&shared) {
        Ok(t) => t,
        Err(reply) => return reply,
    };
    // 3. images, tokens and the grammar (images decoded here, in parallel with the model)
    let built = {
        let (shared, parsed) = (Arc::clone(&shared), Arc::clone(&parsed));
        blocking(move || pipeline::build(&shared, &parsed)).await
    };
    drop(place);
    let built = match built {
        Ok(b) => b,
        Err(e) => return Ok(http::error(&e)),
    };
    // 4. queued, and answered from the model's events
    let pending = match pipeline::submit(&shared, ticket, built, parsed.settings(), received, &id) {
        Ok(p) => p,
        Err(e) => return Ok(http::error(&e)),
    };
    answer(conn, pending, http11).await
}

/// Answers from a queued job's events: whole, or as server-sent events.
async fn answer(conn: &Arc<Conn>, mut pending: Pending, http11: bool) -> Result<Reply, ClientGone> {
    let mut tick = tokio::time::interval(POLL);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    if pending.stream {
        // a failure before the model takes the job is still a plain 500
        let first = match next_event(&mut pending.rx, conn, http11, &mut tick).await {
            None => return Err(ClientGone),
            Some(Event::Failed(m)) => {
                pending.guard.disarm();
                return Ok(http::error(&ApiError::new(500, "generation_failed", m)));
            }
            Some(Event::ShutDown) => {
                pending.guard.disarm();
                return Ok(http::error(&pipeline::draining()));
            }
            Some(e) => e,
        };
        let opening = pending.opening().iter().map(event).collect();
        let s = EventStream { pending, first: Some(first), opening: Some(opening), done: false };
        return Ok(http::events(s));
    }
    loop {
        match next_event(&mut pending.rx, conn, http11, &mut tick).await {
            None => return Err(ClientGone),
            Some(ev) => match pending.absorb(ev) {
                Some(Ok(whole)) => return Ok(http::json(200, &whole)),
                Some(Err(e)) => return Ok(http::error(&e)),
                None => {}
            },
        }
    }
}

impl Shared {
    /// Unix time now, for `created`.
    pub(crate) fn created_now(&self) -> u64 {
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(self.created, |d| d.as_secs())
    }
}

/// A reply as server-sent events: the opening chunks (chat roles, completion echoes), a chunk
/// per text event, one with each choice's finish reason, the usage chunk when asked, and
/// `data: [DONE]`. Dropped before the end (hyper could not write to the client), it cancels the
/// job.
struct EventStream {
    pending: Pending,
    first: Option<Event>,
    /// The opening chunks, until sent.
    opening: Option<String>,
    done: bool,
}

fn event(v: &serde_json::Value) -> String {
    format!("data: {}\n\n", v)
}

impl http::Stream for EventStream {
    fn poll_next(&mut self, cx: &mut Context<'_>) -> Poll<Option<Bytes>> {
        if self.done {
            return Poll::Ready(None);
        }
        if let Some(open) = self.opening.take().filter(|o: &String| !o.is_empty()) {
            return Poll::Ready(Some(open.into()));
        }
        loop {
            let ev = match self.first.take() {
                Some(e) => e,
                None => match self.pending.rx.poll_recv(cx) {
                    Poll::Pending => return Poll::Pending,
                    Poll::Ready(e) => e.unwrap_or_else(pipeline::dropped),
                },
            };
            let out = match self.pending.chunks(ev) {
                Step::Chunks(c) if c.is_empty() => continue,
                Step::Chunks(c) => c.iter().map(event).collect(),
                Step::Last(c) => {
                    self.done = true;
                    c.iter().map(event).collect::<String>() + "data: [DONE]\n\n"
                }
                Step::Failed(e) => {
                    self.done = true;
                    event(&e.to_json()) + "data: [DONE]\n\n"
                }
            };
            return Poll::Ready(Some(out.into()));
        }
    }
}
