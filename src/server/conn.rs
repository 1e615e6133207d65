//! Routing one request and answering it. A chat or completions request is checked in the
//! order of its costs (a place among the requests being read, its declared size, its body
//! within limits, its JSON, a place in the queue, then its images and tokens, on the blocking
//! pool), queued for the model thread, and answered from its events, whole or as server-sent
//! events ([`reply`](super::reply)). A client that goes away cancels its request (see `io` for
//! how a departure is told apart from a half-close).

use super::http::{self, Reply};
use super::io::Conn;
use super::openai::{self, ApiError};
use super::queue::{Choices, Event, Job, Refused, Ticket};
use super::reply::{Answer, Format};
use super::settings::{self, Settings};
use super::{completions, prompt, tools, Shared};
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
        if (path.starts_with("/v1/") || path == "/tokenize" || path == "/detokenize") && req.headers().get(AUTHORIZATION).and_then(|v| v.to_str().ok()).map(str::trim) != Some(&format!("Bearer {}", key)) {
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
        ("POST", "/v1/completions") => return completions::handle(req, conn).await,
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

/// A fresh completion id (`chatcmpl-...` for chat, `cmpl-...` for completions).
fn completion_id(prefix: &str) -> String {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let n = NEXT.fetch_add(1, Ordering::Relaxed);
    let t = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_nanos() as u64);
    format!("{}-{:x}{:06x}", prefix, t, n & 0xff_ffff)
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
}

/// The checks every generation request passes first: not shutting down, the model loaded, a
/// place among the requests being read, and the body within its limits.
pub(crate) async fn intake(req: Request<Incoming>, shared: &Arc<Shared>) -> Result<Intake, Result<Reply, ClientGone>> {
    let received = Instant::now();
    let http11 = req.version() == Version::HTTP_11;
    if shared.is_shutting_down() {
        return Err(refuse(503, "shutting_down", 5, "the server is shutting down"));
    }
    if shared.ready.get().is_none() {
        return Err(refuse(503, "loading", 5, "the model is still loading; try again shortly"));
    }
    let place = match Arc::clone(&shared.intake).try_acquire_owned() {
        Ok(p) => p,
        Err(_) => return Err(refuse(503, "server_busy", 1, format!("{} requests are being received already; try again shortly", shared.cfg.max_active_requests))),
    };
    let deadline = tokio::time::Instant::now() + shared.cfg.read_timeout;
    match http::read_body(req.into_body(), shared.cfg.http.max_body, deadline).await {
        Ok(body) => Ok(Intake { body, place, http11, received }),
        Err(e) => Err(Ok(http::error(&e))),
    }
}

/// A place in the queue before any image is decoded or text tokenized.
pub(crate) fn reserve(shared: &Shared) -> Result<Ticket, Result<Reply, ClientGone>> {
    match shared.queue.reserve() {
        Ok(t) => Ok(t),
        Err(Refused::Full) => Err(refuse(429, "queue_full", shared.retry_after(), format!("{} requests are already waiting; try again later", shared.queue.capacity()))),
        Err(Refused::Closed) => Err(refuse(503, "shutting_down", 5, "the server is shutting down")),
    }
}

/// `POST /v1/chat/completions`.
async fn chat(req: Request<Incoming>, conn: &Arc<Conn>) -> Result<Reply, ClientGone> {
    let shared = Arc::clone(&conn.shared);
    // 1. a place among the requests being read and checked, then the body within its limits
    let Intake { body, place, http11, received } = match intake(req, &shared).await {
        Ok(i) => i,
        Err(reply) => return reply,
    };
    // 2. the JSON, then a place in the queue before any image is decoded or text tokenized
    let limits = shared.cfg.parse;
    let parsed = match blocking(move || openai::parse_chat_request(&body, &limits)).await {
        Ok(p) => Arc::new(p),
        Err(e) => return Ok(http::error(&e)),
    };
    let ticket = match reserve(&shared) {
        Ok(t) => t,
        Err(reply) => return reply,
    };
    // 3. images and tokens (images decoded here, in parallel with the model)
    let p = {
        let (shared, parsed) = (Arc::clone(&shared), Arc::clone(&parsed));
        blocking(move || {
            let ready = shared.ready.get().expect("checked above");
            let s = &shared;
            settings::check_vocab(&parsed.settings, ready.tokenizer.vocab_size())?;
            prompt::build(&parsed, &ready.tokenizer, ready.image_token, &ready.format, &s.cfg.images, &s.cfg.tokens, Some(&s.image_slots), Some(&s.image_cache))
        })
        .await
    };
    drop(place);
    let p = match p {
        Ok(p) => p,
        Err(e) => return Ok(http::error(&e)),
    };
    // 4. queued, and answered from the model's events
    run(conn, ticket, p, &parsed.settings, Format::Chat, parsed.tools.reader(), received, http11).await
}

/// Queues a checked request's prompt with its settings, and answers from the model's events:
/// whole, or as server-sent events; with `tools`, each chat choice is read for tool calls.
#[allow(clippy::too_many_arguments)]
pub(crate) async fn run(conn: &Arc<Conn>, ticket: Ticket, p: prompt::Prompt, st: &Settings, format: Format, tools: Option<tools::CallReader>, received: Instant, http11: bool) -> Result<Reply, ClientGone> {
    let shared = Arc::clone(&conn.shared);
    // 1. the grammar of structured output (compiled once per spec; the first one builds the
    //    token trie): a spec that does not compile is a 400
    let grammar = match st.structured.clone() {
        Some(s) => {
            let sh = Arc::clone(&shared);
            match blocking(move || {
                let ready = sh.ready.get().expect("checked by intake");
                ready.grammars.compile(&ready.tokenizer, &s)
            })
            .await
            {
                Ok(g) => Some(g),
                Err(e) => return Ok(http::error(&e)),
            }
        }
        None => None,
    };
    // 2. the job: unset fields from the defaults, a fresh seed unless one is given
    let d = shared.ready.get().expect("checked by intake").defaults;
    let params = crate::generate::SamplingParams {
        temperature: st.temperature.unwrap_or(d.temperature),
        top_k: st.top_k.unwrap_or(d.top_k),
        top_p: st.top_p.unwrap_or(d.top_p),
        repetition_penalty: st.repetition_penalty.unwrap_or(d.repetition_penalty),
        seed: st.seed.unwrap_or_else(settings::fresh_seed),
    };
    log::debug!("sampling {:?}, {} prompt tokens, {} images, max_tokens {}, n {}", params, p.ids.len(), p.images.len(), p.max_tokens, st.n);
    let (tx, mut rx) = unbounded_channel();
    let cancel = Arc::new(AtomicBool::new(false));
    let job = Job {
        prompt: p.ids,
        images: p.images,
        max_tokens: p.max_tokens,
        params,
        penalties: OutputPenalties { presence: st.presence_penalty, frequency: st.frequency_penalty },
        stop: st.stop.clone(),
        choices: Choices { n: st.n, logprobs: st.logprobs, logit_bias: st.logit_bias.clone(), min_tokens: st.min_tokens, ignore_eos: st.ignore_eos },
        grammar,
        cancel: Arc::clone(&cancel),
        events: tx,
        received,
    };
    match shared.queue.submit_reserved(ticket, job) {
        Ok(n) => log::debug!("queued: {} waiting", n),
        Err(_) => return refuse(503, "shutting_down", 5, "the server is shutting down"),
    }
    let mut guard = CancelOnDrop(Some(cancel));
    // 3. the answer, from the model's events
    let prefix = if format == Format::Chat { "chatcmpl" } else { "cmpl" };
    let mut answer = Answer::new(completion_id(prefix), shared.created_now(), shared.cfg.model_id.clone(), format, st.n, st.logprobs.is_some()).with_tools(tools);
    let mut tick = tokio::time::interval(POLL);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    if st.stream {
        // a failure before the model takes the job is still a plain 500
        let first = match next_event(&mut rx, conn, http11, &mut tick).await {
            None => return Err(ClientGone),
            Some(Event::Failed(m)) => {
                guard.disarm();
                return Ok(http::error(&ApiError::new(500, "generation_failed", m)));
            }
            Some(e) => e,
        };
        let opening = answer.opening().iter().map(event).collect();
        let s = EventStream { rx, first: Some(first), guard, answer, include_usage: st.include_usage, opening: Some(opening), done: false };
        return Ok(http::events(s));
    }
    loop {
        match next_event(&mut rx, conn, http11, &mut tick).await {
            None => return Err(ClientGone),
            Some(Event::Failed(m)) => {
                guard.disarm();
                return Ok(http::error(&ApiError::new(500, "generation_failed", m)));
            }
            Some(ev) => {
                answer.absorb(ev);
                if answer.done() {
                    guard.disarm();
                    return Ok(http::json(200, &answer.whole()));
                }
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

/// A reply as server-sent events: the opening chunks (chat roles, completion echoes), a chunk
/// per text event, one with each choice's finish reason, the usage chunk when asked, and
/// `data: [DONE]`. Dropped before the end (hyper could not write to the client), it cancels the
/// job.
struct EventStream {
    rx: UnboundedReceiver<Event>,
    first: Option<Event>,
    guard: CancelOnDrop,
    answer: Answer,
    include_usage: bool,
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
                None => match self.rx.poll_recv(cx) {
                    Poll::Pending => return Poll::Pending,
                    Poll::Ready(e) => e.unwrap_or_else(|| Event::Failed("the model thread dropped the request".into())),
                },
            };
            let out = match ev {
                Event::Started => continue,
                Event::Failed(m) => {
                    self.done = true;
                    self.guard.disarm();
                    event(&ApiError::new(500, "generation_failed", m).to_json()) + "data: [DONE]\n\n"
                }
                ev => {
                    let mut out: String = self.answer.chunks(ev, self.include_usage).iter().map(event).collect();
                    if self.answer.done() {
                        self.done = true;
                        self.guard.disarm();
                        out += "data: [DONE]\n\n";
                    }
                    out
                }
            };
            return Poll::Ready(Some(out.into()));
        }
    }
}
