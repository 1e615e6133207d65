//! A generation request from its body to its reply, apart from any transport: the HTTP server
//! (`conn`), the batch mode and the Python package all go through these steps, so that one body
//! is checked, run and answered the same way by each. In the order of their costs:
//! 1. [`parse`]: the JSON and its fields;
//! 2. a place in the queue (the caller's: refused with 429 over HTTP, waited for offline);
//! 3. [`build`]: images, the chat template, tokens, the grammar of structured output;
//! 4. [`submit`]: the job queued, its reply begun ([`Pending`]), read from its events whole
//!    ([`Pending::absorb`]) or as stream chunks ([`Pending::chunks`]).

use super::completions::{self, CompletionRequest};
use super::openai::{self, ApiError, ChatRequest, ParseLimits};
use super::queue::{Choices, Event, Job, Ticket};
use super::reply::{Answer, Format};
use super::settings::{self, Settings};
use super::tools::CallReader;
use super::{prompt, Shared};
use crate::generate::grammar::Grammar;
use crate::generate::sampling::OutputPenalties;
use serde_json::Value;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Instant;
use tokio::sync::mpsc::{unbounded_channel, UnboundedReceiver};

/// The endpoints that generate.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Endpoint {
    /// `/v1/chat/completions`
    Chat,
    /// `/v1/completions`
    Completions,
}

impl Endpoint {
    /// The endpoint of a URL path (`None`: not one that generates).
    pub fn from_path(path: &str) -> Option<Endpoint> {
        match path {
            "/v1/chat/completions" => Some(Endpoint::Chat),
            "/v1/completions" => Some(Endpoint::Completions),
            _ => None,
        }
    }

    pub fn path(self) -> &'static str {
        match self {
            Endpoint::Chat => "/v1/chat/completions",
            Endpoint::Completions => "/v1/completions",
        }
    }

    /// The prefix of its responses' ids.
    pub fn id_prefix(self) -> &'static str {
        match self {
            Endpoint::Chat => "chatcmpl",
            Endpoint::Completions => "cmpl",
        }
    }
}

/// A request's id: `log` names it on the log lines (and, over HTTP, in the `X-Request-Id`
/// response header), `response` is its reply's `id`.
#[derive(Clone, Debug)]
pub struct RequestId {
    pub log: String,
    pub response: String,
}

impl RequestId {
    /// The id of a request whose client sent `sent` (an `X-Request-Id`), for responses whose
    /// ids begin with `prefix`: `sent` when it is 1 to 128 letters, digits, `-`, `_`, `.` or
    /// `:` (the response's id is then the prefix and it, as vLLM's), else a fresh one.
    pub fn new(sent: Option<&str>, prefix: &str) -> RequestId {
        let sane = |v: &str| (1..=128).contains(&v.len()) && v.bytes().all(|b| b.is_ascii_alphanumeric() || b"-_.:".contains(&b));
        match sent {
            Some(v) if sane(v) => RequestId { log: v.to_string(), response: format!("{}-{}", prefix, v) },
            other => {
                if other.is_some() {
                    log::debug!("ignoring an X-Request-Id that is not 1 to 128 of [A-Za-z0-9-_.:]");
                }
                let id = completion_id(prefix);
                RequestId { log: id.clone(), response: id }
            }
        }
    }
}

/// Retry-After of a request refused because the server is shutting down: another replica
/// (or this one, restarted) may take it at once.
const DRAIN_RETRY_AFTER: u64 = 1;

/// The 503 of a request refused (or never started) because the server is shutting down.
pub fn draining() -> ApiError {
    ApiError { retry_after: Some(DRAIN_RETRY_AFTER), ..ApiError::new(503, "shutting_down", "the server is shutting down; try again (another replica may take the request)") }
}

/// A body whose JSON and fields are checked.
pub enum Parsed {
    Chat(ChatRequest),
    Completion(CompletionRequest),
}

impl Parsed {
    pub fn settings(&self) -> &Settings {
        match self {
            Parsed::Chat(c) => &c.settings,
            Parsed::Completion(c) => &c.settings,
        }
    }
}

/// Step 1: the JSON and its fields.
pub fn parse(endpoint: Endpoint, body: &[u8], limits: &ParseLimits) -> Result<Parsed, ApiError> {
    Ok(match endpoint {
        Endpoint::Chat => Parsed::Chat(openai::parse_chat_request(body, limits)?),
        Endpoint::Completions => Parsed::Completion(completions::parse_completion_request(body, limits)?),
    })
}

/// What the model thread runs for a request, and how its reply is written.
pub struct Built {
    pub prompt: prompt::Prompt,
    pub format: Format,
    /// Reads the reply's text for tool calls (chat requests with tools).
    pub tools: Option<CallReader>,
    /// What each choice must match (structured output), compiled.
    pub grammar: Option<Arc<Grammar>>,
}

/// Step 3: images fetched and prepared, the prompt rendered and tokenized within the limits,
/// the grammar compiled (once per spec; the first builds the token trie). Each failure is a
/// 400 that names its field. Blocking work: run it off any async executor.
pub(crate) fn build(shared: &Shared, parsed: &Parsed) -> Result<Built, ApiError> {
    let ready = shared.ready.get().ok_or_else(|| ApiError::new(503, "loading", "the model is still loading; try again shortly"))?;
    let (prompt, format, tools) = match parsed {
        Parsed::Chat(c) => {
            settings::check_vocab(&c.settings, ready.tokenizer.vocab_size())?;
            let p = prompt::build(c, &ready.tokenizer, ready.image_token, &ready.format, &shared.cfg.images, &shared.cfg.tokens, Some(&shared.image_slots), Some(&shared.image_cache))?;
            (p, Format::Chat, c.tools.reader())
        }
        Parsed::Completion(c) => {
            let placeholders: Vec<u32> = std::iter::once(ready.image_token).chain(ready.tokenizer.token_to_id("<|video_pad|>")).collect();
            let (p, echo) = completions::build(c, &ready.tokenizer, &placeholders, &shared.cfg.tokens)?;
            (p, Format::Completion { echo }, None)
        }
    };
    let grammar = match &parsed.settings().structured {
        Some(s) => Some(ready.grammars.compile(&ready.tokenizer, s)?),
        None => None,
    };
    Ok(Built { prompt, format, tools, grammar })
}

/// Cancels a job when dropped armed: its reply was abandoned (the client left).
pub struct CancelOnDrop(Option<Arc<AtomicBool>>);

impl CancelOnDrop {
    /// The job ended: nothing to cancel.
    pub fn disarm(&mut self) {
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

/// A fresh completion id (`chatcmpl-...` for chat, `cmpl-...` for completions).
pub fn completion_id(prefix: &str) -> String {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let n = NEXT.fetch_add(1, Ordering::Relaxed);
    let t = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_nanos() as u64);
    format!("{}-{:x}{:06x}", prefix, t, n & 0xff_ffff)
}

/// A queued job and its reply in the making.
pub struct Pending {
    /// The model thread's events for this job.
    pub rx: UnboundedReceiver<Event>,
    pub answer: Answer,
    /// Cancels the job if the reply is dropped before its end.
    pub guard: CancelOnDrop,
    pub stream: bool,
    pub include_usage: bool,
}

/// What one event makes of a streamed reply.
pub enum Step {
    /// Chunks to send (none for an event that shows nothing).
    Chunks(Vec<Value>),
    /// The last chunks: every choice has ended.
    Last(Vec<Value>),
    /// Generation failed.
    Failed(ApiError),
}

/// Step 4: the job queued in the place `ticket` holds (unset sampling fields from the
/// model's defaults, a fresh seed unless one is given), its reply begun under `id`.
pub(crate) fn submit(shared: &Shared, ticket: Ticket, built: Built, st: &Settings, received: Instant, id: &RequestId) -> Result<Pending, ApiError> {
    let d = shared.ready.get().ok_or_else(|| ApiError::new(503, "loading", "the model is still loading; try again shortly"))?.defaults;
    let params = crate::generate::SamplingParams {
        temperature: st.temperature.unwrap_or(d.temperature),
        top_k: st.top_k.unwrap_or(d.top_k),
        top_p: st.top_p.unwrap_or(d.top_p),
        repetition_penalty: st.repetition_penalty.unwrap_or(d.repetition_penalty),
        seed: st.seed.unwrap_or_else(settings::fresh_seed),
    };
    let p = built.prompt;
    log::debug!("sampling {:?}, {} prompt tokens, {} images, max_tokens {}, n {}", params, p.ids.len(), p.images.len(), p.max_tokens, st.n);
    let (tx, rx) = unbounded_channel();
    let cancel = Arc::new(AtomicBool::new(false));
    let job = Job {
        id: id.log.clone(),
        prompt: p.ids,
        images: p.images,
        max_tokens: p.max_tokens,
        params,
        penalties: OutputPenalties { presence: st.presence_penalty, frequency: st.frequency_penalty },
        stop: st.stop.clone(),
        choices: Choices { n: st.n, logprobs: st.logprobs, logit_bias: st.logit_bias.clone(), min_tokens: st.min_tokens, ignore_eos: st.ignore_eos },
        grammar: built.grammar,
        cancel: Arc::clone(&cancel),
        events: tx,
        received,
    };
    match shared.queue.submit_reserved(ticket, job) {
        Ok(n) => log::debug!("queued: {} waiting", n),
        Err(_) => return Err(draining()),
    }
    let answer = Answer::new(id.response.clone(), shared.created_now(), shared.cfg.model_id.clone(), built.format, st.n, st.logprobs.is_some()).with_tools(built.tools);
    Ok(Pending { rx, answer, guard: CancelOnDrop(Some(cancel)), stream: st.stream, include_usage: st.include_usage })
}

/// How often [`Pending::wait`] collects a job's events.
pub const WAIT_POLL: std::time::Duration = std::time::Duration::from_millis(5);

/// The event a closed channel stands for.
pub fn dropped() -> Event {
    Event::Failed("the model thread dropped the request".into())
}

impl Pending {
    /// Adds an event to the whole reply: `Some` once it is complete (the object) or failed.
    pub fn absorb(&mut self, ev: Event) -> Option<Result<Value, ApiError>> {
        match ev {
            Event::Failed(m) => {
                self.guard.disarm();
                Some(Err(ApiError::new(500, "generation_failed", m)))
            }
            Event::ShutDown => {
                self.guard.disarm();
                Some(Err(draining()))
            }
            ev => {
                self.answer.absorb(ev);
                if self.answer.done() {
                    self.guard.disarm();
                    Some(Ok(self.answer.whole()))
                } else {
                    None
                }
            }
        }
    }

    /// The stream's opening chunks (chat roles, completion echoes).
    pub fn opening(&mut self) -> Vec<Value> {
        self.answer.opening()
    }

    /// What an event makes of the streamed reply.
    pub fn chunks(&mut self, ev: Event) -> Step {
        match ev {
            Event::Started => Step::Chunks(Vec::new()),
            Event::Failed(m) => {
                self.guard.disarm();
                Step::Failed(ApiError::new(500, "generation_failed", m))
            }
            Event::ShutDown => {
                self.guard.disarm();
                Step::Failed(draining())
            }
            ev => {
                let out = self.answer.chunks(ev, self.include_usage);
                if self.answer.done() {
                    self.guard.disarm();
                    Step::Last(out)
                } else {
                    Step::Chunks(out)
                }
            }
        }
    }

    /// The whole reply, waiting on this thread (never call it on an async executor). The
    /// events are collected every [`WAIT_POLL`] rather than each as it comes: a receiver parked
    /// on the channel would have the model thread wake it for every token, a system call per
    /// token on the thread the GPU waits for.
    pub fn wait(mut self) -> Result<Value, ApiError> {
        use tokio::sync::mpsc::error::TryRecvError;
        loop {
            let ev = match self.rx.try_recv() {
                Ok(ev) => ev,
                Err(TryRecvError::Empty) => {
                    std::thread::sleep(WAIT_POLL);
                    continue;
                }
                Err(TryRecvError::Disconnected) => dropped(),
            };
            if let Some(r) = self.absorb(ev) {
                return r;
            }
        }
    }
}
