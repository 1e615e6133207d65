//! Builds the kernels in `gpu/` to PTX when the `cuda` feature is on, twice: for compute_61
//! (every GPU since Pascal) and for compute_80 with the `sm80` feature of `gpu/` (the tensor-core
//! kernels that need Ampere or newer, beside the same portable kernels). Leaves
//! `$OUT_DIR/kernels_61.ptx` and `$OUT_DIR/kernels_80.ptx` for `src/lib.rs` to embed. Without the
//! feature nothing CUDA-related is needed or done.
//!
//! Two toolchains: this script and the host crates build on the stable channel of the root
//! `rust-toolchain.toml`; the kernels need `nightly-2021-12-04` (rustc_codegen_nvvm 0.3), so the
//! script runs the builder crate in `gpu-builder/` (its own toolchain file, lockfile and target
//! directory) through `cargo run`, with the variables cargo sets for build scripts removed so that
//! rustup picks the builder's toolchain.
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

/// Whether a variable that cargo (or rustup) sets for build scripts must stay out of the
/// builder's environment: each would pin the nested cargo to this build's compiler, target or
/// flags instead of the builder's own toolchain.
#[cfg(feature = "cuda")]
fn inherited_from_this_build(name: &str) -> bool {
    const EXACT: &[&str] =
        &["RUSTUP_TOOLCHAIN", "RUSTDOC", "RUSTFLAGS", "TARGET", "HOST", "OUT_DIR", "PROFILE", "OPT_LEVEL", "DEBUG", "NUM_JOBS"];
    EXACT.contains(&name) || name.starts_with("CARGO") || name.starts_with("RUSTC") || name.starts_with("DEP_")
}

/// The rustup proxy for `cargo` (it reads the builder folder's toolchain file), else `cargo`.
#[cfg(feature = "cuda")]
fn rustup_cargo() -> std::path::PathBuf {
    let home = std::env::var_os("CARGO_HOME")
        .map(std::path::PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| std::path::Path::new(&h).join(".cargo")));
    match home.map(|h| h.join("bin/cargo")) {
        Some(p) if p.exists() => p,
        _ => "cargo".into(),
    }
}

#[cfg(feature = "cuda")]
fn build_ptx() {
    use std::path::PathBuf;
    use std::process::Command;
    let out = PathBuf::from(std::env::var("OUT_DIR").expect("cargo sets OUT_DIR"));
    let root = PathBuf::from(std::env::var("CARGO_MANIFEST_DIR").expect("cargo sets CARGO_MANIFEST_DIR"));
    for watched in ["gpu/src", "gpu/Cargo.toml", "gpu/Cargo.lock", "gpu-builder/src", "gpu-builder/Cargo.toml", "gpu-builder/Cargo.lock"] {
        println!("cargo:rerun-if-changed={}", watched);
    }
    // <target>/<profile>/build/<pkg>/out -> <target>: the builder and the two kernel builds keep
    // their artifacts beside this build's, each in a folder of its own
    let target_root = out.join("../../../..");
    let cargo = rustup_cargo();
    for (tag, features) in [("61", &[][..]), ("80", &["sm80"][..])] {
        let ptx = out.join(format!("kernels_{}.ptx", tag));
        let mut cmd = Command::new(&cargo);
        for (name, _) in std::env::vars_os() {
            if name.to_str().map_or(false, inherited_from_this_build) {
                cmd.env_remove(&name);
            }
        }
        cmd.current_dir(root.join("gpu-builder"))
            .args(["run", "--quiet", "--release", "--locked", "--target-dir"])
            .arg(target_root.join("gpu-builder"))
            .arg("--")
            .arg(root.join("gpu"))
            .arg(format!("compute_{}", tag))
            .arg(&ptx)
            .arg(target_root.join("cuda-builder").join(format!("compute_{}", tag)))
            .args(features);
        let status = cmd.status().unwrap_or_else(|e| panic!("running {} for gpu-builder/ failed: {}", cargo.display(), e));
        if !status.success() {
            panic!(
                "building the compute_{} PTX kernels in gpu/ failed ({}; gpu-builder/ runs on nightly-2021-12-04, see README: \
                 LLVM 7 and CUDA 11.x libNVVM from ../shared/cuda-toolchain/setup.sh)",
                tag, status
            );
        }
    }
}
