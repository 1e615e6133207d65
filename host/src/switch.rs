//! A/B switches for benchmarks: kernel variants that an environment variable set to `0` turns
//! off (`QWEN3_VL_SKINNY`, `QWEN3_VL_CPU_PANELS`, `QWEN3_VL_STREAM_LAYERS`,
//! `QWEN3_VL_CHUNK_PAGED`, `QWEN3_VL_PAGED_MMA`, `QWEN3_VL_PDL`, `QWEN3_VL_WGMMA`,
//! `QWEN3_VL_FLASH_WGMMA`), and numeric knobs ([`Knob`]: `QWEN3_VL_SKINNY_WAVES`), read once
//! per process.

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

/// A numeric A/B knob for benchmarks (`QWEN3_VL_SKINNY_WAVES`): the variable's value when it
/// parses as a number in `1..=max`, else `default` (a malformed value is logged and ignored);
/// read once per process.
pub(crate) struct Knob {
    name: &'static str,
    default: usize,
    max: usize,
    state: std::sync::atomic::AtomicUsize, // 0 unread, else the value plus one
}

impl Knob {
    pub(crate) const fn new(name: &'static str, default: usize, max: usize) -> Knob {
        Knob { name, default, max, state: std::sync::atomic::AtomicUsize::new(0) }
    }

    pub(crate) fn get(&self) -> usize {
        match self.state.load(Ordering::Relaxed) {
            0 => {
                let v = match std::env::var(self.name) {
                    Ok(s) => match s.trim().parse::<usize>() {
                        Ok(v) if (1..=self.max).contains(&v) => v,
                        _ => {
                            log::warn!("{}={:?} is not a number in 1..={}: using {}", self.name, s, self.max, self.default);
                            self.default
                        }
                    },
                    Err(_) => self.default,
                };
                self.state.store(v + 1, Ordering::Relaxed);
                v
            }
            v => v - 1,
        }
    }
}
