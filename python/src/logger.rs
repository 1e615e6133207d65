//! Log lines of the library on stderr, `qwen3_vl: level: message`, at the level of
//! `QWEN3_VL_LOG` (error, warn, info, debug, trace; default warn: a notebook sees warnings, such
//! as a fallback from CUDA, but not a line per request).
//!
//! A plain stderr writer rather than a bridge to Python's `logging`: the model thread logs
//! while Python threads hold the GIL, and a bridge would have it wait for the GIL (a thread
//! dropping an `Engine` waits for the model thread: each would wait on the other).

use log::{Level, LevelFilter, Log, Metadata, Record};

struct Stderr;

impl Log for Stderr {
    fn enabled(&self, m: &Metadata) -> bool {
        m.level() <= log::max_level()
    }
    fn log(&self, r: &Record) {
        if self.enabled(r.metadata()) {
            let tag = match r.level() {
                Level::Error => "error",
                Level::Warn => "warning",
                Level::Info => "info",
                Level::Debug => "debug",
                Level::Trace => "trace",
            };
            eprintln!("qwen3_vl: {}: {}", tag, r.args());
        }
    }
    fn flush(&self) {}
}

static LOGGER: Stderr = Stderr;

/// Installs the logger (once per process; another logger installed first is kept).
pub fn init() {
    let level = std::env::var("QWEN3_VL_LOG").ok().and_then(|v| v.parse().ok()).unwrap_or(LevelFilter::Warn);
    if log::set_logger(&LOGGER).is_ok() {
        log::set_max_level(level);
    }
}
