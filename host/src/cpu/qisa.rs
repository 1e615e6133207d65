//! Which instruction set runs the quantized CPU kernels ([`QIsa`]), detected at run time: a
//! leaf that the quantized linear layer (`qlinear.rs`) and its SIMD kernels (`simd/quant`)
//! both use.

use std::sync::atomic::{AtomicU8, Ordering};

/// An implementation of the quantized kernels: the instruction set they use.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum QIsa {
    /// AVX-512 VNNI (`vpdpbusd` / `vpdpwssd` on 512-bit vectors; AVX-512BW unpacking).
    Avx512Vnni,
    /// AVX-VNNI (the VEX-encoded 256-bit `vpdpbusd` / `vpdpwssd` of Alder Lake and later).
    AvxVnni,
    /// AVX2 (`vpmaddubsw` + `vpmaddwd`).
    Avx2,
    /// Portable Rust: the reference math of [`crate::quant`].
    Scalar,
}

impl QIsa {
    /// Every variant, fastest first.
    pub const ALL: [QIsa; 4] = [QIsa::Avx512Vnni, QIsa::AvxVnni, QIsa::Avx2, QIsa::Scalar];

    pub fn name(self) -> &'static str {
        match self {
            QIsa::Avx512Vnni => "avx512vnni",
            QIsa::AvxVnni => "avxvnni",
            QIsa::Avx2 => "avx2",
            QIsa::Scalar => "scalar",
        }
    }

    /// Whether this CPU can run the path (runtime detection).
    pub fn is_available(self) -> bool {
        match self {
            QIsa::Scalar => true,
            #[cfg(target_arch = "x86_64")]
            QIsa::Avx512Vnni => is_x86_feature_detected!("avx512f") && is_x86_feature_detected!("avx512bw") && is_x86_feature_detected!("avx512vl") && is_x86_feature_detected!("avx512vnni"),
            #[cfg(target_arch = "x86_64")]
            QIsa::AvxVnni => is_x86_feature_detected!("avx2") && is_x86_feature_detected!("avxvnni"),
            #[cfg(target_arch = "x86_64")]
            QIsa::Avx2 => is_x86_feature_detected!("avx2") && is_x86_feature_detected!("fma"),
            #[cfg(not(target_arch = "x86_64"))]
            _ => false,
        }
    }

    /// The paths this CPU can run, fastest first.
    pub fn available() -> Vec<QIsa> {
        QIsa::ALL.iter().copied().filter(|i| i.is_available()).collect()
    }

    /// The fastest available path, detected on first use and cached.
    pub fn detect() -> QIsa {
        static CACHED: AtomicU8 = AtomicU8::new(u8::MAX);
        match CACHED.load(Ordering::Relaxed) {
            i if (i as usize) < QIsa::ALL.len() => QIsa::ALL[i as usize],
            _ => {
                let i = QIsa::ALL.iter().position(|i| i.is_available()).unwrap_or(QIsa::ALL.len() - 1);
                CACHED.store(i as u8, Ordering::Relaxed);
                QIsa::ALL[i]
            }
        }
    }
}
