//! `qwen3-vl info`: the backend that would run, why, and the kernels in this build.

use super::DeviceArgs;
use qwen3_vl::kernels::{ptx_entries, Arch, Kernel};

#[derive(clap::Args)]
pub struct InfoArgs {
    #[clap(flatten)]
    device: DeviceArgs,
}

pub fn run(a: InfoArgs) -> Result<(), Box<dyn std::error::Error>> {
    let sel = a.device.select()?;
    println!("backend: {}", sel.backend.describe());
    println!("reason:  {}", sel.reason);
    println!("kv cache: {}", a.device.kv_dtype(&*sel.backend));
    #[cfg(feature = "cuda")]
    if let Some(cuda) = sel.backend.as_any().downcast_ref::<qwen3_vl::cuda::CudaBackend>() {
        let (arch, why) = cuda.kernels_module();
        let ((ma, mi), sms) = cuda.device_shape();
        println!("device:  compute capability {}.{}, {} multiprocessors", ma, mi, sms);
        println!("kernels module: {} ({})", arch, why);
    }
    if qwen3_vl::PTX.is_empty() {
        println!("kernels: none (built without the cuda feature)");
    }
    for ptx in qwen3_vl::PTX {
        let entries = ptx_entries(ptx.text);
        println!("kernels: {} in the embedded {} module:", entries.len(), ptx.arch);
        for k in Kernel::in_module(ptx.arch) {
            let mark = if entries.contains(&k.name()) { "ok" } else { "MISSING" };
            println!("  {:<22} {}", k.name(), mark);
        }
    }
    Ok(())
}

#[derive(clap::Args)]
pub struct PtxArgs {
    /// Which module: compute_61 or compute_80.
    #[clap(long, default_value = "compute_61")]
    arch: String,
}

pub fn print_ptx(a: PtxArgs) -> Result<(), Box<dyn std::error::Error>> {
    let arch = match a.arch.parse::<qwen3_vl::kernels::KernelsRequest>()? {
        qwen3_vl::kernels::KernelsRequest::Force(arch) => arch,
        qwen3_vl::kernels::KernelsRequest::Auto => Arch::Compute61,
    };
    let ptx = qwen3_vl::ptx(arch).ok_or("this build has no PTX (rebuild with --features cuda)")?;
    print!("{}", ptx.text);
    Ok(())
}
