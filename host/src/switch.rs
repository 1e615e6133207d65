//! A/B switches for benchmarks: kernel variants that an environment variable set to `0` turns
//! off (`QWEN3_VL_SKINNY`, `QWEN3_VL_CPU_PANELS`, `QWEN3_VL_STREAM_LAYERS`,
//! `QWEN3_VL_CHUNK_PAGED`, `QWEN3_VL_PAGED_MMA`, `QWEN3_VL_PDL`, `QWEN3_VL_WGMMA`,
//! `QWEN3_VL_FLASH_WGMMA`), read once per process.

use std::sync::atomic::{AtomicU8, Ordering};

/// One switch: the variable's name and its cached state.
pub(crate) struct Switch {
    name: &'static str,
    state: AtomicU8, // 0 unread, 1 off, 2 on
}

impl Switch {
    pub(crate) const fn new(name: &'static str) -> Switch {
        Switch { name, state: AtomicU8::new(0) }
    }

    /// On unless the variable is `0`.
    pub(crate) fn on(&self) -> bool {
        match self.state.load(Ordering::Relaxed) {
            0 => {
                let on = std::env::var(self.name).map_or(true, |v| v != "0");
                self.state.store(if on { 2 } else { 1 }, Ordering::Relaxed);
                on
            }
            v => v == 2,
        }
    }
}
