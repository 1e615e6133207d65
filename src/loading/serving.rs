//! What `serve`, `batch` and the Python package share: the model, the limits on requests, the
//! engine and the sampling defaults, turned into a [`ServerConfig`] and a loaded model the same
//! way for all, so that one request body gets the same answer from each.

use super::{describe_sampling, stop_ids, Checked, ModelOptions, Replica, Result, SamplingOptions, VideoOptions};
use crate::generate::SamplingParams;
use crate::server::{self, ServerConfig};
use crate::template::PromptFormat;
use crate::DeviceRequest;
use std::path::PathBuf;
use std::sync::Arc;

/// The image-embedding cache per replica unless configured: 512 MiB (16 images of 1024² at
/// the 2B model's width, with their DeepStack features).
pub const DEFAULT_IMAGE_CACHE: usize = 512 << 20;

/// The server's options (the CLI's flags of `serve` and `batch`); [`ServingOptions::new`]
/// gives the CLI's defaults.
#[derive(Clone, Debug)]
pub struct ServingOptions {
    pub model: ModelOptions,
    /// The model name that responses report (default: the model directory's name).
    pub model_name: Option<String>,
    /// Serve image_url file paths (absolute or file://) from inside this directory only.
    pub allowed_image_dir: Option<PathBuf>,
    /// Resize images above this many pixels down (default from preprocessor_config.json).
    pub max_pixels: Option<usize>,
    /// Refuse images that declare more pixels than this, before decoding them.
    pub max_image_pixels: usize,
    /// Most images per request.
    pub max_images: usize,
    /// Most videos per request.
    pub max_videos: usize,
    /// Refuse videos longer than this many seconds, before decoding their frames.
    pub max_video_seconds: u64,
    /// Refuse videos of more frames than this, before decoding them.
    pub max_video_frames: usize,
    pub video: VideoOptions,
    /// Most prompt tokens per request, image tokens included (default: 8192, at most the
    /// model's context).
    pub max_prompt_tokens: Option<usize>,
    /// Most tokens generated per request; also the default max_tokens (default: 2048).
    pub max_output_tokens: Option<usize>,
    /// Requests generated at once, continuously batched.
    pub max_batch: usize,
    /// Tokens the KV cache holds over all running requests (default:
    /// [`server::default_kv_tokens`]).
    pub kv_cache_tokens: Option<usize>,
    /// Rows of an engine step that reads prompts at most, decode rows included.
    pub max_prefill_tokens: usize,
    /// Bytes of vision-tower outputs kept by image content, so a known image skips the tower
    /// (`None`: [`DEFAULT_IMAGE_CACHE`], or 0 under a `gpu_memory` budget).
    pub image_cache: Option<usize>,
    pub sampling: SamplingOptions,
}

impl ServingOptions {
    /// The model of `model` with the CLI's defaults for the rest.
    pub fn new(model: ModelOptions) -> ServingOptions {
        ServingOptions {
            model,
            model_name: None,
            allowed_image_dir: None,
            max_pixels: None,
            max_image_pixels: 16_777_216,
            max_images: 8,
            max_videos: 2,
            max_video_seconds: 600,
            max_video_frames: 36_000,
            video: VideoOptions::default(),
            max_prompt_tokens: None,
            max_output_tokens: None,
            max_batch: 16,
            kv_cache_tokens: None,
            max_prefill_tokens: 2048,
            image_cache: None,
            sampling: SamplingOptions::default(),
        }
    }
}

/// The checked inputs and the server's settings, before the weights load.
pub struct Prepared {
    pub checked: Checked,
    pub cfg: ServerConfig,
    /// Tokens of the engine's KV cache.
    pub kv_tokens: usize,
    /// Most tokens one request may take (prompt and output).
    pub per_request: usize,
}

/// The loaded replicas of the model and what the server needs besides them.
pub struct Served {
    pub replicas: Vec<Replica>,
    pub defaults: SamplingParams,
    pub stop_ids: Vec<u32>,
    pub tokenizer: Arc<crate::Tokenizer>,
}

impl Served {
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

impl ServingOptions {
    /// Every input checked (before the weights), and the server's settings from the options.
    /// `max_file_mib`: the largest image or video file read.
    pub fn prepare(&self, max_file_mib: usize) -> Result<Prepared> {
        let checked = self.model.check()?;
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
        cfg.image_cache_bytes = self.image_cache_bytes();
        let per_request = (cfg.tokens.max_prompt + cfg.tokens.max_output).min(context);
        if let Some(n) = cfg.kv_cache_tokens {
            if n < per_request {
                return Err(format!("--kv-cache-tokens {} is less than one request may need ({} prompt + {} output tokens)", n, cfg.tokens.max_prompt, cfg.tokens.max_output).into());
            }
        }
        let kv_tokens = cfg.kv_cache_tokens.unwrap_or_else(|| server::default_kv_tokens(cfg.max_batch, per_request));
        Ok(Prepared { checked, cfg, kv_tokens, per_request })
    }

    /// The image-embedding cache's bytes per replica: as given, else
    /// [`DEFAULT_IMAGE_CACHE`] without a GPU memory budget and none under one (the budget's
    /// plan would have to give way to it; give `image_cache` to have both).
    pub fn image_cache_bytes(&self) -> usize {
        self.image_cache.unwrap_or(if self.model.device.gpu_memory.is_some() { 0 } else { DEFAULT_IMAGE_CACHE })
    }

    /// The weights, once per replica of `devices` (CPU ones with `threads` threads each): the
    /// placement plans for the whole KV cache of the engine; any request may carry images, so
    /// under a budget the vision tower goes first. `progress(i, report)`: replica i's
    /// [`LoadProgress`](super::LoadProgress).
    pub fn load(&self, checked: Checked, devices: &[DeviceRequest], threads: Option<usize>, kv_tokens: usize, per_request: usize, progress: &(dyn Fn(usize, Option<(usize, usize)>) + Sync)) -> Result<(Served, PromptFormat)> {
        let mut model = self.model.clone();
        model.device.reserve = self.image_cache_bytes();
        let l = model.load_replicas(checked, devices, threads, host::engine::EngineConfig::cache_tokens_for(kv_tokens), Some(per_request.min(kv_tokens)), progress)?;
        let defaults = self.sampling.params(&l.defaults);
        log::info!("sampling defaults: {}", describe_sampling(&defaults));
        let stop_ids = stop_ids(&l.tokenizer);
        Ok((Served { replicas: l.replicas, defaults, stop_ids, tokenizer: Arc::new(l.tokenizer) }, l.format))
    }
}
