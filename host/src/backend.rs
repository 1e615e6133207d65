//! The backend interface: every op the model uses, once, implemented by the CPU backend
//! (pure Rust, multithreaded) and the CUDA backend (Rust kernels from `gpu/`). Code above
//! this trait is written once and runs on either. Shape and dtype rules live in [`crate::ops`]
//! and both backends check them before doing any work.

use crate::{DType, DeviceKind, Result, Tensor};

/// Device memory accounting (all zero on the CPU backend).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct MemoryStats {
    /// Bytes held by live tensors.
    pub in_use: usize,
    /// Bytes of freed blocks kept for reuse.
    pub cached: usize,
    /// High-water mark of `in_use`.
    pub peak: usize,
    /// Number of real device allocations made so far (cache misses).
    pub device_allocs: u64,
}

pub trait Backend: Send + Sync {
    /// Which device this backend runs on.
    fn kind(&self) -> DeviceKind;

    /// A human-readable description (device name, threads).
    fn describe(&self) -> String;

    /// Copies f32 host data into a new tensor on this backend.
    fn upload_f32(&self, shape: &[usize], data: &[f32]) -> Result<Tensor>;

    /// Copies raw f16/bf16 bits into a new tensor of `dtype` on this backend.
    fn upload_half(&self, shape: &[usize], dtype: DType, bits: &[u16]) -> Result<Tensor>;

    /// Copies an f32 tensor of this backend back to host memory.
    fn download_f32(&self, t: &Tensor) -> Result<Vec<f32>>;

    /// Linear layer: `a [m, k]` f32 times `w [n, k]` (f32/f16/bf16) transposed, plus an optional
    /// `bias [n]` f32; returns `[m, n]` f32.
    fn linear(&self, a: &Tensor, w: &Tensor, bias: Option<&Tensor>) -> Result<Tensor>;

    /// RMSNorm over the last axis of `x` with f32 weight `w [cols]`.
    fn rms_norm(&self, x: &Tensor, w: &Tensor, eps: f32) -> Result<Tensor>;

    /// Softmax over the last axis of `x`.
    fn softmax(&self, x: &Tensor) -> Result<Tensor>;

    /// `silu(gate) * up`, elementwise, same shapes.
    fn silu_mul(&self, gate: &Tensor, up: &Tensor) -> Result<Tensor>;

    /// Waits for all queued work.
    fn synchronize(&self) -> Result<()>;

    /// Device memory accounting.
    fn memory_stats(&self) -> MemoryStats {
        MemoryStats::default()
    }

    /// Test aid: when on, every new output buffer is filled with NaN before the op writes it,
    /// so an element an op fails to write shows up as NaN.
    fn set_poison_outputs(&self, on: bool);
}
