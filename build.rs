//! Builds the kernels in `gpu/` to PTX when the `cuda` feature is on, twice: for compute_61
//! (every GPU since Pascal) and for compute_80 with the `sm80` feature of `gpu/` (the tensor-core
//! kernels that need Ampere or newer, beside the same portable kernels). Leaves
//! `$OUT_DIR/kernels_61.ptx` and `$OUT_DIR/kernels_80.ptx` for `src/lib.rs` to embed. Without the
//! feature nothing CUDA-related is needed or done.
fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    #[cfg(feature = "cuda")]
    build_ptx();
    #[cfg(feature = "cuda")]
    take_driver_shims();
}

/// The CUDA driver is opened at run time (`host/src/cuda/driver.rs` defines every entry point
/// and forwards it through `dlopen`). `cust` still asks to link `libcuda`; marking each shimmed
/// name undefined from the start makes the linker take the definitions from the host library
/// before it reaches `libcuda.so`, which `--as-needed` then leaves out of the binary.
#[cfg(feature = "cuda")]
fn take_driver_shims() {
    let path = "host/src/cuda/driver.rs";
    println!("cargo:rerun-if-changed={}", path);
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("reading {}: {}", path, e));
    let names: Vec<&str> = text
        .lines()
        .filter_map(|l| l.trim().strip_prefix("fn cu"))
        .filter_map(|rest| rest.split('(').next())
        .collect();
    assert!(names.len() > 30, "{} lists only {} driver entry points", path, names.len());
    for name in names {
        println!("cargo:rustc-link-arg=-Wl,--undefined=cu{}", name);
    }
}

#[cfg(feature = "cuda")]
fn build_ptx() {
    use cuda_builder::{CudaBuilder, NvvmArch};
    let out = std::path::PathBuf::from(std::env::var("OUT_DIR").expect("cargo sets OUT_DIR"));
    println!("cargo:rerun-if-changed=gpu/src");
    println!("cargo:rerun-if-changed=gpu/Cargo.toml");
    // cuda_builder picks one target dir for every build it runs from this script; the two
    // architectures need their own (else each build invalidates the other's artifacts). Without
    // PROFILE it passes no --target-dir, and the nested cargo takes CARGO_TARGET_DIR instead.
    let target_root = out.join("../../../cuda-builder");
    std::env::remove_var("PROFILE");
    for (arch, tag, features) in [(NvvmArch::Compute61, "61", &[][..]), (NvvmArch::Compute80, "80", &["--features", "sm80"][..])] {
        std::env::set_var("CARGO_TARGET_DIR", target_root.join(format!("compute_{}", tag)));
        CudaBuilder::new("gpu")
            .arch(arch)
            .release(true)
            .build_args(features)
            .copy_to(out.join(format!("kernels_{}.ptx", tag)))
            .build()
            .unwrap_or_else(|e| panic!("building the compute_{} PTX kernels in gpu/ failed ({:?}; see README: LLVM 7 and CUDA 11.x libNVVM)", tag, e));
    }
}
