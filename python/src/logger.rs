//! Log lines of the library on stderr, `qwen3_vl: level: message`
//! ([`qwen3_vl::logging::Stderr`]), at the level of `QWEN3_VL_LOG` (error, warn, info, debug,
//! trace; default warn: a notebook sees warnings, such as a fallback from CUDA, but not a line
//! per request).
//!
//! A plain stderr writer rather than a bridge to Python's `logging`: the model thread logs
//! while Python threads hold the GIL, and a bridge would have it wait for the GIL (a thread
//! dropping an `Engine` waits for the model thread: each would wait on the other).

use log::LevelFilter;
use qwen3_vl::logging::{env_level, Stderr};

static LOGGER: Stderr = Stderr::new("qwen3_vl: ");

/// Installs the logger (once per process; another logger installed first is kept).
pub fn init() {
    LOGGER.install(env_level(LevelFilter::Warn));
}
