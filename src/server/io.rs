//! One client connection's socket under hyper: the phase of its current request (for the time
//! limits), hyper's reads and writes ([`ConnIo`]), telling a client that only half-closed its
//! side from one that left, and closing without losing the last answer.
//!
//! A client that shuts down its write side after its request still waits for the reply, while
//! one that closed its socket is gone; both look the same to us (end of stream) until something
//! is written: a closed socket answers with a reset. So, when the end of stream arrives while
//! an HTTP/1.1 request waits for the model, the connection writes one interim
//! `100 Continue` (which HTTP/1.1 clients must accept and skip) and a reset after it means the
//! client left. HTTP/1.0 has no interim responses: there a request whose client closed runs to
//! its end. A streamed reply needs no probe: its own writes fail once the client is gone.

use super::http::{error_bytes, head_error};
use super::Shared;
use std::io;
use std::net::SocketAddr;
use std::os::unix::io::AsRawFd;
use std::pin::Pin;
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::{ready, Context, Poll};
use std::time::Duration;
use tokio::net::TcpStream;
use tokio::sync::Notify;
use tokio::time::Instant;

/// The interim response that probes a half-closed connection.
const PROBE: &[u8] = b"HTTP/1.1 100 Continue\r\n\r\n";
/// How long a closing connection reads what the client still sends, so that closing with
/// unread data does not reset the connection before the client has read our answer.
const LINGER: Duration = Duration::from_secs(2);

/// Where the connection is between requests.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) enum Phase {
    /// Waiting for a request since then.
    Idle(Instant),
    /// Bytes of a request head arrived, the first at this time.
    Head(Instant),
    /// A request is being answered (its body read, the model run, its reply written).
    Busy,
    /// The reply was handed over at this time; hyper may still be writing it.
    Done(Instant),
}

/// Which time limit ran out.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) enum Expiry {
    /// No request came (close quietly).
    Idle,
    /// A request head did not arrive whole in time (answer 408).
    Head,
}

struct State {
    phase: Phase,
    /// Whether everything hyper wrote has been flushed (its buffer is empty).
    clean: bool,
    /// Bytes of ours to write before hyper's next ones (the rest of a probe, an error answer).
    out: Vec<u8>,
    /// Hyper's remaining writes are dropped (its bare error answer was replaced by ours).
    swallow: bool,
    /// The current request's connection was probed already.
    probed: bool,
}

/// A client connection.
pub(crate) struct Conn {
    pub stream: TcpStream,
    pub peer: SocketAddr,
    pub shared: Arc<Shared>,
    state: Mutex<State>,
    /// Signalled when the phase changes (the time limits then change).
    pub changed: Notify,
}

impl Conn {
    pub fn new(stream: TcpStream, peer: SocketAddr, shared: Arc<Shared>) -> Arc<Conn> {
        let state = State { phase: Phase::Idle(Instant::now()), clean: true, out: Vec::new(), swallow: false, probed: false };
        Arc::new(Conn { stream, peer, shared, state: Mutex::new(state), changed: Notify::new() })
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn set_phase(&self, st: &mut State, phase: Phase) {
        st.phase = phase;
        self.changed.notify_one();
    }

    /// A request's head arrived whole and is being answered.
    pub fn request_started(&self) {
        let mut st = self.lock();
        st.probed = false;
        self.set_phase(&mut st, Phase::Busy);
    }

    /// The request's reply was handed over whole (or given up).
    pub fn reply_done(&self) {
        let mut st = self.lock();
        self.set_phase(&mut st, Phase::Done(Instant::now()));
    }

    /// When the current time limit runs out, and which one it is (`None`: none runs while a
    /// request is being answered).
    pub fn deadline(&self, idle: Duration, head: Duration) -> Option<(Instant, Expiry)> {
        match self.lock().phase {
            Phase::Idle(t) | Phase::Done(t) => Some((t + idle, Expiry::Idle)),
            Phase::Head(t) => Some((t + head, Expiry::Head)),
            Phase::Busy => None,
        }
    }

    /// Whether an answer of ours can be written now without mixing into hyper's output.
    pub fn can_answer(&self) -> bool {
        let st = self.lock();
        st.clean && !st.swallow && matches!(st.phase, Phase::Head(_) | Phase::Idle(_))
    }

    /// Whether the client has left while its request is being answered: its connection was
    /// reset, or (HTTP/1.1) it ended its side and a probe then reset it (see the module docs).
    pub fn peer_left(&self, http11: bool) -> bool {
        match tcp_state(&self.stream) {
            None | Some(TCP_CLOSE) => true,
            Some(TCP_CLOSE_WAIT) if http11 => {
                self.probe();
                false
            }
            Some(_) => false,
        }
    }

    /// Writes the probe once per request, if nothing of hyper's is pending.
    fn probe(&self) {
        let mut st = self.lock();
        if st.probed || st.phase != Phase::Busy || !st.clean || !st.out.is_empty() {
            return;
        }
        st.probed = true;
        match self.stream.try_write(PROBE) {
            Ok(n) => st.out.extend_from_slice(&PROBE[n..]),
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => st.out.extend_from_slice(PROBE),
            Err(_) => {}
        }
    }

    /// Writes `bytes` (hyper no longer drives the connection), within a second.
    pub async fn write_raw(&self, bytes: &[u8]) {
        let mut rest = bytes;
        let deadline = Instant::now() + Duration::from_secs(1);
        while !rest.is_empty() {
            match tokio::time::timeout_at(deadline, self.stream.writable()).await {
                Ok(Ok(())) => {}
                _ => return,
            }
            match self.stream.try_write(rest) {
                Ok(n) => rest = &rest[n..],
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                Err(_) => return,
            }
        }
    }

    /// Ends our side, then reads and drops what the client still sends for up to [`LINGER`]
    /// (until it closes too), so that our last answer reaches it.
    pub async fn linger_close(&self) {
        // SAFETY: shutdown(2) on the socket this connection owns.
        unsafe {
            libc::shutdown(self.stream.as_raw_fd(), libc::SHUT_WR);
        }
        let deadline = Instant::now() + LINGER;
        let mut sink = [0u8; 16384];
        loop {
            match tokio::time::timeout_at(deadline, self.stream.readable()).await {
                Ok(Ok(())) => {}
                _ => return,
            }
            match self.stream.try_read(&mut sink) {
                Ok(0) => return,
                Ok(_) => {}
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                Err(_) => return,
            }
        }
    }

    /// Writes `st.out` first.
    fn poll_out(&self, st: &mut State, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        while !st.out.is_empty() {
            ready!(self.stream.poll_write_ready(cx))?;
            match self.stream.try_write(&st.out) {
                Ok(n) => {
                    st.out.drain(..n);
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                Err(e) => return Poll::Ready(Err(e)),
            }
        }
        Poll::Ready(Ok(()))
    }
}

const TCP_CLOSE: u8 = 7;
const TCP_CLOSE_WAIT: u8 = 8;

/// The kernel's TCP state of the socket (`None`: it cannot be read).
#[cfg(target_os = "linux")]
fn tcp_state(s: &TcpStream) -> Option<u8> {
    // SAFETY: a zeroed tcp_info is valid; getsockopt writes at most `len` bytes into it.
    unsafe {
        let mut info: libc::tcp_info = std::mem::zeroed();
        let mut len = std::mem::size_of::<libc::tcp_info>() as libc::socklen_t;
        let r = libc::getsockopt(s.as_raw_fd(), libc::IPPROTO_TCP, libc::TCP_INFO, &mut info as *mut libc::tcp_info as *mut libc::c_void, &mut len);
        (r == 0).then_some(info.tcpi_state)
    }
}

/// Elsewhere a departed client is noticed only by the writes of a streamed reply.
#[cfg(not(target_os = "linux"))]
fn tcp_state(_: &TcpStream) -> Option<u8> {
    Some(1)
}

/// The connection as hyper reads and writes it. Besides passing bytes it tracks the phase (the
/// first bytes of a request start its head's time limit) and replaces hyper's bare answer to a
/// request head it could not parse (400, 414, 431 with no body) with an OpenAI-style error:
/// hyper writes nothing else while no request is being answered and its buffer is empty.
pub(crate) struct ConnIo(pub Arc<Conn>);

impl hyper::rt::Read for ConnIo {
    fn poll_read(self: Pin<&mut Self>, cx: &mut Context<'_>, mut buf: hyper::rt::ReadBufCursor<'_>) -> Poll<io::Result<()>> {
        let c = &self.0;
        let mut tmp = [0u8; 16384];
        let room = buf.remaining().min(tmp.len());
        loop {
            ready!(c.stream.poll_read_ready(cx))?;
            match c.stream.try_read(&mut tmp[..room]) {
                Ok(n) => {
                    buf.put_slice(&tmp[..n]);
                    if n > 0 {
                        let mut st = c.lock();
                        if let Phase::Idle(_) | Phase::Done(_) = st.phase {
                            c.set_phase(&mut st, Phase::Head(Instant::now()));
                        }
                    }
                    return Poll::Ready(Ok(()));
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                Err(e) => return Poll::Ready(Err(e)),
            }
        }
    }
}

impl hyper::rt::Write for ConnIo {
    fn poll_write(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        let c = &self.0;
        let mut st = c.lock();
        ready!(c.poll_out(&mut st, cx))?;
        if st.swallow {
            return Poll::Ready(Ok(buf.len()));
        }
        let was_clean = std::mem::replace(&mut st.clean, false);
        if was_clean && matches!(st.phase, Phase::Head(_) | Phase::Idle(_)) && buf.starts_with(b"HTTP/1.") {
            let status = std::str::from_utf8(buf.get(9..12).unwrap_or(b"")).ok().and_then(|s| s.parse().ok()).unwrap_or(400);
            let e = head_error(status, &c.shared.cfg.http);
            log::debug!("bad request head from {}: {}", c.peer, e.message);
            c.shared.metrics.response("", e.status);
            st.out = error_bytes(&e);
            st.swallow = true;
            ready!(c.poll_out(&mut st, cx))?;
            return Poll::Ready(Ok(buf.len()));
        }
        loop {
            ready!(c.stream.poll_write_ready(cx))?;
            match c.stream.try_write(buf) {
                Ok(n) => return Poll::Ready(Ok(n)),
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                Err(e) => return Poll::Ready(Err(e)),
            }
        }
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let c = &self.0;
        let mut st = c.lock();
        ready!(c.poll_out(&mut st, cx))?;
        st.clean = true;
        if let Phase::Done(_) = st.phase {
            c.set_phase(&mut st, Phase::Idle(Instant::now()));
        }
        Poll::Ready(Ok(()))
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let c = &self.0;
        let mut st = c.lock();
        ready!(c.poll_out(&mut st, cx))?;
        // SAFETY: shutdown(2) on the socket this connection owns.
        unsafe {
            libc::shutdown(c.stream.as_raw_fd(), libc::SHUT_WR);
        }
        Poll::Ready(Ok(()))
    }
}
