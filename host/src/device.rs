//! Device selection, the one place that knows both backends: `auto` takes CUDA when a device
//! initializes and the PTX loads, the CPU otherwise, and always says which and why.

use crate::backend::Backend;
use crate::cpu::CpuBackend;
use crate::kernels::{KernelsRequest, Ptx};
use crate::{Error, Result};
use std::str::FromStr;
use std::sync::Arc;

/// What the user asked for (`--device`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DeviceRequest {
    Auto,
    Cpu,
    Cuda,
}

impl FromStr for DeviceRequest {
    type Err = String;
    fn from_str(s: &str) -> std::result::Result<Self, String> {
        match s.to_ascii_lowercase().as_str() {
            "auto" => Ok(DeviceRequest::Auto),
            "cpu" => Ok(DeviceRequest::Cpu),
            "cuda" | "gpu" => Ok(DeviceRequest::Cuda),
            other => Err(format!("unknown device '{}': expected auto, cpu or cuda", other)),
        }
    }
}

/// The chosen backend and the one-line reason it was chosen.
pub struct Selection {
    pub backend: Arc<dyn Backend>,
    pub reason: String,
}

/// Picks a backend. `ptx` lists the kernel modules embedded at build time (none when the crate
/// was built without the `cuda` feature); `kernels` says which one CUDA loads. `Cuda` fails with the reason when CUDA cannot be
/// used; `Auto` then falls back to the CPU and the reason says why. Logs the decision.
pub fn select(request: DeviceRequest, ptx: &[Ptx], kernels: KernelsRequest, cpu_threads: Option<usize>) -> Result<Selection> {
    let cpu = |why: String| -> Result<Selection> {
        let b = CpuBackend::new(cpu_threads)?;
        let reason = format!("using {}: {}", b.describe(), why);
        Ok(Selection { backend: Arc::new(b), reason })
    };
    let sel = match request {
        DeviceRequest::Cpu => cpu("requested with --device cpu".into())?,
        DeviceRequest::Cuda => {
            let b = try_cuda(ptx, kernels)?;
            Selection { reason: format!("using {}: requested with --device cuda", b.describe()), backend: b }
        }
        // the pure-Rust build has no GPU path to fall back from: said at debug level only
        DeviceRequest::Auto if !cfg!(feature = "cuda") => {
            let sel = cpu("this build has no CUDA support (rebuild with --features cuda for the GPU)".into())?;
            log::debug!("{}", sel.reason);
            return Ok(sel);
        }
        DeviceRequest::Auto => match try_cuda(ptx, kernels) {
            Ok(b) => Selection { reason: format!("using {}: a CUDA device initialized and the kernels loaded", b.describe()), backend: b },
            Err(e) => cpu(format!("falling back from CUDA: {}", e))?,
        },
    };
    log::info!("{}", sel.reason);
    Ok(sel)
}

#[cfg(feature = "cuda")]
fn try_cuda(ptx: &[Ptx], kernels: KernelsRequest) -> Result<Arc<dyn Backend>> {
    if ptx.is_empty() {
        return Err(Error::Unavailable("no PTX was embedded in this build".into()));
    }
    Ok(Arc::new(crate::cuda::CudaBackend::new(ptx, kernels)?))
}

#[cfg(not(feature = "cuda"))]
fn try_cuda(_ptx: &[Ptx], _kernels: KernelsRequest) -> Result<Arc<dyn Backend>> {
    Err(Error::Unavailable("this build has no CUDA support (rebuild with --features cuda)".into()))
}
