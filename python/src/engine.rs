//! The model on a thread of its own, taking requests from Python threads: [`Engine`] (load,
//! answer whole, stream, batch, close) and [`Stream`] (a reply's chunks). Waits release the
//! GIL and come back for it every [`SIGNAL_CHECK`], so that Ctrl-C in a notebook interrupts a
//! long generation (the request is cancelled).

use crate::options::{self, Options};
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use qwen3_vl::loading::serving::Prepared;
use qwen3_vl::server::local::{Chunks, Local};
use qwen3_vl::server::openai::ApiError;
use qwen3_vl::server::pipeline::{self, Endpoint, Pending};
use qwen3_vl::DeviceKind;
use serde_json::Value;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Mutex, OnceLock};
use std::thread::JoinHandle;
use std::time::Duration;

/// How long a wait goes on without looking at Python's signals.
const SIGNAL_CHECK: Duration = Duration::from_millis(100);

/// A `qwen3_vl.RequestError` (the API's error: status, code, param, message).
fn request_error(py: Python<'_>, e: &ApiError) -> PyErr {
    python_error(py, "RequestError", (e.message.clone(), e.status, e.code, e.param.clone(), e.kind))
}

/// A `qwen3_vl.LoadError`: the model could not be checked or loaded.
fn load_error(py: Python<'_>, message: String) -> PyErr {
    python_error(py, "LoadError", (message,))
}

fn python_error<'py, A: pyo3::call::PyCallArgs<'py>>(py: Python<'py>, class: &str, args: A) -> PyErr {
    match py.import("qwen3_vl._errors").and_then(|m| m.getattr(class)).and_then(|c| c.call1(args)) {
        Ok(v) => PyErr::from_value(v),
        Err(e) => e,
    }
}

fn endpoint(name: &str) -> PyResult<Endpoint> {
    match name {
        "chat" => Ok(Endpoint::Chat),
        "completions" => Ok(Endpoint::Completions),
        _ => Err(PyValueError::new_err(format!("unknown endpoint '{}' (chat or completions)", name))),
    }
}

/// The runtime whose timer bounds the waits on a reply's events.
fn runtime() -> &'static tokio::runtime::Runtime {
    static RT: OnceLock<tokio::runtime::Runtime> = OnceLock::new();
    RT.get_or_init(|| tokio::runtime::Builder::new_multi_thread().worker_threads(1).thread_name("qwen3-vl-wait").enable_time().build().expect("a one-thread tokio runtime starts"))
}

/// The next event of `p`, or `None` after `within` without one.
fn next_event(p: &mut Pending, within: Duration) -> Option<qwen3_vl::server::queue::Event> {
    runtime().block_on(async { tokio::time::timeout(within, p.rx.recv()).await }).ok().map(|e| e.unwrap_or_else(pipeline::dropped))
}

/// The whole reply of `p`, waiting without the GIL; a Python signal (Ctrl-C) raises and
/// drops `p`, which cancels the request.
fn wait_whole(py: Python<'_>, mut p: Pending) -> PyResult<Value> {
    loop {
        let r = py.detach(|| {
            let t0 = std::time::Instant::now();
            while t0.elapsed() < SIGNAL_CHECK {
                if let Some(r) = next_event(&mut p, SIGNAL_CHECK).and_then(|ev| p.absorb(ev)) {
                    return Some(r);
                }
            }
            None
        });
        match r {
            Some(Ok(v)) => return Ok(v),
            Some(Err(e)) => return Err(request_error(py, &e)),
            None => py.check_signals()?,
        }
    }
}

/// The in-process server and its model thread.
#[pyclass(frozen, module = "qwen3_vl._native")]
pub struct Engine {
    local: Local,
    thread: Mutex<Option<JoinHandle<()>>>,
    /// Which backend runs and why.
    #[pyo3(get)]
    device: String,
    /// The model name that responses report.
    #[pyo3(get)]
    model_id: String,
    /// Requests in flight at once for [`Engine::batch`] (the queue's capacity).
    #[pyo3(get)]
    concurrency: usize,
}

impl Drop for Engine {
    /// Dropped without `close` (the Python side closes it at exit): new requests are refused
    /// and the model thread ends after those accepted, without waiting for it here (a wait
    /// while holding the GIL could stall a thread that needs it).
    fn drop(&mut self) {
        self.local.shutdown();
    }
}

/// Checks the options, loads the model on its thread and returns once it takes requests.
fn start(o: Options) -> Result<Engine, String> {
    // 1. every input, before the weights, on the calling thread
    let Prepared { checked, mut cfg, kv_tokens, per_request } = o.serving.prepare(o.max_file_mib).map_err(|e| e.to_string())?;
    let concurrency = 2 * cfg.max_batch;
    cfg.queue_capacity = concurrency;
    let model_id = cfg.model_id.clone();
    let local = Local::new(cfg);
    // 2. the weights and the engine on the model thread, which says when requests are taken
    let (tx, rx) = mpsc::channel::<Result<String, String>>();
    let server = local.clone();
    let serving = o.serving.clone();
    let thread = std::thread::Builder::new()
        .name("qwen3-vl-model".into())
        .spawn(move || {
            let ready = tx.clone();
            let local = server.clone();
            let run = move || -> Result<(), String> {
                let dev = &serving.model.device;
                let (served, format) = serving.load(checked, &[dev.device], dev.threads, kv_tokens, per_request, &|_, _| {}).map_err(|e| e.to_string())?;
                let replica = &served.replicas[0];
                if replica.backend.kind() != DeviceKind::Cuda && dev.device == qwen3_vl::DeviceRequest::Auto && cfg!(feature = "cuda") {
                    log::warn!("{}", replica.device);
                }
                let device = replica.device.clone();
                local.serve(served.server(format), move || {
                    let _ = ready.send(Ok(device));
                })
                .map_err(|e| e.to_string())
            };
            let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(run)).unwrap_or_else(|p| {
                Err(format!("the model thread panicked: {}", p.downcast_ref::<&str>().map(|s| s.to_string()).or_else(|| p.downcast_ref::<String>().cloned()).unwrap_or_default()))
            });
            server.shutdown();
            if let Err(m) = r {
                log::error!("{}", m);
                let _ = tx.send(Err(m));
            }
        })
        .map_err(|e| format!("cannot start the model thread: {}", e))?;
    match rx.recv() {
        Ok(Ok(device)) => Ok(Engine { local, thread: Mutex::new(Some(thread)), device, model_id, concurrency }),
        Ok(Err(m)) => {
            let _ = thread.join();
            Err(m)
        }
        Err(_) => {
            let _ = thread.join();
            Err("the model thread ended while loading".into())
        }
    }
}

#[pymethods]
impl Engine {
    /// Loads the model of `options` (a JSON object: `model` and the options of
    /// `qwen3_vl.Model`); returns once it takes requests.
    #[new]
    fn new(py: Python<'_>, options: &str) -> PyResult<Engine> {
        let o = options::parse(options).map_err(|m| load_error(py, m))?;
        py.detach(|| start(o)).map_err(|m| load_error(py, m))
    }

    /// The whole answer (JSON text) to the request `body` (JSON bytes) at `endpoint`
    /// (`chat` or `completions`), as `serve` gives it.
    fn complete(&self, py: Python<'_>, endpoint: &str, body: Vec<u8>) -> PyResult<String> {
        let e = self::endpoint(endpoint)?;
        let p = py.detach(|| self.local.submit(e, &body)).map_err(|err| request_error(py, &err))?;
        Ok(wait_whole(py, p)?.to_string())
    }

    /// The reply's chunks as `serve` streams them (the request runs once this returns).
    fn stream(&self, py: Python<'_>, endpoint: &str, body: Vec<u8>) -> PyResult<Stream> {
        let e = self::endpoint(endpoint)?;
        let p = py.detach(|| self.local.submit(e, &body)).map_err(|err| request_error(py, &err))?;
        Ok(Stream { state: Mutex::new(Some(Chunks::new(p))) })
    }

    /// Each of `requests` (endpoint, body) answered, `concurrency` at once through the engine
    /// (default: [`Engine::concurrency`]): in input order, each `(true, answer)` or `(false,
    /// error object)` as JSON text. A Python signal cancels those in flight and raises.
    #[pyo3(signature = (requests, concurrency=None))]
    fn batch(&self, py: Python<'_>, requests: Vec<(String, Vec<u8>)>, concurrency: Option<usize>) -> PyResult<Vec<(bool, String)>> {
        let jobs: Vec<(Endpoint, Vec<u8>)> = requests.into_iter().map(|(e, b)| Ok((endpoint(&e)?, b))).collect::<PyResult<_>>()?;
        let workers = concurrency.unwrap_or(self.concurrency).clamp(1, jobs.len().max(1));
        let next = std::sync::atomic::AtomicUsize::new(0);
        let stop = AtomicBool::new(false);
        let results: Vec<Mutex<Option<(bool, String)>>> = jobs.iter().map(|_| Mutex::new(None)).collect();
        let (done_tx, done_rx) = mpsc::channel::<()>();
        let done_rx = Mutex::new(done_rx);
        let work = || {
            let done_tx = done_tx.clone();
            loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                if i >= jobs.len() || stop.load(Ordering::Relaxed) {
                    return;
                }
                let (e, body) = &jobs[i];
                let r = self.local.submit(*e, body).and_then(|mut p| loop {
                    if stop.load(Ordering::Relaxed) {
                        return Err(ApiError::new(499, "cancelled", "cancelled"));
                    }
                    if let Some(r) = next_event(&mut p, SIGNAL_CHECK).and_then(|ev| p.absorb(ev)) {
                        return r;
                    }
                });
                *results[i].lock().unwrap_or_else(|p| p.into_inner()) = Some(match r {
                    Ok(v) => (true, v.to_string()),
                    Err(e) => (false, e.to_json().to_string()),
                });
                let _ = done_tx.send(());
            }
        };
        let total = jobs.len();
        let interrupted = std::thread::scope(|s| -> PyResult<()> {
            for _ in 0..workers {
                s.spawn(&work);
            }
            let mut finished = 0;
            while finished < total {
                finished += py.detach(|| {
                    let rx = done_rx.lock().unwrap_or_else(|p| p.into_inner());
                    match rx.recv_timeout(SIGNAL_CHECK) {
                        Ok(()) => 1 + rx.try_iter().count(),
                        Err(_) => 0,
                    }
                });
                if let Err(e) = py.check_signals() {
                    stop.store(true, Ordering::Relaxed);
                    return Err(e);
                }
            }
            Ok(())
        });
        // (the scope joined the workers: with `stop` set, each within one SIGNAL_CHECK)
        interrupted?;
        Ok(results.into_iter().map(|m| m.into_inner().unwrap_or_else(|p| p.into_inner()).unwrap_or((false, ApiError::new(500, "not_run", "not run").to_json().to_string()))).collect())
    }

    /// Refuses new requests, lets those accepted finish and waits for the model thread
    /// (its memory, the GPU's included, is freed). Closing twice does nothing.
    fn close(&self, py: Python<'_>) -> PyResult<()> {
        self.local.shutdown();
        let h = self.thread.lock().unwrap_or_else(|p| p.into_inner()).take();
        if let Some(h) = h {
            py.detach(|| h.join()).map_err(|_| load_error(py, "the model thread panicked".into()))?;
        }
        Ok(())
    }

    /// Whether `close` was called (or the model thread ended).
    #[getter]
    fn closed(&self) -> bool {
        self.thread.lock().unwrap_or_else(|p| p.into_inner()).as_ref().is_none_or(|h| h.is_finished())
    }
}


/// A streamed reply: its chunks (JSON text) as `serve` sends them, without the final
/// `[DONE]`. A failure mid-stream raises. Closed or dropped before the end, it cancels the
/// request.
#[pyclass(frozen, module = "qwen3_vl._native")]
pub struct Stream {
    state: Mutex<Option<Chunks>>,
}

#[pymethods]
impl Stream {
    fn __iter__(slf: PyRef<'_, Self>) -> PyRef<'_, Self> {
        slf
    }

    fn __next__(&self, py: Python<'_>) -> PyResult<Option<String>> {
        loop {
            // Some(item): the iterator's item; None: no event yet (Ctrl-C is checked)
            let r = py.detach(|| {
                let mut g = self.state.lock().unwrap_or_else(|p| p.into_inner());
                let Some(chunks) = g.as_mut() else { return Some(None) };
                let r = chunks.next_with(|p| next_event(p, SIGNAL_CHECK));
                if matches!(r, Some(None) | Some(Some(Err(_)))) {
                    *g = None;
                }
                r
            });
            match r {
                Some(Some(Ok(c))) => return Ok(Some(c.to_string())),
                Some(None) => return Ok(None),
                Some(Some(Err(e))) => return Err(request_error(py, &e)),
                None => {
                    if let Err(e) = py.check_signals() {
                        self.close(py);
                        return Err(e);
                    }
                }
            }
        }
    }

    /// Cancels the request if it has not ended; the stream then ends.
    fn close(&self, py: Python<'_>) {
        let st = py.detach(|| self.state.lock().unwrap_or_else(|p| p.into_inner()).take());
        drop(st);
    }
}
