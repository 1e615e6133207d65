//! `qwen3-vl serve`'s HTTP side under unfriendly clients, on loopback: idle connections that
//! must not shut others out, one client's connection limit, half-closed connections, a huge
//! prompt, a full queue with images, a burst past the places for requests being read, refusals
//! at the connection limit, HTTP/1.0 streaming, and `/health` while the model loads. Clients
//! that must look like other hosts bind to other loopback addresses (127.0.0.2, ...). Runs on
//! the tiny checkpoint of tests/fixtures/vision.

mod common;

use common::server::{self, chat, connect, data_url, get, metric, read_response, wait_for, Server};
use serde_json::{json, Value};
use std::io::{Read, Write};
use std::net::{Ipv4Addr, Shutdown, TcpStream};
use std::os::unix::io::FromRawFd;
use std::time::{Duration, Instant};

fn user(text: &str) -> Value {
    json!([{"role": "user", "content": text}])
}

/// A connection to `port` from the loopback address `from` (another "client").
fn connect_from(from: Ipv4Addr, port: u16) -> TcpStream {
    // SAFETY: a new socket, bound and connected with valid sockaddr_in values; on success its
    // descriptor is handed to the TcpStream, which owns it from then on.
    unsafe {
        let fd = libc::socket(libc::AF_INET, libc::SOCK_STREAM, 0);
        assert!(fd >= 0, "socket: {}", std::io::Error::last_os_error());
        let addr = |ip: Ipv4Addr, port: u16| libc::sockaddr_in {
            sin_family: libc::AF_INET as libc::sa_family_t,
            sin_port: port.to_be(),
            sin_addr: libc::in_addr { s_addr: u32::from(ip).to_be() },
            sin_zero: [0; 8],
        };
        let len = std::mem::size_of::<libc::sockaddr_in>() as libc::socklen_t;
        let local = addr(from, 0);
        assert_eq!(libc::bind(fd, &local as *const _ as *const libc::sockaddr, len), 0, "bind {}: {}", from, std::io::Error::last_os_error());
        let remote = addr(Ipv4Addr::LOCALHOST, port);
        assert_eq!(libc::connect(fd, &remote as *const _ as *const libc::sockaddr, len), 0, "connect: {}", std::io::Error::last_os_error());
        let s = TcpStream::from_raw_fd(fd);
        s.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
        s
    }
}

fn send(c: &mut TcpStream, raw: &str) -> server::Response {
    c.write_all(raw.as_bytes()).unwrap();
    read_response(c).expect("a response")
}

fn get_on(c: &mut TcpStream, path: &str) -> server::Response {
    send(c, &format!("GET {} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n", path))
}

fn chat_request(body: &Value, version: &str) -> String {
    let b = body.to_string();
    format!("POST /v1/chat/completions {}\r\nHost: x\r\nContent-Length: {}\r\n\r\n{}", version, b.len(), b)
}

#[test]
fn idle_connections_hold_no_place_that_requests_need() {
    // 64 idle sockets of one client took every slot for --read-timeout (30 s): /health got 503
    let s = Server::start(&[]);
    let idle: Vec<TcpStream> = (0..64).map(|_| connect_from(Ipv4Addr::new(127, 0, 0, 2), s.port)).collect();
    std::thread::sleep(Duration::from_millis(300));
    let t0 = Instant::now();
    let h = get(s.port, "/health");
    assert_eq!(h.status, 200, "{}", h.text());
    let r = chat(s.port, &json!({"messages": user("Hi"), "max_tokens": 2}));
    assert_eq!(r.status, 200, "{}", r.text());
    assert!(t0.elapsed() < Duration::from_secs(20), "{:?}", t0.elapsed());
    assert!(metric(s.port, "qwen3vl_open_connections") >= 64.0);
    drop(idle);
    s.assert_no_panic();
}

#[test]
fn one_client_cannot_take_every_connection() {
    let s = Server::start(&["--max-client-connections", "4"]);
    let other = Ipv4Addr::new(127, 0, 0, 3);
    let held: Vec<TcpStream> = (0..4).map(|_| connect_from(other, s.port)).collect();
    std::thread::sleep(Duration::from_millis(300));
    // its fifth connection is answered (not dropped): 503 with Retry-After
    let r = get_on(&mut connect_from(other, s.port), "/health");
    assert_eq!((r.status, r.error_code().as_str()), (503, "too_many_connections"), "{}", r.text());
    assert!(r.json()["error"]["message"].as_str().unwrap().contains("this client"), "{}", r.text());
    assert_eq!(r.header("retry-after"), Some("1"));
    // another client is served meanwhile
    assert_eq!(get(s.port, "/health").status, 200);
    // once it closes its connections it may open new ones
    drop(held);
    wait_for(30, "the client's places to be released", || get_on(&mut connect_from(other, s.port), "/health").status == 200);
    s.assert_no_panic();
}

#[test]
fn a_half_closed_client_still_gets_its_reply_and_a_closed_one_cancels() {
    let s = Server::start(&["--max-batch", "1", "--max-output-tokens", "100000"]);
    // 1. shutdown(SHUT_WR) after the request: the reply still comes, whole and streamed
    let want = chat(s.port, &json!({"messages": user("Describe a cat."), "max_tokens": 8, "temperature": 0}));
    assert_eq!(want.status, 200, "{}", want.text());
    for stream in [false, true] {
        let mut c = connect(s.port);
        c.write_all(chat_request(&json!({"messages": user("Describe a cat."), "max_tokens": 8, "temperature": 0, "stream": stream}), "HTTP/1.1").as_bytes()).unwrap();
        c.shutdown(Shutdown::Write).unwrap();
        let r = read_response(&mut c).expect("a reply after the half-close");
        assert_eq!(r.status, 200, "stream {}: {}", stream, r.text());
        if stream {
            assert!(r.text().contains("data: [DONE]"), "{}", r.text());
        } else {
            assert_eq!(r.json()["choices"][0]["message"], want.json()["choices"][0]["message"]);
        }
    }
    // 2. a half-closed client that then closes its socket: its request is cancelled
    let mut c = connect(s.port);
    c.write_all(chat_request(&json!({"messages": user("A long story."), "max_tokens": 100_000, "temperature": 0}), "HTTP/1.1").as_bytes()).unwrap();
    c.shutdown(Shutdown::Write).unwrap();
    wait_for(30, "the request to run", || metric(s.port, "qwen3vl_requests_running") >= 1.0);
    std::thread::sleep(Duration::from_millis(300));
    assert_eq!(metric(s.port, "qwen3vl_requests_finished_total{reason=\"cancelled\"}"), 0.0, "a half-close cancelled the request");
    drop(c);
    wait_for(30, "the request to be cancelled", || metric(s.port, "qwen3vl_requests_finished_total{reason=\"cancelled\"}") >= 1.0);
    s.assert_no_panic();
}

#[test]
fn a_huge_prompt_is_refused_by_its_size_before_it_is_tokenized() {
    let s = Server::start(&[]);
    let body = json!({"messages": user(&"hello ".repeat(5 << 20)), "max_tokens": 2}).to_string();
    assert!(body.len() > 30 << 20);
    let t0 = Instant::now();
    let r = server::post(s.port, "/v1/chat/completions", &body);
    assert_eq!((r.status, r.error_code().as_str()), (400, "context_length_exceeded"), "{}", r.text().chars().take(300).collect::<String>());
    assert!(r.json()["error"]["message"].as_str().unwrap().contains("bytes, more than can fit"), "{}", r.text());
    assert!(t0.elapsed() < Duration::from_secs(30), "{:?}", t0.elapsed());
    assert_eq!(chat(s.port, &json!({"messages": user("Hi"), "max_tokens": 2})).status, 200);
    s.assert_no_panic();
}

#[test]
fn a_full_queue_refuses_before_decoding_images() {
    let s = Server::start(&["--queue", "1", "--max-batch", "1", "--max-output-tokens", "100000"]);
    // one request generating, one waiting: the queue is full
    let body = json!({"messages": user("Tell me a long story."), "max_tokens": 100_000, "temperature": 0, "stream": true});
    let mut long = connect(s.port);
    long.write_all(chat_request(&body, "HTTP/1.1").as_bytes()).unwrap();
    wait_for(30, "the long request to run", || metric(s.port, "qwen3vl_requests_running") >= 1.0);
    let port = s.port;
    let waiting = std::thread::spawn(move || chat(port, &json!({"messages": user("Hi"), "max_tokens": 2})));
    wait_for(30, "the second request to queue", || metric(s.port, "qwen3vl_queue_depth") >= 1.0);
    // an image that cannot be decoded (a PNG cut after its header): the queue answers first
    let png = std::fs::read(common::repo_root().join("tests/fixtures/images/big_200x300.png")).unwrap();
    let cut = format!("data:image/png;base64,{}", server::base64(&png[..png.len().min(120)]));
    let r = chat(s.port, &json!({"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": cut}}, {"type": "text", "text": "?"}]}]}));
    assert_eq!((r.status, r.error_code().as_str()), (429, "queue_full"), "{}", r.text());
    assert!(r.header("retry-after").is_some());
    drop(long);
    assert_eq!(waiting.join().unwrap().status, 200);
    // with room, the same image is decoded and refused for what it is
    let r = chat(s.port, &json!({"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": cut}}, {"type": "text", "text": "?"}]}]}));
    assert_eq!((r.status, r.error_code().as_str()), (400, "invalid_image"), "{}", r.text());
    s.assert_no_panic();
}

#[test]
fn a_burst_past_the_places_for_requests_being_received_waits_instead_of_failing() {
    // 256 clients at once on four replicas got "64 requests are being received already" (503)
    let s = Server::start(&["--max-active-requests", "1", "--read-timeout", "3"]);
    let body = json!({"messages": user("Hi"), "max_tokens": 2, "temperature": 0}).to_string();
    let head = format!("POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: {}\r\n\r\n", body.len());
    // 1. a slow client holds the only place: its head and half its body are in
    let mut slow = connect(s.port);
    slow.write_all(format!("{}{}", head, &body[..body.len() / 2]).as_bytes()).unwrap();
    std::thread::sleep(Duration::from_millis(300));
    // 2. another request arrives meanwhile: it waits for the place, and is answered once the
    //    slow one has sent the rest
    let port = s.port;
    let waiting = std::thread::spawn(move || chat(port, &json!({"messages": user("Hi"), "max_tokens": 2, "temperature": 0})));
    std::thread::sleep(Duration::from_millis(500));
    assert!(!waiting.is_finished(), "the second request was answered while the place was taken: {}", waiting.join().unwrap().text());
    slow.write_all(body[body.len() / 2..].as_bytes()).unwrap();
    let first = read_response(&mut slow).expect("the slow client's reply");
    assert_eq!(first.status, 200, "{}", first.text());
    let second = waiting.join().unwrap();
    assert_eq!(second.status, 200, "{}", second.text());
    assert_eq!(second.json()["choices"][0]["message"]["content"], first.json()["choices"][0]["message"]["content"]);
    // 3. no place for --read-timeout: the waiter is refused, 503 with Retry-After. The first
    //    stuck client's place frees when its own time runs out, before the waiter's, and goes
    //    to the second stuck client, which waited longer (places go first come, first served).
    let stuck: Vec<TcpStream> = (0..2)
        .map(|_| {
            let mut c = connect(s.port);
            c.write_all(format!("{}{}", head, &body[..1]).as_bytes()).unwrap();
            std::thread::sleep(Duration::from_millis(300));
            c
        })
        .collect();
    let t0 = Instant::now();
    let r = chat(s.port, &json!({"messages": user("Hi"), "max_tokens": 2}));
    assert_eq!((r.status, r.error_code().as_str()), (503, "server_busy"), "{}", r.text());
    assert!(t0.elapsed() >= Duration::from_secs(2), "refused after {:?}, before the wait", t0.elapsed());
    assert_eq!(r.header("retry-after"), Some("1"));
    drop(stuck);
    s.assert_no_panic();
}

#[test]
fn refusals_at_the_connection_limit_are_read_answered_and_counted() {
    let s = Server::start(&["--max-connections", "2"]);
    let held: Vec<TcpStream> = (0..2).map(|_| connect(s.port)).collect();
    std::thread::sleep(Duration::from_millis(300));
    // a request with a body: all of it is taken, then the 503 arrives whole
    let payload = "x".repeat(256 << 10);
    let mut c = connect(s.port);
    let raw = format!("POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: {}\r\n\r\n{}", payload.len(), payload);
    c.write_all(raw.as_bytes()).expect("the refused request is read, not cut off");
    let r = read_response(&mut c).expect("a whole 503");
    assert_eq!((r.status, r.error_code().as_str()), (503, "too_many_connections"), "{}", r.text());
    assert_eq!(r.header("retry-after"), Some("1"));
    drop(c);
    drop(held);
    wait_for(30, "the connections to close", || {
        let mut c = connect(s.port);
        get_on(&mut c, "/health").status == 200
    });
    assert_eq!(metric(s.port, "qwen3vl_http_responses_total{path=\"/v1/chat/completions\",code=\"503\"}"), 1.0);
    s.assert_no_panic();
}

#[test]
fn http10_clients_get_replies_without_chunked_coding() {
    let s = Server::start(&[]);
    let body = json!({"messages": user("Hi"), "max_tokens": 4, "temperature": 0, "stream": true});
    let mut c = connect(s.port);
    let r = send(&mut c, &chat_request(&body, "HTTP/1.0"));
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.header("transfer-encoding"), None, "{:?}", r.headers);
    assert_eq!(r.header("content-type"), Some("text/event-stream"));
    assert!(r.text().ends_with("data: [DONE]\n\n"), "{}", r.text());
    // the end of the body is the end of the connection
    let mut rest = Vec::new();
    assert_eq!(c.read_to_end(&mut rest).unwrap_or(0), 0);
    // not streamed: a Content-Length
    let mut c = connect(s.port);
    let r = send(&mut c, &chat_request(&json!({"messages": user("Hi"), "max_tokens": 4}), "HTTP/1.0"));
    assert_eq!(r.status, 200, "{}", r.text());
    assert!(r.header("content-length").is_some() && r.header("transfer-encoding").is_none(), "{:?}", r.headers);
    s.assert_no_panic();
}

#[test]
fn health_says_loading_until_the_model_is_ready() {
    let s = Server::start_until(&[], &[("QWEN3_VL_TEST_LOAD_DELAY_MS", "4000")], "accepting connections on http://");
    let h = get(s.port, "/health");
    assert_eq!((h.status, h.json()["status"].as_str()), (503, Some("loading")), "{}", h.text());
    let r = chat(s.port, &json!({"messages": user("Hi"), "max_tokens": 2}));
    assert_eq!((r.status, r.error_code().as_str()), (503, "loading"), "{}", r.text());
    assert!(r.header("retry-after").is_some());
    wait_for(30, "the model to load", || get(s.port, "/health").status == 200);
    assert_eq!(chat(s.port, &json!({"messages": user("Hi"), "max_tokens": 2})).status, 200);
    s.assert_no_panic();
}

#[test]
fn malformed_heads_get_json_errors_and_are_counted() {
    let s = Server::start(&[]);
    for (raw, status) in [(&b"THIS IS NOT HTTP\r\n\r\n"[..], 400), (b"GET / HTTP/1.1\r\nBad Header Line\r\n\r\n", 400), (b"POST /v1/chat/completions HTTP/1.1\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\nab", 400)] {
        let r = server::raw(s.port, raw);
        assert_eq!((r.status, r.error_code().as_str()), (status, "bad_request"), "{}", r.text());
    }
    let r = server::raw(s.port, format!("GET /health HTTP/1.1\r\nX-Big: {}\r\n\r\n", "a".repeat(20_000)).as_bytes());
    assert_eq!((r.status, r.error_code().as_str()), (431, "request_too_large"), "{}", r.text());
    assert_eq!(metric(s.port, "qwen3vl_http_responses_total{path=\"other\",code=\"400\"}"), 3.0);
    s.assert_no_panic();
}

#[test]
fn a_sent_image_still_works_over_a_kept_alive_connection() {
    // keep-alive across a chat with an image, then a plain GET on the same connection
    let s = Server::start(&[]);
    let url = data_url(&common::server::image("a_64x96.png"), "image/png");
    let body = json!({"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": url}}, {"type": "text", "text": "?"}]}], "max_tokens": 2});
    let mut c = connect(s.port);
    assert_eq!(send(&mut c, &chat_request(&body, "HTTP/1.1")).status, 200);
    assert_eq!(send(&mut c, "GET /health HTTP/1.1\r\nHost: x\r\n\r\n").status, 200);
    s.assert_no_panic();
}
