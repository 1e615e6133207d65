//! HTTP on top of hyper: the limits on one request, response bodies (whole, or server-sent
//! events as the model produces them), error responses, and reading a request body within its
//! size and time limits.
//!
//! Framing (request line, headers, Content-Length, chunked coding, `Expect: 100-continue`,
//! pipelining, HTTP/1.0's close-delimited replies) is hyper's; every limit here is checked
//! before memory is reserved: a declared Content-Length never sizes an allocation by itself.

use super::openai::ApiError;
use bytes::Bytes;
use http_body_util::BodyExt;
use hyper::body::{Body as _, Frame, Incoming, SizeHint};
use hyper::header::{HeaderValue, ALLOW, CACHE_CONTROL, CONTENT_TYPE, RETRY_AFTER};
use hyper::{Response, StatusCode};
use std::convert::Infallible;
use std::pin::Pin;
use std::task::{Context, Poll};
use tokio::time::Instant;

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

/// A stream of body pieces produced as the reply is made (server-sent events).
pub(crate) trait Stream: Send {
    /// The next piece; `None` ends the body.
    fn poll_next(&mut self, cx: &mut Context<'_>) -> Poll<Option<Bytes>>;
}

/// A response body: whole, or streamed; `on_drop` runs once hyper is done with it (the
/// response written, or the connection gone).
pub(crate) struct Body {
    kind: Kind,
    on_drop: Option<Box<dyn FnOnce() + Send>>,
}

enum Kind {
    Full(Option<Bytes>),
    Stream(Box<dyn Stream>),
}

impl Body {
    pub fn full(bytes: impl Into<Bytes>) -> Body {
        Body { kind: Kind::Full(Some(bytes.into())), on_drop: None }
    }

    pub fn stream(s: impl Stream + 'static) -> Body {
        Body { kind: Kind::Stream(Box::new(s)), on_drop: None }
    }

    /// Runs `f` when the body is dropped.
    pub fn on_drop(mut self, f: impl FnOnce() + Send + 'static) -> Body {
        self.on_drop = Some(Box::new(f));
        self
    }
}

impl Drop for Body {
    fn drop(&mut self) {
        if let Some(f) = self.on_drop.take() {
            f();
        }
    }
}

impl hyper::body::Body for Body {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        match &mut self.get_mut().kind {
            Kind::Full(b) => Poll::Ready(b.take().map(|b| Ok(Frame::data(b)))),
            Kind::Stream(s) => s.poll_next(cx).map(|b| b.map(|b| Ok(Frame::data(b)))),
        }
    }

    fn is_end_stream(&self) -> bool {
        matches!(self.kind, Kind::Full(None))
    }

    fn size_hint(&self) -> SizeHint {
        match &self.kind {
            Kind::Full(b) => SizeHint::with_exact(b.as_ref().map_or(0, |b| b.len() as u64)),
            Kind::Stream(_) => SizeHint::default(),
        }
    }
}

pub(crate) type Reply = Response<Body>;

fn with_type(status: u16, content_type: &'static str, body: Body) -> Reply {
    let mut r = Response::new(body);
    *r.status_mut() = StatusCode::from_u16(status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    r.headers_mut().insert(CONTENT_TYPE, HeaderValue::from_static(content_type));
    r
}

pub(crate) fn json(status: u16, v: &serde_json::Value) -> Reply {
    with_type(status, "application/json", Body::full(v.to_string()))
}

pub(crate) fn text(status: u16, content_type: &'static str, body: String) -> Reply {
    with_type(status, content_type, Body::full(body))
}

/// A 200 of server-sent events from `s`.
pub(crate) fn events(s: impl Stream + 'static) -> Reply {
    let mut r = with_type(200, "text/event-stream", Body::stream(s));
    r.headers_mut().insert(CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    r
}

/// The OpenAI-style error body of `e`, with Retry-After and Allow when it has them.
pub(crate) fn error(e: &ApiError) -> Reply {
    let mut r = json(e.status, &e.to_json());
    if let Some(s) = e.retry_after {
        r.headers_mut().insert(RETRY_AFTER, HeaderValue::from(s));
    }
    if e.status == 405 {
        r.headers_mut().insert(ALLOW, HeaderValue::from_static(e.allow.unwrap_or("GET")));
    }
    r
}

/// `e` as a whole HTTP/1.1 response that closes the connection, for writing to the socket
/// directly where hyper does not answer: a request that did not arrive in time, or whose head
/// hyper could not parse.
pub(crate) fn error_bytes(e: &ApiError) -> Vec<u8> {
    let body = e.to_json().to_string();
    let reason = StatusCode::from_u16(e.status).ok().and_then(|s| s.canonical_reason()).unwrap_or("Error");
    format!("HTTP/1.1 {} {}\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{}", e.status, reason, body.len(), body).into_bytes()
}

fn too_large(max: usize) -> ApiError {
    ApiError::new(413, "request_too_large", format!("the request body exceeds the limit of {} bytes", max))
}

/// The body size a request declares (its Content-Length), checked against `max` before any of
/// it is read.
pub(crate) fn check_declared(body: &Incoming, max: usize) -> Result<(), ApiError> {
    if body.size_hint().lower() > max as u64 {
        return Err(too_large(max));
    }
    Ok(())
}

/// Reads a whole body: at most `max` bytes (413 past it, counted as it arrives, so a chunked
/// body is cut off too), all of it by `deadline` (408 after), framing errors 400.
pub(crate) async fn read_body(mut body: Incoming, max: usize, deadline: Instant) -> Result<Vec<u8>, ApiError> {
    check_declared(&body, max)?;
    let mut out = Vec::with_capacity((body.size_hint().lower() as usize).min(64 * 1024));
    loop {
        let frame = match tokio::time::timeout_at(deadline, body.frame()).await {
            Err(_) => return Err(ApiError::new(408, "request_timeout", "the request body did not arrive in time")),
            Ok(None) => return Ok(out),
            Ok(Some(Err(e))) => return Err(ApiError::bad_request(format!("the request body could not be read: {}", e))),
            Ok(Some(Ok(f))) => f,
        };
        if let Ok(data) = frame.into_data() {
            if data.len() > max - out.len() {
                return Err(too_large(max));
            }
            out.extend_from_slice(&data);
        }
    }
}

/// The error answered in place of hyper's bare response to a request head it could not parse
/// (`status`: the one hyper chose).
pub(crate) fn head_error(status: u16, limits: &Limits) -> ApiError {
    match status {
        431 => ApiError::new(431, "request_too_large", format!("the request head exceeds {} bytes or {} header lines", limits.max_head, limits.max_headers)),
        414 => ApiError::new(414, "request_too_large", "the request target is too long"),
        400 => ApiError::bad_request("malformed HTTP request: bad request line, header, Content-Length, or a Transfer-Encoding other than chunked"),
        s => ApiError::new(s, "bad_request", "the request could not be read"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn raw_error_responses_are_complete_and_close() {
        let e = ApiError { retry_after: Some(3), ..ApiError::new(408, "request_timeout", "late") };
        let raw = String::from_utf8(error_bytes(&e)).unwrap();
        let (head, body) = raw.split_once("\r\n\r\n").unwrap();
        assert!(head.starts_with("HTTP/1.1 408 Request Timeout\r\n") && head.contains("connection: close"), "{}", head);
        assert!(head.contains(&format!("content-length: {}", body.len())));
        assert_eq!(serde_json::from_str::<serde_json::Value>(body).unwrap()["error"]["code"], "request_timeout");
        assert_eq!(head_error(431, &Limits::default()).status, 431);
        assert_eq!(head_error(400, &Limits::default()).code, "bad_request");
    }
}
