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
/// parses as a number in `1..=max`, else `default` (unset or `0` quietly; anything else is
/// logged and ignored); read once per process. (Its one knob is the CUDA backend's.)
#[cfg_attr(not(feature = "cuda"), allow(dead_code))]
pub(crate) struct Knob {
    name: &'static str,
    default: usize,
    max: usize,
    state: std::sync::atomic::AtomicUsize, // 0 unread, else the value plus one
}

#[cfg_attr(not(feature = "cuda"), allow(dead_code))]
impl Knob {
    pub(crate) const fn new(name: &'static str, default: usize, max: usize) -> Knob {
        Knob { name, default, max, state: std::sync::atomic::AtomicUsize::new(0) }
    }

    pub(crate) fn get(&self) -> usize {
        match self.state.load(Ordering::Relaxed) {
            0 => {
                let text = std::env::var(self.name).ok();
                let (v, ok) = self.parse(text.as_deref());
                if !ok {
                    log::warn!("{}={:?} is not a number in 0..={}: using {}", self.name, text.unwrap_or_default(), self.max, self.default);
                }
                self.state.store(v + 1, Ordering::Relaxed);
                v
            }
            v => v - 1,
        }
    }

    /// The knob's value for the variable's text (`None`: unset), and whether the text was
    /// acceptable.
    fn parse(&self, text: Option<&str>) -> (usize, bool) {
        match text.map(|t| t.trim().parse::<usize>()) {
            None | Some(Ok(0)) => (self.default, true),
            Some(Ok(v)) if v <= self.max => (v, true),
            Some(_) => (self.default, false),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::Knob;

    #[test]
    fn a_knob_takes_numbers_in_its_range_and_falls_back_to_its_default() {
        let k = Knob::new("QWEN3_VL_TEST_KNOB_UNUSED", 3, 4);
        assert_eq!(k.parse(None), (3, true));
        assert_eq!(k.parse(Some("0")), (3, true));
        assert_eq!(k.parse(Some(" 2 ")), (2, true));
        assert_eq!(k.parse(Some("4")), (4, true));
        assert_eq!(k.parse(Some("5")), (3, false));
        assert_eq!(k.parse(Some("-1")), (3, false));
        assert_eq!(k.parse(Some("two")), (3, false));
        // read once: the unset variable gives the default
        assert_eq!(k.get(), 3);
        assert_eq!(k.get(), 3);
    }
}
