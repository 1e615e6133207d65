//! Helpers shared by the integration tests.
#![allow(dead_code)]

use approx::assert_relative_eq;
use qwen3_vl::{select_device, Backend, DType, DeviceKind, DeviceRequest, Result, Tensor};
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

/// Asserts max |got - want| <= rel · std(want), naming the worst element. With
/// QWEN3_VL_REPORT=1 every comparison prints its measured max |diff| / std.
pub fn assert_close_to_std(what: &str, got: &[f32], want: &[f32], rel: f64) {
    assert_eq!(got.len(), want.len(), "{}: length", what);
    let m = want.iter().map(|&v| v as f64).sum::<f64>() / want.len() as f64;
    let std = (want.iter().map(|&v| (v as f64 - m).powi(2)).sum::<f64>() / want.len() as f64).sqrt();
    let (i, worst) = got.iter().zip(want).map(|(g, w)| (*g as f64 - *w as f64).abs()).enumerate().fold((0, 0.0), |a, (i, d)| if d > a.1 { (i, d) } else { a });
    if std::env::var("QWEN3_VL_REPORT").map_or(false, |v| v == "1") {
        eprintln!("report: {}: max |diff| / std = {:.2e} (tolerance {:.0e})", what, worst / std, rel);
    }
    assert!(worst <= rel * std, "{}: max |diff| {:.3e} at {} exceeds {:.0e} of std {:.3e}", what, worst, i, rel, std);
}

/// The tolerance (times the reference std) of logits computed through a KV cache of `kv`: f32
/// arithmetic agrees to 1e-3; an f16 cache rounds keys and values to 11 significant bits
/// (relative error up to 2^-11 ≈ 4.9e-4 each) before attention reads them, which moves the
/// random-weight fixtures' logits by up to ~1e-2 of their std (measured on the CPU and the
/// H100 alike; the two round identically), so 2e-2 is allowed there.
pub fn kv_tolerance(kv: DType) -> f64 {
    if kv == DType::F16 {
        2e-2
    } else {
        1e-3
    }
}

/// The KV-cache types to test: f32 and f16 on every backend.
pub const KV_DTYPES: [DType; 2] = [DType::F32, DType::F16];

/// Runs `op` on the CPU and on `gpu` with the same inputs and compares the f32 outputs
/// element by element: |gpu - cpu| <= abs_tol, or within max_relative of each other.
pub fn agree(
    name: &str,
    gpu: &dyn Backend,
    op: &dyn Fn(&dyn Backend) -> Result<Tensor>,
    abs_tol: f32,
    max_relative: f32,
) {
    let cpu = cpu();
    let want_t = op(&*cpu).unwrap_or_else(|e| panic!("{}: cpu failed: {}", name, e));
    let want = cpu.download_f32(&want_t).unwrap();
    gpu.set_poison_outputs(true);
    let got_t = op(gpu).unwrap_or_else(|e| panic!("{}: gpu failed: {}", name, e));
    assert_eq!(got_t.device(), DeviceKind::Cuda, "{}: the result must come from the GPU", name);
    assert_eq!(got_t.shape(), want_t.shape(), "{}", name);
    let got = gpu.download_f32(&got_t).unwrap();
    assert_eq!(got.len(), want.len());
    for (i, (g, w)) in got.iter().zip(&want).enumerate() {
        assert!(!g.is_nan() || w.is_nan(), "{}: element {} was not written (NaN poison left)", name, i);
        assert_relative_eq!(*g, *w, epsilon = abs_tol, max_relative = max_relative);
    }
}

/// Uploads `data` of shape to `b` as `dtype` (rounding to f16/bf16 bits first).
pub fn upload(b: &dyn Backend, shape: &[usize], data: &[f32], dtype: DType) -> Result<Tensor> {
    match dtype {
        DType::F32 => b.upload_f32(shape, data),
        DType::F16 => b.upload_half(shape, dtype, &data.iter().map(|x| half::f16::from_f32(*x).to_bits()).collect::<Vec<_>>()),
        DType::BF16 => b.upload_half(shape, dtype, &data.iter().map(|x| half::bf16::from_f32(*x).to_bits()).collect::<Vec<_>>()),
        other => panic!("{} is not an element float type", other),
    }
}


/// Like [`agree`], for ops whose results the closure reads back itself (several outputs,
/// caches of any dtype): compares the host vectors `op` returns on the CPU and on `gpu`, the
/// GPU's outputs NaN-poisoned before every launch.
pub fn agree_host(name: &str, gpu: &dyn Backend, op: &dyn Fn(&dyn Backend) -> Result<Vec<f32>>, abs_tol: f32, max_relative: f32) {
    let want = op(&*cpu()).unwrap_or_else(|e| panic!("{}: cpu failed: {}", name, e));
    gpu.set_poison_outputs(true);
    let got = op(gpu).unwrap_or_else(|e| panic!("{}: gpu failed: {}", name, e));
    assert_eq!(got.len(), want.len(), "{}", name);
    for (i, (g, w)) in got.iter().zip(&want).enumerate() {
        assert!(!g.is_nan() || w.is_nan(), "{}: element {} was not written (NaN poison left)", name, i);
        assert_relative_eq!(*g, *w, epsilon = abs_tol, max_relative = max_relative);
    }
}

/// The elements of an f32 or f16 tensor as f32, read back from its backend.
pub fn download_any(b: &dyn Backend, t: &Tensor) -> Result<Vec<f32>> {
    match t.dtype() {
        DType::F16 => Ok(b.download_half(t)?.iter().map(|&h| half::f16::from_bits(h).to_f32()).collect()),
        DType::BF16 => Ok(b.download_half(t)?.iter().map(|&h| half::bf16::from_bits(h).to_f32()).collect()),
        DType::U32 => Ok(b.download_u32(t)?.iter().map(|&v| v as f32).collect()),
        DType::F32 => b.download_f32(t),
        other => panic!("cannot download {} elements", other),
    }
}

pub mod gguf;
pub mod server;
