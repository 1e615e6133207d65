//! A minimal stderr logger for the `log` facade: `level: message` lines (`level: replica N:
//! message` from a replica's threads).

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
            // a replica's threads (`serve --data-parallel`, named `replica-N`) say which
            match std::thread::current().name().and_then(|n| n.strip_prefix("replica-")) {
                Some(i) => eprintln!("{}: replica {}: {}", tag, i, r.args()),
                None => eprintln!("{}: {}", tag, r.args()),
            }
        }
    }
    fn flush(&self) {}
}

static LOGGER: Stderr = Stderr;

/// Whether -q was given: only results (and errors) are printed, no progress or statistics.
static QUIET: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

pub fn quiet() -> bool {
    QUIET.load(std::sync::atomic::Ordering::Relaxed)
}

/// Installs the logger; the level comes from -v/-q, else QWEN3_VL_LOG, else info.
pub fn init(verbose: u8, quiet: bool) {
    QUIET.store(quiet, std::sync::atomic::Ordering::Relaxed);
    let level = if quiet {
        LevelFilter::Error
    } else if verbose > 1 {
        LevelFilter::Trace
    } else if verbose == 1 {
        LevelFilter::Debug
    } else {
        std::env::var("QWEN3_VL_LOG").ok().and_then(|v| v.parse().ok()).unwrap_or(LevelFilter::Info)
    };
    if log::set_logger(&LOGGER).is_ok() {
        log::set_max_level(level);
    }
}
