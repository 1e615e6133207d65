//! Loading a model as the command line does, for every front end (the CLI's subcommands, the
//! Python package): the model directory and its small files checked before any weights, then
//! the backend, the placement under a GPU memory budget and the weights; with the settings of
//! `serve` ([`serving`]) turned into a [`ServerConfig`](crate::server::ServerConfig).
//!
//! The options are plain structs; the CLI's clap arguments map onto them.

pub mod place;
pub mod ranges;
pub mod serving;

pub use place::{default_budget, load_model, place, placed_report};

use crate::generate::SamplingParams;
use crate::generation_config::GenerationDefaults;
use crate::image::PreprocessConfig;
use crate::kernels::KernelsRequest;
use crate::model::placement::human;
use crate::model::{Config, Mix, Model, ModelFiles, Opened};
use crate::template::PromptFormat;
use crate::video::{VideoConfig, VideoLimits};
use crate::{Backend, DType, DeviceKind, DeviceRequest, Precision, Selection, Tokenizer};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;

/// Errors of loading, in words (each names the file or option at fault).
pub type Result<T> = std::result::Result<T, Box<dyn std::error::Error>>;

/// What `--precision auto` asks for: bf16, measured on the H100 within transformers bf16's
/// error on every fixture and 17-27% faster at prefill @512-4096 (README, "Precision").
pub const DEFAULT_PRECISION: Precision = Precision::Bf16;

/// Where and how to run (the CLI's device flags).
#[derive(Clone, Debug)]
pub struct DeviceOptions {
    /// auto (CUDA device 0 if it works, else CPU), cpu, cuda or cuda:N.
    pub device: DeviceRequest,
    /// CPU worker threads (default: all cores).
    pub threads: Option<usize>,
    /// The GPU kernel module.
    pub kernels: KernelsRequest,
    /// How the tensor-core GEMMs round activations (`None`: [`DEFAULT_PRECISION`]).
    pub precision: Option<Precision>,
    /// KV-cache element type (`None`: the backend's default).
    pub kv_cache: Option<DType>,
    /// The most the engine puts on the GPU, in bytes (default: [`default_budget`]).
    pub gpu_memory: Option<usize>,
    /// Exactly this many text layers on the GPU.
    pub gpu_layers: Option<usize>,
    /// Bytes of the budget the placement leaves to caches beside the model (the server's
    /// image-embedding cache).
    pub reserve: usize,
}

impl Default for DeviceOptions {
    fn default() -> DeviceOptions {
        DeviceOptions { device: DeviceRequest::Auto, threads: None, kernels: KernelsRequest::Auto, precision: None, kv_cache: None, gpu_memory: None, gpu_layers: None, reserve: 0 }
    }
}

/// A KV-cache type by name: auto (`None`), f32 or f16.
pub fn parse_kv_cache(s: &str) -> std::result::Result<Option<DType>, String> {
    if s.eq_ignore_ascii_case("auto") {
        return Ok(None);
    }
    match DType::parse_float(s) {
        Some(d @ (DType::F32 | DType::F16)) => Ok(Some(d)),
        _ => Err(format!("unknown KV-cache type '{}': expected auto, f32 or f16", s)),
    }
}

/// A precision by name: auto (`None`), f32 or bf16.
pub fn parse_precision(s: &str) -> std::result::Result<Option<Precision>, String> {
    if s.eq_ignore_ascii_case("auto") {
        return Ok(None);
    }
    s.parse().map(Some)
}

/// A load-time quantization by name: q8_0 or q4_k_m.
pub fn parse_quant(s: &str) -> std::result::Result<Mix, String> {
    match Mix::parse(s) {
        Some(m @ (Mix::Q8_0 | Mix::Q4KM)) => Ok(m),
        _ => Err(format!("unknown quantization '{}': expected q8_0 or q4_k_m", s)),
    }
}

impl DeviceOptions {
    /// The backend these options ask for (logs the choice and why), set to the precision asked
    /// for.
    pub fn select(&self) -> std::result::Result<Selection, crate::Error> {
        let sel = crate::select_device_with(self.device, self.kernels, self.threads)?;
        let want = self.precision.unwrap_or(DEFAULT_PRECISION);
        sel.backend.set_precision(want);
        if self.precision.is_some() && sel.backend.precision() != want {
            log::info!("--precision {}: {} has no 16-bit-activation GEMMs, computing in {}", want, sel.backend.describe(), sel.backend.precision());
        }
        Ok(sel)
    }

    /// The KV-cache type on `backend`.
    pub fn kv_dtype(&self, backend: &dyn Backend) -> DType {
        self.kv_cache.unwrap_or_else(|| backend.default_kv_dtype())
    }
}

/// Where the model comes from (the CLI's model flags).
#[derive(Clone, Debug)]
pub struct ModelOptions {
    /// A directory as published on Hugging Face, a GGUF text model file, or a directory
    /// holding a GGUF text model and its mmproj.
    pub model: PathBuf,
    /// The GGUF vision tower (mmproj) of a GGUF model.
    pub mmproj: Option<PathBuf>,
    /// Quantize the weights while loading.
    pub quant: Option<Mix>,
    /// tokenizer.json to use instead of the model's.
    pub tokenizer: Option<PathBuf>,
    /// The chat template file (default: the model's, else the built-in Qwen3-VL format).
    pub chat_template: Option<PathBuf>,
    pub device: DeviceOptions,
}

impl ModelOptions {
    /// The model at `model` with every other option at its default.
    pub fn new(model: impl Into<PathBuf>) -> ModelOptions {
        ModelOptions { model: model.into(), mmproj: None, quant: None, tokenizer: None, chat_template: None, device: DeviceOptions::default() }
    }
}

/// What was read and checked of a model before its weights load.
pub struct Checked {
    pub config: Config,
    pub tokenizer: Tokenizer,
    pub defaults: GenerationDefaults,
    /// Bytes of tensor data in the checkpoint.
    pub weight_bytes: usize,
    /// The files, opened (mapped, not loaded).
    pub opened: Opened,
    /// Image preprocessing before `--max-pixels`: the directory's preprocessor_config.json,
    /// else a GGUF mmproj's metadata, else Qwen3-VL's defaults.
    pub preprocess: PreprocessConfig,
    /// Video processing: the directory's video_preprocessor_config.json, else Qwen3-VL's
    /// defaults.
    pub video: VideoConfig,
    /// How prompts are written: the model's chat template, else the built-in format.
    pub format: PromptFormat,
}

pub struct Loaded {
    pub backend: Arc<dyn Backend>,
    pub model: Model,
    pub tokenizer: Tokenizer,
    pub defaults: GenerationDefaults,
    /// KV-cache element type of the sessions (`--kv-cache`, else the backend's default).
    pub kv_dtype: DType,
    pub format: PromptFormat,
    /// Which backend runs and why (the device selection's reason).
    pub device: String,
}

/// Resident memory of this process (now and peak), from /proc.
fn process_memory() -> String {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    let field = |k: &str| status.lines().find(|l| l.starts_with(k)).and_then(|l| l.split_whitespace().nth(1)).and_then(|v| v.parse::<f64>().ok()).map(|kb| kb / 1e6);
    match (field("VmRSS:"), field("VmHWM:")) {
        (Some(now), Some(peak)) => format!("process resident {:.2} GB (peak {:.2} GB)", now, peak),
        _ => "process memory unknown".into(),
    }
}

/// A memory report for -v: the device's pool on CUDA, the process's resident set always.
pub fn memory_report(b: &dyn Backend) -> String {
    let m = b.memory_stats();
    if b.kind() == DeviceKind::Cuda {
        format!(
            "device {:.2} GB in use, {:.2} GB cached, peak {:.2} GB, {} allocations; {}",
            m.in_use as f64 / 1e9,
            m.cached as f64 / 1e9,
            m.peak as f64 / 1e9,
            m.device_allocs,
            process_memory()
        )
    } else {
        process_memory()
    }
}

impl ModelOptions {
    /// Step 1, before any weights: the directory exists, config.json describes a supported
    /// model, the checkpoint's files are all there with sound headers, the tokenizer loads,
    /// generation_config.json (if any) parses.
    pub fn check(&self) -> Result<Checked> {
        let t0 = Instant::now();
        let files = ModelFiles::find(&self.model, self.mmproj.as_deref())?;
        let dir = files.dir();
        let mut opened = files.open()?;
        let config = opened.config.clone();
        let weight_bytes = opened.source.total_bytes();
        if self.quant.is_some() && matches!(files, ModelFiles::Gguf { .. }) {
            return Err(format!("--quant quantizes a Hugging Face checkpoint; {} is GGUF already (use it as stored, or `qwen3-vl quantize` the original)", self.model.display()).into());
        }
        if let (Some(mix), ModelFiles::Safetensors(dir)) = (self.quant, &files) {
            quant_report(mix, &config, dir)?;
        }
        let tok_path = self.tokenizer.clone().unwrap_or_else(|| dir.join("tokenizer.json"));
        let tokenizer = match opened.tokenizer.take() {
            Some(t) if self.tokenizer.is_none() && !tok_path.exists() => t,
            _ => {
                if self.tokenizer.is_none() && !tok_path.exists() {
                    return Err(format!("{} has no tokenizer.json (pass one with --tokenizer FILE)", dir.display()).into());
                }
                Tokenizer::from_file(&tok_path)?
            }
        };
        let tok_dir = self.tokenizer.as_deref().and_then(Path::parent).filter(|d| !d.as_os_str().is_empty());
        let dirs: Vec<&Path> = std::iter::once(dir.as_path()).chain(tok_dir).collect();
        let format = PromptFormat::find(self.chat_template.as_deref(), &dirs, opened.chat_template.as_deref())?;
        if format.is_template() {
            log::debug!("prompts: {}", format.describe());
        } else {
            log::info!("prompts: {}", format.describe());
        }
        let preprocess = crate::server::images::preprocess_config_or(&dir, opened.preprocess.as_ref(), None)?;
        let video_path = dir.join("video_preprocessor_config.json");
        let video = if video_path.exists() { VideoConfig::from_file(&video_path)? } else { VideoConfig::qwen3_vl_default() };
        let defaults = GenerationDefaults::from_dir(&dir)?;
        for w in &defaults.warnings {
            log::warn!("{}", w);
        }
        log::debug!(
            "checked {} in {:.2} s: {} text layers, vocab {}, {:.2} GB of weights; tokenizer {} ({} ids); generation_config.json {}",
            self.model.display(),
            t0.elapsed().as_secs_f64(),
            config.text.num_hidden_layers,
            config.text.vocab_size,
            weight_bytes as f64 / 1e9,
            tok_path.display(),
            tokenizer.vocab_size(),
            if defaults.found { "read" } else { "absent (greedy defaults)" }
        );
        Ok(Checked { config, tokenizer, defaults, weight_bytes, opened, preprocess, video, format })
    }

    /// Step 2: the backend and the weights, placed for sessions of up to `context` tokens.
    /// `images`: image prompts of up to this many image tokens are expected (the placement
    /// under a budget serves them first). `progress`: see [`LoadProgress`].
    pub fn load(&self, checked: Checked, context: usize, images: Option<usize>, progress: LoadProgress<'_>) -> Result<Loaded> {
        let r = self.load_on(&self.device, &checked, context, images, progress)?;
        Ok(Loaded { backend: r.backend, model: r.model, tokenizer: checked.tokenizer, defaults: checked.defaults, kv_dtype: r.kv_dtype, format: checked.format, device: r.device })
    }

    /// [`ModelOptions::load`] once per device of `devices` (`serve --data-parallel`): each
    /// replica its own backend and its own weights from the checkpoint's files, loaded at once
    /// on a thread each (named `replica-N`, which the logger puts before their lines). CPU
    /// replicas take `threads` worker threads each. `progress(i, report)`: replica i's
    /// [`LoadProgress`].
    pub fn load_replicas(&self, checked: Checked, devices: &[DeviceRequest], threads: Option<usize>, context: usize, images: Option<usize>, progress: &(dyn Fn(usize, Option<(usize, usize)>) + Sync)) -> Result<Replicas> {
        let args: Vec<DeviceOptions> = devices.iter().map(|&d| DeviceOptions { device: d, threads, ..self.device.clone() }).collect();
        let loaded: Vec<std::result::Result<Replica, String>> = if args.len() == 1 {
            vec![self.load_on(&args[0], &checked, context, images, &mut |r| progress(0, r)).map_err(|e| e.to_string())]
        } else {
            let checked = &checked;
            std::thread::scope(|s| {
                let handles: Vec<_> = args
                    .iter()
                    .enumerate()
                    .map(|(i, dev)| std::thread::Builder::new().name(format!("replica-{}", i)).spawn_scoped(s, move || self.load_on(dev, checked, context, images, &mut |r| progress(i, r)).map_err(|e| e.to_string())))
                    .collect();
                handles
                    .into_iter()
                    .map(|h| match h {
                        Ok(h) => h.join().unwrap_or_else(|_| Err("loading panicked".into())),
                        Err(e) => Err(format!("cannot start a loading thread: {}", e)),
                    })
                    .collect()
            })
        };
        let mut replicas = Vec::new();
        for (i, r) in loaded.into_iter().enumerate() {
            match r {
                Ok(r) => replicas.push(r),
                Err(e) if devices.len() == 1 => return Err(e.into()),
                Err(e) => return Err(format!("replica {} ({}): {}", i, devices[i], e).into()),
            }
        }
        Ok(Replicas { replicas, tokenizer: checked.tokenizer, defaults: checked.defaults, format: checked.format })
    }

    /// One backend as `dev` asks and the model on it.
    fn load_on(&self, dev: &DeviceOptions, checked: &Checked, context: usize, images: Option<usize>, progress: LoadProgress<'_>) -> Result<Replica> {
        let sel = dev.select()?;
        let t0 = Instant::now();
        let (mut model, host) = load_model(dev, &*sel.backend, &checked.opened, self.quant, context, images, progress)?;
        // generation never picks an id the tokenizer cannot decode (the LM head's padding rows)
        model.limit_sampling(checked.tokenizer.vocab_size());
        let c = &model.config.text;
        log::info!(
            "loaded {} ({} weights; {} layers, hidden {}, {} heads / {} KV heads) in {:.1} s",
            self.model.display(),
            model.text.weights_summary(),
            c.num_hidden_layers,
            c.hidden_size,
            c.num_attention_heads,
            c.num_key_value_heads,
            t0.elapsed().as_secs_f64()
        );
        log::info!("{}; {} of checkpoint tensors; memory: {}", placed_report(&model, &*sel.backend), human(checked.weight_bytes), memory_report(&*sel.backend));
        if checked.tokenizer.vocab_size() > c.vocab_size {
            log::warn!("the tokenizer knows {} tokens but the model only {}", checked.tokenizer.vocab_size(), c.vocab_size);
        } else if model.sampled_vocab() < c.vocab_size {
            log::debug!("sampling ids below {} (the tokenizer's); the LM head's other {} rows are padding and never picked", model.sampled_vocab(), c.vocab_size - model.sampled_vocab());
        }
        let kv_dtype = dev.kv_dtype(&*sel.backend);
        Ok(Replica { backend: sel.backend, model, kv_dtype, device: sel.reason, _host: host })
    }
}

/// Reports of the weights being loaded: `Some((done, total))` bytes as they load, then `None`
/// once they are (a progress bar's cue to clear itself).
pub type LoadProgress<'a> = &'a mut dyn FnMut(Option<(usize, usize)>);

/// One replica of the model: its backend and weights.
pub struct Replica {
    pub backend: Arc<dyn Backend>,
    pub model: Model,
    /// KV-cache element type of its sessions.
    pub kv_dtype: DType,
    /// Which backend runs and why (the device selection's reason).
    pub device: String,
    /// The CPU backend of the layers off the GPU, when the model is split.
    _host: Option<Arc<dyn Backend>>,
}

/// The replicas of [`ModelOptions::load_replicas`] and what they share.
pub struct Replicas {
    pub replicas: Vec<Replica>,
    pub tokenizer: Tokenizer,
    pub defaults: GenerationDefaults,
    pub format: PromptFormat,
}

/// Says what `--quant MIX` makes of the checkpoint in `dir` (types with bytes; tensors that
/// cannot take the type asked for) and that it costs time on every start.
fn quant_report(mix: Mix, config: &Config, dir: &std::path::Path) -> Result<()> {
    let ck = crate::model::Checkpoint::open(dir)?;
    let tensors = ck.names().filter_map(|n| Some((n, ck.shape_of(n)?, ck.dtype_of(n)?)));
    let r = crate::model::quantize::MixReport::of(mix, config, tensors);
    if let Some(w) = r.warning() {
        log::warn!("--quant {}: {}", mix.name().to_ascii_lowercase(), w);
    }
    log::info!(
        "--quant {}: quantizing while loading, on every start (slow for a large model: `qwen3-vl quantize {} OUT --type {}` writes GGUF files once, which load as stored); weights as {}",
        mix.name().to_ascii_lowercase(),
        dir.display(),
        mix.name().to_ascii_lowercase(),
        r.describe()
    );
    Ok(())
}

/// Video sampling and decoding options (default: video_preprocessor_config.json's).
#[derive(Clone, Debug, Default)]
pub struct VideoOptions {
    /// Frames sampled per second of video.
    pub video_fps: Option<f64>,
    /// Most frames sampled from a video.
    pub video_max_frames: Option<usize>,
    /// Most pixels over all sampled frames of a video.
    pub video_max_pixels: Option<usize>,
    /// The ffmpeg executable for videos other than GIF and WebP.
    pub ffmpeg: Option<PathBuf>,
}

impl VideoOptions {
    /// The model's video processing with these overrides.
    pub fn config(&self, base: &VideoConfig) -> Result<VideoConfig> {
        let mut c = base.clone();
        if let Some(f) = self.video_fps {
            c.fps = f;
        }
        if let Some(n) = self.video_max_frames {
            c.max_frames = n;
            c.min_frames = c.min_frames.min(n);
        }
        if let Some(p) = self.video_max_pixels {
            let side = c.patch_size * c.merge_size;
            if p < side * side * c.temporal_patch_size {
                return Err(format!("--video-max-pixels {} is below one merged patch per frame pair ({})", p, side * side * c.temporal_patch_size).into());
            }
            c.max_pixels = p;
            c.min_pixels = c.min_pixels.min(p);
        }
        c.validate().map_err(|m| format!("video settings: {}", m))?;
        Ok(c)
    }

    pub fn limits(&self) -> VideoLimits {
        VideoLimits { ffmpeg: self.ffmpeg.clone(), ..VideoLimits::default() }
    }
}

/// Token ids that end a reply: `<|im_end|>` and `<|endoftext|>` when the tokenizer has them.
pub fn stop_ids(tok: &Tokenizer) -> Vec<u32> {
    ["<|im_end|>", "<|endoftext|>"].iter().filter_map(|t| tok.token_to_id(t)).collect()
}

/// Sampling settings over the checkpoint's defaults (unset ones: generation_config.json's,
/// else greedy).
#[derive(Clone, Debug, Default)]
pub struct SamplingOptions {
    /// 0 to 100; 0 is greedy.
    pub temperature: Option<f32>,
    /// Sample among the k most likely tokens (0: all).
    pub top_k: Option<usize>,
    /// Sample from the smallest set of tokens whose probability reaches p.
    pub top_p: Option<f32>,
    /// Penalty > 1 for tokens already in the context.
    pub repetition_penalty: Option<f32>,
    pub seed: u64,
    /// Greedy decoding (same as temperature 0).
    pub greedy: bool,
}

impl SamplingOptions {
    /// The options over the checkpoint's defaults.
    pub fn params(&self, defaults: &GenerationDefaults) -> SamplingParams {
        let mut p = defaults.params;
        if let Some(t) = self.temperature {
            p.temperature = t;
        }
        if let Some(k) = self.top_k {
            p.top_k = k;
        }
        if let Some(x) = self.top_p {
            p.top_p = x;
        }
        if let Some(r) = self.repetition_penalty {
            p.repetition_penalty = r;
        }
        if self.greedy {
            p.temperature = 0.0;
        }
        p.seed = self.seed;
        log::debug!(
            "sampling: {} (defaults from {}, flags override)",
            describe_sampling(&p),
            if defaults.found { "generation_config.json" } else { "no generation_config.json: greedy" }
        );
        p
    }
}

/// Sampling settings in words, for -v.
pub fn describe_sampling(p: &SamplingParams) -> String {
    if p.temperature <= 0.0 {
        format!("greedy, repetition penalty {}", p.repetition_penalty)
    } else {
        format!("temperature {}, top-k {}, top-p {}, repetition penalty {}, seed {}", p.temperature, p.top_k, p.top_p, p.repetition_penalty, p.seed)
    }
}
