//! `qwen3-vl info`: the backend that would run, why, and the kernels in this build.

use super::DeviceArgs;
use qwen3_vl::kernels::{ptx_entries, Kernel};

#[derive(clap::Args)]
pub struct InfoArgs {
    #[clap(flatten)]
    device: DeviceArgs,
}

pub fn run(a: InfoArgs) -> Result<(), Box<dyn std::error::Error>> {
    let sel = qwen3_vl::select_device(a.device.device, a.device.threads)?;
    println!("backend: {}", sel.backend.describe());
    println!("reason:  {}", sel.reason);
    match qwen3_vl::PTX {
        Some(ptx) => {
            let entries = ptx_entries(ptx);
            println!("kernels: {} in the embedded PTX (compute_61):", entries.len());
            for k in Kernel::ALL {
                let mark = if entries.contains(&k.name()) { "ok" } else { "MISSING" };
                println!("  {:<14} {}", k.name(), mark);
            }
        }
        None => println!("kernels: none (built without the cuda feature)"),
    }
    Ok(())
}

pub fn print_ptx() -> Result<(), Box<dyn std::error::Error>> {
    let ptx = qwen3_vl::PTX.ok_or("this build has no PTX (rebuild with --features cuda)")?;
    print!("{}", ptx);
    Ok(())
}
