//! `qwen3-vl info`: the backend that would run, why, and the kernels in this build.

use super::DeviceArgs;
use qwen3_vl::kernels::{ptx_entries, Arch, Kernel};

#[derive(clap::Args)]
pub struct InfoArgs {
    #[clap(flatten)]
    device: DeviceArgs,
    /// Also show where this model's parts would go (GPU / CPU) and the bytes on each side,
    /// without loading its weights.
    #[clap(long, short = 'm')]
    model: Option<std::path::PathBuf>,
    /// The GGUF vision tower (mmproj) of a GGUF model.
    #[clap(long)]
    mmproj: Option<std::path::PathBuf>,
    /// Quantize a safetensors checkpoint while loading: q8_0 or q4_k_m (for the sizes).
    #[clap(long, value_parser = super::load::parse_quant)]
    quant: Option<qwen3_vl::model::Mix>,
    /// Session length the placement is planned for (KV cache and activations).
    #[clap(long, default_value = "4096", value_parser = super::ranges::context, allow_hyphen_values = true)]
    context: usize,
}

pub fn run(a: InfoArgs) -> Result<(), Box<dyn std::error::Error>> {
    let sel = a.device.select()?;
    println!("backend: {}", sel.backend.describe());
    println!("reason:  {}", sel.reason);
    println!("kv cache: {}", a.device.kv_dtype(&*sel.backend));
    println!("precision: {} (GEMM activations)", sel.backend.precision());
    #[cfg(feature = "cuda")]
    println!("driver:  {}", qwen3_vl::cuda::driver::describe());
    #[cfg(feature = "cuda")]
    if let Some(cuda) = sel.backend.as_any().downcast_ref::<qwen3_vl::cuda::CudaBackend>() {
        let (arch, why) = cuda.kernels_module();
        let ((ma, mi), sms) = cuda.device_shape();
        println!("device:  compute capability {}.{}, {} multiprocessors", ma, mi, sms);
        println!("kernels module: {} ({})", arch, why);
    }
    if let Some(m) = &a.model {
        let opened = qwen3_vl::model::ModelFiles::find(m, a.mmproj.as_deref())?.open()?;
        let human = qwen3_vl::model::placement::human;
        if sel.backend.device_memory().is_some() {
            let (free, total) = sel.backend.device_memory().unwrap_or((0, 0));
            for (what, images) in [("text prompts", None), ("image prompts", Some(a.context))] {
                let (p, _) = super::load::place(&a.device, &*sel.backend, &opened, a.quant, a.context, images)?;
                if what == "text prompts" {
                    println!("gpu memory: {} free of {}, budget {}", human(free), human(total), sel.backend.memory_cap().map_or("none".into(), human));
                }
                println!("placement, {}: {} (context {})", what, p.describe(), a.context);
                println!("  bytes: {} on the GPU (weights, KV cache, workspace), {} on the CPU", human(p.device_bytes), human(p.host_bytes));
            }
        } else {
            println!("placement: everything on the CPU ({} of weights, memory-mapped)", human(opened.source.total_bytes()));
        }
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
    /// The module's text as loaded on a device of this compute capability (MAJOR.MINOR, e.g.
    /// 9.0: compute_80 becomes an sm_90 module with its sm_90 instructions in place) instead of
    /// the portable text. Register caps are in either.
    #[clap(long, value_name = "MAJOR.MINOR")]
    loaded_on: Option<String>,
}

pub fn print_ptx(a: PtxArgs) -> Result<(), Box<dyn std::error::Error>> {
    let arch = match a.arch.parse::<qwen3_vl::kernels::KernelsRequest>()? {
        qwen3_vl::kernels::KernelsRequest::Force(arch) => arch,
        qwen3_vl::kernels::KernelsRequest::Auto => Arch::Compute61,
    };
    let ptx = qwen3_vl::ptx(arch).ok_or("this build has no PTX (rebuild with --features cuda)")?;
    let text = match a.loaded_on.as_deref() {
        None => ptx.text_with_caps(),
        Some(cc) => ptx.text_for(parse_compute(cc)?, true).0,
    };
    print!("{}", text);
    Ok(())
}

/// A compute capability written `MAJOR.MINOR` (`9.0`, `8.6`).
fn parse_compute(s: &str) -> Result<(u32, u32), String> {
    let bad = || format!("--loaded-on {:?}: expected a compute capability MAJOR.MINOR such as 9.0", s);
    let (major, minor) = s.split_once('.').ok_or_else(bad)?;
    Ok((major.parse().map_err(|_| bad())?, minor.parse().map_err(|_| bad())?))
}

#[cfg(test)]
mod tests {
    use super::parse_compute;

    #[test]
    fn a_compute_capability_is_major_dot_minor() {
        assert_eq!(parse_compute("9.0"), Ok((9, 0)));
        assert_eq!(parse_compute("8.6"), Ok((8, 6)));
        for bad in ["9", "9.x", "", ".0", "9.0.1", "-1.0"] {
            let e = parse_compute(bad).unwrap_err();
            assert!(e.contains("MAJOR.MINOR"), "{}: {}", bad, e);
        }
    }
}
