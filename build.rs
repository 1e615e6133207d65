//! Builds the kernels in `gpu/` to PTX for compute_61 when the `cuda` feature is on, and
//! leaves `$OUT_DIR/kernels.ptx` for `src/lib.rs` to embed. Without the feature nothing
//! CUDA-related is needed or done.
fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    #[cfg(feature = "cuda")]
    build_ptx();
}

#[cfg(feature = "cuda")]
fn build_ptx() {
    use cuda_builder::{CudaBuilder, NvvmArch};
    let out = std::path::PathBuf::from(std::env::var("OUT_DIR").expect("cargo sets OUT_DIR"));
    println!("cargo:rerun-if-changed=gpu/src");
    println!("cargo:rerun-if-changed=gpu/Cargo.toml");
    CudaBuilder::new("gpu")
        .arch(NvvmArch::Compute61)
        .copy_to(out.join("kernels.ptx"))
        .build()
        .expect("building the PTX kernels in gpu/ failed (see README: LLVM 7 and CUDA 11.x libNVVM)");
}
