//! The bounded queue between connection threads and the threads that run the model (one per
//! replica, `--data-parallel`), and that thread's loop: up to `--max-batch` sequences at once
//! through the batching engine, their text streamed back as events. A queued job goes to one
//! replica's line, chosen by [`Router`] (load and prefix affinity); the capacity is over all. A job of `n` choices runs as `n` sibling sequences on one
//! prefill (see [`Engine::add_siblings`]); its events name the choice.

use super::images::PreparedImage;
use super::logprobs::{describe, TokenLogprob};
use super::metrics::Metrics;
use super::route::{Media, Router};
use super::stop::StopMatcher;
use crate::generate::logprobs::TokenLogprobs;
use crate::generate::grammar::Grammar;
use crate::generate::min_tokens::MinTokens;
use crate::generate::sampling::OutputPenalties;
use crate::generate::{Sampler, SamplingParams, Stop};
use crate::model::Model;
use crate::{Backend, StreamDecoder, Tokenizer};
use host::engine::{combine_image_keys, Engine, EngineConfig, Event as EngineEvent, ImageInput, Request, SeqId};
use std::collections::{HashMap, VecDeque};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

/// What the model thread tells the connection that submitted a job.
#[derive(Clone, Debug, PartialEq)]
pub enum Event {
    /// The job left the queue; generation begins.
    Started,
    /// Generated text of choice `index` (never a broken character, never part of a stop
    /// string), with the log-probabilities of the tokens it came from when they were asked for
    /// (a token whose text is held back comes with the text that releases it).
    Text { index: usize, text: String, logprobs: Vec<TokenLogprob> },
    /// Choice `index` ended (every choice sends one). `cached_tokens`: prompt tokens taken from
    /// the engine's prefix cache.
    Done { index: usize, finish_reason: &'static str, prompt_tokens: usize, cached_tokens: usize, completion_tokens: usize },
    /// Generation failed (a 500 for the client).
    Failed(String),
    /// The server shut down before the job started (a 503 for the client, who may try again
    /// elsewhere).
    ShutDown,
}

/// What each choice of a job draws with besides its sampling parameters.
#[derive(Clone, Debug, PartialEq)]
pub struct Choices {
    /// Sibling sequences on one prefill (OpenAI's `n`), each with its own seed
    /// ([`choice_seed`]).
    pub n: usize,
    /// Log-probabilities of each token and this many top ones.
    pub logprobs: Option<usize>,
    pub logit_bias: Vec<(u32, f32)>,
    /// No stop token (and no stop string) before this many tokens.
    pub min_tokens: usize,
    /// The stop tokens do not end the reply.
    pub ignore_eos: bool,
}

impl Choices {
    /// One choice with nothing extra.
    pub fn one() -> Choices {
        Choices { n: 1, logprobs: None, logit_bias: Vec::new(), min_tokens: 0, ignore_eos: false }
    }
}

/// The seed of choice `index` of a request seeded `seed`: the seed itself for the first (so
/// `n = 1` draws as before), a splitmix64 mix of both for the others.
pub fn choice_seed(seed: u64, index: usize) -> u64 {
    if index == 0 {
        return seed;
    }
    let mut z = seed ^ (index as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// One chat completion to run.
pub struct Job {
    /// The request id the logs name it by.
    pub id: String,
    pub prompt: Vec<u32>,
    pub images: Vec<std::sync::Arc<PreparedImage>>,
    pub max_tokens: usize,
    pub params: SamplingParams,
    pub penalties: OutputPenalties,
    pub stop: Vec<String>,
    pub choices: Choices,
    /// What each choice must match (structured output), compiled.
    pub grammar: Option<Arc<Grammar>>,
    /// Set by the connection when its client went away.
    pub cancel: Arc<AtomicBool>,
    /// The connection's end: a send never blocks the model thread.
    pub events: tokio::sync::mpsc::UnboundedSender<Event>,
    /// When the request arrived (time to first token counts from here).
    pub received: Instant,
}

/// Why a job was not queued.
#[derive(Debug, PartialEq, Eq)]
pub enum Refused {
    /// The queue holds its capacity already.
    Full,
    /// The server is shutting down.
    Closed,
}

struct State {
    /// Each replica's waiting jobs.
    jobs: Vec<VecDeque<Job>>,
    /// Each replica's running sequences (its model thread says).
    running: Vec<usize>,
    /// Each replica's batch: it runs at most this many jobs at once (unbounded until its
    /// model thread says, [`JobQueue::set_batch`]).
    batch: Vec<usize>,
    /// Jobs a replica took from another's line (see [`JobQueue::take`]).
    stolen: u64,
    closed: bool,
    /// Places held by [`Ticket`]s: requests admitted, still being checked.
    reserved: usize,
    router: Router,
    /// The image and video placeholder tokens (where a prompt's media start, for the router).
    vision_tokens: Vec<u32>,
}

impl State {
    fn waiting(&self) -> usize {
        self.jobs.iter().map(VecDeque::len).sum()
    }
}

/// A bounded FIFO of jobs per replica that can be closed (when a model thread has drained it
/// at shutdown).
pub struct JobQueue {
    state: Mutex<State>,
    /// One per replica: its model thread waits on it.
    ready: Vec<Condvar>,
    /// Signalled when a place frees up (a job taken, a ticket dropped) or the queue closes.
    room: Condvar,
    capacity: usize,
}

impl JobQueue {
    /// A queue for one replica.
    pub fn new(capacity: usize) -> JobQueue {
        JobQueue::with_router(capacity, Router::new(1, host::engine::DEFAULT_BLOCK, 0, Default::default()), &[])
    }

    /// A queue of `capacity` jobs over `router.replicas()` replicas; `vision_tokens` (the image
    /// and video placeholders) mark where a prompt's images and videos start.
    pub fn with_router(capacity: usize, router: Router, vision_tokens: &[u32]) -> JobQueue {
        let n = router.replicas();
        let state = State { jobs: (0..n).map(|_| VecDeque::new()).collect(), running: vec![0; n], batch: vec![usize::MAX; n], stolen: 0, closed: false, reserved: 0, router, vision_tokens: vision_tokens.to_vec() };
        JobQueue { state: Mutex::new(state), ready: (0..n).map(|_| Condvar::new()).collect(), room: Condvar::new(), capacity }
    }

    /// Sets the image and video placeholder tokens (known once the model is loaded), which tell
    /// the router where a prompt's images and videos start (the engine keys the blocks from
    /// there by their content).
    pub fn set_vision_tokens(&self, tokens: &[u32]) {
        self.lock().vision_tokens = tokens.to_vec();
    }

    /// How many replicas take jobs.
    pub fn replicas(&self) -> usize {
        self.ready.len()
    }

    /// Each replica's load: waiting + running.
    pub fn loads(&self) -> Vec<usize> {
        let s = self.lock();
        s.jobs.iter().zip(&s.running).map(|(q, r)| q.len() + r).collect()
    }

    /// Replica `replica` runs `n` sequences now (said as soon as one ends, before its client
    /// hears of it, so that the client's next request sees the load without it).
    pub fn set_running(&self, replica: usize, n: usize) {
        if let Some(r) = self.lock().running.get_mut(replica) {
            *r = n;
        }
    }

    /// Replica `replica` runs at most `n` jobs at once (its engine's batch): while it runs that
    /// many, the others may take the jobs waiting in its line.
    pub fn set_batch(&self, replica: usize, n: usize) {
        if let Some(b) = self.lock().batch.get_mut(replica) {
            *b = n;
        }
    }

    /// Jobs a replica took from another replica's line so far.
    pub fn stolen(&self) -> u64 {
        self.lock().stolen
    }

    /// Puts `job` in the line of the replica the router picks; returns the jobs waiting now.
    fn push(&self, s: &mut State, job: Job) -> usize {
        let load: Vec<usize> = s.jobs.iter().zip(&s.running).map(|(q, r)| q.len() + r).collect();
        // (the images' blocks are keyed by their content from the first image token on)
        let first = if job.images.is_empty() { None } else { job.prompt.iter().position(|id| s.vision_tokens.contains(id)) };
        let media = first.map(|first| Media { first, key: combine_image_keys(&job.images.iter().map(|i| i.key).collect::<Vec<_>>()) });
        let choice = s.router.route(&job.prompt, media, &load);
        if s.jobs.len() > 1 {
            log::debug!("replica {} takes a {}-token prompt ({:?}; loads {:?}, {} tokens thought cached there)", choice.replica, job.prompt.len(), choice.why, load, choice.cached_tokens);
        }
        s.jobs[choice.replica].push_back(job);
        self.ready[choice.replica].notify_one();
        if s.running[choice.replica] >= s.batch[choice.replica] {
            // it cannot take the job now: an idle replica may
            self.ready.iter().for_each(Condvar::notify_one);
        }
        s.waiting()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub fn capacity(&self) -> usize {
        self.capacity
    }

    /// Jobs waiting, over all replicas.
    pub fn len(&self) -> usize {
        self.lock().waiting()
    }

    /// Jobs waiting in each replica's line.
    pub fn lines(&self) -> Vec<usize> {
        self.lock().jobs.iter().map(VecDeque::len).collect()
    }

    /// Jobs waiting and places held for requests still being checked: what a request refused
    /// now would have ahead of it.
    pub fn ahead(&self) -> usize {
        let s = self.lock();
        s.waiting() + s.reserved
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Queues `job`; returns how many jobs wait now (it included).
    pub fn submit(&self, job: Job) -> Result<usize, Refused> {
        let mut s = self.lock();
        if s.closed {
            return Err(Refused::Closed);
        }
        if s.waiting() + s.reserved >= self.capacity {
            return Err(Refused::Full);
        }
        Ok(self.push(&mut s, job))
    }

    /// Holds a place in the queue for a request that is still to be checked (images decoded,
    /// text tokenized), so that a request the queue has no room for is refused before that
    /// work. The place is given back when the ticket is dropped, or used by
    /// [`submit_reserved`](Self::submit_reserved).
    pub fn reserve(self: &Arc<Self>) -> Result<Ticket, Refused> {
        let mut s = self.lock();
        if s.closed {
            return Err(Refused::Closed);
        }
        if s.waiting() + s.reserved >= self.capacity {
            return Err(Refused::Full);
        }
        s.reserved += 1;
        Ok(Ticket(Some(Arc::clone(self))))
    }

    /// A place in the queue as [`reserve`](Self::reserve) gives, waiting for one while the
    /// queue is full (offline callers, which would rather wait than be refused).
    pub fn reserve_wait(self: &Arc<Self>) -> Result<Ticket, Refused> {
        let mut s = self.lock();
        loop {
            if s.closed {
                return Err(Refused::Closed);
            }
            if s.waiting() + s.reserved < self.capacity {
                s.reserved += 1;
                return Ok(Ticket(Some(Arc::clone(self))));
            }
            s = self.room.wait_timeout(s, Duration::from_millis(50)).unwrap_or_else(|p| p.into_inner()).0;
        }
    }

    /// Queues `job` in the place `ticket` holds (refused only when the queue has closed since).
    pub fn submit_reserved(&self, mut ticket: Ticket, job: Job) -> Result<usize, Refused> {
        let mut s = self.lock();
        if ticket.0.take().is_some() {
            s.reserved -= 1;
        }
        if s.closed {
            return Err(Refused::Closed);
        }
        Ok(self.push(&mut s, job))
    }

    /// Closes the queue (later submits are refused) and hands back the jobs still waiting in
    /// replica `replica`'s line.
    pub fn close(&self, replica: usize) -> Vec<Job> {
        let mut s = self.lock();
        s.closed = true;
        self.room.notify_all();
        s.jobs.get_mut(replica).map(|l| l.drain(..).collect()).unwrap_or_default()
    }

    /// Replica `replica`'s next job if one waits (never blocks). The job counts as running
    /// from here (until the model thread says otherwise with [`set_running`](Self::set_running)),
    /// so its load never dips between waiting and running.
    pub fn try_next(&self, replica: usize) -> Option<Job> {
        let job = Self::take(&mut self.lock(), replica);
        if job.is_some() {
            self.room.notify_one();
        }
        job
    }

    /// Replica `replica`'s next job: the first of its line, else (work stealing) the first of
    /// the longest line among the replicas that run a full batch, which could not take it yet
    /// (a job routed to a replica for its cached prefix, that replica then filling up). A
    /// replica whose batch has room keeps its line: it takes its jobs within a step.
    fn take(s: &mut State, replica: usize) -> Option<Job> {
        let from = if s.jobs.get(replica)?.is_empty() {
            (0..s.jobs.len()).filter(|&r| r != replica && !s.jobs[r].is_empty() && s.running[r] >= s.batch[r]).max_by_key(|&r| s.jobs[r].len())?
        } else {
            replica
        };
        let job = s.jobs[from].pop_front()?;
        if from != replica {
            s.stolen += 1;
            log::debug!("replica {} takes a job waiting for replica {} (its batch of {} is full; {} more wait there)", replica, from, s.batch[from], s.jobs[from].len());
        }
        s.running[replica] += 1;
        Some(job)
    }

    /// Replica `replica`'s next job, waiting for one. Once `stop()` gives a deadline
    /// (shutdown), the queue closes (later submits are refused; the other replicas still take
    /// what waits in their lines) and `None` is returned when its line is empty and no request
    /// holds a place in the queue any more, or at the deadline.
    pub fn next(&self, replica: usize, stop: &dyn Fn() -> Option<Instant>) -> Option<Job> {
        let ready = self.ready.get(replica)?;
        let mut s = self.lock();
        loop {
            if let Some(job) = Self::take(&mut s, replica) {
                self.room.notify_one();
                return Some(job);
            }
            if let Some(deadline) = stop() {
                if s.reserved == 0 || Instant::now() >= deadline {
                    s.closed = true;
                    self.room.notify_all();
                    return None;
                }
            }
            s = ready.wait_timeout(s, Duration::from_millis(50)).unwrap_or_else(|p| p.into_inner()).0;
        }
    }
}

/// A place held in a [`JobQueue`] (see [`JobQueue::reserve`]).
pub struct Ticket(Option<Arc<JobQueue>>);

impl Drop for Ticket {
    fn drop(&mut self) {
        if let Some(q) = self.0.take() {
            q.lock().reserved -= 1;
            q.room.notify_one();
        }
    }
}

/// The model and what generation needs besides it.
pub struct Worker<'a> {
    /// Which replica this is (its line in the queue).
    pub replica: usize,
    pub model: &'a Model,
    pub backend: &'a dyn Backend,
    pub tokenizer: &'a Tokenizer,
    /// Token ids that end a reply.
    pub stop_ids: Vec<u32>,
    /// The batching engine's settings (running sequences, cache size, cache type).
    pub engine: EngineConfig,
}

/// A sequence the engine runs (one choice of a job): where its text goes and the state of its
/// stream.
struct Active<'t> {
    job: Arc<Job>,
    /// Which choice of the job.
    index: usize,
    /// The token ids that end it (none with `ignore_eos`).
    stop_ids: Arc<Vec<u32>>,
    dec: StreamDecoder<'t>,
    matcher: StopMatcher,
    first: bool,
    /// When its last token came (for the inter-token latency).
    last_token: Option<Instant>,
    generated: usize,
    /// Log-probabilities of tokens whose text is not sent yet.
    logprobs: Vec<TokenLogprob>,
}

/// The engine's counts into the metrics' gauges of `replica`.
fn publish(engine: &Engine<'_>, metrics: &Metrics, replica: usize) {
    metrics.engine(replica, &engine.stats());
}

impl Worker<'_> {
    /// Runs jobs until the queue closes: up to `max_batch` at once through the engine, new
    /// ones joining between its steps. A failed or panicking step fails the jobs it ran (the
    /// server goes on).
    ///
    /// `stop()` turns `Some(deadline)` at shutdown: from then on the jobs running and queued
    /// still run, and the loop returns once none is left; at the deadline the running ones end
    /// with what they have (finish reason "length"), the queued ones are refused
    /// ([`Event::ShutDown`]) and the queue closes.
    pub fn run(&self, queue: &JobQueue, metrics: &Metrics, stop: &dyn Fn() -> Option<Instant>) {
        queue.set_batch(self.replica, self.engine.max_batch);
        let mut engine = match Engine::new(self.model, self.backend, self.engine.clone()) {
            Ok(e) => e,
            Err(e) => {
                log::error!("the engine does not start: {}; failing every request", e);
                while let Some(job) = queue.next(self.replica, stop) {
                    let _ = job.events.send(Event::Failed(format!("the engine does not start: {}", e)));
                }
                return;
            }
        };
        let mut active: HashMap<SeqId, Active<'_>> = HashMap::new();
        let mut trace = super::trace::StepTrace::from_env(self.replica);
        loop {
            let begin = Instant::now();
            // 0. past the shutdown's deadline, what runs ends and what waits is refused
            if stop().is_some_and(|deadline| Instant::now() >= deadline) {
                self.end_all(&mut engine, &mut active, queue, metrics);
                return;
            }
            // 1. new jobs while there is room in the batch (waiting for one when idle)
            while active.len() < self.engine.max_batch {
                let job = if active.is_empty() {
                    match queue.next(self.replica, stop) {
                        Some(j) => j,
                        None => return,
                    }
                } else {
                    match queue.try_next(self.replica) {
                        Some(j) => j,
                        None => break,
                    }
                };
                self.start(&mut engine, &mut active, job, metrics);
            }
            // 2. jobs whose clients went away end now, their blocks freed
            let gone: Vec<SeqId> = active.iter().filter(|(_, a)| a.job.cancel.load(Ordering::SeqCst)).map(|(&id, _)| id).collect();
            for id in gone {
                engine.cancel(id);
                if let Some(a) = active.remove(&id) {
                    queue.set_running(self.replica, active.len());
                    self.finish(a, "cancelled", metrics, 0.0, 0.0, 0);
                }
            }
            publish(&engine, metrics, self.replica);
            queue.set_running(self.replica, active.len());
            if active.is_empty() {
                continue;
            }
            // 3. one step of every running sequence
            let t0 = Instant::now();
            let events = match catch_unwind(AssertUnwindSafe(|| engine.step())) {
                Ok(Ok(ev)) => ev,
                failed => {
                    let msg = match failed {
                        Ok(Err(e)) => e.to_string(),
                        _ => "internal error while generating".to_string(),
                    };
                    log::error!("a batch step failed ({} requests): {}; the server goes on", active.len(), msg);
                    engine.abort_all();
                    queue.set_running(self.replica, 0);
                    for (_, a) in active.drain() {
                        self.ended(&a, metrics);
                        metrics.finished(self.replica, "error", a.job.prompt.len(), a.generated, 0.0, 0.0);
                        let _ = a.job.events.send(Event::Failed(msg.clone()));
                    }
                    publish(&engine, metrics, self.replica);
                    continue;
                }
            };
            metrics.step(self.replica, t0.elapsed().as_secs_f64());
            let t1 = Instant::now();
            // 4. tokens out as text, finished jobs closed
            for ev in events {
                match ev {
                    EngineEvent::Token { id, token, logprobs } => {
                        let stop = match active.get_mut(&id) {
                            Some(a) => self.token(a, token, logprobs, metrics),
                            None => None,
                        };
                        if let Some(reason) = stop {
                            engine.cancel(id);
                            if let Some(a) = active.remove(&id) {
                                queue.set_running(self.replica, active.len());
                                self.finish(a, reason, metrics, 0.0, 0.0, 0);
                            }
                        }
                    }
                    EngineEvent::Finished { id, stop, prefill_secs, decode_secs, cached_tokens, .. } => {
                        if let Some(a) = active.remove(&id) {
                            queue.set_running(self.replica, active.len());
                            let reason = match stop {
                                Stop::StopToken(_) => "stop",
                                Stop::MaxTokens => "length",
                                Stop::Constraint => {
                                    let _ = a.job.events.send(Event::Failed("the sampler's constraint rejected a token".into()));
                                    "error"
                                }
                            };
                            self.finish(a, reason, metrics, prefill_secs, decode_secs, cached_tokens);
                        }
                    }
                }
            }
            publish(&engine, metrics, self.replica);
            queue.set_running(self.replica, active.len());
            if let Some(t) = trace.as_mut() {
                t.turn(begin, t0, t1, Instant::now(), &engine.stats());
            }
        }
    }

    /// The shutdown's deadline passed: the running sequences end with the text they have
    /// (finish reason "length", as a reply cut short by a limit), the jobs in this replica's
    /// line are refused, and the queue closes.
    fn end_all<'t>(&'t self, engine: &mut Engine<'_>, active: &mut HashMap<SeqId, Active<'t>>, queue: &JobQueue, metrics: &Metrics) {
        let waiting = queue.close(self.replica);
        if !active.is_empty() || !waiting.is_empty() {
            log::warn!("shutting down: the deadline passed; ending {} running sequences and refusing {} queued requests", active.len(), waiting.len());
        }
        for (id, a) in active.drain() {
            engine.cancel(id);
            self.finish(a, "shutdown", metrics, 0.0, 0.0, 0);
        }
        for job in waiting {
            metrics.finished(self.replica, "shutdown", 0, 0, 0.0, 0.0);
            log::info!("[{}] refused: the server shut down before it started", job.id);
            let _ = job.events.send(Event::ShutDown);
        }
        queue.set_running(self.replica, 0);
        publish(engine, metrics, self.replica);
    }

    /// `a` leaves the engine: when it is the job's last choice, the job's latency is counted.
    fn ended(&self, a: &Active<'_>, metrics: &Metrics) {
        if Arc::strong_count(&a.job) == 1 {
            metrics.request_latency(self.replica, a.job.received.elapsed().as_secs_f64());
        }
    }

    /// The sampler of choice `index` of `job`: its own seed, the job's penalties, bias,
    /// logprobs, `min_tokens` (over `stop_ids`) and grammar (a constraint of its own).
    fn sampler(&self, job: &Job, index: usize, stop_ids: &[u32]) -> Sampler {
        let params = SamplingParams { seed: choice_seed(job.params.seed, index), ..job.params };
        let c = &job.choices;
        let mut s = Sampler::new(params).with_output_penalties(job.penalties);
        if !c.logit_bias.is_empty() {
            s = s.with_logit_bias(c.logit_bias.clone());
        }
        if let Some(top) = c.logprobs {
            s = s.with_logprobs(top);
        }
        if c.min_tokens > 0 && !stop_ids.is_empty() {
            s = s.with_constraint(Box::new(MinTokens::new(c.min_tokens, stop_ids.to_vec())));
        }
        if let Some(g) = &job.grammar {
            s = s.with_constraint(g.constraint());
        }
        s
    }

    /// Hands `job` to the engine, its `n` choices as siblings on one prefill (or fails it: a
    /// prompt the engine refuses).
    fn start<'t>(&'t self, engine: &mut Engine<'_>, active: &mut HashMap<SeqId, Active<'t>>, job: Job, metrics: &Metrics) {
        if job.cancel.load(Ordering::SeqCst) {
            metrics.finished(self.replica, "cancelled", 0, 0, 0.0, 0.0);
            return;
        }
        let _ = job.events.send(Event::Started);
        let images = if job.images.is_empty() {
            None
        } else {
            Some(ImageInput {
                parts: job.images.iter().map(|i| Arc::clone(i) as host::engine::PatchRows).collect(),
                row_len: job.images[0].row_len,
                grids: job.images.iter().map(|i| i.grid).collect(),
                keys: job.images.iter().map(|i| i.key).collect(),
            })
        };
        let stop_ids = Arc::new(if job.choices.ignore_eos { Vec::new() } else { self.stop_ids.clone() });
        let req = Request { prompt: job.prompt.clone(), images, max_new: job.max_tokens, sampler: self.sampler(&job, 0, &stop_ids), stop_ids: stop_ids.to_vec() };
        let added = engine.add(req).and_then(|id| {
            let more = (1..job.choices.n).map(|i| self.sampler(&job, i, &stop_ids)).collect();
            Ok(std::iter::once(id).chain(engine.add_siblings(id, more)?).collect::<Vec<_>>())
        });
        match added {
            Ok(ids) => {
                let job = Arc::new(job);
                for (index, id) in ids.into_iter().enumerate() {
                    let a = Active {
                        dec: self.tokenizer.stream_decoder(true),
                        matcher: StopMatcher::new(job.stop.clone()),
                        first: true,
                        last_token: None,
                        generated: 0,
                        job: Arc::clone(&job),
                        index,
                        stop_ids: Arc::clone(&stop_ids),
                        logprobs: Vec::new(),
                    };
                    active.insert(id, a);
                }
            }
            Err(e) => {
                log::error!("[{}] generation failed: {}", job.id, e);
                metrics.finished(self.replica, "error", 0, 0, 0.0, 0.0);
                let _ = job.events.send(Event::Failed(e.to_string()));
            }
        }
    }

    /// A new token of `a`: its text through the stop-string matcher (from `min_tokens` on) to
    /// the client, with its log-probabilities when asked. Returns the finish reason when the
    /// sequence ends here (a stop string, a client gone, text that does not decode).
    fn token(&self, a: &mut Active<'_>, t: u32, logprobs: Option<Box<TokenLogprobs>>, metrics: &Metrics) -> Option<&'static str> {
        let now = Instant::now();
        if a.first {
            a.first = false;
            if a.index == 0 {
                metrics.time_to_first_token(self.replica, now.saturating_duration_since(a.job.received).as_secs_f64());
            }
        }
        if let Some(prev) = a.last_token.replace(now) {
            metrics.inter_token(self.replica, now.saturating_duration_since(prev).as_secs_f64());
        }
        a.generated += 1;
        log::trace!("token {}", t);
        if a.stop_ids.contains(&t) {
            return None; // the engine reports the end next
        }
        if let Some(lp) = logprobs {
            a.logprobs.push(describe(self.tokenizer, &lp));
        }
        let piece = match a.dec.push(t) {
            Ok(p) => p,
            Err(e) => {
                let _ = a.job.events.send(Event::Failed(e.to_string()));
                return Some("error");
            }
        };
        // (stop strings apply once min_tokens are out, as vLLM's)
        let (text, stopped) = if a.generated <= a.job.choices.min_tokens { (piece, false) } else { a.matcher.push(&piece) };
        if !text.is_empty() && a.job.events.send(Event::Text { index: a.index, text, logprobs: std::mem::take(&mut a.logprobs) }).is_err() {
            return Some("cancelled");
        }
        if stopped {
            return Some("stop_string");
        }
        None
    }

    /// Closes a choice: held-back text flushed (unless a stop string cut it), `Done` sent.
    /// `reason` "shutdown" (ended by the shutdown's deadline) reaches the client as "length".
    fn finish(&self, mut a: Active<'_>, reason: &'static str, metrics: &Metrics, prefill_secs: f64, decode_secs: f64, cached_tokens: usize) {
        self.ended(&a, metrics);
        // (the prompt counts once per job, with its first choice)
        let (prompt, generated) = (if a.index == 0 { a.job.prompt.len() } else { 0 }, a.generated);
        let (counted, reason) = match reason {
            "error" | "cancelled" => {
                metrics.finished(self.replica, reason, prompt, generated, prefill_secs, decode_secs);
                log::info!("[{}] {} after {} generated tokens", a.job.id, if reason == "error" { "failed" } else { "cancelled (the client left)" }, generated);
                return;
            }
            "stop_string" => ("stop", "stop"),
            r => {
                let (text, _) = a.matcher.push(&a.dec.finish());
                let rest = text + &a.matcher.finish();
                if !rest.is_empty() || !a.logprobs.is_empty() {
                    let _ = a.job.events.send(Event::Text { index: a.index, text: rest, logprobs: std::mem::take(&mut a.logprobs) });
                }
                (r, if r == "shutdown" { "length" } else { r })
            }
        };
        metrics.finished(self.replica, counted, prompt, generated, prefill_secs, decode_secs);
        log::info!("[{}] {} prompt ({} from the prefix cache) + {} generated tokens, prefill {:.3} s, decode {:.3} s, {}", a.job.id, a.job.prompt.len(), cached_tokens, generated, prefill_secs, decode_secs, counted);
        let _ = a.job.events.send(Event::Done { index: a.index, finish_reason: reason, prompt_tokens: a.job.prompt.len(), cached_tokens, completion_tokens: generated });
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::sync::mpsc::unbounded_channel as channel;

    fn job() -> Job {
        Job {
            id: "test".into(),
            prompt: vec![1],
            images: vec![],
            max_tokens: 1,
            params: SamplingParams::greedy(),
            penalties: OutputPenalties::default(),
            stop: vec![],
            choices: Choices::one(),
            grammar: None,
            cancel: Arc::new(AtomicBool::new(false)),
            events: channel().0,
            received: Instant::now(),
        }
    }

    #[test]
    fn queue_is_bounded_fifo_and_closes_when_drained() {
        let q = JobQueue::new(2);
        let mut a = job();
        a.max_tokens = 7;
        assert_eq!(q.submit(a), Ok(1));
        assert_eq!(q.submit(job()), Ok(2));
        assert_eq!(q.submit(job()).unwrap_err(), Refused::Full);
        // stopping: the queued jobs still come out, in order, then the queue closes
        let stop = || Some(Instant::now() + Duration::from_secs(60));
        assert_eq!(q.next(0, &stop).unwrap().max_tokens, 7);
        assert!(q.next(0, &stop).is_some());
        assert!(q.next(0, &stop).is_none());
        assert_eq!(q.submit(job()).unwrap_err(), Refused::Closed);
    }

    #[test]
    fn an_idle_replica_takes_jobs_waiting_for_a_full_one() {
        let q = JobQueue::with_router(8, Router::new(2, host::engine::DEFAULT_BLOCK, 64, Default::default()), &[]);
        q.set_batch(0, 2);
        q.set_batch(1, 2);
        let mut a = job();
        a.max_tokens = 7;
        q.lock().jobs[0].push_back(a); // as if routed to replica 0 for its prefix
        q.lock().jobs[0].push_back(job());
        // replica 0 has room: its line stays its own
        q.set_running(0, 1);
        assert!(q.try_next(1).is_none());
        // replica 0 full: replica 1 takes the first job waiting there
        q.set_running(0, 2);
        assert_eq!(q.try_next(1).map(|j| j.max_tokens), Some(7));
        assert_eq!((q.stolen(), q.loads()), (1, vec![3, 1]));
        // a replica with jobs of its own takes those first
        let mut b = job();
        b.max_tokens = 9;
        q.lock().jobs[1].push_back(b);
        assert_eq!(q.try_next(1).map(|j| j.max_tokens), Some(9));
        let stop = || None;
        assert_eq!(q.next(1, &stop).map(|j| j.max_tokens), Some(1));
        assert_eq!((q.stolen(), q.lines()), (2, vec![0, 0]));
    }

    #[test]
    fn tickets_hold_places_until_used_or_dropped() {
        let q = Arc::new(JobQueue::new(2));
        let a = q.reserve().unwrap();
        let b = q.reserve().unwrap();
        assert_eq!(q.reserve().err(), Some(Refused::Full));
        assert_eq!(q.submit(job()).unwrap_err(), Refused::Full);
        assert_eq!(q.len(), 0, "reserved places are not waiting jobs");
        assert_eq!(q.ahead(), 2, "but they are ahead of a refused request");
        drop(a);
        assert_eq!(q.submit_reserved(b, job()), Ok(1));
        assert_eq!(q.submit(job()), Ok(2));
        assert_eq!(q.reserve().err(), Some(Refused::Full));
    }

    #[test]
    fn replicas_have_lines_of_their_own_under_one_capacity() {
        use crate::server::route::{RoutePolicy, Router};
        let q = JobQueue::with_router(3, Router::new(2, 16, 1024, RoutePolicy::default()), &[]);
        let long = |seed: u32| {
            let mut j = job();
            j.prompt = (0..100).map(|i| i * 7 + seed).collect();
            j
        };
        // two different prompts spread over the idle replicas; the first one's repeat follows
        // it to its replica
        assert_eq!(q.submit(long(1)), Ok(1));
        assert_eq!(q.submit(long(2)), Ok(2));
        assert_eq!(q.loads(), vec![1, 1]);
        assert_eq!(q.submit(long(1)), Ok(3));
        assert_eq!(q.submit(long(3)).unwrap_err(), Refused::Full, "the capacity is over all replicas");
        let first = (0..2).find(|&r| q.loads()[r] == 2).expect("the repeat joined its prompt's replica");
        let a = q.try_next(first).unwrap();
        let b = q.try_next(first).unwrap();
        assert_eq!(a.prompt, b.prompt);
        assert!(q.try_next(first).is_none());
        // running sequences count as load: a new prompt goes to the other replica
        q.set_running(first, 5);
        let other = 1 - first;
        assert_eq!(q.submit(long(4)), Ok(2));
        assert_eq!(q.loads()[other], 2);
        assert_eq!(q.next(other, &|| None).unwrap().prompt[0], 2);
    }

    /// A video prompt is routed with its video's content: its repeat follows it to its replica
    /// for the cached prefix, the same tokens with another video go by load.
    #[test]
    fn video_prompts_are_routed_by_their_content_too() {
        use crate::server::images::PreparedImage;
        use crate::server::route::{RoutePolicy, Router};
        const VIDEO: u32 = 9_999;
        let q = JobQueue::with_router(8, Router::new(2, 16, 1024, RoutePolicy::default()), &[7_777, VIDEO]);
        let video = |key: u64| {
            let mut j = job();
            j.prompt = (0..100).map(|i| if (10..90).contains(&i) { VIDEO } else { i * 7 + 1 }).collect();
            j.images = vec![Arc::new(PreparedImage { patches: vec![0.0; 4], row_len: 1, grid: [1, 2, 2], tokens: 1, video: None, key })];
            j
        };
        assert_eq!(q.submit(video(1)), Ok(1));
        let first = (0..2).find(|&r| q.loads()[r] == 1).unwrap();
        assert_eq!(q.submit(video(1)), Ok(2));
        assert_eq!(q.loads()[first], 2, "the repeat joined its replica");
        assert_eq!(q.submit(video(2)), Ok(3));
        assert_eq!(q.loads()[1 - first], 1, "another video: only the 10 tokens before it match, so by load");
    }

    #[test]
    fn a_draining_queue_waits_for_places_held_until_the_deadline() {
        let q = Arc::new(JobQueue::new(4));
        let t = q.reserve().unwrap();
        let t0 = Instant::now();
        // a place is held: the queue stays open until the deadline
        assert!(q.next(0, &|| Some(t0 + Duration::from_millis(150))).is_none());
        assert!(t0.elapsed() >= Duration::from_millis(150));
        assert_eq!(q.submit_reserved(t, job()).unwrap_err(), Refused::Closed);
        // with the place used in time, its job still comes out
        let q = Arc::new(JobQueue::new(4));
        let t = q.reserve().unwrap();
        let q2 = Arc::clone(&q);
        let h = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(100));
            q2.submit_reserved(t, job()).unwrap();
        });
        assert!(q.next(0, &|| Some(t0 + Duration::from_secs(60))).is_some());
        h.join().unwrap();
    }

    #[test]
    fn closing_hands_back_the_waiting_jobs_and_refuses_more() {
        let q = Arc::new(JobQueue::new(4));
        let t = q.reserve().unwrap();
        q.submit(job()).unwrap();
        q.submit(job()).unwrap();
        assert_eq!(q.lines(), vec![2]);
        assert_eq!(q.close(0).len(), 2);
        assert!(q.is_empty());
        assert_eq!(q.submit(job()).unwrap_err(), Refused::Closed);
        assert_eq!(q.submit_reserved(t, job()).unwrap_err(), Refused::Closed);
        assert_eq!(q.reserve().err(), Some(Refused::Closed));
    }
}
