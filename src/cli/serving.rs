//! What `serve` and `batch` share: the model, the limits on requests, the engine and the
//! sampling defaults, as flags mapped onto the library's [`ServingOptions`] (which turns them
//! into a server's settings and a loaded model the same way for every front end), and the
//! replicas of `--data-parallel`.

use super::load::{CliResult, Checked, ModelArgs, SamplingArgs, WeightBars};
use super::ranges;
use qwen3_vl::loading::serving::ServingOptions;
use qwen3_vl::server::ServerConfig;
use qwen3_vl::template::PromptFormat;
use qwen3_vl::DeviceRequest;
use std::path::PathBuf;

pub use qwen3_vl::loading::serving::Served as Model;

#[derive(clap::Args)]
pub struct ServingArgs {
    #[clap(flatten)]
    pub model: ModelArgs,
    /// The model name that responses report (default: the model directory's name).
    #[clap(long)]
    pub model_name: Option<String>,
    /// Serve image_url file paths (absolute or file://) from inside this directory only.
    #[clap(long)]
    pub allowed_image_dir: Option<PathBuf>,
    /// Resize images above this many pixels down (default from preprocessor_config.json).
    #[clap(long, value_parser = ranges::max_pixels, allow_hyphen_values = true)]
    pub max_pixels: Option<usize>,
    /// Refuse images that declare more pixels than this, before decoding them.
    #[clap(long, default_value = "16777216", value_parser = ranges::max_pixels, allow_hyphen_values = true)]
    pub max_image_pixels: usize,
    /// Most images per request (0 to 256).
    #[clap(long, default_value = "8", value_parser = ranges::images, allow_hyphen_values = true)]
    pub max_images: usize,
    /// Most videos per request (0 to 256).
    #[clap(long, default_value = "2", value_parser = ranges::images, allow_hyphen_values = true)]
    pub max_videos: usize,
    /// Refuse videos longer than this many seconds, before decoding their frames.
    #[clap(long, default_value = "600", value_parser = ranges::seconds, allow_hyphen_values = true)]
    pub max_video_seconds: u64,
    /// Refuse videos of more frames than this, before decoding them.
    #[clap(long, default_value = "36000", value_parser = ranges::max_tokens, allow_hyphen_values = true)]
    pub max_video_frames: usize,
    #[clap(flatten)]
    pub video: super::load::VideoOpts,
    /// Most prompt tokens per request, image tokens included (default: 8192, at most the model's context).
    #[clap(long, value_parser = ranges::max_tokens, allow_hyphen_values = true)]
    pub max_prompt_tokens: Option<usize>,
    /// Most tokens generated per request; also the default max_tokens (default: 2048).
    #[clap(long, value_parser = ranges::max_tokens, allow_hyphen_values = true)]
    pub max_output_tokens: Option<usize>,
    /// Requests generated at once, continuously batched (1 to 1024).
    #[clap(long, default_value = "16", value_parser = ranges::queue, allow_hyphen_values = true)]
    pub max_batch: usize,
    /// Tokens the KV cache holds over all running requests (default: 1,024 per --max-batch
    /// request up to 16,384, at least one request's prompt and output); requests wait for
    /// blocks beyond it.
    #[clap(long, value_parser = ranges::max_tokens, allow_hyphen_values = true)]
    pub kv_cache_tokens: Option<usize>,
    /// Rows of an engine step that reads prompts at most, its decode rows included (they take at
    /// most half), so a long prompt does not stall the other streams (an image prompt is read
    /// whole).
    #[clap(long, default_value = "2048", value_parser = ranges::max_tokens, allow_hyphen_values = true)]
    pub max_prefill_tokens: usize,
    /// Vision-tower outputs kept per replica by image content, so a request about an image seen
    /// before (another question, a later turn) skips the tower: 512MiB, 1G, 0 (off) or bytes
    /// (default: 512MiB, or 0 under --gpu-memory, whose placement then leaves this much free).
    #[clap(long, value_parser = qwen3_vl::loading::ranges::image_cache)]
    pub image_cache: Option<usize>,
    /// Replicas of the model, one engine each (1 to 64): one per CUDA device (--devices,
    /// default the first N), or N CPU replicas with --device cpu. Requests go to the least
    /// loaded replica, or to the one that ran their prompt's start recently.
    #[clap(long, value_parser = super::replicas::parse_replicas, allow_hyphen_values = true)]
    pub data_parallel: Option<usize>,
    /// The CUDA devices of the replicas: ordinals (0,1,3) or all; --data-parallel defaults to
    /// their count.
    #[clap(long, value_parser = super::replicas::parse_devices)]
    pub devices: Option<super::replicas::DeviceList>,
    #[clap(flatten)]
    pub sampling: SamplingArgs,
}

/// The checked inputs and the server's settings, before the weights load.
pub struct Prepared {
    pub checked: Checked,
    pub cfg: ServerConfig,
    /// Tokens of the engine's KV cache.
    pub kv_tokens: usize,
    /// Most tokens one request may take (prompt and output).
    pub per_request: usize,
    /// Where each replica runs (`--data-parallel`, `--devices`).
    pub devices: Vec<DeviceRequest>,
}

impl ServingArgs {
    /// The library's options of these flags (all but the replicas').
    pub fn options(&self) -> ServingOptions {
        ServingOptions {
            model: self.model.options(),
            model_name: self.model_name.clone(),
            allowed_image_dir: self.allowed_image_dir.clone(),
            max_pixels: self.max_pixels,
            max_image_pixels: self.max_image_pixels,
            max_images: self.max_images,
            max_videos: self.max_videos,
            max_video_seconds: self.max_video_seconds,
            max_video_frames: self.max_video_frames,
            video: self.video.options(),
            max_prompt_tokens: self.max_prompt_tokens,
            max_output_tokens: self.max_output_tokens,
            max_batch: self.max_batch,
            kv_cache_tokens: self.kv_cache_tokens,
            max_prefill_tokens: self.max_prefill_tokens,
            image_cache: self.image_cache,
            sampling: self.sampling.options(),
        }
    }

    /// Every input checked (before the weights), and the server's settings from the flags.
    /// `max_file_mib`: the largest image or video file read.
    pub fn prepare(&self, max_file_mib: usize) -> CliResult<Prepared> {
        let p = self.options().prepare(max_file_mib)?;
        let devices = super::replicas::replica_devices(self.model.device.device, self.data_parallel, self.devices.as_ref(), &|| qwen3_vl::cuda_device_count().map_err(|e| e.to_string()))?;
        let mut cfg = p.cfg;
        cfg.replicas = devices.len();
        Ok(Prepared { checked: p.checked, cfg, kv_tokens: p.kv_tokens, per_request: p.per_request, devices })
    }

    /// The weights, once per replica of `devices` (see [`ServingOptions::load`]), with a
    /// progress bar each.
    pub fn load(&self, checked: Checked, devices: &[DeviceRequest], kv_tokens: usize, per_request: usize) -> CliResult<(Model, PromptFormat)> {
        let threads = super::replicas::cpu_threads(self.model.device.threads, devices);
        if devices.len() > 1 {
            let list: Vec<String> = devices.iter().map(|d| d.to_string()).collect();
            let each = threads.filter(|_| devices[0] == DeviceRequest::Cpu).map_or(String::new(), |t| format!(", {} threads each", t));
            log::info!("{} replicas on {}{}", devices.len(), list.join(", "), each);
        }
        let bars = WeightBars::new(devices.len());
        self.options().load(checked, devices, threads, kv_tokens, per_request, &|i, r| bars.report(i, r))
    }
}

