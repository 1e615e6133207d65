//! qwen3-vl: Qwen3-VL inference with GPU kernels written in Rust (rust-cuda, PTX for
//! compute_61 and newer) and a pure-Rust CPU path that gives the same answers.
//!
//! This crate is the user-facing entry: it re-exports the engine (`host/`) and embeds the PTX
//! built from `gpu/` when the `cuda` feature is on.

pub use host::*;

pub mod generation_config;
pub mod server;
pub mod signals;

/// The PTX of every kernel in `gpu/`, built by `build.rs` for compute_61 (`None` without the
/// `cuda` feature).
#[cfg(feature = "cuda")]
pub const PTX: Option<&str> = Some(include_str!(concat!(env!("OUT_DIR"), "/kernels.ptx")));
#[cfg(not(feature = "cuda"))]
pub const PTX: Option<&str> = None;

/// Picks a backend for `request` with this build's kernels; see [`host::device::select`].
pub fn select_device(request: DeviceRequest, cpu_threads: Option<usize>) -> Result<Selection> {
    host::device::select(request, PTX, cpu_threads)
}
