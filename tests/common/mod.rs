//! Helpers shared by the integration tests.
#![allow(dead_code)]

use approx::assert_relative_eq;
use qwen3_vl::kernels::{Arch, KernelsRequest};
use qwen3_vl::{select_device, select_device_with, Backend, DType, DeviceKind, DeviceRequest, Result, Tensor};
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

/// The CUDA backend, or `None` (with a note on stderr, and the test counted as skipped) when
/// this machine has none.
pub fn gpu(test: &str) -> Option<Arc<dyn Backend>> {
    gpu_or_skip(test, Skip::Whole)
}

/// What a test leaves out when there is no GPU.
#[derive(Clone, Copy)]
enum Skip {
    /// Everything: a GPU test.
    Whole,
    /// Its GPU part: a test that also runs on the CPU.
    Part,
}

fn gpu_or_skip(test: &str, skip: Skip) -> Option<Arc<dyn Backend>> {
    match select_device(DeviceRequest::Cuda(0), None) {
        Ok(sel) => {
            assert_eq!(sel.backend.kind(), qwen3_vl::DeviceKind::Cuda);
            Some(sel.backend)
        }
        Err(e) => {
            assert!(!expect_gpu(), "{}: {}=1 but CUDA is unavailable: {}", test, EXPECT_GPU_VAR, e);
            eprintln!("{}: skipped on this machine: {}", test, e);
            record_gpu_skip(test, skip, &e.to_string());
            None
        }
    }
}

/// Where tests that skipped their GPU work leave a note, one file per test
/// (`whole--BINARY--TEST` for a GPU test, `part--BINARY--TEST` for a CPU and GPU test that ran
/// on the CPU only): `.ci/run` counts them into its summary (`N passed, N failed, N skipped`),
/// since cargo counts a test that returned early as passed.
pub fn gpu_skip_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("gpu-skipped")
}

/// Notes that the running test (the test harness names its thread after it; `label` when the
/// tests run on the main thread) skipped its GPU work. Best effort: a note that cannot be
/// written only loses a count.
fn record_gpu_skip(label: &str, skip: Skip, why: &str) {
    let exe = std::env::current_exe().ok().and_then(|p| p.file_stem().map(|s| s.to_string_lossy().into_owned())).unwrap_or_default();
    let binary = exe.rsplit_once('-').map_or(exe.as_str(), |(name, _hash)| name).to_string();
    let test = match std::thread::current().name() {
        Some(name) if name != "main" => name.to_string(),
        _ => label.to_string(),
    };
    let kind = match skip {
        Skip::Whole => "whole",
        Skip::Part => "part",
    };
    let file: String = format!("{}--{}--{}", kind, binary, test).chars().map(|c| if c.is_ascii_alphanumeric() || c == '_' || c == '-' { c } else { '_' }).collect();
    let dir = gpu_skip_dir();
    let _ = std::fs::create_dir_all(&dir).and_then(|_| std::fs::write(dir.join(file), format!("{}: {}\n", label, why)));
}

/// One CUDA backend on each of the first `n` devices (`--device cuda:0`, `cuda:1`, ...), or
/// `None` (with a note, the test counted as skipped) when this machine has fewer: a machine
/// of one GPU skips even with QWEN3_VL_EXPECT_GPU=1, which promises a GPU, not several.
pub fn gpus_at_least(test: &str, n: usize) -> Option<Vec<Arc<dyn Backend>>> {
    let count = match qwen3_vl::cuda_device_count() {
        Ok(c) => c,
        Err(e) => {
            assert!(!expect_gpu(), "{}: {}=1 but CUDA is unavailable: {}", test, EXPECT_GPU_VAR, e);
            0
        }
    };
    if count < n {
        let why = format!("{} CUDA devices visible, the test needs {}", count, n);
        eprintln!("{}: skipped on this machine: {}", test, why);
        record_gpu_skip(test, Skip::Whole, &why);
        return None;
    }
    Some((0..n).map(|i| select_device(DeviceRequest::Cuda(i), None).unwrap_or_else(|e| panic!("{}: cuda:{} does not open: {}", test, i, e)).backend).collect())
}

pub fn cpu() -> Arc<dyn Backend> {
    select_device(DeviceRequest::Cpu, None).expect("the CPU backend always starts").backend
}

/// The CUDA backend once per kernel module the device supports, each forced
/// (`--kernels compute_61`, `compute_80`): the portable FP32 kernels and the tensor-core ones
/// are tested in turn on one GPU. Empty (with a note) without a GPU.
pub fn gpus(test: &str) -> Vec<Arc<dyn Backend>> {
    gpus_or_skip(test, Skip::Whole)
}

fn gpus_or_skip(test: &str, skip: Skip) -> Vec<Arc<dyn Backend>> {
    if gpu_or_skip(test, skip).is_none() {
        return Vec::new();
    }
    let mut v = Vec::new();
    for arch in Arch::ALL {
        match select_device_with(DeviceRequest::Cuda(0), KernelsRequest::Force(arch), None) {
            Ok(sel) => v.push(sel.backend),
            // an older device than the module needs: not an error
            Err(e) if e.to_string().contains("needs compute capability") => eprintln!("{}: {} skipped: {}", test, arch, e),
            Err(e) => panic!("{}: the {} module does not load: {}", test, arch, e),
        }
    }
    v
}

/// The CPU backend, plus the CUDA one per kernel module when this machine has a GPU: model
/// tests run on each.
pub fn backends(test: &str) -> Vec<Arc<dyn Backend>> {
    let mut v = vec![cpu()];
    v.extend(gpus_or_skip(test, Skip::Part));
    v
}

/// The kernel module a backend runs (`None` on the CPU).
pub fn kernels_arch(b: &dyn Backend) -> Option<Arch> {
    #[cfg(feature = "cuda")]
    {
        b.as_any().downcast_ref::<qwen3_vl::cuda::CudaBackend>().map(|c| c.kernels_module().0)
    }
    #[cfg(not(feature = "cuda"))]
    {
        let _ = b;
        None
    }
}

/// Whether a backend runs attention on tensor cores (the compute_80 module).
pub fn tensor_cores(b: &dyn Backend) -> bool {
    kernels_arch(b) == Some(Arch::Compute80)
}

/// Per-element tolerance `(absolute, relative)` of attention outputs against the CPU, for
/// inputs in [-1, 1). FP32 kernels (compute_61): f32 arithmetic in another order, 1e-5 + 1e-4
/// relative. Tensor cores (compute_80): q, k, v and the probabilities are rounded to f16 (unit
/// roundoff u = 2^-11 ≈ 4.9e-4) with f32 sums. Rounding v and p moves an output (a convex
/// combination of value rows, |v| ≤ 1) by at most 2u ≈ 1e-3; rounding q and k moves each score
/// by at most 2u · Σ|q_i k_i| · scale (≈ 3.7e-3 at d = 128 for these inputs), which moves the
/// weights, and so the output, by about twice that at worst: 4e-3 absolute covers the sum with
/// the worst cases far out in the tails. Measured on the H100 (QWEN3_VL_REPORT=1, every case of
/// tests/gpu_attention.rs): at most 4.2e-4 on tensor cores, 2.4e-7 with the FP32 kernels.
pub fn attention_tolerance(b: &dyn Backend) -> (f32, f32) {
    if tensor_cores(b) {
        (4e-3, 1e-2)
    } else {
        (1e-5, 1e-4)
    }
}

/// Tolerance (times the reference std) of a model's logits through a KV cache of `kv` on `b`:
/// [`kv_tolerance`], and on tensor cores the f16-cache bound whatever the cache type, since
/// their attention rounds keys and values to f16 as an f16 cache does (and queries and
/// probabilities likewise): measured at most 4.0e-3 of the std on the H100 over the text and
/// image fixtures, either cache type, with every greedy continuation unchanged.
pub fn logits_tolerance(b: &dyn Backend, kv: DType) -> f64 {
    if tensor_cores(b) {
        kv_tolerance(DType::F16)
    } else {
        kv_tolerance(kv)
    }
}

/// Tolerance (times the reference std) of the vision tower's outputs on `b`: 1e-3 for f32
/// arithmetic; on tensor cores the attention's f16 operands (relative 2^-11 ≈ 4.9e-4 each,
/// through the 3 blocks of the tiny tower) moved embeddings and DeepStack features by at most
/// 9.1e-4 of their std on the H100, so 5e-3.
pub fn tower_tolerance(b: &dyn Backend) -> f64 {
    if tensor_cores(b) {
        5e-3
    } else {
        1e-3
    }
}

/// Asserts max |got - want| <= rel · std(want), naming the worst element; a NaN or infinity
/// where the reference is finite counts as an infinite difference. With QWEN3_VL_REPORT=1
/// every comparison prints its measured max |diff| / std.
pub fn assert_close_to_std(what: &str, got: &[f32], want: &[f32], rel: f64) {
    assert_eq!(got.len(), want.len(), "{}: length", what);
    assert!(want.iter().all(|v| v.is_finite()), "{}: the reference is not finite", what);
    let m = want.iter().map(|&v| v as f64).sum::<f64>() / want.len() as f64;
    let std = (want.iter().map(|&v| (v as f64 - m).powi(2)).sum::<f64>() / want.len() as f64).sqrt();
    let diff = |g: f32, w: f32| if g.is_finite() { (g as f64 - w as f64).abs() } else { f64::INFINITY };
    let (i, worst) = got.iter().zip(want).map(|(g, w)| diff(*g, *w)).enumerate().fold((0, 0.0), |a, (i, d)| if d > a.1 { (i, d) } else { a });
    if std::env::var("QWEN3_VL_REPORT").map_or(false, |v| v == "1") {
        eprintln!("report: {}: max |diff| / std = {:.2e} (tolerance {:.0e})", what, worst / std, rel);
    }
    assert!(worst <= rel * std, "{}: max |diff| {:.3e} at {} exceeds {:.0e} of std {:.3e}", what, worst, i, rel, std);
}

/// The tolerance (times the reference std) of logits computed through a KV cache of `kv`: f32
/// arithmetic agrees to 1e-3; an f16 cache rounds keys and values to 11 significant bits
/// (relative error up to 2^-11 ≈ 4.9e-4 each) before attention reads them, which moved the
/// fixtures' logits by at most 3.2e-3 of their std (measured on the CPU and the H100 alike: the
/// two round identically), so 1e-2 is allowed there.
pub fn kv_tolerance(kv: DType) -> f64 {
    if kv == DType::F16 {
        1e-2
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
    if std::env::var("QWEN3_VL_REPORT").map_or(false, |v| v == "1") {
        let worst = got.iter().zip(&want).map(|(g, w)| (g - w).abs()).fold(0.0f32, f32::max);
        eprintln!("report: {}: max |diff| = {:.2e} (tolerance {:.0e} absolute or {:.0e} relative)", name, worst, abs_tol, max_relative);
    }
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

/// A scratch file or folder under the temporary folder, removed when dropped (the test passing
/// or failing): bind it to a named variable (`let dir = ...`, `let _dir = ...`, never
/// `let _ = ...`) that lives as long as anything (a server, a child process) reads the path.
/// `name` is the entry's name in `temp_dir()`, with the process id in it so that test binaries
/// running at once do not collide.
pub struct Scratch(PathBuf);

impl Scratch {
    /// A fresh, empty folder `name`.
    pub fn dir(name: &str) -> Scratch {
        let s = Scratch::path(name);
        std::fs::create_dir_all(&s.0).unwrap();
        s
    }

    /// The path of `name` with nothing there (what was is removed): for a file the test writes,
    /// or a folder a command creates.
    pub fn path(name: &str) -> Scratch {
        let s = Scratch(std::env::temp_dir().join(name));
        s.remove();
        s
    }

    fn remove(&self) {
        let _ = match std::fs::symlink_metadata(&self.0) {
            Ok(m) if m.is_dir() => std::fs::remove_dir_all(&self.0),
            Ok(_) => std::fs::remove_file(&self.0),
            Err(_) => Ok(()),
        };
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        self.remove();
    }
}

impl std::ops::Deref for Scratch {
    type Target = std::path::Path;
    fn deref(&self) -> &std::path::Path {
        &self.0
    }
}

impl AsRef<std::path::Path> for Scratch {
    fn as_ref(&self) -> &std::path::Path {
        &self.0
    }
}

impl AsRef<std::ffi::OsStr> for Scratch {
    fn as_ref(&self) -> &std::ffi::OsStr {
        self.0.as_os_str()
    }
}

/// A prompt's greedy continuation of `steps` tokens through a session of its own on `b` (KV cache
/// of `kv`), and how many of its first tokens are decided by a clear margin: the steps before
/// the first whose top two logits are within 1e-2 of the logits' std. Another path (another
/// backend, a batch) may differ from it only after those.
pub fn greedy_alone(model: &qwen3_vl::model::Model, b: &dyn Backend, kv: DType, prompt: &[u32], steps: usize) -> (Vec<u32>, usize) {
    let mut s = qwen3_vl::generate::Session::with_kv_dtype(model, b, prompt.len() + steps, kv).unwrap();
    let mut logits = s.feed(prompt).unwrap();
    let (mut tokens, mut clear) = (Vec::new(), None);
    for step in 0..steps {
        logits.truncate(model.sampled_vocab());
        if clear.is_none() && top_two_within(&logits, 1e-2) {
            clear = Some(step);
        }
        let t = qwen3_vl::generate::sampling::argmax(&logits);
        tokens.push(t);
        if step + 1 < steps {
            logits = s.feed(&[t]).unwrap();
        }
    }
    (tokens, clear.unwrap_or(steps))
}

/// Whether the two largest `logits` are within `rel` of the logits' std of each other: a greedy
/// pick another path may make differently.
pub fn top_two_within(logits: &[f32], rel: f32) -> bool {
    let mut sorted = logits.to_vec();
    sorted.sort_by(|a, b| b.partial_cmp(a).unwrap());
    let mean = logits.iter().sum::<f32>() / logits.len() as f32;
    let std = (logits.iter().map(|v| (v - mean) * (v - mean)).sum::<f32>() / logits.len() as f32).sqrt();
    sorted[0] - sorted[1] < rel * std
}

/// A copy of the model in `src` in a scratch directory named after `tag` (removed when dropped): `model.safetensors`
/// with every tensor (f32 or bf16) converted to f16 after `edit(name, values as f32)`, and the
/// config files beside it (`config.json`, `preprocessor_config.json` where present).
pub fn f16_copy(src: &std::path::Path, tag: &str, edit: &dyn Fn(&str, &mut [f32])) -> Scratch {
    half_copy(src, tag, safetensors::Dtype::F16, edit)
}

/// [`f16_copy`] into `dtype` (f16 or bf16).
pub fn half_copy(src: &std::path::Path, tag: &str, dtype: safetensors::Dtype, edit: &dyn Fn(&str, &mut [f32])) -> Scratch {
    use safetensors::tensor::{Dtype, TensorView};
    let dir = Scratch::dir(&format!("qwen3-vl-{}-{}", tag, std::process::id()));
    for f in ["config.json", "preprocessor_config.json"] {
        if src.join(f).exists() {
            std::fs::copy(src.join(f), dir.join(f)).unwrap();
        }
    }
    let bytes = std::fs::read(src.join("model.safetensors")).unwrap();
    let st = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    let bits = |x: f32| match dtype {
        Dtype::F16 => half::f16::from_f32(x).to_bits(),
        Dtype::BF16 => half::bf16::from_f32(x).to_bits(),
        other => panic!("half_copy into {:?}", other),
    };
    let converted: Vec<(String, Vec<usize>, Vec<u8>)> = st
        .tensors()
        .into_iter()
        .map(|(name, v)| {
            let mut f: Vec<f32> = match v.dtype() {
                Dtype::F32 => v.data().chunks_exact(4).map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect(),
                Dtype::BF16 => v.data().chunks_exact(2).map(|c| half::bf16::from_bits(u16::from_le_bytes([c[0], c[1]])).to_f32()).collect(),
                other => panic!("{}: {:?} is neither f32 nor bf16", name, other),
            };
            edit(&name, &mut f);
            (name, v.shape().to_vec(), f.iter().flat_map(|&x| bits(x).to_le_bytes()).collect())
        })
        .collect();
    let views: Vec<(String, TensorView<'_>)> = converted.iter().map(|(n, s, d)| (n.clone(), TensorView::new(dtype, s.clone(), d).unwrap())).collect();
    safetensors::serialize_to_file(views, None, &dir.join("model.safetensors")).unwrap();
    dir
}

/// Shape and values (as f32) of the f16 tensor `name` of a [`f16_copy`].
pub fn f16_tensor(st: &safetensors::SafeTensors<'_>, name: &str) -> (Vec<usize>, Vec<f32>) {
    let t = st.tensor(name).unwrap();
    (t.shape().to_vec(), t.data().chunks_exact(2).map(|c| half::f16::from_bits(u16::from_le_bytes([c[0], c[1]])).to_f32()).collect())
}
