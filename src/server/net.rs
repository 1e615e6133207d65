//! Accepting connections and driving each through hyper: the limits on open connections (in
//! all, and per client address), the time limits (an idle connection, a request head that does
//! not arrive whole), and graceful shutdown.
//!
//! A connection is a small async task: idle and slow ones cost no thread and hold no place
//! that a request needs (requests being read and checked take one of
//! `max_active_requests` places, from their head's arrival until they are queued). Over a
//! connection limit the connection is still read and answered (503 with Retry-After, counted
//! in /metrics) and then closed; only past [`MAX_REFUSING`] such refusals at once are further
//! connections closed unanswered (counted as dropped).

use super::conn;
use super::io::{Conn, ConnIo, Expiry};
use super::openai::ApiError;
use super::Shared;
use hyper::server::conn::http1;
use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;
use tokio::net::TcpListener;

/// Refused connections being read and answered at once.
const MAX_REFUSING: usize = 64;
/// The most time a refused connection has to send its request head.
const REFUSAL_READ: Duration = Duration::from_secs(5);

/// Open connections by client address, and refusals in progress.
#[derive(Default)]
pub(crate) struct Clients {
    open: std::sync::Mutex<HashMap<IpAddr, usize>>,
    refusing: std::sync::atomic::AtomicUsize,
}

/// A place taken by a connection: an open one of its client, or a refusal.
pub(crate) struct Place {
    shared: Arc<Shared>,
    ip: Option<IpAddr>,
}

impl Drop for Place {
    fn drop(&mut self) {
        let clients = &self.shared.clients;
        match self.ip {
            Some(ip) => {
                let mut open = clients.open.lock().unwrap_or_else(|p| p.into_inner());
                if let Some(n) = open.get_mut(&ip) {
                    *n -= 1;
                    if *n == 0 {
                        open.remove(&ip);
                    }
                }
                self.shared.metrics.connections.fetch_sub(1, Ordering::SeqCst);
            }
            None => {
                clients.refusing.fetch_sub(1, Ordering::SeqCst);
            }
        }
    }
}

/// A place for a new connection from `ip`, or the error that refuses it.
fn admit(shared: &Arc<Shared>, ip: IpAddr) -> Result<Place, ApiError> {
    let cfg = &shared.cfg;
    let busy = |msg: String| ApiError { retry_after: Some(1), ..ApiError::new(503, "too_many_connections", msg) };
    let mut open = shared.clients.open.lock().unwrap_or_else(|p| p.into_inner());
    if shared.metrics.connections.load(Ordering::SeqCst) >= cfg.max_connections {
        return Err(busy(format!("{} connections are open, the most this server takes; try again later", cfg.max_connections)));
    }
    let n = open.entry(ip).or_insert(0);
    if *n >= cfg.max_client_connections {
        return Err(busy(format!("this client has {} connections open, the most one client may have; reuse them or try again later", cfg.max_client_connections)));
    }
    *n += 1;
    shared.metrics.connections.fetch_add(1, Ordering::SeqCst);
    Ok(Place { shared: Arc::clone(shared), ip: Some(ip) })
}

/// A place for answering a refused connection, if fewer than [`MAX_REFUSING`] are.
fn refusal(shared: &Arc<Shared>) -> Option<Place> {
    let r = &shared.clients.refusing;
    r.fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| (n < MAX_REFUSING).then_some(n + 1)).ok()?;
    Some(Place { shared: Arc::clone(shared), ip: None })
}

/// Accepts connections until shutdown, each in its own task.
pub(crate) async fn accept_loop(listener: TcpListener, shared: Arc<Shared>) {
    let mut stop = shared.stop.subscribe();
    loop {
        let accepted = tokio::select! {
            r = listener.accept() => r,
            _ = stop.wait_for(|s| *s) => break,
        };
        let (stream, peer) = match accepted {
            Ok(a) => a,
            Err(e) => {
                // out of file descriptors, most likely: the waiting ones stay in the backlog
                log::warn!("accept failed: {}", e);
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        let _ = stream.set_nodelay(true);
        let (place, refused) = match admit(&shared, peer.ip()) {
            Ok(p) => (p, None),
            Err(e) => match refusal(&shared) {
                Some(p) => {
                    log::warn!("refusing a connection from {}: {}", peer, e.message);
                    (p, Some(e))
                }
                None => {
                    log::warn!("closing a connection from {} unanswered: {} refusals are being answered already", peer, MAX_REFUSING);
                    shared.metrics.dropped_connections.fetch_add(1, Ordering::Relaxed);
                    continue;
                }
            },
        };
        tokio::spawn(drive(Conn::new(stream, peer, Arc::clone(&shared)), refused, place));
    }
    log::info!("no longer accepting connections");
}

/// Serves one connection (every request answered with `refused`, when given) until it closes,
/// times out, or shutdown finds it idle.
async fn drive(conn: Arc<Conn>, refused: Option<ApiError>, place: Place) {
    let shared = Arc::clone(&conn.shared);
    let cfg = &shared.cfg;
    let head_limit = if refused.is_some() { cfg.read_timeout.min(REFUSAL_READ) } else { cfg.read_timeout };
    let mut builder = http1::Builder::new();
    builder
        .half_close(true)
        .keep_alive(refused.is_none())
        .max_headers(cfg.http.max_headers)
        .max_header_size(cfg.http.max_head)
        .header_read_timeout(None);
    let service = {
        let conn = Arc::clone(&conn);
        hyper::service::service_fn(move |req| conn::handle(req, Arc::clone(&conn), refused.clone()))
    };
    let mut http = Box::pin(builder.serve_connection(ConnIo(Arc::clone(&conn)), service));
    let mut stop = shared.stop.subscribe();
    let mut graceful = false;
    let mut late_head = false;
    loop {
        let deadline = conn.deadline(cfg.idle_timeout, head_limit);
        tokio::select! {
            r = http.as_mut() => {
                if let Err(e) = r {
                    log::debug!("connection from {}: {}", conn.peer, e);
                }
                break;
            }
            _ = conn.changed.notified() => {}
            _ = sleep_until(deadline.map(|d| d.0)) => {
                if let Some((at, why)) = conn.deadline(cfg.idle_timeout, head_limit) {
                    if at <= tokio::time::Instant::now() {
                        late_head = why == Expiry::Head;
                        break;
                    }
                }
            }
            _ = stop.wait_for(|s| *s), if !graceful => {
                http.as_mut().graceful_shutdown();
                graceful = true;
            }
        }
    }
    drop(http);
    if late_head && conn.can_answer() {
        let e = ApiError::new(408, "request_timeout", format!("the request did not arrive within {} s", head_limit.as_secs_f64()));
        shared.metrics.response("", 408);
        conn.write_raw(&super::http::error_bytes(&e)).await;
    }
    drop(place);
    conn.linger_close().await;
}

async fn sleep_until(at: Option<tokio::time::Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}
