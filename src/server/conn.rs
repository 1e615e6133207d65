//! One connection: read requests (keep-alive, pipelining), route them, answer. Chat requests
//! are checked here, queued for the model thread, and answered from its events, whole or as
//! server-sent events; a client that goes away cancels its request.

use super::http::{ChunkedWriter, Connection, ReadError, Request, Response};
use super::openai::{self, ApiError};
use super::queue::{Event, Job, Refused};
use super::{prompt, Shared};
use crate::generate::sampling::OutputPenalties;
use serde_json::json;
use std::io::{self, Read, Write};
use std::net::TcpStream;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc::{channel, Receiver, RecvTimeoutError};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// How often a blocked read or a wait for the model checks for timeouts, shutdown and a
/// vanished client.
const POLL: Duration = Duration::from_millis(100);

/// Serves one connection until it closes, errs, idles out, or the server shuts down.
pub(crate) fn handle(stream: TcpStream, shared: &Shared) {
    if let Err(e) = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| serve_connection(stream, shared))) {
        log::error!("a connection handler panicked ({:?}); the connection is closed, the server goes on", e.downcast_ref::<&str>());
    }
}

fn serve_connection(stream: TcpStream, shared: &Shared) {
    let _ = stream.set_read_timeout(Some(POLL));
    let _ = stream.set_write_timeout(Some(shared.cfg.read_timeout));
    let _ = stream.set_nodelay(true);
    let mut out = match stream.try_clone() {
        Ok(s) => s,
        Err(_) => return,
    };
    let mut conn = Connection::new(stream);
    loop {
        // 1. one request, within the time limits
        let idle_since = Instant::now();
        let mut started: Option<Instant> = None;
        let mut keep_waiting = |has_started: bool| {
            if has_started {
                started.get_or_insert_with(Instant::now).elapsed() < shared.cfg.read_timeout
            } else {
                !shared.is_shutting_down() && idle_since.elapsed() < shared.cfg.idle_timeout
            }
        };
        let mut send_continue = || {
            let mut o = &out;
            o.write_all(b"HTTP/1.1 100 Continue\r\n\r\n").and_then(|_| o.flush())
        };
        let req = match conn.read_request(&shared.cfg.http, &mut keep_waiting, &mut send_continue) {
            Ok(r) => r,
            Err(ReadError::Closed) | Err(ReadError::Io(_)) | Err(ReadError::Timeout { started: false }) => return,
            Err(ReadError::Timeout { started: true }) => {
                let e = ApiError::new(408, "request_timeout", format!("the request did not arrive within {} s", shared.cfg.read_timeout.as_secs_f64()));
                shared.metrics.response("", 408);
                let _ = Response::error(&e).write_to(&mut out, false);
                linger_close(&conn.inner);
                return;
            }
            Err(ReadError::Bad(e)) => {
                log::debug!("bad request: {}", e.message);
                shared.metrics.response("", e.status);
                let _ = Response::error(&e).write_to(&mut out, false);
                linger_close(&conn.inner);
                return;
            }
        };
        // 2. the answer
        let keep_alive = req.keep_alive && !shared.is_shutting_down();
        let t0 = Instant::now();
        let (status, keep) = route(&req, &mut out, &conn.inner, shared, keep_alive);
        shared.metrics.response(&req.path, status);
        log::info!("{} {} {} in {:.3} s", req.method, req.path, status, t0.elapsed().as_secs_f64());
        if !keep {
            return;
        }
    }
}

/// Closes a connection whose client may still be sending (a body over the limit, a request
/// cut off): our side is shut first and what arrives is read and dropped for a moment, so that
/// closing with unread data does not reset the connection before the client read the answer.
fn linger_close(s: &TcpStream) {
    let _ = s.shutdown(std::net::Shutdown::Write);
    let t0 = Instant::now();
    let mut sink = [0u8; 16384];
    let mut r = s;
    while t0.elapsed() < Duration::from_secs(2) {
        match r.read(&mut sink) {
            Ok(0) => break,
            Ok(_) => {}
            Err(e) if matches!(e.kind(), io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut | io::ErrorKind::Interrupted) => {}
            Err(_) => break,
        }
    }
}

/// Answers one request; returns the status sent and whether the connection stays open.
fn route(req: &Request, out: &mut TcpStream, peer: &TcpStream, shared: &Shared, keep_alive: bool) -> (u16, bool) {
    let send = |out: &mut TcpStream, r: Response| -> (u16, bool) {
        let ok = r.write_to(out, keep_alive).is_ok();
        (r.status, ok && keep_alive)
    };
    let method_not_allowed = |allow: &'static str| ApiError { allow: Some(allow), ..ApiError::new(405, "method_not_allowed", format!("{} is not allowed on {} (use {})", req.method, req.path, allow)) };
    // 1. the API key, for the API itself
    if let Some(key) = &shared.cfg.api_key {
        if req.path.starts_with("/v1/") && req.header("authorization") != Some(&format!("Bearer {}", key)) {
            return send(out, Response::error(&ApiError::new(401, "invalid_api_key", "missing or wrong API key (Authorization: Bearer ...)")));
        }
    }
    // 2. the routes
    match (req.method.as_str(), req.path.as_str()) {
        ("GET", "/health") => {
            if shared.is_shutting_down() {
                send(out, Response::json(503, &json!({"status": "shutting down"})))
            } else {
                send(out, Response::json(200, &json!({"status": "ok"})))
            }
        }
        ("GET", "/metrics") => send(out, Response::text(200, "text/plain; version=0.0.4", shared.metrics.render(shared.queue.len(), shared.queue.capacity()))),
        ("GET", "/v1/models") => send(out, Response::json(200, &json!({"object": "list", "data": [model_json(shared)]}))),
        ("GET", p) if p.starts_with("/v1/models/") => {
            if &p["/v1/models/".len()..] == shared.cfg.model_id {
                send(out, Response::json(200, &model_json(shared)))
            } else {
                send(out, Response::error(&ApiError::new(404, "model_not_found", format!("no model '{}' here (this server has '{}')", &p["/v1/models/".len()..], shared.cfg.model_id))))
            }
        }
        ("POST", "/v1/chat/completions") => chat(req, out, peer, shared, keep_alive),
        (_, "/health") | (_, "/metrics") | (_, "/v1/models") => send(out, Response::error(&method_not_allowed("GET"))),
        (_, "/v1/chat/completions") => send(out, Response::error(&method_not_allowed("POST"))),
        _ => send(out, Response::error(&ApiError::new(404, "not_found", format!("no route for {} {}", req.method, req.path.chars().take(200).collect::<String>())))),
    }
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

/// Whether the client closed its side (or the socket failed), without consuming its data.
fn peer_gone(s: &TcpStream) -> bool {
    if s.set_nonblocking(true).is_err() {
        return true;
    }
    let mut b = [0u8; 1];
    let r = s.peek(&mut b);
    let _ = s.set_nonblocking(false);
    match r {
        Ok(0) => true,
        Ok(_) => false,
        Err(e) => e.kind() != io::ErrorKind::WouldBlock && e.kind() != io::ErrorKind::Interrupted,
    }
}

/// Waits for a job's events while watching its client: a client that went away cancels the
/// job. The socket is checked at least every [`POLL`], also while events keep coming.
struct Watch<'a> {
    rx: &'a Receiver<Event>,
    peer: &'a TcpStream,
    cancel: &'a AtomicBool,
    checked: Instant,
}

impl<'a> Watch<'a> {
    fn new(rx: &'a Receiver<Event>, peer: &'a TcpStream, cancel: &'a AtomicBool) -> Watch<'a> {
        Watch { rx, peer, cancel, checked: Instant::now() }
    }

    /// The next event (`None`: the client left, and the job was cancelled).
    fn next(&mut self) -> Option<Event> {
        loop {
            if self.checked.elapsed() >= POLL {
                self.checked = Instant::now();
                if peer_gone(self.peer) {
                    self.cancel.store(true, Ordering::SeqCst);
                    return None;
                }
            }
            match self.rx.recv_timeout(POLL) {
                Ok(e) => return Some(e),
                Err(RecvTimeoutError::Timeout) => {}
                Err(RecvTimeoutError::Disconnected) => return Some(Event::Failed("the model thread dropped the request".into())),
            }
        }
    }
}

/// `POST /v1/chat/completions`.
fn chat(req: &Request, out: &mut TcpStream, peer: &TcpStream, shared: &Shared, keep_alive: bool) -> (u16, bool) {
    let received = Instant::now();
    let fail = |out: &mut TcpStream, e: &ApiError| -> (u16, bool) {
        log::debug!("{} {}: {}", e.status, e.code, e.message);
        let ok = Response::error(e).write_to(out, keep_alive).is_ok();
        (e.status, ok && keep_alive)
    };
    if shared.is_shutting_down() {
        return fail(out, &ApiError { retry_after: Some(5), ..ApiError::new(503, "shutting_down", "the server is shutting down") });
    }
    // 1. check the request and build the prompt (images decoded here, in parallel with the model)
    let parsed = match openai::parse_chat_request(&req.body, &shared.cfg.parse) {
        Ok(p) => p,
        Err(e) => return fail(out, &e),
    };
    let p = match prompt::build(&parsed, &shared.tokenizer, shared.image_token, &shared.cfg.images, &shared.cfg.tokens, Some(&shared.image_slots), Some(&shared.image_cache)) {
        Ok(p) => p,
        Err(e) => return fail(out, &e),
    };
    // 2. queue it
    let d = shared.cfg.defaults;
    let params = crate::generate::SamplingParams {
        temperature: parsed.temperature.unwrap_or(d.temperature),
        top_k: parsed.top_k.unwrap_or(d.top_k),
        top_p: parsed.top_p.unwrap_or(d.top_p),
        repetition_penalty: parsed.repetition_penalty.unwrap_or(d.repetition_penalty),
        seed: parsed.seed.unwrap_or(d.seed),
    };
    log::debug!("sampling {:?}, {} prompt tokens, {} images, max_tokens {}", params, p.ids.len(), p.images.len(), p.max_tokens);
    let (tx, rx) = channel();
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
    match shared.queue.submit(job) {
        Ok(n) => log::debug!("queued: {} waiting", n),
        Err(Refused::Full) => {
            let e = ApiError { retry_after: Some(shared.retry_after()), ..ApiError::new(429, "queue_full", format!("{} requests are already waiting; try again later", shared.queue.capacity())) };
            return fail(out, &e);
        }
        Err(Refused::Closed) => return fail(out, &ApiError { retry_after: Some(5), ..ApiError::new(503, "shutting_down", "the server is shutting down") }),
    }
    // 3. answer from the model's events
    let (id, model) = (completion_id(), shared.cfg.model_id.as_str());
    if parsed.stream {
        stream_reply(out, peer, &rx, &cancel, keep_alive, &id, shared.created_now(), model, parsed.include_usage)
    } else {
        let mut text = String::new();
        let mut watch = Watch::new(&rx, peer, &cancel);
        loop {
            match watch.next() {
                None => return (499, false), // the client left
                Some(Event::Started) => {}
                Some(Event::Text(t)) => text.push_str(&t),
                Some(Event::Failed(m)) => return fail(out, &ApiError::new(500, "generation_failed", m)),
                Some(Event::Done { finish_reason, prompt_tokens, cached_tokens, completion_tokens }) => {
                    let body = openai::completion(&id, shared.created_now(), model, &text, finish_reason, prompt_tokens, cached_tokens, completion_tokens);
                    let ok = Response::json(200, &body).write_to(out, keep_alive).is_ok();
                    return (200, ok && keep_alive);
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

/// Streams a reply as server-sent events: a role chunk, content chunks, a chunk with the
/// finish reason, the usage chunk when asked, and `data: [DONE]`.
#[allow(clippy::too_many_arguments)]
fn stream_reply(out: &mut TcpStream, peer: &TcpStream, rx: &Receiver<Event>, cancel: &AtomicBool, keep_alive: bool, id: &str, created: u64, model: &str, include_usage: bool) -> (u16, bool) {
    // 1. wait for the model to take the job (a failure before that is still a plain 500)
    let mut watch = Watch::new(rx, peer, cancel);
    let first = match watch.next() {
        None => return (499, false),
        Some(Event::Failed(m)) => {
            let ok = Response::error(&ApiError::new(500, "generation_failed", m)).write_to(out, keep_alive).is_ok();
            return (500, ok && keep_alive);
        }
        Some(e) => e,
    };
    let mut w = match ChunkedWriter::start(out, "text/event-stream", keep_alive) {
        Ok(w) => w,
        Err(_) => {
            cancel.store(true, Ordering::SeqCst);
            return (200, false);
        }
    };
    let event = |v: &serde_json::Value| format!("data: {}\n\n", v).into_bytes();
    let mut sent = w.send(&event(&openai::chunk(id, created, model, json!({"role": "assistant", "content": ""}), None)));
    // 2. content until done
    let mut next = Some(first);
    loop {
        if sent.is_err() {
            cancel.store(true, Ordering::SeqCst);
            return (200, false);
        }
        let ev = match next.take() {
            Some(e) => e,
            None => match watch.next() {
                Some(e) => e,
                None => return (200, false),
            },
        };
        match ev {
            Event::Started => {}
            Event::Text(t) => sent = w.send(&event(&openai::chunk(id, created, model, json!({"content": t}), None))),
            Event::Failed(m) => {
                let _ = w.send(&event(&ApiError::new(500, "generation_failed", m).to_json()));
                let _ = w.send(b"data: [DONE]\n\n");
                let _ = w.finish();
                return (200, false);
            }
            Event::Done { finish_reason, prompt_tokens, cached_tokens, completion_tokens } => {
                let mut r = w.send(&event(&openai::chunk(id, created, model, json!({}), Some(finish_reason))));
                if include_usage {
                    r = r.and_then(|_| w.send(&event(&openai::usage_chunk(id, created, model, prompt_tokens, cached_tokens, completion_tokens))));
                }
                let ok = r.and_then(|_| w.send(b"data: [DONE]\n\n")).and_then(|_| w.finish()).is_ok();
                return (200, ok && keep_alive);
            }
        }
    }
}
