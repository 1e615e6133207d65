//! qwen3-vl's engine: tensors, the backend interface with its CPU and CUDA implementations,
//! and device selection. The kernels themselves live in the `gpu` crate (`gpu/`), whose pure
//! math ([`gpu::math`]) the CPU backend shares.

pub mod backend;
pub mod chunks;
pub mod cpu;
#[cfg(feature = "cuda")]
pub mod cuda;
pub mod device;
pub mod engine;
pub mod generate;
pub mod gguf;
pub mod image;
pub mod video;
mod dtype;
mod error;
pub mod kernels;
pub mod logging;
mod memory;
pub mod model;
pub mod ops;
pub mod pages;
pub mod pick;
pub mod quant;
pub mod template;
mod switch;
mod tensor;
#[cfg(any(test, feature = "test-support"))]
#[doc(hidden)]
pub mod test_support;
pub mod tokenizer;

pub use backend::{AttnParams, Backend, BlockMask, Gelu, Mark, MemoryStats, Precision};
pub use pages::Pages;
/// The kernels crate: launch parameters, tile sizes and the math shared with the kernels.
pub use gpu;
pub use device::{cuda_device_count, select, DeviceRequest, Selection};
pub use dtype::DType;
pub use error::{Error, Result};
pub use tensor::{Blocks, CpuBuffer, DeviceKind, MappedBytes, Storage, Tensor};
pub use tokenizer::{StreamDecoder, Tokenizer};
