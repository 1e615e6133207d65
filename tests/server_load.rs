//! A load test on loopback: 8 concurrent clients send 50 requests each (streamed and not, text
//! and image prompts, kept-alive and fresh connections) to one `qwen3-vl serve`. Nothing may be
//! lost: every request gets a complete, well-formed 200 whose greedy text equals the answer to
//! the same prompt asked alone. Bounded in count (400 requests) and time (5 minutes).

mod common;

use common::server::{self, chat, data_url, image, read_response, Server};
use serde_json::{json, Value};
use std::io::Write;
use std::sync::Arc;
use std::time::{Duration, Instant};

const CLIENTS: usize = 8;
const REQUESTS_PER_CLIENT: usize = 50;
const LIMIT: Duration = Duration::from_secs(300);

/// The prompts the clients cycle through.
fn prompts() -> Vec<Value> {
    let img = data_url(&image("b_50x70.png"), "image/png");
    vec![
        json!([{"role": "user", "content": "Hello!"}]),
        json!([{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Describe a cat in one sentence."}]),
        json!([{"role": "user", "content": "你好，世界"}]),
        json!([{"role": "user", "content": [{"type": "image_url", "image_url": {"url": img}}, {"type": "text", "text": "What is this?"}]}]),
        json!([{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello! How can I help?"}, {"role": "user", "content": "Count to three."}]),
    ]
}

fn body(messages: &Value, stream: bool) -> String {
    json!({"model": "tiny", "messages": messages, "max_tokens": 6, "temperature": 0, "stream": stream, "stream_options": {"include_usage": stream}}).to_string()
}

/// The reply text of a response, checking that it is complete and well-formed.
fn reply_text(r: &server::Response, stream: bool) -> Result<String, String> {
    if r.status != 200 {
        return Err(format!("status {}: {}", r.status, r.text()));
    }
    if !stream {
        let v: Value = serde_json::from_slice(&r.body).map_err(|e| format!("bad JSON {}: {}", e, r.text()))?;
        let u = &v["usage"];
        if v["choices"][0]["finish_reason"].as_str().is_none() || u["total_tokens"].as_u64() != Some(u["prompt_tokens"].as_u64().unwrap_or(0) + u["completion_tokens"].as_u64().unwrap_or(0)) {
            return Err(format!("incomplete completion {}", v));
        }
        return v["choices"][0]["message"]["content"].as_str().map(String::from).ok_or_else(|| format!("no content: {}", v));
    }
    let events = r.events();
    if events.last().map(String::as_str) != Some("[DONE]") {
        return Err(format!("stream not ended by [DONE]: {:?}", events));
    }
    let mut text = String::new();
    let (mut finished, mut usage) = (false, false);
    for e in &events[..events.len() - 1] {
        let c: Value = serde_json::from_str(e).map_err(|err| format!("bad chunk {}: {}", err, e))?;
        if c.get("usage").is_some() {
            usage = true;
        } else {
            text.push_str(c["choices"][0]["delta"]["content"].as_str().unwrap_or(""));
            finished |= c["choices"][0]["finish_reason"].is_string();
        }
    }
    if !finished || !usage {
        return Err(format!("stream without finish reason or usage: {:?}", events));
    }
    Ok(text)
}

#[test]
fn eight_clients_many_requests_nothing_lost() {
    let s = Server::start(&[]);
    let port = s.port;
    let prompts = Arc::new(prompts());
    // 1. each prompt's answer, asked alone
    let expected: Arc<Vec<String>> = Arc::new(prompts.iter().map(|m| reply_text(&chat(port, &serde_json::from_str(&body(m, false)).unwrap()), false).unwrap()).collect());
    // 2. the clients: even ones keep one connection alive, odd ones connect per request
    let t0 = Instant::now();
    let handles: Vec<_> = (0..CLIENTS)
        .map(|client| {
            let (prompts, expected) = (Arc::clone(&prompts), Arc::clone(&expected));
            std::thread::spawn(move || -> Vec<String> {
                let mut failures = Vec::new();
                let mut conn: Option<std::net::TcpStream> = None;
                for i in 0..REQUESTS_PER_CLIENT {
                    if t0.elapsed() > LIMIT {
                        failures.push(format!("client {}: out of time at request {}", client, i));
                        break;
                    }
                    let k = (client + i) % prompts.len();
                    let stream = (client + i) % 3 == 0;
                    let b = body(&prompts[k], stream);
                    let keep = client % 2 == 0;
                    let head = format!("POST /v1/chat/completions HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\nContent-Length: {}\r\n{}\r\n", b.len(), if keep { "" } else { "Connection: close\r\n" });
                    let mut c = match conn.take() {
                        Some(c) => c,
                        None => server::connect(port),
                    };
                    let result = c.write_all(format!("{}{}", head, b).as_bytes()).map_err(|e| e.to_string()).and_then(|_| read_response(&mut c).map_err(|e| e.to_string()));
                    match result.and_then(|r| reply_text(&r, stream)) {
                        Ok(text) if text == expected[k] => {}
                        Ok(text) => failures.push(format!("client {} request {}: prompt {} gave {:?}, alone {:?}", client, i, k, text, expected[k])),
                        Err(e) => failures.push(format!("client {} request {}: {}", client, i, e)),
                    }
                    if keep {
                        conn = Some(c);
                    }
                }
                failures
            })
        })
        .collect();
    let failures: Vec<String> = handles.into_iter().flat_map(|h| h.join().expect("client thread")).collect();
    let secs = t0.elapsed().as_secs_f64();
    assert!(failures.is_empty(), "{} of {} requests failed:\n{}", failures.len(), CLIENTS * REQUESTS_PER_CLIENT, failures.join("\n"));
    // 3. the server counted them all, and is still well (a response is counted once its last
    //    byte is written, which the client may read first: the count may lag by a moment)
    let want = CLIENTS * REQUESTS_PER_CLIENT + prompts.len();
    let counted = || -> (usize, String) {
        let metrics = server::get(port, "/metrics").text();
        let ok: f64 = metrics.lines().find(|l| l.starts_with("qwen3vl_http_responses_total{path=\"/v1/chat/completions\",code=\"200\"}")).and_then(|l| l.rsplit(' ').next()).and_then(|v| v.parse().ok()).unwrap_or(0.0);
        (ok as usize, metrics)
    };
    let mut seen = counted();
    for _ in 0..100 {
        if seen.0 == want {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
        seen = counted();
    }
    let (ok, metrics) = seen;
    assert_eq!(ok, want);
    assert!(metrics.contains("qwen3vl_queue_depth 0"), "{}", metrics);
    assert_eq!(server::get(port, "/health").status, 200);
    eprintln!("{} requests from {} clients in {:.1} s", CLIENTS * REQUESTS_PER_CLIENT, CLIENTS, secs);
    s.assert_no_panic();
}
