//! The CLI's logging: `level: message` lines on stderr ([`qwen3_vl::logging::Stderr`]) at the
//! level of -v/-q, and whether -q was given.

use log::LevelFilter;
use qwen3_vl::logging::{env_level, Stderr};

static LOGGER: Stderr = Stderr::new("");

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
        env_level(LevelFilter::Info)
    };
    LOGGER.install(level);
}
