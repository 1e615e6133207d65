//! qwen3-vl's GPU kernels, written in Rust with `cuda_std` and compiled to PTX (compute_61)
//! by `cuda_builder` from the workspace's `build.rs`.
//!
//! - [`math`] and [`params`] compile for both sides: the scalar math that the CPU backend
//!   calls too, and the `#[repr(C)]` launch parameter structs.
//! - The kernel modules compile for the GPU only. One file per kernel family; every kernel
//!   is named `<op>[_<variant>]_<dtype>`, and the host keeps the typed list of those names.
#![cfg_attr(
    target_os = "cuda",
    no_std,
    feature(register_attr, link_llvm_intrinsics, asm, asm_experimental_arch),
    register_attr(nvvm_internal)
)]
#![allow(clippy::missing_safety_doc)]

/// `body` once for each listed index below `n`, with `$i` a constant: loops over register
/// arrays written out, so that every index is known at compile time (a loop the compiler
/// leaves rolled would index the arrays dynamically and move them to local memory).
#[cfg(target_os = "cuda")]
macro_rules! unroll {
    ($i:ident < $n:expr, [$($k:literal),*], $body:block) => {
        $(
            #[allow(clippy::identity_op)]
            if $k < $n {
                let $i: usize = $k;
                $body
            }
        )*
    };
}

pub mod math;
pub mod params;
pub mod qmath;

#[cfg(target_os = "cuda")]
mod mem;
#[cfg(target_os = "cuda")]
mod reduce;

#[cfg(target_os = "cuda")]
pub mod activation;
#[cfg(target_os = "cuda")]
pub mod attention;
#[cfg(all(target_os = "cuda", feature = "sm80"))]
pub mod attention_paged;
#[cfg(all(target_os = "cuda", feature = "sm80"))]
pub mod attention_paged_mma;
#[cfg(target_os = "cuda")]
pub mod embedding;
#[cfg(target_os = "cuda")]
pub mod flash;
#[cfg(all(target_os = "cuda", feature = "sm80"))]
pub mod flash_mma;
#[cfg(target_os = "cuda")]
pub mod dequant;
#[cfg(target_os = "cuda")]
pub mod gemv;
#[cfg(target_os = "cuda")]
pub mod matmul;
#[cfg(all(target_os = "cuda", feature = "sm80"))]
pub mod mma;
#[cfg(all(target_os = "cuda", feature = "sm80"))]
pub mod mma_pipe;
#[cfg(target_os = "cuda")]
pub mod mmvq;
#[cfg(target_os = "cuda")]
pub mod norm;
#[cfg(target_os = "cuda")]
pub mod rope;
#[cfg(target_os = "cuda")]
pub mod sample;
#[cfg(target_os = "cuda")]
pub mod softmax;
#[cfg(all(target_os = "cuda", feature = "sm80"))]
pub mod wgmma;
