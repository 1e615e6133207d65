//! Device selection, the one place that knows both backends: `auto` takes CUDA when a device
//! initializes and the PTX loads, the CPU otherwise, and always says which and why.

use crate::backend::Backend;
use crate::cpu::CpuBackend;
use crate::kernels::{KernelsRequest, Ptx};
use crate::{Error, Result};
use std::str::FromStr;
use std::sync::Arc;

/// What the user asked for (`--device`): `auto` (CUDA device 0 when it works), `cpu`, or
/// `cuda` / `cuda:N` (the CUDA device of ordinal N, 0 by default).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DeviceRequest {
    Auto,
    Cpu,
    Cuda(usize),
}

impl FromStr for DeviceRequest {
    type Err = String;
    fn from_str(s: &str) -> std::result::Result<Self, String> {
        let lower = s.to_ascii_lowercase();
        let (name, ordinal) = match lower.split_once(':') {
            Some((n, o)) => (n, Some(o)),
            None => (lower.as_str(), None),
        };
        match (name, ordinal) {
            ("auto", None) => Ok(DeviceRequest::Auto),
            ("cpu", None) => Ok(DeviceRequest::Cpu),
            ("cuda" | "gpu", None) => Ok(DeviceRequest::Cuda(0)),
            ("cuda" | "gpu", Some(o)) => match o.parse::<usize>() {
                Ok(n) if n < MAX_ORDINAL => Ok(DeviceRequest::Cuda(n)),
                _ => Err(format!("bad device '{}': the ordinal after cuda: must be a number below {} (cuda:0, cuda:1, ...)", s, MAX_ORDINAL)),
            },
            _ => Err(format!("unknown device '{}': expected auto, cpu, cuda or cuda:N", s)),
        }
    }
}

impl std::fmt::Display for DeviceRequest {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            DeviceRequest::Auto => f.write_str("auto"),
            DeviceRequest::Cpu => f.write_str("cpu"),
            DeviceRequest::Cuda(n) => write!(f, "cuda:{}", n),
        }
    }
}

/// Ordinals at or above this are refused while parsing (the driver numbers devices densely
/// from 0; no host has this many).
const MAX_ORDINAL: usize = 1024;

/// How many CUDA devices this process sees (after `CUDA_VISIBLE_DEVICES`), or why none can be
/// counted (no driver, a build without CUDA).
pub fn cuda_device_count() -> Result<usize> {
    #[cfg(feature = "cuda")]
    {
        crate::cuda::CudaBackend::device_count()
    }
    #[cfg(not(feature = "cuda"))]
    {
        Err(Error::Unavailable("this build has no CUDA support (rebuild with --features cuda)".into()))
    }
}

/// The chosen backend and the one-line reason it was chosen.
pub struct Selection {
    pub backend: Arc<dyn Backend>,
    pub reason: String,
}

/// Picks a backend. `Cuda(n)` opens device `n` (its primary context): backends of different
/// ordinals live side by side in one process, each used from its own thread. `ptx` lists the kernel modules embedded at build time (none when the crate
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
        DeviceRequest::Cuda(ordinal) => {
            let b = try_cuda(ptx, kernels, ordinal)?;
            Selection { reason: format!("using {}: requested with --device {}", b.describe(), request), backend: b }
        }
        // the pure-Rust build has no GPU path to fall back from: said at debug level only
        DeviceRequest::Auto if !cfg!(feature = "cuda") => {
            let sel = cpu("this build has no CUDA support (rebuild with --features cuda for the GPU)".into())?;
            log::debug!("{}", sel.reason);
            return Ok(sel);
        }
        DeviceRequest::Auto => match try_cuda(ptx, kernels, 0) {
            Ok(b) => Selection { reason: format!("using {}: a CUDA device initialized and the kernels loaded", b.describe()), backend: b },
            Err(e) => cpu(format!("falling back from CUDA: {}", e))?,
        },
    };
    log::info!("{}", sel.reason);
    Ok(sel)
}

#[cfg(feature = "cuda")]
fn try_cuda(ptx: &[Ptx], kernels: KernelsRequest, ordinal: usize) -> Result<Arc<dyn Backend>> {
    if ptx.is_empty() {
        return Err(Error::Unavailable("no PTX was embedded in this build".into()));
    }
    Ok(Arc::new(crate::cuda::CudaBackend::new(ptx, kernels, ordinal)?))
}

#[cfg(not(feature = "cuda"))]
fn try_cuda(_ptx: &[Ptx], _kernels: KernelsRequest, _ordinal: usize) -> Result<Arc<dyn Backend>> {
    Err(Error::Unavailable("this build has no CUDA support (rebuild with --features cuda)".into()))
}

#[cfg(test)]
mod tests {
    use super::DeviceRequest;

    #[test]
    fn device_names_parse_with_an_optional_ordinal() {
        assert_eq!("auto".parse(), Ok(DeviceRequest::Auto));
        assert_eq!("CPU".parse(), Ok(DeviceRequest::Cpu));
        assert_eq!("cuda".parse(), Ok(DeviceRequest::Cuda(0)));
        assert_eq!("gpu".parse(), Ok(DeviceRequest::Cuda(0)));
        assert_eq!("cuda:3".parse(), Ok(DeviceRequest::Cuda(3)));
        assert_eq!(DeviceRequest::Cuda(3).to_string(), "cuda:3");
        for bad in ["cuda:", "cuda:x", "cuda:-1", "cuda:99999", "cpu:1", "auto:0", "tpu"] {
            let e = bad.parse::<DeviceRequest>().unwrap_err();
            assert!(e.contains(bad), "{}: {}", bad, e);
        }
    }
}
