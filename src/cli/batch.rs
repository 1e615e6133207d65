//! `qwen3-vl batch`: a file of requests in the OpenAI Batch format run through the engine, as
//! `serve` would answer each (the same pipeline: `qwen3_vl::server::local`), many at once.
//!
//! Input lines: `{"custom_id", "method": "POST", "url": "/v1/chat/completions" or
//! "/v1/completions", "body"}`. Output lines, in the order requests finish:
//! `{"id", "custom_id", "response": {"status_code", "request_id", "body"}, "error"}`; a request
//! the API refuses gets its status and error object in `response` (as OpenAI's batches do), a
//! line that is not a request gets `error` and no `response`. Each line is written whole and
//! flushed, so that a rerun with the same output file skips every `custom_id` answered there
//! (server-side failures, 5xx, are run again) and a crash or Ctrl-C loses nothing but the
//! requests in flight. The first Ctrl-C stops taking new lines and lets those in flight
//! finish; a second exits at once.

use super::load::CliResult;
use super::progress::Progress;
use super::ranges;
use super::serving::{Prepared, ServingArgs};
use qwen3_vl::server::local::Local;
use qwen3_vl::server::openai::ApiError;
use qwen3_vl::server::pipeline::Endpoint;
use qwen3_vl::signals;
use serde_json::{json, Value};
use std::collections::HashSet;
use std::fs::{File, OpenOptions};
use std::io::{BufRead, BufReader, Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;

/// Longest input line read (a request with images as data URLs can be large).
const MAX_LINE_BYTES: usize = 256 << 20;

#[derive(clap::Args)]
pub struct BatchArgs {
    #[clap(flatten)]
    serving: ServingArgs,
    /// The requests, one JSON object per line (`-`: stdin).
    #[clap(long, short = 'i')]
    input: PathBuf,
    /// Where the results go, one JSON object per line (`-`: stdout). An existing file is
    /// appended to, and the requests it answers already are skipped.
    #[clap(long, short = 'o')]
    output: PathBuf,
    /// Requests in flight at once, being prepared or waiting for the engine (default: twice
    /// --max-batch, so that the engine always has the next ones ready; 1 to 4096).
    #[clap(long, value_parser = ranges::queue, allow_hyphen_values = true)]
    concurrency: Option<usize>,
    /// Largest image or video file read, in MiB (1 to 4096).
    #[clap(long, default_value = "32", value_parser = ranges::mib, allow_hyphen_values = true)]
    max_file_mib: usize,
}

/// What a run did, for the summary.
#[derive(Default)]
struct Counts {
    answered: AtomicUsize,
    errors: AtomicUsize,
    skipped: AtomicUsize,
    prompt_tokens: AtomicU64,
    completion_tokens: AtomicU64,
}

/// The input lines, read one at a time by the workers.
struct Lines {
    reader: Box<dyn BufRead + Send>,
    /// 1-based number of the last line read.
    number: usize,
    /// custom_ids seen in this input (a second one is an error line).
    seen: HashSet<String>,
}

impl Lines {
    /// The next line: its number, its length in bytes (for the progress over a file's bytes)
    /// and its text (`None` at the end); a line too long or not UTF-8 comes as an error message.
    fn next(&mut self) -> Option<(usize, u64, Result<String, String>)> {
        let mut buf = Vec::new();
        let n = (&mut self.reader).take(MAX_LINE_BYTES as u64 + 1).read_until(b'\n', &mut buf);
        self.number += 1;
        match n {
            Ok(0) => None,
            Ok(n) if buf.len() > MAX_LINE_BYTES => {
                // skip the rest of the line
                let mut bytes = n as u64;
                let mut rest = Vec::new();
                loop {
                    rest.clear();
                    match (&mut self.reader).take(1 << 20).read_until(b'\n', &mut rest) {
                        Ok(0) | Err(_) => break,
                        Ok(n) => bytes += n as u64,
                    }
                    if rest.ends_with(b"\n") {
                        break;
                    }
                }
                Some((self.number, bytes, Err(format!("the line is longer than {} MiB", MAX_LINE_BYTES >> 20))))
            }
            Ok(n) => Some((self.number, n as u64, String::from_utf8(buf).map_err(|_| "the line is not UTF-8".to_string()))),
            Err(e) => Some((self.number, 0, Err(format!("cannot read the input: {}", e)))),
        }
    }
}

/// One input line checked: its custom_id, endpoint and body.
struct Line {
    custom_id: String,
    endpoint: Endpoint,
    body: Vec<u8>,
}

/// Checks one line's envelope (the body itself is the API's to check).
fn parse_line(text: &str) -> Result<Line, (Option<String>, String)> {
    let v: Value = serde_json::from_str(text).map_err(|e| (None, format!("not valid JSON: {}", e)))?;
    let o = v.as_object().ok_or((None, "not a JSON object".to_string()))?;
    let custom_id = match o.get("custom_id") {
        Some(Value::String(s)) if !s.is_empty() => s.clone(),
        _ => return Err((None, "'custom_id' must be a non-empty string".into())),
    };
    let fail = |m: String| (Some(custom_id.clone()), m);
    match o.get("method") {
        Some(Value::String(m)) if m == "POST" => {}
        Some(m) => return Err(fail(format!("'method' must be \"POST\", not {}", m))),
        None => return Err(fail("'method' is required (\"POST\")".into())),
    }
    let endpoint = match o.get("url") {
        Some(Value::String(u)) => Endpoint::from_path(u).ok_or_else(|| fail(format!("'url' {} is not one this batch runs (/v1/chat/completions or /v1/completions)", u)))?,
        _ => return Err(fail("'url' must be a string (/v1/chat/completions or /v1/completions)".into())),
    };
    let body = match o.get("body") {
        Some(b @ Value::Object(_)) => serde_json::to_vec(b).map_err(|e| fail(e.to_string()))?,
        _ => return Err(fail("'body' must be a JSON object".into())),
    };
    Ok(Line { custom_id, endpoint, body })
}

/// A fresh id for an output line.
fn line_id() -> String {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let t = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_nanos() as u64);
    format!("batch_req_{:x}{:06x}", t, NEXT.fetch_add(1, Ordering::Relaxed) & 0xff_ffff)
}

/// What an output file answers already: custom_ids, and the numbers of input lines that
/// were no request at all (they have no custom_id to go by).
#[derive(Default)]
struct Done {
    ids: HashSet<String>,
    lines: HashSet<usize>,
}

/// Whether an output line answers its request for good (a rerun skips it): a response below
/// 500, or an input line that was no request. Server-side failures are run again.
fn answered(v: &Value) -> Option<&str> {
    let id = v.get("custom_id")?.as_str()?;
    match v.get("response") {
        Some(Value::Object(r)) => (r.get("status_code")?.as_u64()? < 500).then_some(id),
        _ => v.get("error").filter(|e| e.is_object()).map(|_| id),
    }
}

/// The input line an error line without a custom_id stands for.
fn broken_line(v: &Value) -> Option<usize> {
    if !v.get("custom_id").is_some_and(Value::is_null) {
        return None;
    }
    v.get("error")?.get("line")?.as_u64().map(|n| n as usize)
}

/// The output file opened for appending, with the custom_ids it answers already. A last line
/// cut short (a crash mid-write) is removed first.
fn open_output(path: &Path) -> CliResult<(File, Done)> {
    let mut done = Done::default();
    let mut f = OpenOptions::new().read(true).append(true).create(true).open(path).map_err(|e| format!("cannot open {}: {}", path.display(), e))?;
    let mut keep = 0u64;
    let mut reader = BufReader::new(&mut f);
    let mut line = Vec::new();
    loop {
        line.clear();
        let n = reader.read_until(b'\n', &mut line).map_err(|e| format!("cannot read {}: {}", path.display(), e))?;
        if n == 0 || !line.ends_with(b"\n") {
            break;
        }
        keep += n as u64;
        if let Ok(v) = serde_json::from_slice::<Value>(&line) {
            if let Some(id) = answered(&v) {
                done.ids.insert(id.to_string());
            }
            if let Some(n) = broken_line(&v) {
                done.lines.insert(n);
            }
        }
    }
    let len = f.seek(SeekFrom::End(0))?;
    if len > keep {
        log::warn!("{}: removing a last line cut short ({} bytes)", path.display(), len - keep);
        f.set_len(keep)?;
    }
    Ok((f, done))
}

/// Everything the workers share.
struct Run {
    local: Local,
    lines: Mutex<Lines>,
    out: Mutex<Box<dyn Write + Send>>,
    /// What the output answers already.
    done: Done,
    counts: Counts,
    /// Over the input's bytes where it is a regular file (whose size is known without reading
    /// it), else over its lines (stdin, a pipe).
    progress: Progress,
    by_bytes: bool,
    start: Instant,
}

impl Run {
    /// Writes one output line whole and flushes it.
    fn write(&self, v: &Value) {
        let mut s = v.to_string();
        s.push('\n');
        let mut out = self.out.lock().unwrap_or_else(|p| p.into_inner());
        if let Err(e) = out.write_all(s.as_bytes()).and_then(|_| out.flush()) {
            log::error!("cannot write a result: {}", e);
        }
    }

    /// A line of `bytes` bytes is done (answered, skipped or an error line).
    fn advance(&self, bytes: u64) {
        self.progress.add(if self.by_bytes { bytes } else { 1 });
    }

    /// A line of `bytes` bytes the output answers already.
    fn skip(&self, bytes: u64) {
        self.counts.skipped.fetch_add(1, Ordering::Relaxed);
        self.advance(bytes);
    }

    fn error_line(&self, number: usize, bytes: u64, custom_id: Option<String>, message: String) {
        self.counts.errors.fetch_add(1, Ordering::Relaxed);
        self.advance(bytes);
        log::warn!("line {}: {}", number, message);
        self.write(&json!({"id": line_id(), "custom_id": custom_id, "response": null, "error": {"code": "invalid_request", "message": format!("line {}: {}", number, message), "line": number}}));
    }

    /// Takes lines until the input ends (or Ctrl-C), running each.
    fn work(&self) {
        while !signals::shutdown_requested() {
            // 1. the next line that is a request still to answer
            let (number, bytes, text) = {
                let mut lines = self.lines.lock().unwrap_or_else(|p| p.into_inner());
                match lines.next() {
                    None => return,
                    Some(l) => l,
                }
            };
            if self.done.lines.contains(&number) {
                self.skip(bytes);
                continue;
            }
            let text = match text {
                Ok(t) if t.trim().is_empty() => {
                    self.advance(bytes);
                    continue;
                }
                Ok(t) => t,
                Err(m) => {
                    self.error_line(number, bytes, None, m);
                    continue;
                }
            };
            let line = match parse_line(&text) {
                Ok(l) => l,
                Err((Some(id), _)) if self.done.ids.contains(&id) => {
                    self.skip(bytes);
                    continue;
                }
                Err((id, m)) => {
                    self.error_line(number, bytes, id, m);
                    continue;
                }
            };
            if self.done.ids.contains(&line.custom_id) {
                self.skip(bytes);
                continue;
            }
            if !self.lines.lock().unwrap_or_else(|p| p.into_inner()).seen.insert(line.custom_id.clone()) {
                self.error_line(number, bytes, Some(line.custom_id.clone()), format!("custom_id '{}' appears more than once in the input", line.custom_id));
                continue;
            }
            // 2. the request, as serve runs it
            let reply = self.local.complete(line.endpoint, &line.body);
            let response = match reply {
                Ok(body) => {
                    let usage = |k: &str| body.get("usage").and_then(|u| u.get(k)).and_then(Value::as_u64).unwrap_or(0);
                    self.counts.prompt_tokens.fetch_add(usage("prompt_tokens"), Ordering::Relaxed);
                    self.counts.completion_tokens.fetch_add(usage("completion_tokens"), Ordering::Relaxed);
                    self.counts.answered.fetch_add(1, Ordering::Relaxed);
                    json!({"status_code": 200, "request_id": body.get("id").cloned().unwrap_or(Value::Null), "body": body})
                }
                Err(e) if e.code == "shutting_down" => return,
                Err(e) => {
                    self.counts.errors.fetch_add(1, Ordering::Relaxed);
                    log::warn!("line {} ({}): {} {}", number, line.custom_id, e.status, e.message);
                    response_error(&e)
                }
            };
            self.write(&json!({"id": line_id(), "custom_id": line.custom_id, "response": response, "error": null}));
            self.advance(bytes);
            let c = &self.counts;
            let lines = c.answered.load(Ordering::Relaxed) + c.errors.load(Ordering::Relaxed) + c.skipped.load(Ordering::Relaxed);
            let secs = self.start.elapsed().as_secs_f64().max(1e-3);
            self.progress.message(&format!("{} lines, {:.0} tok/s", lines, c.completion_tokens.load(Ordering::Relaxed) as f64 / secs));
        }
    }
}

/// An API error as a batch response: its status and OpenAI's error object.
fn response_error(e: &ApiError) -> Value {
    json!({"status_code": e.status, "request_id": null, "body": e.to_json()})
}

pub fn run(a: BatchArgs) -> CliResult<()> {
    signals::install_server();
    // 1. the files, then every input before the weights
    let stdin = a.input.as_os_str() == "-";
    let stdout = a.output.as_os_str() == "-";
    if !stdin && !stdout && std::fs::canonicalize(&a.input).ok().is_some_and(|i| std::fs::canonicalize(&a.output).ok().as_ref() == Some(&i)) {
        return Err(format!("--output {} is the input file", a.output.display()).into());
    }
    // (a regular file's size is the progress bar's total, known without reading the file; a
    // pipe, `-i <(...)`, has none, and can be read only once)
    let (reader, size): (Box<dyn BufRead + Send>, Option<u64>) = if stdin {
        (Box::new(BufReader::new(std::io::stdin())), None)
    } else {
        let f = File::open(&a.input).map_err(|e| format!("cannot open {}: {}", a.input.display(), e))?;
        let size = f.metadata().ok().filter(|m| m.is_file()).map(|m| m.len());
        (Box::new(BufReader::new(f)), size)
    };
    let (out, done): (Box<dyn Write + Send>, Done) = if stdout {
        (Box::new(std::io::stdout()), Done::default())
    } else {
        let (f, done) = open_output(&a.output)?;
        if !done.ids.is_empty() || !done.lines.is_empty() {
            log::info!("{}: {} lines answered already are skipped", a.output.display(), done.ids.len() + done.lines.len());
        }
        (Box::new(f), done)
    };
    let Prepared { checked, mut cfg, kv_tokens, per_request, devices } = a.serving.prepare(a.max_file_mib)?;
    let concurrency = a.concurrency.unwrap_or(2 * cfg.max_batch).max(1);
    cfg.queue_capacity = concurrency;
    // 2. the weights, then the model on this thread while the workers feed it
    let (model, format) = a.serving.load(checked, &devices, kv_tokens, per_request)?;
    let progress = match size {
        Some(n) => Progress::bytes("batch", n),
        None => Progress::count("batch", 0, "lines"),
    };
    let local = Local::new(cfg);
    let run = Arc::new(Run { local: local.clone(), lines: Mutex::new(Lines { reader, number: 0, seen: HashSet::new() }), out: Mutex::new(out), done, counts: Counts::default(), progress, by_bytes: size.is_some(), start: Instant::now() });
    let feeder = {
        let run = Arc::clone(&run);
        move || {
            std::thread::spawn(move || {
                std::thread::scope(|s| {
                    for _ in 0..concurrency {
                        s.spawn(|| run.work());
                    }
                });
                run.local.shutdown();
            })
        }
    };
    let mut handle = None;
    local.serve(model.server(format), || handle = Some(feeder()))?;
    if let Some(h) = handle {
        let _ = h.join();
    }
    // 3. the summary
    run.progress.clear();
    let c = &run.counts;
    let secs = run.start.elapsed().as_secs_f64();
    let (answered, errors, skipped) = (c.answered.load(Ordering::Relaxed), c.errors.load(Ordering::Relaxed), c.skipped.load(Ordering::Relaxed));
    let generated = c.completion_tokens.load(Ordering::Relaxed);
    eprintln!(
        "batch: {} answered, {} errors, {} skipped (answered before) in {:.1} s; {} prompt + {} generated tokens, {:.1} generated tok/s{}",
        answered,
        errors,
        skipped,
        secs,
        c.prompt_tokens.load(Ordering::Relaxed),
        generated,
        generated as f64 / secs.max(1e-9),
        if signals::shutdown_requested() { " (interrupted: rerun with the same output to go on)" } else { "" }
    );
    let (steps, step_secs, host_rows) = run.local.step_totals();
    log::info!("engine: {} steps, {:.2} s in them ({:.2} ms a step), {} rows sampled on the host", steps, step_secs, 1e3 * step_secs / steps.max(1) as f64, host_rows);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lines_are_checked_before_their_bodies() {
        let ok = parse_line(r#"{"custom_id": "a", "method": "POST", "url": "/v1/chat/completions", "body": {"messages": []}}"#).unwrap();
        assert_eq!((ok.custom_id.as_str(), ok.endpoint), ("a", Endpoint::Chat));
        let err = |s: &str| parse_line(s).err().unwrap();
        assert_eq!(err("{").0, None);
        assert_eq!(err(r#"{"method": "POST"}"#).0, None);
        assert!(err(r#"{"custom_id": "b", "method": "GET", "url": "/v1/completions", "body": {}}"#).1.contains("POST"));
        assert!(err(r#"{"custom_id": "b", "method": "POST", "url": "/v1/embeddings", "body": {}}"#).1.contains("/v1/embeddings"));
        assert!(err(r#"{"custom_id": "b", "method": "POST", "url": "/v1/completions", "body": 3}"#).1.contains("body"));
    }

    #[test]
    fn reruns_skip_what_was_answered_for_good() {
        assert_eq!(answered(&json!({"custom_id": "a", "response": {"status_code": 200}, "error": null})), Some("a"));
        assert_eq!(answered(&json!({"custom_id": "b", "response": {"status_code": 400}, "error": null})), Some("b"));
        assert_eq!(answered(&json!({"custom_id": "c", "response": {"status_code": 500}, "error": null})), None);
        assert_eq!(answered(&json!({"custom_id": "d", "response": null, "error": {"message": "x"}})), Some("d"));
        assert_eq!(answered(&json!({"custom_id": null, "response": null, "error": {"message": "x", "line": 3}})), None);
        assert_eq!(broken_line(&json!({"custom_id": null, "response": null, "error": {"message": "x", "line": 3}})), Some(3));
        assert_eq!(broken_line(&json!({"custom_id": "d", "response": null, "error": {"message": "x", "line": 3}})), None);
    }

    #[test]
    fn a_torn_last_line_is_cut_off() {
        let dir = std::env::temp_dir().join(format!("qwen3-vl-batch-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let p = dir.join("out.jsonl");
        std::fs::write(&p, "{\"custom_id\": \"a\", \"response\": {\"status_code\": 200}}\n{\"custom_id\": \"b\", \"resp").unwrap();
        let (_, done) = open_output(&p).unwrap();
        assert_eq!(done.ids.into_iter().collect::<Vec<_>>(), vec!["a".to_string()]);
        assert!(std::fs::read_to_string(&p).unwrap().ends_with("}}\n"));
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
