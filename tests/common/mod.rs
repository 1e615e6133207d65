//! Helpers shared by the integration tests.
#![allow(dead_code)]

use qwen3_vl::{select_device, Backend, DeviceRequest};
use std::path::PathBuf;
use std::sync::Arc;

/// The repository root holding `tests/fixtures`: `QWEN3_VL_ROOT` when set (test binaries run on
/// another machine, see tools/package-gpu-tests.sh), else where the crate was built.
pub fn repo_root() -> PathBuf {
    std::env::var_os("QWEN3_VL_ROOT").map(PathBuf::from).unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")))
}

/// Deterministic pseudo-random f32 in [-1, 1) (xorshift32).
pub fn random(n: usize, seed: u32) -> Vec<f32> {
    let mut s = seed.wrapping_mul(0x9E37_79B9) | 1;
    (0..n)
        .map(|_| {
            s ^= s << 13;
            s ^= s >> 17;
            s ^= s << 5;
            (s >> 8) as f32 / (1u32 << 23) as f32 - 1.0
        })
        .collect()
}

/// Set to 1 on a machine that has a GPU: then a GPU test fails instead of skipping when CUDA
/// does not come up, so a broken GPU path cannot pass as "skipped".
pub const EXPECT_GPU_VAR: &str = "QWEN3_VL_EXPECT_GPU";

pub fn expect_gpu() -> bool {
    std::env::var(EXPECT_GPU_VAR).map_or(false, |v| v == "1")
}

/// The CUDA backend, or `None` (with a note on stderr) when this machine has none.
pub fn gpu(test: &str) -> Option<Arc<dyn Backend>> {
    match select_device(DeviceRequest::Cuda, None) {
        Ok(sel) => {
            assert_eq!(sel.backend.kind(), qwen3_vl::DeviceKind::Cuda);
            Some(sel.backend)
        }
        Err(e) => {
            assert!(!expect_gpu(), "{}: {}=1 but CUDA is unavailable: {}", test, EXPECT_GPU_VAR, e);
            eprintln!("{}: skipped on this machine: {}", test, e);
            None
        }
    }
}

pub fn cpu() -> Arc<dyn Backend> {
    select_device(DeviceRequest::Cpu, None).expect("the CPU backend always starts").backend
}

/// The CPU backend, plus the CUDA one when this machine has a GPU: model tests run on each.
pub fn backends(test: &str) -> Vec<Arc<dyn Backend>> {
    let mut v = vec![cpu()];
    if let Some(g) = gpu(test) {
        v.push(g);
    }
    v
}

/// Asserts max |got - want| <= rel · std(want), naming the worst element.
pub fn assert_close_to_std(what: &str, got: &[f32], want: &[f32], rel: f64) {
    assert_eq!(got.len(), want.len(), "{}: length", what);
    let m = want.iter().map(|&v| v as f64).sum::<f64>() / want.len() as f64;
    let std = (want.iter().map(|&v| (v as f64 - m).powi(2)).sum::<f64>() / want.len() as f64).sqrt();
    let (i, worst) = got.iter().zip(want).map(|(g, w)| (*g as f64 - *w as f64).abs()).enumerate().fold((0, 0.0), |a, (i, d)| if d > a.1 { (i, d) } else { a });
    assert!(worst <= rel * std, "{}: max |diff| {:.3e} at {} exceeds {:.0e} of std {:.3e}", what, worst, i, rel, std);
}
pub mod server;
