//! The bounded queue between connection threads and the one thread that runs the model, and
//! that thread's loop: one request at a time, its text streamed back as events.

use super::images::PreparedImage;
use super::metrics::Metrics;
use super::stop::StopMatcher;
use crate::generate::sampling::OutputPenalties;
use crate::generate::{Sampler, SamplingParams, Session, Stop};
use crate::model::{Images, Model};
use crate::{Backend, Tokenizer};
use std::collections::VecDeque;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::Sender;
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

/// What the model thread tells the connection that submitted a job.
#[derive(Clone, Debug, PartialEq)]
pub enum Event {
    /// The job left the queue; generation begins.
    Started,
    /// Generated text (never a broken character, never part of a stop string).
    Text(String),
    Done { finish_reason: &'static str, prompt_tokens: usize, completion_tokens: usize },
    /// Generation failed (a 500 for the client).
    Failed(String),
}

/// One chat completion to run.
pub struct Job {
    pub prompt: Vec<u32>,
    pub images: Vec<PreparedImage>,
    pub max_tokens: usize,
    pub params: SamplingParams,
    pub penalties: OutputPenalties,
    pub stop: Vec<String>,
    /// Set by the connection when its client went away.
    pub cancel: Arc<AtomicBool>,
    pub events: Sender<Event>,
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
    jobs: VecDeque<Job>,
    closed: bool,
}

/// A bounded FIFO of jobs that can be closed (when the model thread has drained it).
pub struct JobQueue {
    state: Mutex<State>,
    ready: Condvar,
    capacity: usize,
}

impl JobQueue {
    pub fn new(capacity: usize) -> JobQueue {
        JobQueue { state: Mutex::new(State { jobs: VecDeque::new(), closed: false }), ready: Condvar::new(), capacity }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub fn capacity(&self) -> usize {
        self.capacity
    }

    /// Jobs waiting.
    pub fn len(&self) -> usize {
        self.lock().jobs.len()
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
        if s.jobs.len() >= self.capacity {
            return Err(Refused::Full);
        }
        s.jobs.push_back(job);
        self.ready.notify_one();
        Ok(s.jobs.len())
    }

    /// The next job, waiting for one. Once `stopping()` says so and the queue is empty, the
    /// queue closes (later submits are refused) and `None` is returned.
    pub fn next(&self, stopping: &dyn Fn() -> bool) -> Option<Job> {
        let mut s = self.lock();
        loop {
            if let Some(job) = s.jobs.pop_front() {
                return Some(job);
            }
            if stopping() {
                s.closed = true;
                return None;
            }
            s = self.ready.wait_timeout(s, Duration::from_millis(50)).unwrap_or_else(|p| p.into_inner()).0;
        }
    }
}

/// The model and what generation needs besides it.
pub struct Engine<'a> {
    pub model: &'a Model,
    pub backend: &'a dyn Backend,
    pub tokenizer: &'a Tokenizer,
    /// Token ids that end a reply.
    pub stop_ids: Vec<u32>,
    /// KV-cache element type of the sessions.
    pub kv_dtype: host::DType,
}

impl Engine<'_> {
    /// Runs jobs until the queue closes. A panic inside one job fails that job only.
    pub fn run(&self, queue: &JobQueue, metrics: &Metrics, stopping: &dyn Fn() -> bool, mut on_finished: impl FnMut(f64)) {
        while let Some(job) = queue.next(stopping) {
            if job.cancel.load(Ordering::SeqCst) {
                metrics.finished("cancelled", 0, 0, 0.0, 0.0);
                continue;
            }
            metrics.running.store(1, Ordering::Relaxed);
            let t0 = Instant::now();
            let events = job.events.clone();
            if catch_unwind(AssertUnwindSafe(|| self.run_job(job, metrics))).is_err() {
                log::error!("a request failed with a panic; the server goes on");
                metrics.finished("error", 0, 0, 0.0, 0.0);
                let _ = events.send(Event::Failed("internal error while generating".into()));
            }
            metrics.running.store(0, Ordering::Relaxed);
            on_finished(t0.elapsed().as_secs_f64());
        }
    }

    /// Generates one reply, sending its text as it comes.
    fn run_job(&self, job: Job, metrics: &Metrics) {
        let _ = job.events.send(Event::Started);
        let fail = |msg: String| {
            log::error!("generation failed: {}", msg);
            metrics.finished("error", 0, 0, 0.0, 0.0);
            let _ = job.events.send(Event::Failed(msg));
        };
        // 1. a session sized for this request
        let mut session = match Session::with_kv_dtype(self.model, self.backend, job.prompt.len() + job.max_tokens, self.kv_dtype) {
            Ok(s) => s,
            Err(e) => return fail(e.to_string()),
        };
        let patches: Vec<f32> = job.images.iter().flat_map(|i| i.patches.iter().copied()).collect();
        let grids: Vec<[usize; 3]> = job.images.iter().map(|i| i.grid).collect();
        let images = Images { patches: &patches, row_len: job.images.first().map_or(0, |i| i.row_len), grids: &grids };
        let mut sampler = Sampler::new(job.params).with_output_penalties(job.penalties);
        // 2. generate, streaming text through the stop-string matcher
        let mut dec = self.tokenizer.stream_decoder(true);
        let mut matcher = StopMatcher::new(job.stop.clone());
        let (mut cancelled, mut stop_string, mut first) = (false, false, true);
        let mut decode_error = None;
        let result = session.generate_with_images(&job.prompt, if grids.is_empty() { None } else { Some(&images) }, job.max_tokens, &mut sampler, &self.stop_ids, &mut |t| {
            if first {
                first = false;
                metrics.time_to_first_token(job.received.elapsed().as_secs_f64());
            }
            log::trace!("token {}", t);
            if job.cancel.load(Ordering::SeqCst) {
                cancelled = true;
                return false;
            }
            if self.stop_ids.contains(&t) {
                return false;
            }
            let piece = match dec.push(t) {
                Ok(p) => p,
                Err(e) => {
                    decode_error = Some(e.to_string());
                    return false;
                }
            };
            let (text, stopped) = matcher.push(&piece);
            if !text.is_empty() && job.events.send(Event::Text(text)).is_err() {
                cancelled = true;
                return false;
            }
            stop_string = stopped;
            !stopped
        });
        let g = match result {
            Ok(g) => g,
            Err(e) => return fail(e.to_string()),
        };
        if let Some(e) = decode_error {
            return fail(e);
        }
        // 3. the end: flush held-back text, say why it stopped
        let finish_reason = if cancelled {
            "cancelled"
        } else if stop_string || matches!(g.stop, Stop::StopToken(_)) {
            "stop"
        } else {
            "length"
        };
        if !cancelled && !stop_string {
            let (text, _) = matcher.push(&dec.finish());
            let rest = text + &matcher.finish();
            if !rest.is_empty() {
                let _ = job.events.send(Event::Text(rest));
            }
        }
        metrics.finished(finish_reason, g.prompt_tokens, g.tokens.len(), g.prefill_secs, g.decode_secs);
        log::info!(
            "{} prompt + {} generated tokens, prefill {:.2} s, decode {:.2} s, {}",
            g.prompt_tokens,
            g.tokens.len(),
            g.prefill_secs,
            g.decode_secs,
            finish_reason
        );
        if !cancelled {
            let _ = job.events.send(Event::Done { finish_reason, prompt_tokens: g.prompt_tokens, completion_tokens: g.tokens.len() });
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::mpsc::channel;

    fn job() -> Job {
        Job {
            prompt: vec![1],
            images: vec![],
            max_tokens: 1,
            params: SamplingParams::greedy(),
            penalties: OutputPenalties::default(),
            stop: vec![],
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
        assert_eq!(q.next(&|| true).unwrap().max_tokens, 7);
        assert!(q.next(&|| true).is_some());
        assert!(q.next(&|| true).is_none());
        assert_eq!(q.submit(job()).unwrap_err(), Refused::Closed);
    }
}
