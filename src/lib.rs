//! qwen3-vl: Qwen3-VL inference with GPU kernels written in Rust (rust-cuda, PTX for
//! compute_61 and compute_80) and a pure-Rust CPU path that gives the same answers.
//!
//! This crate is the user-facing entry: it re-exports the engine (`host/`) and embeds the PTX
//! modules built from `gpu/` when the `cuda` feature is on.

pub use host::*;

use host::kernels::{Arch, KernelsRequest, Ptx};

pub mod generation_config;
pub mod loading;
pub mod server;
pub mod signals;

/// The PTX modules of `gpu/`, built by `build.rs`: compute_61 (every GPU since Pascal) and
/// compute_80 (adds the tensor-core kernels). Empty without the `cuda` feature.
#[cfg(feature = "cuda")]
pub const PTX: &[Ptx] = &[
    Ptx { arch: Arch::Compute61, text: include_str!(concat!(env!("OUT_DIR"), "/kernels_61.ptx")) },
    Ptx { arch: Arch::Compute80, text: include_str!(concat!(env!("OUT_DIR"), "/kernels_80.ptx")) },
];
#[cfg(not(feature = "cuda"))]
pub const PTX: &[Ptx] = &[];

/// The embedded module of `arch`, if this build has it.
pub fn ptx(arch: Arch) -> Option<&'static Ptx> {
    PTX.iter().find(|p| p.arch == arch)
}

/// Picks a backend for `request` with this build's kernels (the best module the device
/// supports); see [`host::device::select`].
pub fn select_device(request: DeviceRequest, cpu_threads: Option<usize>) -> Result<Selection> {
    select_device_with(request, KernelsRequest::Auto, cpu_threads)
}

/// [`select_device`] with an explicit kernel module choice (`--kernels`).
pub fn select_device_with(request: DeviceRequest, kernels: KernelsRequest, cpu_threads: Option<usize>) -> Result<Selection> {
    host::device::select(request, PTX, kernels, cpu_threads)
}
