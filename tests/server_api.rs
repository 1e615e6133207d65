//! `qwen3-vl serve` over raw HTTP on 127.0.0.1: the endpoints, the same answers as `generate`,
//! streaming, stop strings, seeded sampling, OpenAI-style errors for bad requests and
//! malformed HTTP, time limits, the queue (429), cancellation by disconnect, and draining on
//! SIGTERM. Runs on the tiny full-vocabulary checkpoint of tests/fixtures/vision.

mod common;

use common::server::{self, chat, data_url, generate_greedy, get, image, metric, post, raw, read_response, Server};
use serde_json::{json, Value};
use std::io::{Read, Write};
use std::time::{Duration, Instant};

fn user(text: &str) -> Value {
    json!([{"role": "user", "content": text}])
}

fn content(r: &server::Response) -> String {
    assert_eq!(r.status, 200, "{}", r.text());
    r.json()["choices"][0]["message"]["content"].as_str().expect("content").to_string()
}

/// The text of a streamed reply, checking the event sequence on the way.
fn streamed(r: &server::Response) -> (String, String, Option<Value>) {
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.header("content-type"), Some("text/event-stream"));
    let events = r.events();
    assert_eq!(events.last().map(String::as_str), Some("[DONE]"), "{:?}", events);
    let chunks: Vec<Value> = events[..events.len() - 1].iter().map(|e| serde_json::from_str(e).expect("JSON chunk")).collect();
    assert_eq!(chunks[0]["choices"][0]["delta"]["role"], "assistant");
    let (mut text, mut finish, mut usage) = (String::new(), String::new(), None);
    for c in &chunks {
        assert_eq!(c["object"], "chat.completion.chunk");
        assert_eq!(c["id"], chunks[0]["id"], "one id per stream");
        if let Some(u) = c.get("usage") {
            assert!(c["choices"].as_array().unwrap().is_empty());
            usage = Some(u.clone());
            continue;
        }
        assert!(finish.is_empty(), "content after the finish reason");
        text.push_str(c["choices"][0]["delta"]["content"].as_str().unwrap_or(""));
        if let Some(f) = c["choices"][0]["finish_reason"].as_str() {
            finish = f.to_string();
        }
    }
    (text, finish, usage)
}

#[test]
fn endpoints_answer_and_unknown_ones_get_json_errors() {
    let s = Server::start(&[]);
    let h = get(s.port, "/health");
    assert_eq!((h.status, h.json()["status"].as_str()), (200, Some("ok")));
    let m = get(s.port, "/v1/models").json();
    assert_eq!((m["object"].as_str(), m["data"][0]["id"].as_str(), m["data"][0]["object"].as_str()), (Some("list"), Some("tiny"), Some("model")));
    assert_eq!(get(s.port, "/v1/models/tiny").status, 200);
    let r = get(s.port, "/v1/models/gpt-4");
    assert_eq!((r.status, r.error_code().as_str()), (404, "model_not_found"));
    let r = get(s.port, "/v2/whatever");
    assert_eq!((r.status, r.error_code().as_str()), (404, "not_found"));
    let r = post(s.port, "/health", "{}");
    assert_eq!((r.status, r.header("allow")), (405, Some("GET")));
    let r = get(s.port, "/v1/chat/completions");
    assert_eq!((r.status, r.header("allow")), (405, Some("POST")));
    let metrics = get(s.port, "/metrics");
    assert_eq!(metrics.status, 200);
    assert!(metrics.header("content-type").unwrap().starts_with("text/plain"));
    let t = metrics.text();
    for name in ["qwen3vl_http_responses_total{path=\"/health\",code=\"200\"} 1", "# TYPE qwen3vl_queue_depth gauge", "qwen3vl_time_to_first_token_seconds_count 0"] {
        assert!(t.contains(name), "{} not in\n{}", name, t);
    }
    s.assert_no_panic();
}

#[test]
fn greedy_replies_match_generate_for_text_and_images() {
    let s = Server::start(&[]);
    let mut hits = 0;
    let img = image("a_64x96.png");
    for (prompt, images) in [("Describe a cat in one sentence, then a dog in another, and say which you like more.", vec![]), ("What is in this picture?", vec![img.clone()])] {
        let want = generate_greedy(prompt, &images, 12);
        let mut parts: Vec<Value> = images.iter().map(|i| json!({"type": "image_url", "image_url": {"url": data_url(i, "image/png")}})).collect();
        parts.push(json!({"type": "text", "text": prompt}));
        let body = json!({"model": "tiny", "messages": [{"role": "user", "content": parts}], "max_tokens": 12, "temperature": 0});
        let r = chat(s.port, &body);
        let v = r.json();
        assert_eq!(content(&r), want, "non-streamed reply of {:?}", prompt);
        let usage = &v["usage"];
        let (p, c) = (usage["prompt_tokens"].as_u64().unwrap(), usage["completion_tokens"].as_u64().unwrap());
        assert!(p > if images.is_empty() { 5 } else { 20 } && usage["total_tokens"].as_u64() == Some(p + c));
        let finish = v["choices"][0]["finish_reason"].as_str().unwrap();
        assert_eq!(finish, if c == 12 { "length" } else { "stop" });
        assert_eq!((v["object"].as_str(), v["model"].as_str(), v["choices"][0]["message"]["role"].as_str()), (Some("chat.completion"), Some("tiny"), Some("assistant")));
        // the same, streamed, with the usage chunk
        let mut sb = body.clone();
        sb["stream"] = json!(true);
        sb["stream_options"] = json!({"include_usage": true});
        let (text, f, u) = streamed(&chat(s.port, &sb));
        assert_eq!((text.as_str(), f.as_str()), (want.as_str(), finish));
        // the repeat takes the prompt's whole 16-token blocks from the prefix cache (all but
        // the last token; with an image, all of its tokens or only the blocks before it)
        let mut u = u.unwrap();
        let cached = |u: &Value| u["prompt_tokens_details"]["cached_tokens"].as_u64();
        assert_eq!(cached(usage), Some(0), "the first request of its prompt");
        let c = cached(&u).unwrap();
        if images.is_empty() {
            assert_eq!(c, (p - 1) / 16 * 16, "{}", u);
        } else {
            assert!(c <= (p - 1) / 16 * 16 && c % 16 == 0, "{}", u);
        }
        hits += cached(&u).unwrap();
        u["prompt_tokens_details"] = usage["prompt_tokens_details"].clone();
        assert_eq!(u, *usage);
    }
    assert!(hits > 0);
    assert_eq!(metric(s.port, "qwen3vl_prefix_cache_hit_tokens_total"), hits as f64);
    s.assert_no_panic();
}

#[test]
fn videos_are_answered_as_generate_answers_them() {
    let s = Server::start(&[]);
    let dir = common::repo_root().join("tests/fixtures/video");
    let mut clips = vec![("gif_exact_12x64x96.gif", "image/gif")];
    let have_ffmpeg = qwen3_vl::video::find_ffmpeg(None).map_or(false, |p| p.is_file());
    if have_ffmpeg {
        clips.push(("h264_30x64x96.mp4", "video/mp4"));
    } else {
        assert!(std::env::var_os("CI").is_none(), "ffmpeg is not installed: .ci/run installs it");
    }
    for (file, mime) in clips {
        let path = dir.join(file);
        let out = server::cli("generate", &["-q", "--greedy", "--max-tokens", "8", "-p", "What happens?"]).arg("--video").arg(&path).output().unwrap();
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        let want = String::from_utf8(out.stdout).unwrap().trim_end_matches('\n').to_string();
        let parts = json!([{"type": "video_url", "video_url": {"url": data_url(&path, mime)}}, {"type": "text", "text": "What happens?"}]);
        let r = chat(s.port, &json!({"messages": [{"role": "user", "content": parts}], "max_tokens": 8, "temperature": 0}));
        assert_eq!(content(&r), want, "{}", file);
        assert!(r.json()["usage"]["prompt_tokens"].as_u64().unwrap() > 50, "{}", r.text());
    }
    // errors name the part
    let gif = data_url(&dir.join("gif_exact_12x64x96.gif"), "image/gif");
    let vid = |url: &str| json!({"type": "video_url", "video_url": {"url": url}});
    for (body, code, needle) in [
        (json!({"messages": [{"role": "user", "content": [vid("data:video/avi;base64,AAAA")]}]}), "unsupported_video_type", "video/avi"),
        // bytes that are no video: ffprobe says so, or without ffmpeg the error names the tool
        (json!({"messages": [{"role": "user", "content": [vid("data:video/mp4;base64,aGVsbG8gdGhlcmU=")]}]}), if have_ffmpeg { "invalid_video" } else { "video_unsupported" }, "messages[0].content[0].video_url"),
        (json!({"messages": [{"role": "user", "content": [vid(&gif), vid(&gif), vid(&gif)]}]}), "too_many_videos", "at most 2"),
        (json!({"messages": [{"role": "assistant", "content": [vid(&gif)]}]}), "invalid_value", "videos are only accepted in user messages"),
        (json!({"messages": [{"role": "user", "content": "<|video_pad|>"}]}), "invalid_value", "video_url parts"),
    ] {
        let r = chat(s.port, &body);
        assert_eq!(r.status, 400, "{}", r.text());
        assert_eq!(r.json()["error"]["code"].as_str(), Some(code), "{}", r.text());
        assert!(r.text().contains(needle), "{}", r.text());
    }
    s.assert_no_panic();
}

#[test]
fn stop_strings_end_the_reply_before_them() {
    let s = Server::start(&[]);
    let base = json!({"messages": user("Hello!"), "max_tokens": 16, "temperature": 0});
    let full = content(&chat(s.port, &base));
    let chars: Vec<char> = full.chars().collect();
    assert!(chars.len() >= 8, "the reply is long enough to cut: {:?}", full);
    let stop: String = chars[4..6].iter().collect();
    let want = &full[..full.find(&stop).unwrap()];
    let mut b = base.clone();
    b["stop"] = json!([stop, "never appears"]);
    let r = chat(s.port, &b);
    assert_eq!((content(&r).as_str(), r.json()["choices"][0]["finish_reason"].as_str()), (want, Some("stop")));
    b["stream"] = json!(true);
    let (text, finish, _) = streamed(&chat(s.port, &b));
    assert_eq!((text.as_str(), finish.as_str()), (want, "stop"));
    s.assert_no_panic();
}

#[test]
fn sampling_is_seeded_and_penalties_apply() {
    let s = Server::start(&[]);
    let body = |seed: u64| json!({"messages": user("Hello!"), "max_tokens": 10, "temperature": 1.0, "top_p": 0.95, "top_k": 50, "seed": seed});
    let a = content(&chat(s.port, &body(7)));
    assert_eq!(a, content(&chat(s.port, &body(7))), "same seed, same reply");
    let others: Vec<String> = (8..11).map(|k| content(&chat(s.port, &body(k)))).collect();
    assert!(others.iter().any(|o| *o != a), "other seeds should give another reply");
    // a strong presence penalty changes a greedy reply that repeats itself
    let greedy = json!({"messages": user("Hello!"), "max_tokens": 16, "temperature": 0});
    let plain = content(&chat(s.port, &greedy));
    let mut pen = greedy.clone();
    pen["presence_penalty"] = json!(2.0);
    pen["frequency_penalty"] = json!(2.0);
    let penalized = content(&chat(s.port, &pen));
    assert_ne!(plain, penalized);
    s.assert_no_panic();
}

#[test]
fn bad_requests_get_openai_errors_naming_the_problem() {
    let s = Server::start(&["--max-images", "2", "--max-image-pixels", "4096", "--max-prompt-tokens", "64", "--max-output-tokens", "100"]);
    let png = data_url(&image("b_50x70.png"), "image/png");
    let big = data_url(&image("a_64x96.png"), "image/png"); // 6144 pixels > 4096
    let truncated = png[..png.len() / 2].to_string();
    let img = |url: &str| json!({"role": "user", "content": [{"type": "image_url", "image_url": {"url": url}}, {"type": "text", "text": "?"}]});
    let cases: Vec<(String, u16, &str, &str)> = vec![
        ("{\"messages\": [".into(), 400, "invalid_json", "not valid JSON"),
        ("[1, 2]".into(), 400, "invalid_json", "JSON object"),
        ("{}".into(), 400, "missing_required_parameter", "'messages' is required"),
        (json!({"messages": "hi"}).to_string(), 400, "invalid_type", "'messages' must be an array"),
        (json!({"messages": user("hi"), "temperature": "warm"}).to_string(), 400, "invalid_type", "'temperature' must be a number"),
        (json!({"messages": user("hi"), "temperature": 3}).to_string(), 400, "invalid_value", "between 0 and 2"),
        (json!({"messages": user("hi"), "top_p": 1.5}).to_string(), 400, "invalid_value", "'top_p'"),
        (json!({"messages": user("hi"), "max_tokens": 0}).to_string(), 400, "invalid_value", "at least 1"),
        (json!({"messages": user("hi"), "max_tokens": 101}).to_string(), 400, "invalid_value", "at most 100"),
        (json!({"messages": user("hi"), "n": 17}).to_string(), 400, "invalid_value", "between 1 and 16"),
        (json!({"messages": user("hi"), "frobnicate": 1}).to_string(), 400, "unknown_parameter", "'frobnicate'"),
        (json!({"messages": user("hi"), "stream": "yes"}).to_string(), 400, "invalid_type", "'stream'"),
        (json!({"messages": user("hi"), "stop": [1]}).to_string(), 400, "invalid_type", "stop[0]"),
        (json!({"messages": user("hi"), "tools": [{"type": "function"}]}).to_string(), 400, "missing_required_parameter", "tools[0].function is required"),
        (json!({"messages": [{"role": "wizard", "content": "hi"}]}).to_string(), 400, "invalid_value", "unknown role"),
        (json!({"messages": [{"role": "user", "content": 5}]}).to_string(), 400, "invalid_type", "messages[0].content"),
        (json!({"messages": [img("https://example.com/cat.png")]}).to_string(), 400, "unsupported_image_url", "fetches nothing"),
        (json!({"messages": [img("/etc/passwd")]}).to_string(), 400, "unsupported_image_url", "--allowed-image-dir"),
        (json!({"messages": [img("data:image/png;base64,iVBOR$$$")]}).to_string(), 400, "invalid_base64", "invalid base64 character"),
        (json!({"messages": [img(&truncated)]}).to_string(), 400, "invalid_image", "messages[0].content[0].image_url"),
        (json!({"messages": [img("data:image/gif;base64,R0lGODlh")]}).to_string(), 400, "unsupported_image_type", "image/gif"),
        (json!({"messages": [img(&big)]}).to_string(), 400, "image_too_large", "96x64 is more pixels than the limit of 4096"),
        (json!({"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": png}, {"type": "image_url", "image_url": png}, {"type": "image_url", "image_url": png}]}]}).to_string(), 400, "too_many_images", "at most 2"),
        (json!({"messages": user(&"word ".repeat(200))}).to_string(), 400, "context_length_exceeded", "limit of 64"),
        (json!({"messages": user("<|image_pad|>")}).to_string(), 400, "invalid_value", "image_url parts"),
    ];
    for (body, status, code, words) in &cases {
        let r = post(s.port, "/v1/chat/completions", body);
        assert_eq!(r.status, *status, "{} -> {}", body.chars().take(120).collect::<String>(), r.text());
        assert_eq!(r.error_code(), *code, "{}", r.text());
        assert!(r.json()["error"]["message"].as_str().unwrap().contains(words), "{:?} not in {}", words, r.text());
    }
    // one good image still works after all that
    let r = chat(s.port, &json!({"messages": [img(&png)], "max_tokens": 3}));
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(get(s.port, "/health").status, 200);
    s.assert_no_panic();
}

#[test]
fn malformed_http_is_answered_and_the_server_goes_on() {
    let s = Server::start(&["--max-body-mib", "1"]);
    let p = s.port;
    let code = |raw_req: &[u8]| raw(p, raw_req).status;
    assert_eq!(code(b"THIS IS NOT HTTP\r\n\r\n"), 400);
    assert_eq!(code(b"GET / HTTP/1.1\r\nBad Header Line\r\n\r\n"), 400);
    assert_eq!(code(b"POST /v1/chat/completions HTTP/1.1\r\nContent-Length: abc\r\n\r\n"), 400);
    assert_eq!(code(b"POST /v1/chat/completions HTTP/1.1\r\nContent-Length: 5\r\nContent-Length: 6\r\n\r\nhello!"), 400);
    assert_eq!(code(b"POST /v1/chat/completions HTTP/1.1\r\nContent-Length: 999999999999\r\n\r\n"), 413);
    // a request whose last transfer coding is not chunked has no knowable length: 400 and close
    // (RFC 9112, 6.3)
    assert_eq!(code(b"POST /v1/chat/completions HTTP/1.1\r\nTransfer-Encoding: gzip\r\n\r\n"), 400);
    assert_eq!(code(b"POST /v1/chat/completions HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\nnot-hex\r\n"), 400);
    assert_eq!(code(format!("GET /health HTTP/1.1\r\nX-Big: {}\r\n\r\n", "a".repeat(20_000)).as_bytes()), 431);
    assert_eq!(code(b"POST /v1/chat/completions HTTP/1.1\r\nContent-Length: 0\r\n\r\n"), 400);
    // a body over the limit, actually sent
    let mut big = format!("POST /v1/chat/completions HTTP/1.1\r\nContent-Length: {}\r\n\r\n", 2 << 20).into_bytes();
    big.extend(std::iter::repeat(b'x').take(2 << 20));
    let mut c = server::connect(p);
    let _ = c.write_all(&big); // the server may close before reading it all
    assert_eq!(read_response(&mut c).unwrap().status, 413);
    // a chunked body and Expect: 100-continue are understood
    let body = json!({"messages": user("Hi"), "max_tokens": 2}).to_string();
    let (a, b) = body.split_at(10);
    let r = raw(p, format!("POST /v1/chat/completions HTTP/1.1\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n{:x}\r\n{}\r\n{:x}\r\n{}\r\n0\r\n\r\n", a.len(), a, b.len(), b).as_bytes());
    assert_eq!(r.status, 200, "{}", r.text());
    let mut c = server::connect(p);
    c.write_all(format!("POST /v1/chat/completions HTTP/1.1\r\nExpect: 100-continue\r\nContent-Length: {}\r\n\r\n", body.len()).as_bytes()).unwrap();
    let mut cont = [0u8; 25];
    c.read_exact(&mut cont).unwrap();
    assert_eq!(&cont, b"HTTP/1.1 100 Continue\r\n\r\n");
    c.write_all(body.as_bytes()).unwrap();
    assert_eq!(read_response(&mut c).unwrap().status, 200);
    // two pipelined requests on one keep-alive connection
    let mut c = server::connect(p);
    c.write_all(b"GET /health HTTP/1.1\r\n\r\nGET /v1/models HTTP/1.1\r\n\r\n").unwrap();
    assert_eq!(read_response(&mut c).unwrap().status, 200);
    assert_eq!(read_response(&mut c).unwrap().json()["object"], "list");
    assert_eq!(get(p, "/health").status, 200);
    s.assert_no_panic();
}

#[test]
fn slow_and_idle_clients_are_timed_out() {
    let s = Server::start(&["--read-timeout", "1"]);
    // a head that never completes: 408, then closed
    let t0 = Instant::now();
    let mut c = server::connect(s.port);
    c.write_all(b"POST /v1/chat/completions HTTP/1.1\r\nContent-Le").unwrap();
    let r = read_response(&mut c).unwrap();
    assert_eq!((r.status, r.error_code().as_str()), (408, "request_timeout"));
    assert!(t0.elapsed() < Duration::from_secs(10));
    // a trickle of bytes (one every 30 ms, for up to 8 s) is cut off after the read timeout
    let t0 = Instant::now();
    let mut c = server::connect(s.port);
    let mut writer = c.try_clone().unwrap();
    let trickle = std::thread::spawn(move || {
        for b in b"GET /health HTTP/1.1\r\nX-Slow: ".iter().chain([b'a'; 300].iter()) {
            if writer.write_all(&[*b]).is_err() || t0.elapsed() > Duration::from_secs(8) {
                break;
            }
            std::thread::sleep(Duration::from_millis(30));
        }
    });
    let r = read_response(&mut c).unwrap();
    let cut = t0.elapsed();
    assert_eq!(r.status, 408, "{}", r.text());
    assert!(cut < Duration::from_secs(4), "a trickling client held the connection for {:?}", cut);
    trickle.join().unwrap();
    // an idle keep-alive connection is closed
    let mut c = server::connect(s.port);
    let mut buf = [0u8; 1];
    assert_eq!(c.read(&mut buf).unwrap_or(0), 0, "the idle connection should be closed");
    assert_eq!(get(s.port, "/health").status, 200);
    s.assert_no_panic();
}

#[test]
fn local_images_only_from_the_allowed_directory() {
    let dir = common::repo_root().join("tests/fixtures/vision");
    let s = Server::start(&["--allowed-image-dir", dir.to_str().unwrap()]);
    let ask = |url: String| chat(s.port, &json!({"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": url}}, {"type": "text", "text": "What is this?"}]}], "max_tokens": 6, "temperature": 0}));
    let path = image("a_64x96.png");
    let by_file = content(&ask(format!("file://{}", path.display())));
    assert_eq!(by_file, content(&ask(path.display().to_string())));
    assert_eq!(by_file, content(&ask(data_url(&path, "image/png"))));
    let outside = common::repo_root().join("tests/fixtures/images/photo_50x70.jpg");
    for url in [outside.display().to_string(), format!("{}/../images/photo_50x70.jpg", dir.display()), format!("{}/missing.png", dir.display())] {
        let r = ask(url.clone());
        assert_eq!((r.status, r.error_code().as_str()), (400, "image_not_allowed"), "{}", url);
    }
    s.assert_no_panic();
}

/// Opens a streamed request and waits for its first content chunk: the model is busy with it.
fn start_long_stream(port: u16, max_tokens: usize) -> std::net::TcpStream {
    let body = json!({"messages": user("Tell me a long story."), "max_tokens": max_tokens, "temperature": 0, "stream": true}).to_string();
    let mut c = server::connect(port);
    c.write_all(format!("POST /v1/chat/completions HTTP/1.1\r\nContent-Length: {}\r\n\r\n{}", body.len(), body).as_bytes()).unwrap();
    let mut seen = Vec::new();
    let mut buf = [0u8; 4096];
    while !String::from_utf8_lossy(&seen).contains("\"content\":\"") || String::from_utf8_lossy(&seen).matches("data: ").count() < 2 {
        let n = c.read(&mut buf).unwrap();
        assert!(n > 0, "the stream ended early: {}", String::from_utf8_lossy(&seen));
        seen.extend_from_slice(&buf[..n]);
    }
    c
}

#[test]
fn a_full_queue_answers_429_and_a_disconnect_cancels() {
    // a batch of one: the second request waits in the queue
    let s = Server::start(&["--queue", "1", "--max-batch", "1", "--max-output-tokens", "100000"]);
    // 1. one request generating, one waiting: the next is refused with Retry-After
    let long = start_long_stream(s.port, 100_000);
    let port = s.port;
    let waiting = std::thread::spawn(move || chat(port, &json!({"messages": user("Hi"), "max_tokens": 3})));
    let t0 = Instant::now();
    while metric(s.port, "qwen3vl_queue_depth") < 1.0 {
        assert!(t0.elapsed() < Duration::from_secs(30), "the second request never queued");
        std::thread::sleep(Duration::from_millis(20));
    }
    let r = chat(s.port, &json!({"messages": user("Hi"), "max_tokens": 3}));
    assert_eq!((r.status, r.error_code().as_str()), (429, "queue_full"), "{}", r.text());
    let retry: u64 = r.header("retry-after").expect("Retry-After").parse().unwrap();
    assert!(retry >= 1);
    // 2. the streaming client leaves: its generation stops and the waiting request runs
    let t0 = Instant::now();
    drop(long);
    let r = waiting.join().unwrap();
    assert_eq!(r.status, 200, "{}", r.text());
    assert!(t0.elapsed() < Duration::from_secs(30), "the cancelled generation held the model for {:?}", t0.elapsed());
    assert_eq!(metric(s.port, "qwen3vl_requests_finished_total{reason=\"cancelled\"}"), 1.0);
    assert!(metric(s.port, "qwen3vl_completion_tokens_total") < 50_000.0);
    // 3. a non-streamed request whose client leaves is cancelled too
    let body = json!({"messages": user("Another long story."), "max_tokens": 100_000, "temperature": 0}).to_string();
    let mut c = server::connect(s.port);
    c.write_all(format!("POST /v1/chat/completions HTTP/1.1\r\nContent-Length: {}\r\n\r\n{}", body.len(), body).as_bytes()).unwrap();
    let t0 = Instant::now();
    while metric(s.port, "qwen3vl_requests_running") < 1.0 {
        assert!(t0.elapsed() < Duration::from_secs(30));
        std::thread::sleep(Duration::from_millis(20));
    }
    drop(c);
    let t0 = Instant::now();
    while metric(s.port, "qwen3vl_requests_finished_total{reason=\"cancelled\"}") < 2.0 {
        assert!(t0.elapsed() < Duration::from_secs(30), "the non-streamed request was not cancelled");
        std::thread::sleep(Duration::from_millis(50));
    }
    s.assert_no_panic();
}

#[test]
fn requests_run_together_and_leaving_clients_free_their_kv_blocks() {
    let s = Server::start(&["--max-batch", "3", "--max-output-tokens", "100000"]);
    // 1. three long streams generate at once (one batch), a fourth waits in the queue
    let streams: Vec<_> = (0..3).map(|_| start_long_stream(s.port, 100_000)).collect();
    let t0 = Instant::now();
    while metric(s.port, "qwen3vl_requests_running") < 3.0 {
        assert!(t0.elapsed() < Duration::from_secs(30), "the three requests never ran together");
        std::thread::sleep(Duration::from_millis(20));
    }
    assert!(metric(s.port, "qwen3vl_kv_blocks_used") >= 3.0);
    // a short request still finishes while they run: it waits for a slot, then runs beside two
    let port = s.port;
    let short = std::thread::spawn(move || chat(port, &json!({"messages": user("Hi"), "max_tokens": 3})));
    std::thread::sleep(Duration::from_millis(200));
    let mut streams = streams.into_iter();
    drop(streams.next());
    let r = short.join().unwrap();
    assert_eq!(r.status, 200, "{}", r.text());
    // 2. the other clients leave: every block is free again
    drop(streams);
    let t0 = Instant::now();
    while metric(s.port, "qwen3vl_requests_finished_total{reason=\"cancelled\"}") < 3.0 || metric(s.port, "qwen3vl_kv_blocks_used") > 0.0 {
        assert!(t0.elapsed() < Duration::from_secs(30), "the cancelled requests kept their blocks");
        std::thread::sleep(Duration::from_millis(50));
    }
    s.assert_no_panic();
}

#[test]
fn sigterm_finishes_accepted_requests_then_exits() {
    let mut s = Server::start(&[]);
    let port = s.port;
    // a request in flight when the signal arrives
    let mut c = start_long_stream(port, 300);
    s.terminate();
    let mut rest = Vec::new();
    c.read_to_end(&mut rest).unwrap();
    let rest = String::from_utf8_lossy(&rest);
    assert!(rest.contains("\"finish_reason\":\"") && rest.contains("data: [DONE]"), "the in-flight reply was cut: {}", rest);
    let status = s.wait(Duration::from_secs(60)).expect("the server exits after draining");
    assert!(status.success(), "exit status {:?}", status);
    assert!(s.log().contains("server stopped"), "{}", s.log());
    assert!(std::net::TcpStream::connect(("127.0.0.1", port)).is_err(), "no longer listening");
    s.assert_no_panic();
}

#[test]
fn images_that_cannot_fit_are_refused_before_decoding() {
    // 200x300 becomes 192x288 pixels: 6 x 9 = 54 image tokens; two exceed a limit of 100
    let s = Server::start(&["--max-prompt-tokens", "100"]);
    let url = data_url(&common::repo_root().join("tests/fixtures/images/big_200x300.png"), "image/png");
    let part = json!({"type": "image_url", "image_url": {"url": url}});
    let r = chat(s.port, &json!({"messages": [{"role": "user", "content": [part, part, {"type": "text", "text": "?"}]}]}));
    assert_eq!((r.status, r.error_code().as_str()), (400, "context_length_exceeded"), "{}", r.text());
    assert!(r.text().contains("messages[0].content[1].image_url take 108 tokens"), "{}", r.text());
    let r = chat(s.port, &json!({"messages": [{"role": "user", "content": [part, {"type": "text", "text": "?"}]}], "max_tokens": 2}));
    assert_eq!(r.status, 200, "{}", r.text());
    assert!(r.json()["usage"]["prompt_tokens"].as_u64().unwrap() > 54);
    s.assert_no_panic();
}

#[test]
fn hot_sampling_never_picks_an_id_the_tokenizer_lacks() {
    // seed 4 at temperature 1 picked padding id 151,891 within 500 tokens before sampling was
    // limited to the tokenizer's ids (tests/cli.rs, PADDING_SEEDS): a 500 then, and an error
    // event in a stream
    let s = Server::start(&[]);
    let body = |stream: bool| json!({"messages": user("Hi"), "temperature": 1, "seed": 4, "max_tokens": 500, "stream": stream});
    let r = chat(s.port, &body(false));
    assert_eq!(r.status, 200, "{}", r.text());
    assert!(!content(&r).is_empty());
    let (text, finish, _) = streamed(&chat(s.port, &body(true)));
    assert!(!text.is_empty() && (finish == "stop" || finish == "length"), "{} {:?}", finish, text);
    assert_eq!(text, content(&r), "the same seed streams the same reply");
    s.assert_no_panic();
}
