//! `qwen3-vl batch` on the tiny fixture model: a file in the OpenAI Batch format answered as
//! `serve` answers the same bodies (text, an image by path, a JSON schema, a completion), broken
//! lines and failing requests as error lines while the rest go on, a rerun that redoes nothing,
//! and stdin/stdout.

mod common;

use common::server::{cli, image, post, Server};
use common::Scratch;
use serde_json::{json, Value};
use std::collections::HashMap;
use std::io::Write;
use std::path::Path;
use std::process::Stdio;

/// A fresh scratch folder, removed when dropped.
fn temp_dir(name: &str) -> Scratch {
    Scratch::dir(&format!("qwen3-vl-batch-{}-{}", name, std::process::id()))
}

/// The request bodies of the test, by custom_id, with their URLs.
fn requests(images: &Path) -> Vec<(String, &'static str, Value)> {
    let img = images.join("a_64x96.png");
    let schema = json!({"type": "object", "properties": {"name": {"type": "string", "maxLength": 6}, "n": {"type": "integer"}}, "required": ["name", "n"], "additionalProperties": false});
    vec![
        ("text".into(), "/v1/chat/completions", json!({"messages": [{"role": "user", "content": "Say hello."}], "max_tokens": 8, "temperature": 0})),
        (
            "image".into(),
            "/v1/chat/completions",
            json!({"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": img.to_str().unwrap()}}, {"type": "text", "text": "What is it?"}]}], "max_tokens": 6, "temperature": 0}),
        ),
        (
            "schema".into(),
            "/v1/chat/completions",
            json!({"messages": [{"role": "user", "content": "A person as JSON."}], "max_tokens": 40, "temperature": 0, "response_format": {"type": "json_schema", "json_schema": {"name": "p", "schema": schema, "strict": true}}}),
        ),
        ("completion".into(), "/v1/completions", json!({"prompt": "Once upon a time", "max_tokens": 5, "temperature": 0})),
        ("sampled".into(), "/v1/chat/completions", json!({"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 6, "temperature": 0.8, "seed": 7, "n": 2})),
    ]
}

fn line(id: &str, url: &str, body: &Value) -> String {
    json!({"custom_id": id, "method": "POST", "url": url, "body": body}).to_string()
}

fn read_results(p: &Path) -> Vec<Value> {
    std::fs::read_to_string(p).unwrap().lines().map(|l| serde_json::from_str(l).expect("each output line is JSON")).collect()
}

fn by_id(results: &[Value]) -> HashMap<String, Value> {
    results.iter().filter_map(|r| Some((r["custom_id"].as_str()?.to_string(), r.clone()))).collect()
}

/// What must agree between two answers to one body: the choices (text, tool calls, finish
/// reasons) and the usage.
fn essence(body: &Value) -> Value {
    let choices: Vec<Value> = body["choices"].as_array().unwrap().iter().map(|c| json!([c["index"], c["message"], c["text"], c["finish_reason"]])).collect();
    json!({"object": body["object"], "choices": choices, "usage": body["usage"]})
}

#[test]
fn batch_answers_as_serve_does_and_resumes() {
    let dir = temp_dir("main");
    let images = std::fs::canonicalize(image("")).unwrap();
    let input = dir.join("in.jsonl");
    let output = dir.join("out.jsonl");
    // 1. the requests, a broken line, a missing image, a duplicate id and a wrong URL
    let reqs = requests(&images);
    let mut text: Vec<String> = reqs.iter().map(|(id, url, b)| line(id, url, b)).collect();
    text.insert(2, "{not json".into());
    text.push(line("missing", "/v1/chat/completions", &json!({"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": images.join("nope.png").to_str().unwrap()}}]}]})));
    text.push(line("text", "/v1/chat/completions", &json!({"messages": [{"role": "user", "content": "again"}]})));
    text.push(json!({"custom_id": "url", "method": "POST", "url": "/v1/embeddings", "body": {}}).to_string());
    text.push(String::new());
    std::fs::write(&input, text.join("\n") + "\n").unwrap();
    let dir_arg = images.to_str().unwrap();
    let run = |extra: &[&str]| {
        let out = cli("batch", &["--device", "cpu", "--allowed-image-dir", dir_arg, "-i", input.to_str().unwrap(), "-o", output.to_str().unwrap()]).args(extra).output().expect("run qwen3-vl batch");
        let log = String::from_utf8_lossy(&out.stderr).into_owned();
        assert!(out.status.success(), "batch failed: {}", log);
        assert!(!log.contains("panicked"), "{}", log);
        log
    };
    let log = run(&["--max-batch", "4"]);
    assert!(log.contains("5 answered, 4 errors, 0 skipped"), "{}", log);
    // 2. one line per input line (the blank one aside), each in the Batch output shape
    let results = read_results(&output);
    assert_eq!(results.len(), 9, "{:#?}", results);
    for r in &results {
        assert!(r["id"].as_str().unwrap().starts_with("batch_req_"), "{}", r);
        assert!(r["response"].is_null() != r["error"].is_null(), "either a response or an error: {}", r);
    }
    let broken: Vec<&Value> = results.iter().filter(|r| r["custom_id"].is_null()).collect();
    assert_eq!(broken.len(), 1);
    assert!(broken[0]["error"]["message"].as_str().unwrap().starts_with("line 3:"), "{}", broken[0]);
    let ids = by_id(&results);
    let missing = &ids["missing"]["response"];
    assert_eq!(missing["status_code"], 400, "{}", missing);
    assert!(missing["body"]["error"]["message"].as_str().unwrap().contains("nope.png"), "{}", missing);
    assert!(ids["url"]["error"]["message"].as_str().unwrap().contains("/v1/embeddings"));
    let dup: Vec<&Value> = results.iter().filter(|r| r["custom_id"] == "text").collect();
    assert_eq!(dup.len(), 2);
    assert!(dup.iter().any(|r| r["error"]["message"].as_str().is_some_and(|m| m.contains("more than once"))), "{:?}", dup);
    // 3. the answers equal serve's for the same bodies
    let server = Server::start(&["--device", "cpu", "--allowed-image-dir", dir_arg]);
    for (id, url, body) in &reqs {
        let r = results.iter().find(|r| r["custom_id"] == id.as_str() && r["error"].is_null()).unwrap_or_else(|| panic!("no answer for {}", id));
        assert_eq!(r["response"]["status_code"], 200, "{}: {}", id, r);
        let batch_body = &r["response"]["body"];
        assert_eq!(r["response"]["request_id"], batch_body["id"]);
        let served = post(server.port, url, &body.to_string());
        assert_eq!(served.status, 200, "{}: {}", id, served.text());
        assert_eq!(essence(batch_body), essence(&served.json()), "{}: batch and serve differ", id);
    }
    let schema_text = ids["schema"]["response"]["body"]["choices"][0]["message"]["content"].as_str().unwrap().to_string();
    let v: Value = serde_json::from_str(&schema_text).unwrap_or_else(|e| panic!("schema answer {:?} is not JSON: {}", schema_text, e));
    assert!(v["name"].is_string() && v["n"].is_i64(), "{}", v);
    // 4. a rerun redoes nothing; after a line is lost (and a torn one is left), only it is redone
    let log = run(&[]);
    assert!(log.contains("0 answered, 0 errors, 9 skipped"), "{}", log);
    assert_eq!(read_results(&output).len(), 9, "a rerun wrote lines");
    let kept: Vec<String> = std::fs::read_to_string(&output).unwrap().lines().filter(|l| !l.contains("\"custom_id\":\"completion\"")).map(String::from).collect();
    std::fs::write(&output, kept.join("\n") + "\n{\"custom_id\":\"x\",\"resp").unwrap();
    let log = run(&[]);
    assert!(log.contains("1 answered"), "{}", log);
    let again = read_results(&output);
    assert_eq!(again.len(), 9);
    assert_eq!(again.iter().filter(|r| r["custom_id"] == "completion").count(), 1);
}

#[test]
fn batch_reads_stdin_and_writes_stdout() {
    let body = json!({"messages": [{"role": "user", "content": "Say hello."}], "max_tokens": 4, "temperature": 0});
    let input = format!("{}\n{}\n", line("a", "/v1/chat/completions", &body), line("b", "/v1/completions", &json!({"prompt": "Hi", "max_tokens": 3})));
    let mut child = cli("batch", &["--device", "cpu", "-q", "-i", "-", "-o", "-"]).stdin(Stdio::piped()).stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().unwrap();
    child.stdin.take().unwrap().write_all(input.as_bytes()).unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let lines: Vec<Value> = String::from_utf8(out.stdout).unwrap().lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    assert_eq!(lines.len(), 2);
    let ids = by_id(&lines);
    assert_eq!(ids["a"]["response"]["body"]["object"], "chat.completion");
    assert_eq!(ids["b"]["response"]["body"]["object"], "text_completion");
}

#[test]
fn batch_reads_a_named_pipe_once() {
    // `-i <(...)` or a FIFO: read once, no second pass over it (which would take its lines,
    // or wait for a writer that is gone)
    let dir = temp_dir("fifo");
    let (fifo, output) = (dir.join("in.jsonl"), dir.join("out.jsonl"));
    let path = std::ffi::CString::new(fifo.to_str().unwrap()).unwrap();
    assert_eq!(unsafe { libc::mkfifo(path.as_ptr(), 0o600) }, 0, "mkfifo: {}", std::io::Error::last_os_error());
    let body = json!({"prompt": "Hi", "max_tokens": 3});
    let input: String = ["a", "b", "c"].iter().map(|id| line(id, "/v1/completions", &body) + "\n").collect();
    let mut child = cli("batch", &["--device", "cpu", "-q", "-i", fifo.to_str().unwrap(), "-o", output.to_str().unwrap()]).stdin(Stdio::null()).stderr(Stdio::piped()).spawn().unwrap();
    let writer = std::thread::spawn(move || std::fs::write(&fifo, input).unwrap());
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(120);
    while child.try_wait().unwrap().is_none() {
        if std::time::Instant::now() > deadline {
            let _ = child.kill();
            panic!("batch on a named pipe did not finish in 120 s");
        }
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    writer.join().unwrap();
    let ids = by_id(&read_results(&output));
    for id in ["a", "b", "c"] {
        assert_eq!(ids[id]["response"]["status_code"], 200, "{}: {:?}", id, ids.get(id));
    }
}
