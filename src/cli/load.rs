//! Inputs of the model-running subcommands, checked before the weights load: the model
//! directory and its small files, images, prompts; then the backend and the weights, with a
//! progress bar, and reports for -v (placement, memory, timings).

use super::progress::Progress;
use super::{ranges, DeviceArgs};
use qwen3_vl::generate::SamplingParams;
use qwen3_vl::generation_config::GenerationDefaults;
use qwen3_vl::generate::chat::{Media, VideoPrompt};
use qwen3_vl::image::PreprocessConfig;
use qwen3_vl::loading::{ModelOptions, SamplingOptions, VideoOptions};
use qwen3_vl::video::{VideoConfig, VideoLimits};
use qwen3_vl::model::{Mix, Model, Opened, Placement};
use qwen3_vl::template::{media, Conversation, Piece, PromptFormat, Turn};
use qwen3_vl::Backend;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;

pub use qwen3_vl::loading::{describe_sampling, memory_report, stop_ids, Checked, Loaded};

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
    qwen3_vl::loading::parse_quant(s)
}

pub type CliResult<T> = Result<T, Box<dyn std::error::Error>>;

impl ModelArgs {
    /// The library's options of these flags.
    pub fn options(&self) -> ModelOptions {
        ModelOptions {
            model: self.model.clone(),
            mmproj: self.mmproj.clone(),
            quant: self.quant,
            tokenizer: self.tokenizer.clone(),
            chat_template: self.chat_template.clone(),
            device: self.device.options(),
        }
    }

    /// Step 1, before any weights (see [`ModelOptions::check`]).
    pub fn check(&self) -> CliResult<Checked> {
        self.options().check()
    }

    /// Step 2: the backend and the weights (see [`ModelOptions::load`]), with a progress bar.
    pub fn load(&self, checked: Checked, context: usize, images: Option<usize>) -> CliResult<Loaded> {
        let bars = WeightBars::new(1);
        self.options().load(checked, context, images, &mut |r| bars.report(0, r))
    }
}

/// The bars of weights being loaded (one per replica), each drawn from its first report on
/// and cleared once its weights are loaded.
pub struct WeightBars(Vec<std::sync::OnceLock<Progress>>);

impl WeightBars {
    pub fn new(n: usize) -> WeightBars {
        WeightBars((0..n).map(|_| std::sync::OnceLock::new()).collect())
    }

    /// Replica `i`'s report (see [`qwen3_vl::loading::LoadProgress`]).
    pub fn report(&self, i: usize, r: Option<(usize, usize)>) {
        match r {
            Some((done, total)) => self.0[i].get_or_init(|| Progress::bytes("loading weights", 0)).set(done as u64, total as u64),
            None => {
                if let Some(b) = self.0[i].get() {
                    b.clear();
                }
            }
        }
    }
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
    /// The library's options of these flags.
    pub fn options(&self) -> VideoOptions {
        VideoOptions { video_fps: self.video_fps, video_max_frames: self.video_max_frames, video_max_pixels: self.video_max_pixels, ffmpeg: self.ffmpeg.clone() }
    }

    /// The model's video processing with these overrides.
    pub fn config(&self, base: &VideoConfig) -> CliResult<VideoConfig> {
        self.options().config(base)
    }

    pub fn limits(&self) -> VideoLimits {
        self.options().limits()
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
        let keys = if self.keys.len() == self.grids.len() { self.keys.clone() } else { Vec::new() };
        self.images().map(|im| qwen3_vl::engine::ImageInput { keys, ..qwen3_vl::engine::ImageInput::flat(im.patches.to_vec(), im.row_len, im.grids.to_vec()) })
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
    /// The library's options of these flags.
    pub fn options(&self) -> SamplingOptions {
        SamplingOptions { temperature: self.temperature, top_k: self.top_k, top_p: self.top_p, repetition_penalty: self.repetition_penalty, seed: self.seed, greedy: self.greedy }
    }

    /// The flags over the checkpoint's defaults.
    pub fn params(&self, defaults: &GenerationDefaults) -> SamplingParams {
        self.options().params(defaults)
    }
}

/// Where the model of `opened` goes on `backend` (see [`qwen3_vl::loading::place`]).
pub fn place(dev: &DeviceArgs, backend: &dyn Backend, opened: &Opened, quant: Option<Mix>, context: usize, images: Option<usize>) -> CliResult<(Placement, Option<Arc<dyn Backend>>)> {
    qwen3_vl::loading::place(&dev.options(), backend, opened, quant, context, images)
}

/// Loads the model of `opened` onto `backend` as [`place`] decides, with a progress bar.
pub fn load_model(dev: &DeviceArgs, backend: &dyn Backend, opened: &Opened, quant: Option<Mix>, context: usize, images: Option<usize>) -> CliResult<(Model, Option<Arc<dyn Backend>>)> {
    let bars = WeightBars::new(1);
    qwen3_vl::loading::load_model(&dev.options(), backend, opened, quant, context, images, &mut |r| bars.report(0, r))
}
