//! A stderr logger for the `log` facade, shared by the CLI and the Python package: a line a
//! record, `{prefix}{level}: message`, and `{prefix}{level}: replica N: message` from a thread
//! named `replica-N` (the threads of `serve --data-parallel` and of loading its replicas).
//!
//! A plain stderr writer: it takes no lock of its own and waits on nothing (the Python
//! package's model thread logs while Python threads hold the GIL; a bridge to Python's
//! `logging` would have it wait for the GIL).

use log::{Level, LevelFilter, Log, Metadata, Record};

/// The logger; `prefix` stands before every line (`""` for the CLI, `"qwen3_vl: "` where the
/// lines mix with a host program's, as in a notebook).
pub struct Stderr {
    prefix: &'static str,
}

impl Stderr {
    pub const fn new(prefix: &'static str) -> Stderr {
        Stderr { prefix }
    }

    /// Installs this logger at `level` (once per process: a logger installed first is kept,
    /// with its level).
    pub fn install(&'static self, level: LevelFilter) {
        if log::set_logger(self).is_ok() {
            log::set_max_level(level);
        }
    }
}

/// The level that `QWEN3_VL_LOG` names (off, error, warn, info, debug, trace), else `default`
/// (a name that is not a level is said on stderr).
pub fn env_level(default: LevelFilter) -> LevelFilter {
    match std::env::var("QWEN3_VL_LOG") {
        Ok(v) => v.parse().unwrap_or_else(|_| {
            // (said on stderr directly: no logger is installed yet)
            eprintln!("warning: QWEN3_VL_LOG={:?} is not a level (off, error, warn, info, debug or trace); logging at {}", v, default.as_str().to_lowercase());
            default
        }),
        Err(_) => default,
    }
}

impl Log for Stderr {
    fn enabled(&self, m: &Metadata) -> bool {
        m.level() <= log::max_level()
    }
    fn log(&self, r: &Record) {
        if !self.enabled(r.metadata()) {
            return;
        }
        let tag = match r.level() {
            Level::Error => "error",
            Level::Warn => "warning",
            Level::Info => "info",
            Level::Debug => "debug",
            Level::Trace => "trace",
        };
        match std::thread::current().name().and_then(|n| n.strip_prefix("replica-")) {
            Some(i) => eprintln!("{}{}: replica {}: {}", self.prefix, tag, i, r.args()),
            None => eprintln!("{}{}: {}", self.prefix, tag, r.args()),
        }
    }
    fn flush(&self) {}
}
