//! Device memory accounting, reported through the backend interface and counted by the CUDA
//! pool: a leaf that both use.

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
