//! Inputs of the model-running subcommands, checked before the weights load: the model
//! directory and its small files, images, prompts; then the backend and the weights, with a
//! progress bar, and reports for -v (placement, memory, timings).

use super::{ranges, DeviceArgs};
use qwen3_vl::generate::SamplingParams;
use qwen3_vl::generation_config::GenerationDefaults;
use qwen3_vl::generate::chat::{Media, VideoPrompt};
use qwen3_vl::image::PreprocessConfig;
use qwen3_vl::video::{VideoConfig, VideoLimits};
use qwen3_vl::model::placement::human;
use qwen3_vl::model::{Config, LoadQuant, Mix, Model, ModelFiles, Offload, Opened, Placement};
use qwen3_vl::template::{media, Conversation, Piece, PromptFormat, Turn};
use qwen3_vl::{Backend, DeviceKind, DeviceRequest, Tokenizer};
use std::io::Read;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;

/// Where the model comes from.
#[derive(clap::Args, Clone, Debug)]
pub struct ModelArgs {
    /// The model: a directory as published on Hugging Face (config.json, *.safetensors,
    /// tokenizer.json), a GGUF text model file (with --mmproj, or the one mmproj beside it), or
    /// a directory holding a GGUF text model and its mmproj.
    #[clap(long, short = 'm')]
    pub model: PathBuf,
    /// The GGUF vision tower (mmproj) of a GGUF model.
    #[clap(long)]
    pub mmproj: Option<PathBuf>,
    /// Quantize the weights while loading: q8_0 or q4_k_m (a Hugging Face checkpoint; a GGUF
    /// model is used as stored).
    #[clap(long, value_parser = parse_quant)]
    pub quant: Option<Mix>,
    /// tokenizer.json to use instead of the model directory's (or the GGUF file's tokenizer).
    #[clap(long)]
    pub tokenizer: Option<PathBuf>,
    /// The chat template: a Jinja file, or a JSON file with a chat_template field (default: the
    /// model directory's chat_template.jinja, chat_template.json or tokenizer_config.json, then
    /// those beside --tokenizer, then the GGUF file's; else the built-in Qwen3-VL format).
    #[clap(long)]
    pub chat_template: Option<PathBuf>,
    #[clap(flatten)]
    pub device: DeviceArgs,
}

/// `--quant`: q8_0 or q4_k_m.
pub fn parse_quant(s: &str) -> Result<Mix, String> {
    match Mix::parse(s) {
        Some(m @ (Mix::Q8_0 | Mix::Q4KM)) => Ok(m),
        _ => Err(format!("unknown quantization '{}': expected q8_0 or q4_k_m", s)),
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
    pub kv_dtype: qwen3_vl::DType,
    pub format: PromptFormat,
}

pub type CliResult<T> = Result<T, Box<dyn std::error::Error>>;

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

impl ModelArgs {
    /// Step 1, before any weights: the directory exists, config.json describes a supported
    /// model, the checkpoint's files are all there with sound headers, the tokenizer loads,
    /// generation_config.json (if any) parses.
    pub fn check(&self) -> CliResult<Checked> {
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
        let preprocess = qwen3_vl::server::images::preprocess_config_or(&dir, opened.preprocess.as_ref(), None)?;
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
    /// under a budget serves them first).
    pub fn load(&self, checked: Checked, context: usize, images: Option<usize>) -> CliResult<Loaded> {
        let r = self.load_on(&self.device, &checked, context, images)?;
        Ok(Loaded { backend: r.backend, model: r.model, tokenizer: checked.tokenizer, defaults: checked.defaults, kv_dtype: r.kv_dtype, format: checked.format })
    }

    /// [`ModelArgs::load`] once per device of `devices` (`serve --data-parallel`): each replica
    /// its own backend and its own weights from the checkpoint's files, loaded at once on a
    /// thread each (named `replica-N`, which the logger puts before their lines). CPU replicas
    /// take `threads` worker threads each.
    pub fn load_replicas(&self, checked: Checked, devices: &[DeviceRequest], threads: Option<usize>, context: usize, images: Option<usize>) -> CliResult<Replicas> {
        let args: Vec<DeviceArgs> = devices.iter().map(|&d| DeviceArgs { device: d, threads, ..self.device.clone() }).collect();
        let loaded: Vec<Result<Replica, String>> = if args.len() == 1 {
            vec![self.load_on(&args[0], &checked, context, images).map_err(|e| e.to_string())]
        } else {
            let checked = &checked;
            std::thread::scope(|s| {
                let handles: Vec<_> = args
                    .iter()
                    .enumerate()
                    .map(|(i, dev)| std::thread::Builder::new().name(format!("replica-{}", i)).spawn_scoped(s, move || self.load_on(dev, checked, context, images).map_err(|e| e.to_string())))
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
    fn load_on(&self, dev: &DeviceArgs, checked: &Checked, context: usize, images: Option<usize>) -> CliResult<Replica> {
        let sel = dev.select()?;
        let t0 = Instant::now();
        let (mut model, host) = load_model(dev, &*sel.backend, &checked.opened, self.quant, context, images)?;
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
        Ok(Replica { backend: sel.backend, model, kv_dtype, _host: host })
    }
}

/// One replica of the model: its backend and weights.
pub struct Replica {
    pub backend: Arc<dyn Backend>,
    pub model: Model,
    /// KV-cache element type of its sessions.
    pub kv_dtype: qwen3_vl::DType,
    /// The CPU backend of the layers off the GPU, when the model is split.
    _host: Option<Arc<dyn Backend>>,
}

/// The replicas of [`ModelArgs::load_replicas`] and what they share.
pub struct Replicas {
    pub replicas: Vec<Replica>,
    pub tokenizer: Tokenizer,
    pub defaults: GenerationDefaults,
    pub format: PromptFormat,
}

/// Says what `--quant MIX` makes of the checkpoint in `dir` (types with bytes; tensors that
/// cannot take the type asked for) and that it costs time on every start.
fn quant_report(mix: Mix, config: &Config, dir: &std::path::Path) -> CliResult<()> {
    let ck = qwen3_vl::model::Checkpoint::open(dir)?;
    let tensors = ck.names().filter_map(|n| Some((n, ck.shape_of(n)?, ck.dtype_of(n)?)));
    let r = qwen3_vl::model::quantize::MixReport::of(mix, config, tensors);
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

/// The user's message: `-p TEXT`, `-p -` (standard input) or `--prompt-file FILE`.
#[derive(clap::Args, Clone, Debug)]
#[clap(group(clap::ArgGroup::new("prompt-source").required(true).args(["prompt", "prompt_file"])))]
pub struct PromptArgs {
    /// The user's message; "-" reads it from standard input.
    #[clap(long, short = 'p')]
    pub prompt: Option<String>,
    /// Read the user's message from this file.
    #[clap(long)]
    pub prompt_file: Option<PathBuf>,
}

impl PromptArgs {
    /// The message text; one final newline of a file or of standard input is dropped.
    pub fn read(&self) -> CliResult<String> {
        let mut text = match (&self.prompt, &self.prompt_file) {
            (Some(p), _) if p == "-" => {
                let mut s = String::new();
                std::io::stdin().read_to_string(&mut s).map_err(|e| format!("reading the prompt from standard input: {}", e))?;
                s
            }
            (Some(p), _) => return Ok(p.clone()),
            (None, Some(f)) => std::fs::read_to_string(f).map_err(|e| format!("--prompt-file {}: {}", f.display(), e))?,
            (None, None) => return Err("give the prompt with -p TEXT, -p - (standard input) or --prompt-file FILE".into()),
        };
        if text.ends_with('\n') {
            text.pop();
            if text.ends_with('\r') {
                text.pop();
            }
        }
        if text.trim().is_empty() {
            return Err("the prompt is empty".into());
        }
        Ok(text)
    }
}

/// Images and videos attached to the user's message.
#[derive(clap::Args, Clone, Debug)]
pub struct ImageArgs {
    /// An image (JPEG, PNG or WebP) to ask about; repeat for several, they come before the text.
    #[clap(long = "image", short = 'i')]
    pub images: Vec<PathBuf>,
    /// Resize images above this many pixels down (bounds memory and time; default from
    /// preprocessor_config.json).
    #[clap(long, value_parser = ranges::max_pixels, allow_hyphen_values = true)]
    pub max_pixels: Option<usize>,
    /// A video to ask about (animated GIF and WebP natively; MP4, WebM, MOV and the rest
    /// through ffmpeg); repeat for several. Images and videos go in the order given.
    #[clap(long = "video")]
    pub videos: Vec<PathBuf>,
    #[clap(flatten)]
    pub video: VideoOpts,
    /// Whether each attachment, in command-line order, is a video (set after parsing from the
    /// positions of -i and --video; empty: images first).
    #[clap(skip)]
    pub order: Vec<bool>,
}

/// Video sampling and decoding options (defaults from video_preprocessor_config.json).
#[derive(clap::Args, Clone, Debug, Default)]
pub struct VideoOpts {
    /// Frames sampled per second of video.
    #[clap(long, value_parser = ranges::video_fps, allow_hyphen_values = true)]
    pub video_fps: Option<f64>,
    /// Most frames sampled from a video.
    #[clap(long, value_parser = ranges::video_max_frames, allow_hyphen_values = true)]
    pub video_max_frames: Option<usize>,
    /// Most pixels over all sampled frames of a video (its frames are resized to share them).
    #[clap(long, value_parser = ranges::max_pixels, allow_hyphen_values = true)]
    pub video_max_pixels: Option<usize>,
    /// The ffmpeg executable for videos other than GIF and WebP (default: $QWEN3_VL_FFMPEG, else
    /// PATH).
    #[clap(long)]
    pub ffmpeg: Option<PathBuf>,
}

impl VideoOpts {
    /// The model's video processing with these overrides.
    pub fn config(&self, base: &VideoConfig) -> CliResult<VideoConfig> {
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

/// Preprocessed images and videos: concatenated patch rows, per-item grids, and the prompt
/// placeholder of each, in order.
#[derive(Default)]
pub struct Prepared {
    pub patches: Vec<f32>,
    pub row_len: usize,
    pub grids: Vec<[usize; 3]>,
    pub media: Vec<Media>,
    /// Each item's content hash ([`qwen3_vl::engine::image_key`]), made once where it is
    /// prepared: a chat sends its images again every turn, and the engine keys the prefix
    /// cache's blocks by them.
    pub keys: Vec<u64>,
}

impl Prepared {
    pub fn images(&self) -> Option<qwen3_vl::model::Images<'_>> {
        if self.grids.is_empty() {
            None
        } else {
            Some(qwen3_vl::model::Images { patches: &self.patches, row_len: self.row_len, grids: &self.grids })
        }
    }

    /// The images and videos as the engine takes them (a copy of the patches), `None` without.
    pub fn input(&self) -> Option<qwen3_vl::engine::ImageInput> {
        let key = (self.keys.len() == self.grids.len()).then(|| qwen3_vl::engine::combine_image_keys(&self.keys));
        self.images().map(|im| qwen3_vl::engine::ImageInput { patches: im.patches.to_vec(), row_len: im.row_len, grids: im.grids.to_vec(), key })
    }

    /// Placeholder tokens of every image and video.
    pub fn tokens(&self) -> usize {
        self.media.iter().map(Media::tokens).sum()
    }

    /// Adds the images and videos of `other` after these.
    pub fn extend(&mut self, other: &Prepared) {
        if !other.grids.is_empty() {
            self.row_len = other.row_len;
        }
        self.patches.extend_from_slice(&other.patches);
        self.grids.extend_from_slice(&other.grids);
        self.media.extend_from_slice(&other.media);
        self.keys.extend_from_slice(&other.keys);
    }
}

/// Decodes and preprocesses image files with the model's preprocessing `base` (see
/// [`Checked::preprocess`]), `max_pixels` lowering the resize cap.
pub fn prepare_images(paths: &[PathBuf], base: &PreprocessConfig, max_pixels: Option<usize>) -> CliResult<Prepared> {
    use qwen3_vl::image::{load_image, preprocess};
    let mut out = Prepared::default();
    if paths.is_empty() {
        return Ok(out);
    }
    let cfg = qwen3_vl::server::images::cap_pixels(base.clone(), max_pixels)?;
    for path in paths {
        let t0 = Instant::now();
        let img = load_image(path)?;
        let p = preprocess(&img, &cfg)?;
        log::info!(
            "{}: {}x{} -> {} patches ({}x{} grid), {} image tokens, {:.0} ms",
            path.display(),
            img.width,
            img.height,
            p.rows(),
            p.grid_thw[1],
            p.grid_thw[2],
            p.num_tokens(cfg.merge_size),
            t0.elapsed().as_secs_f64() * 1e3
        );
        out.row_len = p.row_len;
        out.media.push(Media::Image(p.num_tokens(cfg.merge_size)));
        out.grids.push(p.grid_thw);
        out.keys.push(qwen3_vl::engine::image_key(&p.patches, p.row_len, &[p.grid_thw]));
        out.patches.extend_from_slice(&p.patches);
    }
    Ok(out)
}

/// Decodes, samples and preprocesses a video file with `cfg`.
pub fn prepare_video(path: &Path, cfg: &VideoConfig, limits: &VideoLimits) -> CliResult<Prepared> {
    let t0 = Instant::now();
    let v = qwen3_vl::video::load_video(path, cfg, limits)?;
    let p = &v.patches;
    log::info!(
        "{}: {}x{}, {} frames at {:.2} fps ({:.1} s) -> {} sampled, {} temporal patches of {}x{} patches, {} video tokens, {:.0} ms",
        path.display(),
        v.info.width,
        v.info.height,
        v.info.frames,
        v.info.fps,
        v.info.duration,
        v.indices.len(),
        p.grid_thw[0],
        p.grid_thw[1],
        p.grid_thw[2],
        p.num_tokens(cfg.merge_size),
        t0.elapsed().as_secs_f64() * 1e3
    );
    let media = Media::Video(VideoPrompt { timestamps: p.timestamps.clone(), tokens_per_frame: p.tokens_per_frame(cfg.merge_size) });
    let key = qwen3_vl::engine::image_key(&p.patches, p.row_len, &[p.grid_thw]);
    Ok(Prepared { row_len: p.row_len, grids: vec![p.grid_thw], media: vec![media], keys: vec![key], patches: v.patches.patches })
}

impl ImageArgs {
    /// The images and videos, in command-line order, with the model's image and video
    /// processing (`base`, `video`).
    pub fn prepare(&self, base: &PreprocessConfig, video: &VideoConfig) -> CliResult<Prepared> {
        let order: Vec<bool> = if self.order.len() == self.images.len() + self.videos.len() {
            self.order.clone()
        } else {
            std::iter::repeat(false).take(self.images.len()).chain(std::iter::repeat(true).take(self.videos.len())).collect()
        };
        let vcfg = if self.videos.is_empty() { video.clone() } else { self.video.config(video)? };
        let limits = self.video.limits();
        let (mut images, mut videos) = (self.images.iter(), self.videos.iter());
        let mut out = Prepared::default();
        for is_video in order {
            let p = if is_video {
                prepare_video(videos.next().expect("counted"), &vcfg, &limits)?
            } else {
                prepare_images(std::slice::from_ref(images.next().expect("counted")), base, self.max_pixels)?
            };
            out.extend(&p);
        }
        Ok(out)
    }
}

/// Whether each of `images` and `videos` (argument ids of a subcommand's matches), merged in
/// command-line order, is a video.
pub fn media_order(m: &clap::ArgMatches, images: &str, videos: &str) -> Vec<bool> {
    let idx = |id: &str| -> Vec<usize> { m.indices_of(id).map(|i| i.collect()).unwrap_or_default() };
    let mut all: Vec<(usize, bool)> = idx(images).into_iter().map(|i| (i, false)).chain(idx(videos).into_iter().map(|i| (i, true))).collect();
    all.sort_unstable();
    all.into_iter().map(|(_, v)| v).collect()
}

/// A user message of `text` with `media` (images and videos, before the text, in order).
pub fn user_turn(text: &str, media: &[Media]) -> Turn {
    let mut parts: Vec<Piece> = media.iter().map(|m| if matches!(m, Media::Video(_)) { Piece::Video } else { Piece::Image }).collect();
    parts.push(Piece::Text(text.to_string()));
    Turn::parts("user", parts)
}

/// The prompt text of `turns` (whose images and videos are `media`, in order), with the
/// assistant's opening: rendered with `format`, the placeholders expanded.
pub fn render_prompt(format: &PromptFormat, turns: &[Turn], media: &[Media]) -> CliResult<String> {
    let text = format.render(&Conversation::new(turns))?;
    Ok(media::expand(&text, media).map_err(|e| e.to_string())?)
}

/// Token ids that end a reply: `<|im_end|>` and `<|endoftext|>` when the tokenizer has them.
pub fn stop_ids(tok: &Tokenizer) -> Vec<u32> {
    ["<|im_end|>", "<|endoftext|>"].iter().filter_map(|t| tok.token_to_id(t)).collect()
}

/// Sampling flags; unset ones come from the model's generation_config.json, else greedy.
#[derive(clap::Args, Clone, Debug)]
pub struct SamplingArgs {
    /// Sampling temperature, 0 to 100; 0 is greedy.
    #[clap(long, value_parser = ranges::temperature, allow_hyphen_values = true)]
    pub temperature: Option<f32>,
    /// Sample among the k most likely tokens (0: all).
    #[clap(long, value_parser = ranges::top_k, allow_hyphen_values = true)]
    pub top_k: Option<usize>,
    /// Sample from the smallest set of tokens whose probability reaches p (above 0, at most 1).
    #[clap(long, value_parser = ranges::top_p, allow_hyphen_values = true)]
    pub top_p: Option<f32>,
    /// Penalty > 1 for tokens already in the context (above 0, at most 100; 1 is off).
    #[clap(long, value_parser = ranges::repetition_penalty, allow_hyphen_values = true)]
    pub repetition_penalty: Option<f32>,
    /// Random seed.
    #[clap(long, default_value = "0")]
    pub seed: u64,
    /// Greedy decoding (same as --temperature 0).
    #[clap(long)]
    pub greedy: bool,
}

impl SamplingArgs {
    /// The flags over the checkpoint's defaults.
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
pub fn place(dev: &DeviceArgs, backend: &dyn Backend, opened: &Opened, quant: Option<Mix>, context: usize, images: Option<usize>) -> CliResult<(Placement, Option<Arc<dyn Backend>>)> {
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
    let mut p = Placement::plan(&sizes, Some(budget), dev.gpu_layers, images.is_some());
    if quant.is_none() && p.as_ref().map_or(true, |p| p.is_split()) {
        let q8 = LoadQuant { mix: None, vision_q8: true };
        let s8 = Model::sizes(opened, q8, backend, context, image_tokens, kv);
        if s8.vision < sizes.vision {
            if let Ok(mut p8) = Placement::plan(&s8, Some(budget), dev.gpu_layers, images.is_some()) {
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
        "placement{}: {}; GPU {} (weights, KV cache at {} tokens, {} workspace), CPU {}; budget {}{}",
        if p.vision_first { " for image prompts" } else { "" },
        p.describe(),
        human(p.device_bytes),
        context,
        human(if p.vision_on_device { sizes.text_work.max(sizes.vision_work) } else { sizes.text_work }),
        human(p.host_bytes),
        human(budget),
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
    let host = qwen3_vl::select_device_with(qwen3_vl::DeviceRequest::Cpu, qwen3_vl::kernels::KernelsRequest::Auto, dev.threads)?.backend;
    Ok((p, Some(host)))
}

/// Loads the model of `opened` onto `backend` as [`place`] decides.
pub fn load_model(dev: &DeviceArgs, backend: &dyn Backend, opened: &Opened, quant: Option<Mix>, context: usize, images: Option<usize>) -> CliResult<(Model, Option<Arc<dyn Backend>>)> {
    let (p, host) = place(dev, backend, opened, quant, context, images)?;
    let offload = host.as_ref().map(|h| Offload { host: h, placement: &p });
    let lq = LoadQuant { mix: quant, vision_q8: p.vision_q8 };
    let bar = super::progress::Progress::bytes("loading weights", 0);
    let model = Model::load_placed(opened, lq, backend, offload, &mut |done, total| bar.set(done as u64, total as u64))?;
    bar.clear();
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
