//! Builds one PTX module of the kernel crate with `cuda_builder` on the pinned nightly.
//!
//! Usage: `qwen3-vl-gpu-builder GPU_DIR ARCH OUT_PTX TARGET_DIR [FEATURE ...]`, with ARCH
//! `compute_61` or `compute_80`. The root `build.rs` runs it through `cargo run` in this folder, so
//! rustup picks this folder's `rust-toolchain.toml`. TARGET_DIR is the kernel build's own target
//! directory (one per module: else each build invalidates the other's artifacts).
use cuda_builder::{CudaBuilder, NvvmArch};
use std::process::exit;

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.len() < 4 {
        eprintln!("usage: qwen3-vl-gpu-builder GPU_DIR compute_61|compute_80 OUT_PTX TARGET_DIR [FEATURE ...]");
        exit(2);
    }
    let arch = match args[1].as_str() {
        "compute_61" => NvvmArch::Compute61,
        "compute_80" => NvvmArch::Compute80,
        other => {
            eprintln!("unknown architecture {:?}: compute_61 or compute_80", other);
            exit(2);
        }
    };
    let mut features = Vec::new();
    for f in &args[4..] {
        features.push("--features".to_string());
        features.push(f.clone());
    }
    // cuda_builder passes no --target-dir without PROFILE, so the nested cargo takes
    // CARGO_TARGET_DIR.
    std::env::remove_var("PROFILE");
    std::env::set_var("CARGO_TARGET_DIR", &args[3]);
    if let Err(e) = CudaBuilder::new(&args[0]).arch(arch).release(true).build_args(&features).copy_to(&args[2]).build() {
        eprintln!("building the {} PTX kernels in {} failed: {:?} (README: LLVM 7 and CUDA 11.x libNVVM, ../shared/cuda-toolchain/setup.sh)", args[1], args[0], e);
        exit(1);
    }
}
