//! Where the model goes: the GPU memory budget, the placement of the layers under it (the
//! rest on the CPU), and the weights loaded that way.

use super::{DeviceOptions, LoadProgress, Result};
use crate::model::placement::human;
use crate::model::{LoadQuant, Mix, Model, Offload, Opened, Placement};
use crate::{Backend, DeviceKind};
use std::sync::Arc;

/// The margin kept free below the device's free memory when `--gpu-memory` is not given: 5% of
/// it, at least 256 MiB (the driver, other processes, fragmentation).
pub fn default_budget(free: usize) -> usize {
    free.saturating_sub((free / 20).max(256 << 20))
}

/// Where the model of `opened` goes on `backend` for sessions of `context` tokens, with image
/// prompts of up to `images` image tokens in view when given (`Some(context)` when unknown):
/// the pool is capped at the budget (`--gpu-memory`, else the
/// default), the placement planned from the tensor sizes (when the vision tower is stored in
/// 16 or 32 bits and loading it as Q8_0 keeps more on the GPU, the plan says so and the load
/// does it), and a CPU backend made for the parts off the GPU. On the CPU: everything there.
pub fn place(dev: &DeviceOptions, backend: &dyn Backend, opened: &Opened, quant: Option<Mix>, context: usize, images: Option<usize>) -> Result<(Placement, Option<Arc<dyn Backend>>)> {
    let n = opened.config.text.num_hidden_layers;
    if backend.kind() != DeviceKind::Cuda {
        if dev.gpu_memory.is_some() || dev.gpu_layers.is_some() {
            log::warn!("--gpu-memory / --gpu-layers have no effect: running on {}", backend.describe());
        }
        return Ok((Placement::all_on_device(n), None));
    }
    // 1. the budget, and the pool's cap at it
    let free = backend.device_memory().map(|m| m.0);
    let budget = match (dev.gpu_memory, free) {
        (Some(b), _) => b,
        (None, Some(f)) => default_budget(f),
        (None, None) => return Err("cannot query the GPU's free memory; give a budget with --gpu-memory".into()),
    };
    backend.set_memory_cap(Some(budget))?;
    // 2. the plan, and the plan with the vision tower as Q8_0 when that keeps more on the GPU
    let kv = dev.kv_dtype(backend);
    let image_tokens = images.unwrap_or(context);
    let mut sizes = Model::sizes(opened, LoadQuant::mix(quant), backend, context, image_tokens, kv);
    let planned = budget.saturating_sub(dev.reserve);
    let mut p = Placement::plan(&sizes, Some(planned), dev.gpu_layers, images.is_some());
    if quant.is_none() && p.as_ref().map_or(true, |p| p.is_split()) {
        let q8 = LoadQuant { mix: None, vision_q8: true };
        let s8 = Model::sizes(opened, q8, backend, context, image_tokens, kv);
        if s8.vision < sizes.vision {
            if let Ok(mut p8) = Placement::plan(&s8, Some(planned), dev.gpu_layers, images.is_some()) {
                if p.as_ref().map_or(true, |p| p8.better_than(p)) {
                    p8.vision_q8 = true;
                    log::info!(
                        "quantizing the vision tower to Q8_0 while loading ({} instead of {}): that is what fits it on the GPU within the budget{}",
                        human(s8.vision),
                        human(sizes.vision),
                        if images.is_some() { " beside the text layers" } else { "" }
                    );
                    p = Ok(p8);
                    sizes = s8;
                }
            }
        }
    }
    let p = p?;
    log::info!(
        "placement{}: {}; GPU {} (weights, KV cache at {} tokens, {} workspace), CPU {}; budget {}{}{}",
        if p.vision_first { " for image prompts" } else { "" },
        p.describe(),
        human(p.device_bytes),
        context,
        human(if p.vision_on_device { sizes.text_work.max(sizes.vision_work) } else { sizes.text_work }),
        human(p.host_bytes),
        human(budget),
        if dev.reserve > 0 { format!(", {} of it kept for the image-embedding cache", human(dev.reserve)) } else { String::new() },
        match (dev.gpu_memory, free) {
            (Some(_), _) => " (--gpu-memory)".to_string(),
            (None, Some(f)) => format!(" (default: {} free less the margin)", human(f)),
            _ => String::new(),
        }
    );
    if !p.is_split() {
        return Ok((p, None));
    }
    log::info!("decode steps run as plain launches, not recorded CUDA graphs: the model is split between the GPU and the CPU");
    let host = crate::select_device_with(crate::DeviceRequest::Cpu, crate::kernels::KernelsRequest::Auto, dev.threads)?.backend;
    Ok((p, Some(host)))
}

/// Loads the model of `opened` onto `backend` as [`place`] decides.
/// `progress`: see [`LoadProgress`].
pub fn load_model(dev: &DeviceOptions, backend: &dyn Backend, opened: &Opened, quant: Option<Mix>, context: usize, images: Option<usize>, progress: LoadProgress<'_>) -> Result<(Model, Option<Arc<dyn Backend>>)> {
    let (p, host) = place(dev, backend, opened, quant, context, images)?;
    let offload = host.as_ref().map(|h| Offload { host: h, placement: &p });
    let lq = LoadQuant { mix: quant, vision_q8: p.vision_q8 };
    let model = Model::load_placed(opened, lq, backend, offload, &mut |done, total| progress(Some((done, total))))?;
    progress(None);
    Ok((model, host))
}

/// Weight bytes on each side, in words.
pub fn placed_report(model: &Model, b: &dyn Backend) -> String {
    let (gpu, cpu) = model.placed_bytes(b);
    if b.kind() == DeviceKind::Cuda {
        format!("weights: {} on the GPU, {} on the CPU", human(gpu), human(cpu))
    } else {
        format!("placement: everything on the CPU; weights {}", human(gpu + cpu))
    }
}
