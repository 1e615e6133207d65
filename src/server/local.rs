//! The server without HTTP, for offline callers (the batch mode, the Python package): a
//! request is its endpoint and body, as a client would send them, run through the same
//! pipeline and engine as `serve`'s, and answered with the same JSON objects. Where `serve`
//! refuses a request when its queue is full, [`Local::submit`] waits for a place.

use super::openai::ApiError;
use super::pipeline::{self, Endpoint, Pending, Step};
use super::queue::Event;
use super::{Loaded, ServerConfig, Shared};
use serde_json::Value;
use std::collections::VecDeque;
use std::sync::Arc;
use std::time::Instant;

/// An in-process server: [`serve`](Local::serve) runs the model on one thread while others
/// [`submit`](Local::submit) requests.
#[derive(Clone)]
pub struct Local {
    shared: Arc<Shared>,
}

impl Local {
    /// A server that takes requests once [`serve`](Local::serve) has the model.
    pub fn new(cfg: ServerConfig) -> Local {
        Local { shared: Arc::new(Shared::new(cfg)) }
    }

    /// Runs the replicas (as many as the config's `replicas`; one on the calling thread, see
    /// [`Shared::run_models`]) until [`shutdown`](Local::shutdown) is called and the accepted
    /// requests are done; `on_ready` once requests are taken.
    pub fn serve(&self, models: Vec<Loaded<'_>>, on_ready: impl FnOnce()) -> std::io::Result<()> {
        self.shared.run_models(models, &|| false, on_ready)
    }

    /// New requests are refused from now on; the accepted ones finish (no deadline: their
    /// callers wait for them), then `serve` returns.
    pub fn shutdown(&self) {
        self.shared.begin_drain(super::NO_DEADLINE);
    }

    /// Whether the model is loaded.
    pub fn is_ready(&self) -> bool {
        self.shared.ready.get().is_some()
    }

    /// Engine steps so far, seconds spent in them, rows sampled on the host.
    pub fn step_totals(&self) -> (u64, f64, u64) {
        self.shared.metrics.step_totals()
    }

    pub fn config(&self) -> &ServerConfig {
        &self.shared.cfg
    }

    /// Checks and queues one request (waiting for a place in the queue), as `serve` does with
    /// the same body. Errors are the API's (status, code, the field they name).
    pub fn submit(&self, endpoint: Endpoint, body: &[u8]) -> Result<Pending, ApiError> {
        let received = Instant::now();
        let shared = &self.shared;
        if shared.is_shutting_down() {
            return Err(pipeline::draining());
        }
        let parsed = pipeline::parse(endpoint, body, &shared.cfg.parse)?;
        let ticket = shared.queue.reserve_wait().map_err(|_| pipeline::draining())?;
        let built = pipeline::build(shared, &parsed)?;
        pipeline::submit(shared, ticket, built, parsed.settings(), received, &pipeline::RequestId::new(None, endpoint.id_prefix()))
    }

    /// The whole reply of a request (see [`submit`](Local::submit)), whatever its `stream`.
    pub fn complete(&self, endpoint: Endpoint, body: &[u8]) -> Result<Value, ApiError> {
        self.submit(endpoint, body)?.wait()
    }
}

/// A streamed reply's chunks, as `serve` sends them in its server-sent events (without the
/// final `[DONE]`), waiting on the calling thread. A failure mid-stream is the last item.
/// Dropped before the end, it cancels the request.
pub struct Chunks {
    pending: Pending,
    ready: VecDeque<Value>,
    done: bool,
}

impl Chunks {
    pub fn new(mut pending: Pending) -> Chunks {
        let ready = pending.opening().into();
        Chunks { pending, ready, done: false }
    }
}

impl Chunks {
    /// The next chunk, taking events from `recv` (`None` from it: no event yet). Returns
    /// `None` when `recv` had none, else the iterator's item: a chunk, the end, or the failure.
    pub fn next_with(&mut self, mut recv: impl FnMut(&mut Pending) -> Option<Event>) -> Option<Option<Result<Value, ApiError>>> {
        loop {
            if let Some(c) = self.ready.pop_front() {
                return Some(Some(Ok(c)));
            }
            if self.done {
                return Some(None);
            }
            let ev = recv(&mut self.pending)?;
            match self.pending.chunks(ev) {
                Step::Chunks(c) => self.ready.extend(c),
                Step::Last(c) => {
                    self.ready.extend(c);
                    self.done = true;
                }
                Step::Failed(e) => {
                    self.done = true;
                    return Some(Some(Err(e)));
                }
            }
        }
    }
}

impl Iterator for Chunks {
    type Item = Result<Value, ApiError>;

    fn next(&mut self) -> Option<Self::Item> {
        self.next_with(|p| Some(p.rx.blocking_recv().unwrap_or_else(pipeline::dropped))).flatten()
    }
}
