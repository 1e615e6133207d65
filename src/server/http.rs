//! HTTP/1.1 on blocking sockets: reading one request (head parsed by `httparse`, body by
//! Content-Length or chunked transfer coding) under size and time limits, and writing
//! responses, whole or chunked (for server-sent events).
//!
//! Reading is generic over [`Read`] so that the fuzz test can drive it from memory. Every
//! limit is checked before memory is reserved: a declared Content-Length or chunk size never
//! sizes an allocation by itself.

use super::openai::ApiError;
use std::io::{self, Read, Write};

/// Limits on one request.
#[derive(Clone, Copy, Debug)]
pub struct Limits {
    /// Bytes of the request line and headers together.
    pub max_head: usize,
    /// Bytes of the body (after removing the chunked coding).
    pub max_body: usize,
    /// Most header lines.
    pub max_headers: usize,
}

impl Default for Limits {
    fn default() -> Limits {
        Limits { max_head: 16 * 1024, max_body: 32 * 1024 * 1024, max_headers: 64 }
    }
}

/// One parsed request.
#[derive(Clone, Debug, PartialEq)]
pub struct Request {
    pub method: String,
    /// The path without the query string.
    pub path: String,
    /// Header names lower-cased, values as sent (non-UTF-8 bytes replaced).
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
    /// Whether the connection may serve another request after this one.
    pub keep_alive: bool,
}

impl Request {
    /// The first value of header `name` (lower-case).
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.iter().find(|(n, _)| n == name).map(|(_, v)| v.as_str())
    }
}

/// Why no request was read.
#[derive(Debug)]
pub enum ReadError {
    /// The peer closed the connection (or went idle past the limit) between requests.
    Closed,
    /// The request was malformed or over a limit: answer with this error, then close.
    Bad(ApiError),
    /// The socket failed, or the request did not arrive in time: close without answering
    /// (after a 408 when part of it had arrived).
    Timeout { started: bool },
    Io(io::Error),
}

/// Asked after every read that brought bytes and every read that timed out, with whether
/// part of the request has arrived: `true` keeps reading, `false` gives up
/// ([`ReadError::Timeout`]). So a deadline holds also against a client that trickles bytes.
pub type TimeoutPolicy<'a> = &'a mut dyn FnMut(bool) -> bool;

/// A byte source with the bytes read ahead of the current request (pipelined requests).
pub struct Connection<R> {
    pub inner: R,
    buf: Vec<u8>,
}

impl<R: Read> Connection<R> {
    pub fn new(inner: R) -> Connection<R> {
        Connection { inner, buf: Vec::new() }
    }

    /// Whether bytes of a next request are already buffered.
    pub fn has_buffered(&self) -> bool {
        !self.buf.is_empty()
    }

    /// Reads more bytes into the buffer, at most `max` in total; `Ok(0)` at end of stream.
    fn fill(&mut self, max: usize, started: bool, on_timeout: TimeoutPolicy<'_>) -> Result<usize, ReadError> {
        let mut chunk = [0u8; 8192];
        loop {
            let room = max.saturating_sub(self.buf.len()).min(chunk.len());
            if room == 0 {
                return Ok(0);
            }
            match self.inner.read(&mut chunk[..room]) {
                Ok(n) => {
                    self.buf.extend_from_slice(&chunk[..n]);
                    if n > 0 && !on_timeout(true) {
                        return Err(ReadError::Timeout { started: true });
                    }
                    return Ok(n);
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) if matches!(e.kind(), io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut) => {
                    if !on_timeout(started) {
                        return Err(ReadError::Timeout { started });
                    }
                }
                Err(e) => return Err(ReadError::Io(e)),
            }
        }
    }

    /// Reads one request. `on_timeout` decides whether to keep waiting (see
    /// [`TimeoutPolicy`]); `on_continue` is called when the client asked for
    /// `100 Continue` before sending its body (and the body is within the limit).
    pub fn read_request(&mut self, limits: &Limits, on_timeout: TimeoutPolicy<'_>, on_continue: &mut dyn FnMut() -> io::Result<()>) -> Result<Request, ReadError> {
        // 1. the head: up to the blank line, at most max_head bytes
        let head_len = loop {
            if let Some(end) = find_head_end(&self.buf) {
                break end;
            }
            if self.buf.len() >= limits.max_head {
                return Err(ReadError::Bad(ApiError::new(431, "request_too_large", format!("the request head exceeds {} bytes", limits.max_head))));
            }
            let started = !self.buf.is_empty();
            if self.fill(limits.max_head, started, on_timeout)? == 0 {
                return Err(if started { ReadError::Bad(ApiError::bad_request("the connection closed in the middle of the request head")) } else { ReadError::Closed });
            }
        };
        // 2. parse it
        let mut storage = vec![httparse::EMPTY_HEADER; limits.max_headers];
        let mut parsed = httparse::Request::new(&mut storage);
        match parsed.parse(&self.buf[..head_len]) {
            Ok(httparse::Status::Complete(_)) => {}
            Ok(httparse::Status::Partial) => return Err(ReadError::Bad(ApiError::bad_request("incomplete request head"))),
            Err(httparse::Error::TooManyHeaders) => {
                return Err(ReadError::Bad(ApiError::new(431, "request_too_large", format!("more than {} header lines", limits.max_headers))));
            }
            Err(e) => return Err(ReadError::Bad(ApiError::bad_request(format!("malformed request head: {}", e)))),
        }
        let method = parsed.method.unwrap_or("").to_string();
        let target = parsed.path.unwrap_or("");
        let path = target.split('?').next().unwrap_or("").to_string();
        let version = parsed.version.unwrap_or(1);
        let headers: Vec<(String, String)> = parsed.headers.iter().map(|h| (h.name.to_ascii_lowercase(), String::from_utf8_lossy(h.value).trim().to_string())).collect();
        self.buf.drain(..head_len);
        let get = |name: &str| headers.iter().filter(|(n, _)| n == name).map(|(_, v)| v.as_str()).collect::<Vec<_>>();
        let connection = get("connection").join(",").to_ascii_lowercase();
        let keep_alive = if version == 0 { connection.contains("keep-alive") } else { !connection.contains("close") };
        // 3. the body framing
        let lengths = get("content-length");
        let chunked = match get("transfer-encoding").last().map(|v| v.to_ascii_lowercase()) {
            None => false,
            Some(te) if te == "chunked" => true,
            Some(te) => return Err(ReadError::Bad(ApiError::new(501, "unsupported_transfer_encoding", format!("transfer-encoding '{}' is not supported (only chunked)", te)))),
        };
        if chunked && !lengths.is_empty() {
            return Err(ReadError::Bad(ApiError::bad_request("both Content-Length and Transfer-Encoding: chunked were sent")));
        }
        let declared = match lengths.as_slice() {
            [] => None,
            [one] => Some(parse_length(one)?),
            [first, rest @ ..] => {
                if rest.iter().any(|v| v != first) {
                    return Err(ReadError::Bad(ApiError::bad_request("conflicting Content-Length headers")));
                }
                Some(parse_length(first)?)
            }
        };
        if let Some(n) = declared {
            if n > limits.max_body as u64 {
                return Err(ReadError::Bad(too_large(limits.max_body)));
            }
        }
        let has_body = chunked || declared.map_or(false, |n| n > 0);
        if has_body && get("expect").iter().any(|v| v.eq_ignore_ascii_case("100-continue")) {
            on_continue().map_err(ReadError::Io)?;
        }
        // 4. the body
        let body = if chunked {
            self.read_chunked(limits.max_body, on_timeout)?
        } else {
            let n = declared.unwrap_or(0) as usize;
            while self.buf.len() < n {
                if self.fill(n, true, on_timeout)? == 0 {
                    return Err(ReadError::Bad(ApiError::bad_request(format!("the body ended after {} of {} bytes", self.buf.len(), n))));
                }
            }
            self.buf.drain(..n).collect()
        };
        Ok(Request { method, path, headers, body, keep_alive })
    }

    /// One line (without CRLF) of a chunked body, at most `max` bytes.
    fn read_line(&mut self, max: usize, on_timeout: TimeoutPolicy<'_>) -> Result<Vec<u8>, ReadError> {
        loop {
            if let Some(i) = self.buf.windows(2).position(|w| w == b"\r\n") {
                let line = self.buf[..i].to_vec();
                self.buf.drain(..i + 2);
                return Ok(line);
            }
            if self.buf.len() > max {
                return Err(ReadError::Bad(ApiError::bad_request("a chunk-size or trailer line is too long")));
            }
            let want = self.buf.len() + 1024;
            if self.fill(want, true, on_timeout)? == 0 {
                return Err(ReadError::Bad(ApiError::bad_request("the connection closed in the middle of a chunked body")));
            }
        }
    }

    fn read_chunked(&mut self, max_body: usize, on_timeout: TimeoutPolicy<'_>) -> Result<Vec<u8>, ReadError> {
        let mut body = Vec::new();
        loop {
            let line = self.read_line(256, on_timeout)?;
            let size_text = String::from_utf8_lossy(&line);
            let hex = size_text.split(';').next().unwrap_or("").trim();
            if hex.is_empty() || hex.len() > 16 || !hex.bytes().all(|b| b.is_ascii_hexdigit()) {
                return Err(ReadError::Bad(ApiError::bad_request(format!("bad chunk size '{}'", size_text.chars().take(40).collect::<String>()))));
            }
            let size = u64::from_str_radix(hex, 16).map_err(|_| ReadError::Bad(ApiError::bad_request("bad chunk size")))?;
            if size == 0 {
                // trailers, up to the blank line
                for _ in 0..64 {
                    if self.read_line(8192, on_timeout)?.is_empty() {
                        return Ok(body);
                    }
                }
                return Err(ReadError::Bad(ApiError::bad_request("too many trailer lines")));
            }
            if size > (max_body - body.len()) as u64 {
                return Err(ReadError::Bad(too_large(max_body)));
            }
            let size = size as usize;
            while self.buf.len() < size + 2 {
                if self.fill(size + 2, true, on_timeout)? == 0 {
                    return Err(ReadError::Bad(ApiError::bad_request("the connection closed in the middle of a chunk")));
                }
            }
            if &self.buf[size..size + 2] != b"\r\n" {
                return Err(ReadError::Bad(ApiError::bad_request("a chunk does not end with CRLF")));
            }
            body.extend_from_slice(&self.buf[..size]);
            self.buf.drain(..size + 2);
        }
    }
}

fn too_large(max: usize) -> ApiError {
    ApiError::new(413, "request_too_large", format!("the request body exceeds the limit of {} bytes", max))
}

fn parse_length(v: &str) -> Result<u64, ReadError> {
    if v.is_empty() || v.len() > 19 || !v.bytes().all(|b| b.is_ascii_digit()) {
        return Err(ReadError::Bad(ApiError::bad_request(format!("bad Content-Length '{}'", v.chars().take(40).collect::<String>()))));
    }
    v.parse().map_err(|_| ReadError::Bad(ApiError::bad_request("bad Content-Length")))
}

/// The length of the head including its blank line, once complete.
fn find_head_end(buf: &[u8]) -> Option<usize> {
    buf.windows(4).position(|w| w == b"\r\n\r\n").map(|i| i + 4)
}

/// The reason phrase of a status code we send.
pub fn reason(status: u16) -> &'static str {
    match status {
        100 => "Continue",
        200 => "OK",
        400 => "Bad Request",
        401 => "Unauthorized",
        404 => "Not Found",
        405 => "Method Not Allowed",
        408 => "Request Timeout",
        411 => "Length Required",
        413 => "Payload Too Large",
        415 => "Unsupported Media Type",
        429 => "Too Many Requests",
        431 => "Request Header Fields Too Large",
        500 => "Internal Server Error",
        501 => "Not Implemented",
        503 => "Service Unavailable",
        _ => "Unknown",
    }
}

/// A whole response.
pub struct Response {
    pub status: u16,
    pub content_type: &'static str,
    pub extra_headers: Vec<(&'static str, String)>,
    pub body: Vec<u8>,
}

impl Response {
    pub fn json(status: u16, body: &serde_json::Value) -> Response {
        Response { status, content_type: "application/json", extra_headers: Vec::new(), body: body.to_string().into_bytes() }
    }

    pub fn text(status: u16, content_type: &'static str, body: String) -> Response {
        Response { status, content_type, extra_headers: Vec::new(), body: body.into_bytes() }
    }

    /// The OpenAI-style error body of `e`, with Retry-After when it has one.
    pub fn error(e: &ApiError) -> Response {
        let mut r = Response::json(e.status, &e.to_json());
        if let Some(s) = e.retry_after {
            r.extra_headers.push(("Retry-After", s.to_string()));
        }
        if e.status == 405 {
            r.extra_headers.push(("Allow", e.allow.unwrap_or("GET").to_string()));
        }
        r
    }

    /// Writes the response; `keep_alive` decides the Connection header.
    pub fn write_to(&self, w: &mut dyn Write, keep_alive: bool) -> io::Result<()> {
        let mut head = format!(
            "HTTP/1.1 {} {}\r\nContent-Type: {}\r\nContent-Length: {}\r\nConnection: {}\r\n",
            self.status,
            reason(self.status),
            self.content_type,
            self.body.len(),
            if keep_alive { "keep-alive" } else { "close" }
        );
        for (k, v) in &self.extra_headers {
            head.push_str(&format!("{}: {}\r\n", k, v));
        }
        head.push_str("\r\n");
        let mut out = head.into_bytes();
        out.extend_from_slice(&self.body);
        w.write_all(&out)?;
        w.flush()
    }
}

/// A response sent in chunks as it is produced (server-sent events).
pub struct ChunkedWriter<'a> {
    w: &'a mut dyn Write,
}

impl<'a> ChunkedWriter<'a> {
    /// Sends the head of a 200 `content_type` response with chunked transfer coding.
    pub fn start(w: &'a mut dyn Write, content_type: &str, keep_alive: bool) -> io::Result<ChunkedWriter<'a>> {
        let head = format!(
            "HTTP/1.1 200 OK\r\nContent-Type: {}\r\nCache-Control: no-cache\r\nTransfer-Encoding: chunked\r\nConnection: {}\r\n\r\n",
            content_type,
            if keep_alive { "keep-alive" } else { "close" }
        );
        w.write_all(head.as_bytes())?;
        w.flush()?;
        Ok(ChunkedWriter { w })
    }

    /// Sends one chunk (nothing for empty data, which would end the body).
    pub fn send(&mut self, data: &[u8]) -> io::Result<()> {
        if data.is_empty() {
            return Ok(());
        }
        let mut out = format!("{:x}\r\n", data.len()).into_bytes();
        out.extend_from_slice(data);
        out.extend_from_slice(b"\r\n");
        self.w.write_all(&out)?;
        self.w.flush()
    }

    /// Ends the body.
    pub fn finish(self) -> io::Result<()> {
        self.w.write_all(b"0\r\n\r\n")?;
        self.w.flush()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn read(raw: &[u8]) -> Result<Request, ReadError> {
        Connection::new(raw).read_request(&Limits::default(), &mut |_| true, &mut || Ok(()))
    }

    #[test]
    fn reads_content_length_and_chunked_bodies_and_pipelined_requests() {
        let raw = b"POST /v1/chat/completions?x=1 HTTP/1.1\r\nHost: a\r\nContent-Length: 5\r\n\r\nhelloGET /health HTTP/1.1\r\nConnection: close\r\n\r\n";
        let mut c = Connection::new(&raw[..]);
        let r = c.read_request(&Limits::default(), &mut |_| true, &mut || Ok(())).unwrap();
        assert_eq!((r.method.as_str(), r.path.as_str(), &r.body[..], r.keep_alive), ("POST", "/v1/chat/completions", &b"hello"[..], true));
        let r = c.read_request(&Limits::default(), &mut |_| true, &mut || Ok(())).unwrap();
        assert_eq!((r.path.as_str(), r.keep_alive), ("/health", false));
        assert!(matches!(c.read_request(&Limits::default(), &mut |_| true, &mut || Ok(())), Err(ReadError::Closed)));
        let r = read(b"POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n3;ext=1\r\nabc\r\n2\r\nde\r\n0\r\nX-T: 1\r\n\r\n").unwrap();
        assert_eq!(r.body, b"abcde");
    }

    #[test]
    fn the_deadline_holds_against_a_trickle() {
        // a reader that hands out one byte per read: the policy is asked after each
        struct Trickle(Vec<u8>);
        impl Read for Trickle {
            fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
                if self.0.is_empty() || buf.is_empty() {
                    return Ok(0);
                }
                buf[0] = self.0.remove(0);
                Ok(1)
            }
        }
        let mut calls = 0;
        let mut c = Connection::new(Trickle(b"GET /health HTTP/1.1\r\nX: aaaaaaaaaaaaaaaa\r\n\r\n".to_vec()));
        let r = c.read_request(&Limits::default(), &mut |started| {
            calls += 1;
            started && calls < 10
        }, &mut || Ok(()));
        assert!(matches!(r, Err(ReadError::Timeout { started: true })));
        assert_eq!(calls, 10);
    }

    #[test]
    fn framing_errors_get_the_right_status() {
        let status = |raw: &[u8]| match read(raw) {
            Err(ReadError::Bad(e)) => e.status,
            other => panic!("{:?}", other.map(|r| r.path)),
        };
        assert_eq!(status(b"POST / HTTP/1.1\r\nContent-Length: 99999999999\r\n\r\n"), 413);
        assert_eq!(status(b"POST / HTTP/1.1\r\nContent-Length: -1\r\n\r\n"), 400);
        assert_eq!(status(b"POST / HTTP/1.1\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\nab"), 400);
        assert_eq!(status(b"POST / HTTP/1.1\r\nContent-Length: 10\r\n\r\nabc"), 400);
        assert_eq!(status(b"POST / HTTP/1.1\r\nTransfer-Encoding: gzip\r\n\r\n"), 501);
        assert_eq!(status(b"POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n"), 400);
        assert_eq!(status(b"POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\nffffffffffffffff\r\n"), 413);
        assert_eq!(status(b"GARBAGE\r\n\r\n"), 400);
        assert_eq!(status(&[b"GET / HTTP/1.1\r\nX: ".to_vec(), vec![b'a'; 20000]].concat()), 431);
    }
}
