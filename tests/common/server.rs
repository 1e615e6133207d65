//! Running the `qwen3-vl` binary from tests: the CLI, and `serve` on a free loopback port with a
//! small raw HTTP/1.1 client (requests are written by hand so that malformed ones can be too).

use super::repo_root;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// The `qwen3-vl` binary: `QWEN3_VL_BIN` when set (packed GPU tests), else the one cargo built.
pub fn bin() -> PathBuf {
    std::env::var_os("QWEN3_VL_BIN").map(PathBuf::from).unwrap_or_else(|| PathBuf::from(env!("CARGO_BIN_EXE_qwen3-vl")))
}

/// The tiny full-vocabulary vision-language checkpoint and the real Qwen tokenizer.
pub fn tiny_model() -> PathBuf {
    repo_root().join("tests/fixtures/vision/tiny")
}

pub fn tokenizer() -> PathBuf {
    repo_root().join("tests/fixtures/tokenizer/tokenizer.json")
}

pub fn image(name: &str) -> PathBuf {
    repo_root().join("tests/fixtures/vision").join(name)
}

/// A `qwen3-vl` command on the tiny model: `qwen3-vl SUB -m tiny --tokenizer ... ARGS`.
pub fn cli(sub: &str, args: &[&str]) -> Command {
    let mut c = Command::new(bin());
    c.arg(sub).arg("-m").arg(tiny_model()).arg("--tokenizer").arg(tokenizer()).args(args);
    c
}

/// The reply `qwen3-vl generate -q --greedy` prints for a prompt (and images).
pub fn generate_greedy(prompt: &str, images: &[PathBuf], max_tokens: usize) -> String {
    let mut c = cli("generate", &["-q", "--greedy", "--max-tokens", &max_tokens.to_string(), "-p", prompt]);
    for i in images {
        c.arg("-i").arg(i);
    }
    let out = c.output().expect("run qwen3-vl generate");
    assert!(out.status.success(), "generate failed: {}", String::from_utf8_lossy(&out.stderr));
    let text = String::from_utf8(out.stdout).expect("utf-8 reply");
    text.strip_suffix('\n').expect("generate ends its reply with a newline").to_string()
}

/// A running `qwen3-vl serve`, killed when dropped.
pub struct Server {
    child: Child,
    pub port: u16,
    log: Arc<Mutex<String>>,
}

impl Server {
    /// Starts `serve` on the tiny model on 127.0.0.1 with a free port, plus `args`, and waits
    /// until the model is loaded.
    pub fn start(args: &[&str]) -> Server {
        Server::start_until(args, &[], "listening on http://")
    }

    /// Starts `serve` with `args` and environment `env`, returning once it prints a line that
    /// begins with `prefix` followed by its address (`accepting connections on http://`: bound,
    /// the model still loading; `listening on http://`: ready).
    pub fn start_until(args: &[&str], env: &[(&str, &str)], prefix: &'static str) -> Server {
        let mut c = cli("serve", &["--host", "127.0.0.1", "--port", "0"]);
        c.args(args).envs(env.iter().copied());
        let mut child = c.stdin(Stdio::null()).stdout(Stdio::null()).stderr(Stdio::piped()).spawn().expect("spawn qwen3-vl serve");
        let log = Arc::new(Mutex::new(String::new()));
        let (tx, rx) = std::sync::mpsc::channel();
        let stderr = child.stderr.take().unwrap();
        let sink = Arc::clone(&log);
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines().flatten() {
                if let Some(addr) = line.strip_prefix(prefix) {
                    let port = addr.split_whitespace().next().and_then(|a| a.rsplit(':').next()).and_then(|p| p.parse::<u16>().ok());
                    let _ = tx.send(port);
                }
                let mut l = sink.lock().unwrap();
                l.push_str(&line);
                l.push('\n');
            }
        });
        let port = match rx.recv_timeout(Duration::from_secs(120)) {
            Ok(Some(p)) => p,
            _ => {
                let _ = child.kill();
                panic!("the server did not start: {}", log.lock().unwrap());
            }
        };
        Server { child, port, log }
    }

    /// Everything the server wrote to stderr so far.
    pub fn log(&self) -> String {
        self.log.lock().unwrap().clone()
    }

    pub fn pid(&self) -> i32 {
        self.child.id() as i32
    }

    /// Sends SIGTERM.
    pub fn terminate(&self) {
        // SAFETY: signalling our own child process.
        unsafe {
            libc::kill(self.pid(), libc::SIGTERM);
        }
    }

    /// Waits for the process to exit, at most `limit`.
    pub fn wait(&mut self, limit: Duration) -> Option<std::process::ExitStatus> {
        let t0 = Instant::now();
        while t0.elapsed() < limit {
            if let Ok(Some(s)) = self.child.try_wait() {
                return Some(s);
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        None
    }

    /// Asserts the server never panicked.
    pub fn assert_no_panic(&self) {
        let log = self.log();
        assert!(!log.contains("panicked"), "the server panicked:\n{}", log);
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        if std::thread::panicking() {
            eprintln!("--- server log ---\n{}--- end of server log ---", self.log());
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A parsed HTTP response.
#[derive(Debug)]
pub struct Response {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
}

impl Response {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.iter().find(|(n, _)| n.eq_ignore_ascii_case(name)).map(|(_, v)| v.as_str())
    }

    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }

    pub fn json(&self) -> serde_json::Value {
        serde_json::from_slice(&self.body).unwrap_or_else(|e| panic!("not JSON ({}): {}", e, self.text()))
    }

    /// The `data:` payloads of a server-sent event stream.
    pub fn events(&self) -> Vec<String> {
        self.text().split("\n\n").filter_map(|e| e.strip_prefix("data: ")).map(String::from).collect()
    }

    /// `error.code` of an OpenAI-style error body, checking the object's shape.
    pub fn error_code(&self) -> String {
        let v = self.json();
        let e = &v["error"];
        assert!(e["message"].as_str().map_or(false, |m| !m.is_empty()) && e["type"].is_string(), "not an OpenAI error object: {}", v);
        e["code"].as_str().unwrap_or("").to_string()
    }
}

pub fn connect(port: u16) -> TcpStream {
    let s = TcpStream::connect(("127.0.0.1", port)).expect("connect");
    s.set_read_timeout(Some(Duration::from_secs(120))).unwrap();
    s
}

/// Reads one line (up to LF) byte by byte, so that nothing of a following response is
/// consumed.
fn read_line(s: &mut TcpStream) -> std::io::Result<String> {
    let mut line = Vec::new();
    let mut b = [0u8; 1];
    while s.read(&mut b)? == 1 {
        line.push(b[0]);
        if b[0] == b'\n' {
            break;
        }
    }
    Ok(String::from_utf8_lossy(&line).into_owned())
}

/// Reads one response from `s` (Content-Length, chunked, or to the end of the stream),
/// leaving any bytes after it unread. Interim (1xx) responses before it are skipped, as HTTP/1.1
/// clients must.
pub fn read_response(s: &mut TcpStream) -> std::io::Result<Response> {
    let (status, headers) = loop {
        let (status, headers) = read_head(s)?;
        if !(100..200).contains(&status) {
            break (status, headers);
        }
    };
    let get = |n: &str| headers.iter().find(|(k, _): &&(String, String)| k.eq_ignore_ascii_case(n)).map(|(_, v)| v.clone());
    let mut body = Vec::new();
    if let Some(n) = get("content-length") {
        body.resize(n.parse().unwrap(), 0);
        s.read_exact(&mut body)?;
    } else if get("transfer-encoding").map_or(false, |t| t.eq_ignore_ascii_case("chunked")) {
        loop {
            let size = read_line(s)?;
            let n = usize::from_str_radix(size.trim(), 16).map_err(|_| std::io::Error::new(std::io::ErrorKind::InvalidData, format!("bad chunk size {:?}", size)))?;
            let mut chunk = vec![0; n + 2];
            s.read_exact(&mut chunk)?;
            assert_eq!(&chunk[n..], b"\r\n", "chunk not ended by CRLF");
            if n == 0 {
                break;
            }
            body.extend_from_slice(&chunk[..n]);
        }
    } else {
        s.read_to_end(&mut body)?;
    }
    Ok(Response { status, headers, body })
}

/// Reads a status line and headers.
fn read_head(s: &mut TcpStream) -> std::io::Result<(u16, Vec<(String, String)>)> {
    let line = read_line(s)?;
    let status = line.split_whitespace().nth(1).and_then(|c| c.parse().ok()).ok_or_else(|| std::io::Error::new(std::io::ErrorKind::InvalidData, format!("bad status line {:?}", line)))?;
    let mut headers = Vec::new();
    loop {
        let h = read_line(s)?;
        let h = h.trim_end();
        if h.is_empty() {
            break;
        }
        if let Some((k, v)) = h.split_once(':') {
            headers.push((k.trim().to_string(), v.trim().to_string()));
        }
    }
    Ok((status, headers))
}

/// Sends `raw` on a new connection and reads the response.
pub fn raw(port: u16, raw: &[u8]) -> Response {
    let mut s = connect(port);
    s.write_all(raw).unwrap();
    read_response(&mut s).expect("a response")
}

pub fn get(port: u16, path: &str) -> Response {
    raw(port, format!("GET {} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n", path).as_bytes())
}

pub fn post(port: u16, path: &str, body: &str) -> Response {
    raw(port, format!("POST {} HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{}", path, body.len(), body).as_bytes())
}

pub fn chat(port: u16, body: &serde_json::Value) -> Response {
    post(port, "/v1/chat/completions", &body.to_string())
}

/// A `data:` URL of a file.
pub fn data_url(path: &std::path::Path, mime: &str) -> String {
    format!("data:{};base64,{}", mime, base64(&std::fs::read(path).unwrap()))
}

/// Standard base64 with padding.
pub fn base64(bytes: &[u8]) -> String {
    const A: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut s = String::new();
    for c in bytes.chunks(3) {
        let n = (c[0] as u32) << 16 | (*c.get(1).unwrap_or(&0) as u32) << 8 | *c.get(2).unwrap_or(&0) as u32;
        for i in 0..4 {
            if i <= c.len() {
                s.push(A[(n >> (18 - 6 * i) & 63) as usize] as char);
            } else {
                s.push('=');
            }
        }
    }
    s
}

/// The value of the first sample line of `/metrics` that starts with `line_start` (0 if none).
pub fn metric(port: u16, line_start: &str) -> f64 {
    let t = get(port, "/metrics").text();
    t.lines().find(|l| l.starts_with(line_start)).and_then(|l| l.rsplit(' ').next()).and_then(|v| v.parse().ok()).unwrap_or(0.0)
}

/// Waits up to `limit_secs` for `cond`, failing the test with `what` after that.
pub fn wait_for(limit_secs: u64, what: &str, mut cond: impl FnMut() -> bool) {
    let t0 = Instant::now();
    while !cond() {
        assert!(t0.elapsed() < Duration::from_secs(limit_secs), "timed out waiting for {}", what);
        std::thread::sleep(Duration::from_millis(20));
    }
}
