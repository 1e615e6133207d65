//! `qwen3-vl serve` as an operator runs it, on loopback: the vLLM-named metrics with their
//! labels (checked with Prometheus' own text parser when the `prometheus_client` Python
//! package is at hand), the drain on SIGTERM within `--shutdown-timeout`, Retry-After under a
//! burst, request ids in the response headers and the log, and a series per replica under
//! `--data-parallel` (CPU replicas). Runs on the tiny checkpoint of tests/fixtures/vision.

mod common;

use common::server::{self, chat, get, metric, raw, read_response, wait_for, Server};
use serde_json::{json, Value};
use std::io::{Read, Write};
use std::net::TcpStream;
use std::process::Command;
use std::time::{Duration, Instant};

fn user(text: &str) -> Value {
    json!([{"role": "user", "content": text}])
}

/// Writes a chat request on a new connection without reading the answer.
fn send_chat(port: u16, body: &Value) -> TcpStream {
    let b = body.to_string();
    let mut c = server::connect(port);
    c.write_all(format!("POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: {}\r\n\r\n{}", b.len(), b).as_bytes()).unwrap();
    c
}

/// The Python with `prometheus_client` importable (`None`: skipped with a note, unless
/// `QWEN3_VL_EXPECT_OPENAI=1`, under which CI installs it beside openai: then it fails).
fn prometheus_python() -> Option<Command> {
    let python = std::env::var("QWEN3_VL_PYTHON").unwrap_or_else(|_| "python3".into());
    let expect = std::env::var("QWEN3_VL_EXPECT_OPENAI").is_ok_and(|v| v == "1");
    let py = || {
        let mut c = Command::new(&python);
        if let Some(p) = std::env::var_os("QWEN3_VL_PYTHONPATH") {
            c.env("PYTHONPATH", p);
        }
        c
    };
    let probe = py().args(["-c", "import prometheus_client"]).output();
    if !probe.as_ref().is_ok_and(|o| o.status.success()) {
        assert!(!expect, "QWEN3_VL_EXPECT_OPENAI=1 but {} cannot import prometheus_client", python);
        eprintln!("the Prometheus parser check is skipped: {} has no prometheus_client (pip install prometheus_client)", python);
        return None;
    }
    Some(py())
}

/// Parses `text` with prometheus_client's parser and prints `name|kind|labels as JSON|value`
/// per sample.
const PARSE: &str = r#"
import json, sys
from prometheus_client.parser import text_string_to_metric_families
for fam in text_string_to_metric_families(sys.stdin.read()):
    for s in fam.samples:
        print("%s|%s|%s|%s" % (s.name, fam.type, json.dumps(s.labels, sort_keys=True), s.value))
"#;

#[test]
fn metrics_carry_vllm_names_and_labels() {
    let s = Server::start(&["--model-name", "tiny \"vl\""]);
    let r = chat(s.port, &json!({"messages": user("Hi"), "max_tokens": 6, "ignore_eos": true}));
    assert_eq!(r.status, 200, "{}", r.text());
    let t = get(s.port, "/metrics").text();
    // 1. the families, labeled with the model and the replica
    let labels = r#"model_name="tiny \"vl\"",replica="0""#;
    for (name, kind) in [
        ("vllm:num_requests_running", "gauge"),
        ("vllm:num_requests_waiting", "gauge"),
        ("vllm:kv_cache_usage_perc", "gauge"),
        ("vllm:prompt_tokens_total", "counter"),
        ("vllm:generation_tokens_total", "counter"),
        ("vllm:request_success_total", "counter"),
        ("vllm:time_to_first_token_seconds", "histogram"),
        ("vllm:inter_token_latency_seconds", "histogram"),
        ("vllm:e2e_request_latency_seconds", "histogram"),
    ] {
        assert!(t.contains(&format!("# TYPE {} {}\n", name, kind)), "no {} {} in\n{}", kind, name, t);
    }
    let v = |series: &str| t.lines().find(|l| l.starts_with(series)).and_then(|l| l.rsplit(' ').next()).and_then(|v| v.parse::<f64>().ok()).unwrap_or_else(|| panic!("no {} in\n{}", series, t));
    assert_eq!(v(&format!("vllm:generation_tokens_total{{{}}} ", labels)), 6.0);
    assert!(v(&format!("vllm:prompt_tokens_total{{{}}} ", labels)) > 0.0);
    assert_eq!(v(&format!("vllm:request_success_total{{{},finished_reason=\"length\"}} ", labels)), 1.0);
    assert_eq!(v(&format!("vllm:e2e_request_latency_seconds_count{{{}}} ", labels)), 1.0);
    assert_eq!(v(&format!("vllm:time_to_first_token_seconds_count{{{}}} ", labels)), 1.0);
    assert_eq!(v(&format!("vllm:inter_token_latency_seconds_count{{{}}} ", labels)), 5.0, "one gap per token after the first");
    assert_eq!(v(&format!("vllm:time_to_first_token_seconds_bucket{{{},le=\"2560\"}} ", labels)), 1.0, "vLLM's last TTFT bound");
    assert_eq!(v(&format!("vllm:e2e_request_latency_seconds_bucket{{{},le=\"7680\"}} ", labels)), 1.0, "vLLM's last e2e bound");
    let kv = v(&format!("vllm:kv_cache_usage_perc{{{}}} ", labels));
    assert!((0.0..=1.0).contains(&kv), "{}", kv);
    assert_eq!(v("qwen3vl_completion_tokens_total "), 6.0, "the own names stay");
    // 2. Prometheus' parser reads the same
    let Some(mut py) = prometheus_python() else { return };
    let mut child = py.args(["-c", PARSE]).stdin(std::process::Stdio::piped()).stdout(std::process::Stdio::piped()).stderr(std::process::Stdio::piped()).spawn().unwrap();
    child.stdin.take().unwrap().write_all(t.as_bytes()).unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success(), "prometheus_client rejected the exposition: {}\n{}", String::from_utf8_lossy(&out.stderr), t);
    let parsed = String::from_utf8(out.stdout).unwrap();
    let labels_json = json!({"model_name": "tiny \"vl\"", "replica": "0"}).to_string().replace(",", ", ").replace(":", ": ");
    // (the value compared as a number: prometheus_client versions print 0 or 0.0)
    for (want, value) in [
        (format!("vllm:num_requests_waiting|gauge|{}|", labels_json), 0.0),
        (format!("vllm:generation_tokens_total|counter|{}|", labels_json), 6.0),
        (format!("vllm:e2e_request_latency_seconds_count|histogram|{}|", labels_json), 1.0),
    ] {
        let read = parsed.lines().any(|l| l.strip_prefix(want.as_str()).and_then(|v| v.parse::<f64>().ok()) == Some(value));
        assert!(read, "prometheus_client did not read {:?} = {}:\n{}", want, value, parsed);
    }
    assert!(parsed.contains("vllm:request_success_total|counter|{\"finished_reason\": \"length\""), "{}", parsed);
    s.assert_no_panic();
}

#[test]
fn sigterm_drains_within_the_shutdown_timeout_and_exits_0() {
    let mut s = Server::start(&["--shutdown-timeout", "2", "--max-batch", "2", "--max-output-tokens", "100000"]);
    let port = s.port;
    let long = |stream: bool| json!({"messages": user("Tell me a long story."), "max_tokens": 100_000, "ignore_eos": true, "stream": stream});
    // 1. two requests running (one streamed, one whole), one queued, one idle kept-alive
    //    connection
    let mut streamed = send_chat(port, &long(true));
    let mut head = [0u8; 1];
    streamed.read_exact(&mut head).unwrap();
    let mut whole = send_chat(port, &long(false));
    wait_for(60, "two running", || metric(port, "qwen3vl_requests_running") >= 2.0);
    let mut queued = send_chat(port, &long(false));
    wait_for(60, "one queued", || metric(port, "qwen3vl_queue_depth") >= 1.0);
    let mut idle = server::connect(port);
    idle.write_all(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n").unwrap();
    assert_eq!(read_response(&mut idle).unwrap().status, 200);
    // 2. SIGTERM: a readiness probe sees the drain on new and kept-alive connections alike;
    //    new requests get 503 with Retry-After
    s.terminate();
    let t0 = Instant::now();
    wait_for(60, "the drain to begin", || get(port, "/health").status == 503);
    let h = get(port, "/health");
    assert_eq!(h.json()["status"], "draining", "{}", h.text());
    idle.write_all(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n").unwrap();
    let h = read_response(&mut idle).unwrap();
    assert_eq!((h.status, h.json()["status"].as_str()), (503, Some("draining")));
    let r = chat(port, &json!({"messages": user("Hi"), "max_tokens": 2}));
    assert_eq!((r.status, r.error_code().as_str()), (503, "shutting_down"), "{}", r.text());
    assert!(r.header("retry-after").is_some_and(|v| v.parse::<u64>().is_ok()), "{:?}", r.headers);
    // 3. at the deadline: the stream ends with a finish reason and [DONE], the whole reply
    //    answers what it has, the queued request gets 503
    let mut rest = Vec::new();
    streamed.read_to_end(&mut rest).unwrap();
    let rest = String::from_utf8_lossy(&rest);
    let ended = t0.elapsed();
    let (last, done) = (rest.rfind("\"finish_reason\":\"length\"").unwrap_or(usize::MAX), rest.rfind("data: [DONE]").unwrap_or(0));
    assert!(last < done && rest[done..].trim_end().ends_with("0"), "the stream did not end cleanly: ...{}", &rest[rest.len().saturating_sub(600)..]);
    assert!(ended < Duration::from_secs(5), "the stream ran {:?} past SIGTERM with --shutdown-timeout 2", ended);
    let w = read_response(&mut whole).unwrap();
    assert_eq!(w.status, 200, "{}", w.text());
    let w = w.json();
    assert_eq!(w["choices"][0]["finish_reason"], "length", "{}", w);
    assert!(w["usage"]["completion_tokens"].as_u64().unwrap() > 0, "{}", w);
    let q = read_response(&mut queued).unwrap();
    assert_eq!((q.status, q.error_code().as_str()), (503, "shutting_down"), "{}", q.text());
    // 4. the process exits 0, the whole drain time-limited
    let status = s.wait(Duration::from_secs(10)).expect("the server exits after the drain");
    assert!(status.success(), "exit status {:?}", status);
    assert!(t0.elapsed() < Duration::from_secs(6), "exited {:?} after SIGTERM with --shutdown-timeout 2", t0.elapsed());
    let log = s.log();
    assert!(log.contains("the deadline passed; ending 2 running sequences and refusing 1 queued requests") && log.contains("server stopped"), "{}", log);
    s.assert_no_panic();
}

#[test]
fn retry_after_follows_the_drain_rate_under_a_burst() {
    let args = ["--max-batch", "4", "--queue", "4", "--max-output-tokens", "20000"];
    let body = |n: usize| json!({"messages": user("Count to a thousand."), "max_tokens": n, "ignore_eos": true});
    let burst = |port: u16, k: usize, n: usize| (0..k).map(|_| std::thread::spawn(move || chat(port, &body(n)))).collect::<Vec<_>>();
    let join = |hs: Vec<std::thread::JoinHandle<server::Response>>| hs.into_iter().for_each(|h| assert_eq!(h.join().unwrap().status, 200));
    // 1. a length that keeps a full batch busy for about 3 s here (on a server of its own,
    //    so that this does not count in the rate; long enough that the batch outlasts the
    //    queue filling up behind it)
    let n = {
        let s = Server::start(&args);
        let t0 = Instant::now();
        join(burst(s.port, 4, 200));
        ((3.0 / (t0.elapsed().as_secs_f64() / 200.0)) as usize).clamp(300, 20000)
    };
    let s = Server::start(&args);
    let port = s.port;
    // 2. a burst measures the rate; a second fills the batch, then five more come at once: four
    //    fill the queue and one is refused. (Should the batch end before they arrive, the
    //    machine sped up: again with longer requests.)
    let mut n = n;
    for _ in 0..3 {
        join(burst(port, 4, n));
        // (the gauge drops a moment after the last reply is read: a stale 4 would let the
        // next wait pass before the new batch runs, and all nine requests race for the places)
        wait_for(60, "the measuring burst to leave the batch", || metric(port, "qwen3vl_requests_running") == 0.0);
        let running = burst(port, 4, n);
        wait_for(60, "a full batch", || metric(port, "qwen3vl_requests_running") >= 4.0);
        let more: Vec<_> = (0..5).map(|_| std::thread::spawn(move || (chat(port, &body(n)), Instant::now()))).collect();
        let more: Vec<_> = more.into_iter().map(|h| h.join().unwrap()).collect();
        join(running);
        let refused: Vec<_> = more.iter().filter(|(r, _)| r.status == 429).collect();
        if refused.is_empty() {
            n *= 2;
            continue;
        }
        assert_eq!(refused.len(), 1, "{:?}", more.iter().map(|(r, _)| r.status).collect::<Vec<_>>());
        let (r, refused_at) = refused[0];
        assert_eq!(r.error_code(), "queue_full", "{}", r.text());
        let retry: u64 = r.header("retry-after").expect("Retry-After").parse().unwrap();
        let last = more.iter().filter(|(r, _)| r.status == 200).map(|(_, at)| *at).max().expect("four answered");
        assert_eq!(more.iter().filter(|(r, _)| r.status == 200).count(), 4);
        let drained = last.duration_since(*refused_at).as_secs_f64();
        // the batch ahead and then the queue of 4 ran in `drained` s (about 2 batches): the
        // queue left within it. (A smoothed time per request times the queue, the old
        // estimate, said about 5 batches; the bounds leave room for a machine whose speed
        // varies.)
        eprintln!("Retry-After {} s; the queue drained in {:.2} s ({} tokens per request)", retry, drained, n);
        assert!(retry >= 1 && (retry as f64) <= 1.5 * drained + 1.0 && (retry as f64) >= drained / 6.0, "Retry-After {} s for a queue that drained in {:.2} s", retry, drained);
        s.assert_no_panic();
        return;
    }
    panic!("the batch never outlasted the queue filling behind it");
}

#[test]
fn request_ids_come_back_and_are_logged_with_the_client() {
    let s = Server::start(&[]);
    let req = |extra: &str, body: &str| {
        raw(s.port, format!("POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n{}Content-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{}", extra, body.len(), body).as_bytes())
    };
    let ok = json!({"messages": user("Hi"), "max_tokens": 3}).to_string();
    // 1. the client's id: echoed, the completion's id built on it
    let r = req("X-Request-Id: trace-42.a:b\r\n", &ok);
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.header("x-request-id"), Some("trace-42.a:b"));
    assert_eq!(r.json()["id"], "chatcmpl-trace-42.a:b");
    // 2. none (or one that is not sane): the completion's id
    for extra in ["", "X-Request-Id: has spaces and ; semicolons\r\n"] {
        let r = req(extra, &ok);
        let id = r.json()["id"].as_str().unwrap().to_string();
        assert!(id.starts_with("chatcmpl-") && id.len() > 9, "{}", id);
        assert_eq!(r.header("x-request-id"), Some(id.as_str()));
        wait_for(60, "its log lines", || s.log().contains(&format!("[{}] 127.0.0.1:", id)));
    }
    // 3. a refused request carries its id too, streamed replies as well
    let r = req("X-Request-Id: bad-one\r\n", "{not json");
    assert_eq!((r.status, r.header("x-request-id")), (400, Some("bad-one")));
    let r = req("X-Request-Id: streamed-1\r\n", &json!({"messages": user("Hi"), "max_tokens": 3, "stream": true}).to_string());
    assert_eq!((r.status, r.header("x-request-id")), (200, Some("streamed-1")));
    // 4. the log: received, finished (or refused) and the model's line, with the client
    let log = || s.log();
    wait_for(60, "the finished lines", || log().contains("[streamed-1] 127.0.0.1:") && log().matches("finished: 200").count() >= 4);
    let log = log();
    let lines = |id: &str| log.lines().filter(|l| l.contains(&format!("[{}]", id))).map(String::from).collect::<Vec<_>>();
    let traced = lines("trace-42.a:b");
    assert!(traced.iter().any(|l| l.contains("127.0.0.1:") && l.contains("POST /v1/chat/completions received")), "{:?}", traced);
    assert!(traced.iter().any(|l| l.contains("generated tokens")), "the model's line: {:?}", traced);
    assert!(traced.iter().any(|l| l.contains("127.0.0.1:") && l.contains("finished: 200")), "{:?}", traced);
    let bad = lines("bad-one");
    assert!(bad.iter().any(|l| l.contains("127.0.0.1:") && l.contains("refused: 400")), "{:?}", bad);
    s.assert_no_panic();
}

#[test]
fn sigterm_while_loading_exits_0_at_once() {
    let mut s = Server::start_until(&[], &[("QWEN3_VL_TEST_LOAD_DELAY_MS", "20000")], "accepting connections on http://");
    let h = get(s.port, "/health");
    assert_eq!((h.status, h.json()["status"].as_str()), (503, Some("loading")), "{}", h.text());
    let t0 = Instant::now();
    s.terminate();
    let status = s.wait(Duration::from_secs(10)).expect("the server exits while loading");
    assert!(status.success() && t0.elapsed() < Duration::from_secs(2), "{:?} after {:?}", status, t0.elapsed());
    s.assert_no_panic();
}

#[test]
fn each_replica_has_its_own_series() {
    let mut s = Server::start(&["--device", "cpu", "--data-parallel", "2", "--threads", "1", "--max-batch", "4", "--model-name", "tiny", "--shutdown-timeout", "1", "--max-output-tokens", "100000"]);
    let port = s.port;
    std::thread::scope(|sc| {
        let hs: Vec<_> = (0..8).map(|i| sc.spawn(move || chat(port, &json!({"messages": user(&format!("Question {}: name a color.", i)), "max_tokens": 5, "ignore_eos": true})))).collect();
        for h in hs {
            assert_eq!(h.join().unwrap().status, 200);
        }
    });
    let t = get(port, "/metrics").text();
    let v = |series: String| t.lines().find(|l| l.starts_with(&series)).and_then(|l| l.rsplit(' ').next()).and_then(|v| v.parse::<f64>().ok()).unwrap_or_else(|| panic!("no {} in\n{}", series, t));
    let labels = |r: usize| format!("model_name=\"tiny\",replica=\"{}\"", r);
    let mut generated = 0.0;
    for r in 0..2 {
        for family in ["vllm:num_requests_running", "vllm:num_requests_waiting", "vllm:kv_cache_usage_perc"] {
            v(format!("{}{{{}}} ", family, labels(r)));
        }
        generated += v(format!("vllm:generation_tokens_total{{{}}} ", labels(r)));
        assert!(v(format!("vllm:e2e_request_latency_seconds_count{{{}}} ", labels(r))) >= 1.0, "replica {} served nothing:\n{}", r, t);
    }
    assert!(!t.contains("replica=\"2\""));
    assert_eq!(generated, 40.0);
    assert_eq!(v("qwen3vl_completion_tokens_total ".into()), 40.0, "the own names sum the replicas");
    // the drain ends both replicas' streams at the deadline
    let long = json!({"messages": user("Tell me a long story."), "max_tokens": 100_000, "ignore_eos": true, "stream": true});
    let mut streams: Vec<TcpStream> = (0..2).map(|_| send_chat(port, &long)).collect();
    wait_for(60, "both replicas running", || get(port, "/metrics").text().lines().filter(|l| l.starts_with("vllm:num_requests_running{") && l.ends_with(" 1")).count() == 2);
    s.terminate();
    let t0 = Instant::now();
    for c in &mut streams {
        let mut rest = Vec::new();
        c.read_to_end(&mut rest).unwrap();
        let rest = String::from_utf8_lossy(&rest);
        assert!(rest.contains("\"finish_reason\":\"length\"") && rest.contains("data: [DONE]"), "...{}", &rest[rest.len().saturating_sub(400)..]);
    }
    let status = s.wait(Duration::from_secs(10)).expect("the server exits after the drain");
    assert!(status.success() && t0.elapsed() < Duration::from_secs(5), "{:?} after {:?}", status, t0.elapsed());
    s.assert_no_panic();
}

/// The same image asked about with another question: the second request takes the image's
/// embeddings from the image-embedding cache (the tower ran once; the metrics say so), and
/// answers as a server without the cache does.
#[test]
fn a_known_image_with_a_new_question_skips_the_tower() {
    let img = server::data_url(&server::image("a_64x96.png"), "image/png");
    let ask = |q: &str| json!({"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": img}}, {"type": "text", "text": q}]}], "max_tokens": 6, "temperature": 0});
    let mut answers = Vec::new();
    for cache in ["64MiB", "0"] {
        let s = Server::start(&["--image-cache", cache]);
        let mut texts = Vec::new();
        for q in ["What is this?", "Which colours do you see here?"] {
            let r = chat(s.port, &ask(q));
            assert_eq!(r.status, 200, "{}", r.text());
            texts.push(r.json()["choices"][0]["message"]["content"].as_str().unwrap().to_string());
        }
        let (runs, hits) = (metric(s.port, "qwen3vl_vision_tower_images_total"), metric(s.port, "qwen3vl_image_cache_hits_total"));
        if cache == "0" {
            assert_eq!((runs, hits), (2.0, 0.0), "without the cache the tower runs for each request");
        } else {
            assert_eq!((runs, hits), (1.0, 1.0), "the second question took the cached embeddings");
            let held = metric(s.port, "qwen3vl_image_cache_bytes");
            assert!(held > 0.0 && held <= (64 << 20) as f64, "the cache holds the image within its budget: {} bytes", held);
        }
        answers.push(texts);
    }
    assert_eq!(answers[0], answers[1], "the cached embeddings answer as the tower's");
}
