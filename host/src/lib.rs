//! qwen3-vl's engine: tensors, the backend interface with its CPU and CUDA implementations,
//! and device selection. The kernels themselves live in the `gpu` crate (`gpu/`), whose pure
//! math ([`gpu::math`]) the CPU backend shares.

pub mod backend;
pub mod cpu;
#[cfg(feature = "cuda")]
pub mod cuda;
pub mod device;
mod dtype;
mod error;
pub mod kernels;
pub mod ops;
mod tensor;

pub use backend::{AttnParams, Backend, MemoryStats};
pub use device::{select, DeviceRequest, Selection};
pub use dtype::DType;
pub use error::{Error, Result};
pub use tensor::{CpuBuffer, DeviceKind, Storage, Tensor};
