//! Ctrl-C, SIGTERM and SIGPIPE for the command-line tool.
//!
//! - `chat`: Ctrl-C during a reply stops that reply (the conversation goes on); Ctrl-C at the
//!   prompt ends the program.
//! - `serve`: the first Ctrl-C or SIGTERM asks for a graceful shutdown (drain, then exit); a
//!   second one exits at once.
//! - everything else: SIGPIPE is restored to its default, so `qwen3-vl info | head -1` ends
//!   quietly instead of panicking in `println!`.
//!
//! The handlers only touch atomics and call `write` / `_exit`, which are async-signal-safe.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

const MODE_CHAT: usize = 1;
const MODE_SERVER: usize = 2;

static MODE: AtomicUsize = AtomicUsize::new(0);
/// chat: a reply is being generated.
static GENERATING: AtomicBool = AtomicBool::new(false);
/// chat: Ctrl-C arrived during the current reply.
static STOP_REPLY: AtomicBool = AtomicBool::new(false);
/// serve: how many termination signals arrived.
static TERMINATE: AtomicUsize = AtomicUsize::new(0);

extern "C" fn on_signal(sig: libc::c_int) {
    match MODE.load(Ordering::SeqCst) {
        MODE_CHAT if sig == libc::SIGINT && GENERATING.load(Ordering::SeqCst) => STOP_REPLY.store(true, Ordering::SeqCst),
        MODE_SERVER if TERMINATE.fetch_add(1, Ordering::SeqCst) == 0 => {}
        _ => {
            let nl = b"\n";
            // SAFETY: write(2) and _exit(2) are async-signal-safe.
            unsafe {
                libc::write(2, nl.as_ptr() as *const libc::c_void, 1);
                libc::_exit(128 + sig);
            }
        }
    }
}

fn install(signals: &[libc::c_int]) {
    for &sig in signals {
        // SAFETY: a zeroed sigaction is a valid "no flags, empty mask" value; the handler only
        // does async-signal-safe work (see on_signal).
        unsafe {
            let mut sa: libc::sigaction = std::mem::zeroed();
            sa.sa_sigaction = on_signal as extern "C" fn(libc::c_int) as usize;
            sa.sa_flags = libc::SA_RESTART;
            libc::sigemptyset(&mut sa.sa_mask);
            libc::sigaction(sig, &sa, std::ptr::null_mut());
        }
    }
}

/// Default SIGPIPE: writing to a closed pipe ends the process quietly, as for other Unix tools.
pub fn default_sigpipe() {
    // SAFETY: restoring a default disposition.
    unsafe {
        libc::signal(libc::SIGPIPE, libc::SIG_DFL);
    }
}

/// Installs the `chat` behavior of Ctrl-C (see the module docs).
pub fn install_chat() {
    MODE.store(MODE_CHAT, Ordering::SeqCst);
    install(&[libc::SIGINT]);
}

/// Installs the `serve` behavior of Ctrl-C and SIGTERM (see the module docs).
pub fn install_server() {
    MODE.store(MODE_SERVER, Ordering::SeqCst);
    install(&[libc::SIGINT, libc::SIGTERM]);
}

/// Whether `serve` was asked to shut down.
pub fn shutdown_requested() -> bool {
    TERMINATE.load(Ordering::SeqCst) > 0
}

/// Marks a chat reply in progress: Ctrl-C stops it while this lives.
pub struct Reply(());

impl Reply {
    pub fn start() -> Reply {
        STOP_REPLY.store(false, Ordering::SeqCst);
        GENERATING.store(true, Ordering::SeqCst);
        Reply(())
    }

    /// Whether Ctrl-C asked to stop this reply.
    pub fn interrupted(&self) -> bool {
        STOP_REPLY.load(Ordering::SeqCst)
    }
}

impl Drop for Reply {
    fn drop(&mut self) {
        GENERATING.store(false, Ordering::SeqCst);
    }
}
