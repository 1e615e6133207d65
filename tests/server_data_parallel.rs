//! `serve --data-parallel N` on loopback with CPU replicas of the tiny model: greedy answers
//! equal one replica's, both replicas serve concurrent requests (their log lines say which
//! replica finished what), a repeated long prompt stays on the replica that cached it, and
//! impossible device flags are refused before the weights load.

mod common;

use common::server::{chat, cli, get, Server};
use serde_json::{json, Value};
use std::collections::HashMap;

const DP2: &[&str] = &["--device", "cpu", "--data-parallel", "2", "--threads", "1", "--max-batch", "4"];

fn ask(port: u16, text: &str, max_tokens: usize) -> String {
    let r = chat(port, &json!({"model": "tiny", "messages": [{"role": "user", "content": text}], "max_tokens": max_tokens, "temperature": 0}));
    assert_eq!(r.status, 200, "{}", r.text());
    let v: Value = r.json();
    v["choices"][0]["message"]["content"].as_str().expect("a reply").to_string()
}

/// `(replica, prompt tokens, tokens from the prefix cache)` of every finished request in a
/// replica's log lines (`info: replica R: [ID] P prompt (C from the prefix cache) + ...`).
fn finished(log: &str) -> Vec<(usize, usize, usize)> {
    log.lines()
        .filter_map(|l| {
            let rest = l.strip_prefix("info: replica ")?;
            let (r, rest) = rest.split_once(": ")?;
            let rest = rest.split_once("] ").filter(|_| rest.starts_with('[')).map_or(rest, |(_, r)| r);
            let (p, rest) = rest.split_once(" prompt (")?;
            let (c, _) = rest.split_once(" from the prefix cache")?;
            Some((r.parse().ok()?, p.parse().ok()?, c.parse().ok()?))
        })
        .collect()
}

/// The finished requests of `s`'s log once there are `n` (the log is read from the server's
/// stderr on a thread of its own, which may lag the replies a little).
fn wait_finished(s: &Server, n: usize) -> Vec<(usize, usize, usize)> {
    let t0 = std::time::Instant::now();
    loop {
        let done = finished(&s.log());
        if done.len() >= n || t0.elapsed() > std::time::Duration::from_secs(10) {
            return done;
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
}

#[test]
fn two_cpu_replicas_answer_as_one_and_both_serve() {
    let prompts: Vec<String> = (0..8).map(|i| format!("Question {}: name a color and a number.", i)).collect();
    // 1. one replica's greedy answers
    let one = Server::start(&["--device", "cpu", "--threads", "1"]);
    let want: Vec<String> = prompts.iter().map(|p| ask(one.port, p, 8)).collect();
    drop(one);
    // 2. two replicas, all prompts at once
    let s = Server::start(DP2);
    assert_eq!(get(s.port, "/health").status, 200);
    let got: Vec<String> = std::thread::scope(|sc| {
        let hs: Vec<_> = prompts.iter().map(|p| sc.spawn(move || ask(s.port, p, 8))).collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    });
    assert_eq!(got, want, "the replicas' greedy answers differ from one replica's");
    // 3. both replicas finished requests, and the log says so per replica
    let done = wait_finished(&s, prompts.len());
    assert_eq!(done.len(), prompts.len(), "one finish line per request:\n{}", s.log());
    for r in 0..2 {
        assert!(done.iter().any(|d| d.0 == r), "replica {} served nothing: {:?}\n{}", r, done, s.log());
    }
    for r in 0..2 {
        assert!(s.log().contains(&format!("info: replica {}: engine on CPU", r)), "replica {}'s engine did not log its start:\n{}", r, s.log());
    }
    s.assert_no_panic();
}

#[test]
fn a_repeated_long_prompt_stays_on_the_replica_that_cached_it() {
    let s = Server::start(DP2);
    let long = format!("Read this and answer briefly. {}", "The quick brown fox jumps over the lazy dog. ".repeat(30));
    // the long prompt, then 1, 2, 3, 4 short ones (no whole block in common): the short ones
    // take turns between the idle replicas, so without its cache the long one would move too
    for i in 0..4 {
        ask(s.port, &long, 2);
        for j in 0..=i {
            ask(s.port, &format!("Short question {}.{}?", i, j), 2);
        }
    }
    let done = wait_finished(&s, 14);
    let longest = done.iter().map(|d| d.1).max().expect("finished requests");
    let long_runs: Vec<&(usize, usize, usize)> = done.iter().filter(|d| d.1 == longest).collect();
    assert_eq!(long_runs.len(), 4, "{:?}", done);
    assert!(long_runs.iter().all(|d| d.0 == long_runs[0].0), "the long prompt moved between replicas: {:?}", long_runs);
    assert!(long_runs[1..].iter().all(|d| d.2 > longest / 2), "repeats did not come from the prefix cache: {:?}", long_runs);
    let short_replicas: HashMap<usize, usize> = done.iter().filter(|d| d.1 < longest).fold(HashMap::new(), |mut m, d| {
        *m.entry(d.0).or_default() += 1;
        m
    });
    assert_eq!(short_replicas.len(), 2, "short prompts should spread over both replicas: {:?}", done);
    s.assert_no_panic();
}

#[test]
fn impossible_device_flags_are_refused_by_name() {
    for (args, says) in [
        (&["--device", "cpu", "--devices", "0"][..], "--devices picks CUDA devices"),
        (&["--device", "cpu", "--data-parallel", "0"][..], "--data-parallel"),
        (&["--device", "cuda:1", "--devices", "0,1"][..], "--device cuda:1 and --devices"),
        (&["--device", "cpu", "--devices", "0,0"][..], "listed twice"),
    ] {
        let out = cli("serve", &[&["--port", "0"][..], args].concat()).output().expect("run serve");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success() && err.contains(says), "{:?}: {}", args, err);
    }
    // without CUDA, several replicas need --device cpu
    if qwen3_vl::cuda_device_count().map_or(true, |n| n < 2) {
        let out = cli("serve", &["--port", "0", "--data-parallel", "2"]).output().expect("run serve");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success() && err.contains("--data-parallel") && err.contains("--device cpu"), "{}", err);
    }
}
