//! What every checked launcher shares: the launcher handle (module + stream), the size and
//! grid checks that return `Err` naming the kernel before anything is launched, and the
//! driver-status conversion. The launchers themselves live beside their backend ops, one file
//! per kernel family (`linear.rs`, `norm.rs`, `attention.rs`, ...).

use super::module::Kernels;
use super::pool::DeviceBuffer;
use crate::kernels::Kernel;
use crate::{Error, Result};
pub use super::error::{cuda_err, OkOrCuda};

pub const MAX_GRID_X: usize = (1 << 31) - 1;
pub const MAX_GRID_Y: usize = 65_535;

/// The loaded kernels and the stream they are launched on.
pub struct Launcher<'a> {
    pub kernels: &'a Kernels,
    pub stream: cust::sys::CUstream,
    /// The backend's KV scale flag (a u32 on the device; see `CudaBackend::kv_flag`).
    pub kv_flag: u64,
    /// The backend's arrival counters ([`super::ARRIVAL_COUNTERS`] u32, zero between launches).
    pub counters: u64,
    /// The tensor-core GEMMs take their 16-bit-activation variants (`Precision::Bf16`).
    pub a16: bool,
}

impl Launcher<'_> {
    /// `kernel`, or on an sm_90a module its warpgroup variant of the same tile and parameters
    /// (`gpu/src/wgmma.rs`, `gpu/src/flash_mma.rs`; `Kernel::wgmma_variant`) where the device's
    /// blocks may take its shared memory.
    pub fn wgmma_or(&self, kernel: Kernel) -> Kernel {
        match kernel.wgmma_variant() {
            Some(w) if self.kernels.sm90a() && self.kernels.fits_shared(w.large_shared_bytes()) => w,
            _ => kernel,
        }
    }

    /// Launches `kernel` with its single parameter struct `params` and no dynamic shared memory.
    pub fn launch<P: Copy>(&self, kernel: Kernel, grid: [u32; 3], block: u32, params: &P) -> Result<()> {
        self.kernels.launch(self.stream, kernel, grid, block, 0, params)
    }

    /// Launches with `shared_bytes` of dynamic shared memory (at most 48 KiB, or what the module
    /// loader raised the kernel's limit to: `Kernel::large_shared_bytes`).
    pub fn launch_shared<P: Copy>(&self, kernel: Kernel, grid: [u32; 3], block: u32, shared_bytes: u32, params: &P) -> Result<()> {
        self.kernels.launch(self.stream, kernel, grid, block, shared_bytes, params)
    }

    /// [`Launcher::launch_shared`] in thread-block clusters of `cluster` blocks per axis (sm_90).
    pub fn launch_cluster<P: Copy>(&self, kernel: Kernel, grid: [u32; 3], block: u32, shared_bytes: u32, params: &P, cluster: [u32; 3]) -> Result<()> {
        self.kernels.launch_cluster(self.stream, kernel, grid, block, shared_bytes, params, cluster)
    }

}

/// Checks that `buf` holds at least `bytes`.
pub fn need(kernel: Kernel, what: &str, buf: &DeviceBuffer, bytes: usize) -> Result<()> {
    if buf.len() < bytes {
        return Err(Error::Limit {
            op: kernel.name(),
            msg: format!("{} buffer holds {} bytes, the launch reads or writes {}", what, buf.len(), bytes),
        });
    }
    Ok(())
}

/// `v` as a kernel's u32 size field.
pub fn fits_u32(kernel: Kernel, what: &str, v: usize) -> Result<u32> {
    if v > u32::MAX as usize {
        return Err(Error::Limit { op: kernel.name(), msg: format!("{} = {} exceeds u32", what, v) });
    }
    Ok(v as u32)
}

/// `v` as a grid dimension no larger than `max`.
pub fn grid_dim(kernel: Kernel, axis: &str, v: usize, max: usize) -> Result<u32> {
    if v > max {
        return Err(Error::Limit { op: kernel.name(), msg: format!("grid {} = {} exceeds the limit {}", axis, v, max) });
    }
    Ok(v as u32)
}

pub fn ceil_div(a: usize, b: usize) -> usize {
    (a + b - 1) / b
}
