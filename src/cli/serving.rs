//! What `serve` and `batch` share: the model, the limits on requests, the engine and the
//! sampling defaults, turned into a [`ServerConfig`] and a loaded model the same way for both,
//! so that one request body gets the same answer from either.

use super::load::{self, describe_sampling, stop_ids, CliResult, ModelArgs, SamplingArgs};
use super::ranges;
use qwen3_vl::generate::SamplingParams;
use qwen3_vl::server::{self, ServerConfig};
use qwen3_vl::template::PromptFormat;
use qwen3_vl::DeviceRequest;
use std::path::PathBuf;
use std::sync::Arc;

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
    /// Prompt tokens read per engine step at most, so a long prompt does not stall the other
    /// streams (an image prompt is read whole).
    #[clap(long, default_value = "2048", value_parser = ranges::max_tokens, allow_hyphen_values = true)]
    pub max_prefill_tokens: usize,
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
    pub checked: load::Checked,
    pub cfg: ServerConfig,
    /// Tokens of the engine's KV cache.
    pub kv_tokens: usize,
    /// Most tokens one request may take (prompt and output).
    pub per_request: usize,
    /// Where each replica runs (`--data-parallel`, `--devices`).
    pub devices: Vec<DeviceRequest>,
}

/// The loaded replicas of the model and what the server needs besides them.
pub struct Model {
    pub replicas: Vec<load::Replica>,
    pub defaults: SamplingParams,
    pub stop_ids: Vec<u32>,
    pub tokenizer: Arc<qwen3_vl::Tokenizer>,
}

impl Model {
    /// The replicas as the server takes them, with the prompt format.
    pub fn server(&self, format: PromptFormat) -> Vec<server::Loaded<'_>> {
        self.replicas
            .iter()
            .map(|r| server::Loaded {
                model: &r.model,
                backend: &*r.backend,
                tokenizer: Arc::clone(&self.tokenizer),
                stop_ids: self.stop_ids.clone(),
                defaults: self.defaults,
                kv_dtype: Some(r.kv_dtype),
                format: format.clone(),
            })
            .collect()
    }
}

impl ServingArgs {
    /// Every input checked (before the weights), and the server's settings from the flags.
    /// `max_file_mib`: the largest image or video file read.
    pub fn prepare(&self, max_file_mib: usize) -> CliResult<Prepared> {
        let checked = self.model.check()?;
        let devices = super::replicas::replica_devices(self.model.device.device, self.data_parallel, self.devices.as_ref(), &|| qwen3_vl::cuda_device_count().map_err(|e| e.to_string()))?;
        let context = checked.config.text.max_position_embeddings;
        let preprocess = server::images::cap_pixels(checked.preprocess.clone(), self.max_pixels)?;
        let allowed = match &self.allowed_image_dir {
            Some(d) => Some(std::fs::canonicalize(d).map_err(|e| format!("--allowed-image-dir {}: {}", d.display(), e))?),
            None => None,
        };
        if let Some(d) = &allowed {
            if !d.is_dir() {
                return Err(format!("--allowed-image-dir {} is not a directory", d.display()).into());
            }
        }
        let model_id = self.model_name.clone().unwrap_or_else(|| {
            std::fs::canonicalize(&self.model.model).ok().and_then(|p| p.file_name().map(|n| n.to_string_lossy().into_owned())).unwrap_or_else(|| "qwen3-vl".into())
        });
        let mut cfg = ServerConfig::new(model_id, context, preprocess);
        cfg.images.allowed_dir = allowed;
        cfg.images.max_source_pixels = self.max_image_pixels;
        cfg.images.max_file_bytes = max_file_mib << 20;
        cfg.parse.max_images = self.max_images;
        cfg.parse.max_videos = self.max_videos;
        cfg.images.video = self.video.config(&checked.video)?;
        cfg.images.video_limits.max_bytes = (max_file_mib << 20) as u64;
        cfg.images.video_limits.max_duration = self.max_video_seconds as f64;
        cfg.images.video_limits.max_source_frames = self.max_video_frames;
        cfg.images.video_limits.ffmpeg = self.video.ffmpeg.clone();
        cfg.images.video_limits.timeout = std::time::Duration::from_secs(self.max_video_seconds.clamp(30, 600));
        if let Some(n) = self.max_prompt_tokens {
            cfg.tokens.max_prompt = n.min(context);
        }
        if let Some(n) = self.max_output_tokens {
            cfg.tokens.max_output = n.min(context);
        }
        cfg.max_batch = self.max_batch;
        cfg.kv_cache_tokens = self.kv_cache_tokens;
        cfg.max_prefill_tokens = self.max_prefill_tokens;
        cfg.replicas = devices.len();
        let per_request = (cfg.tokens.max_prompt + cfg.tokens.max_output).min(context);
        if let Some(n) = cfg.kv_cache_tokens {
            if n < per_request {
                return Err(format!("--kv-cache-tokens {} is less than one request may need ({} prompt + {} output tokens)", n, cfg.tokens.max_prompt, cfg.tokens.max_output).into());
            }
        }
        let kv_tokens = cfg.kv_cache_tokens.unwrap_or_else(|| server::default_kv_tokens(cfg.max_batch, per_request));
        Ok(Prepared { checked, cfg, kv_tokens, per_request, devices })
    }

    /// The weights, once per replica of `devices`: the placement plans for the whole KV cache
    /// of the engine; any request may carry images, so under a budget the vision tower goes
    /// first.
    pub fn load(&self, checked: load::Checked, devices: &[DeviceRequest], kv_tokens: usize, per_request: usize) -> CliResult<(Model, PromptFormat)> {
        let threads = super::replicas::cpu_threads(self.model.device.threads, devices);
        if devices.len() > 1 {
            let list: Vec<String> = devices.iter().map(|d| d.to_string()).collect();
            let each = threads.filter(|_| devices[0] == DeviceRequest::Cpu).map_or(String::new(), |t| format!(", {} threads each", t));
            log::info!("{} replicas on {}{}", devices.len(), list.join(", "), each);
        }
        let l = self.model.load_replicas(checked, devices, threads, kv_tokens, Some(per_request.min(kv_tokens)))?;
        let defaults = self.sampling.params(&l.defaults);
        log::info!("sampling defaults: {}", describe_sampling(&defaults));
        let stop_ids = stop_ids(&l.tokenizer);
        Ok((Model { replicas: l.replicas, defaults, stop_ids, tokenizer: Arc::new(l.tokenizer) }, l.format))
    }
}
