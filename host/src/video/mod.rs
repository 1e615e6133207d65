//! Video input for the vision tower: files to sampled RGB frames, and frames to the patches,
//! timestamps and prompt pieces the model reads, as transformers' Qwen3-VL processor makes them.
//!
//! Decoding: animated GIFs and WebPs natively (`gif.rs`, `webp.rs`; frame delays give the frame
//! rate); every other container and codec through an `ffmpeg` executable (`ffmpeg.rs`: spawned
//! without a shell, raw RGB frames read from a pipe, the frame rate and count from `ffprobe`,
//! under a time limit).
//! Frames are sampled as the processor does ([`sample_indices`]), and each kept frame is
//! resized at once to the size all frames share ([`resized_size`]), so memory stays near the
//! processor's pixel budget whatever the source resolution and length.
//!
//! Processing (`process.rs`): [`VideoConfig`] from `video_preprocessor_config.json`, frame
//! sampling by fps, the joint resize of all frames within one pixel budget, rescale and
//! normalize, frames paired into temporal patches (an odd count padded with the last frame),
//! and the timestamp of each temporal patch. In the prompt a video becomes, per temporal patch,
//! `<{t:.1f} seconds><|vision_start|><|video_pad|>×(h·w/m²)<|vision_end|>`
//! ([`crate::generate::chat::Content::Video`]); the tower treats each temporal patch as a
//! frame of its own (attention within it), and so do the rotary positions
//! ([`crate::model::positions`]).

mod ffmpeg;
mod gif;
mod process;
mod webp;

pub use ffmpeg::{find_ffmpeg, FFMPEG_ENV};
pub use process::{preprocess_video, resized_size, sample_indices, smart_resize_video, timestamp_text, timestamps, VideoConfig, MAX_FRAMES_LIMIT};

use crate::image::{resize_bicubic, RgbImage};
use crate::{Error, Result};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// What the processor makes of one video.
#[derive(Clone, Debug, PartialEq)]
pub struct VideoPatches {
    /// `grid_t · grid_h · grid_w` rows of `row_len` values, in merge-window order within each
    /// temporal patch (as [`crate::image::ImagePatches`]); each row `(C, T, P, P)` over the
    /// frames of its temporal patch.
    pub patches: Vec<f32>,
    /// (temporal patches, height / patch, width / patch): transformers' `video_grid_thw`.
    pub grid_thw: [usize; 3],
    pub row_len: usize,
    /// Seconds of each temporal patch (the mean time of its first and last frame).
    pub timestamps: Vec<f64>,
}

impl VideoPatches {
    /// `<|video_pad|>` tokens per temporal patch: `grid_h · grid_w / merge²`.
    pub fn tokens_per_frame(&self, merge: usize) -> usize {
        self.grid_thw[1] * self.grid_thw[2] / (merge * merge).max(1)
    }

    /// All `<|video_pad|>` tokens of the video.
    pub fn num_tokens(&self, merge: usize) -> usize {
        self.grid_thw[0] * self.tokens_per_frame(merge)
    }
}

/// A video's stream as its container (or, for GIF, its frames) describes it.
#[derive(Clone, Debug, PartialEq)]
pub struct VideoInfo {
    pub width: usize,
    pub height: usize,
    /// Frames in the stream.
    pub frames: usize,
    /// Frames per second (average).
    pub fps: f64,
    /// Seconds.
    pub duration: f64,
}

/// Bounds on the videos a caller accepts; every one is checked before the frames are decoded.
#[derive(Clone, Debug)]
pub struct VideoLimits {
    /// Most bytes of an encoded video.
    pub max_bytes: u64,
    /// Most seconds of video.
    pub max_duration: f64,
    /// Most pixels of one frame (width × height).
    pub max_frame_pixels: usize,
    /// Most frames in the stream.
    pub max_source_frames: usize,
    /// How long decoding (the `ffmpeg` run) may take.
    pub timeout: Duration,
    /// The `ffmpeg` executable; found on `PATH` (or through [`FFMPEG_ENV`]) when `None`.
    pub ffmpeg: Option<PathBuf>,
}

impl Default for VideoLimits {
    fn default() -> Self {
        VideoLimits {
            max_bytes: 4 << 30,
            max_duration: 4.0 * 3600.0,
            max_frame_pixels: crate::image::DEFAULT_MAX_PIXELS,
            max_source_frames: 2_000_000,
            timeout: Duration::from_secs(600),
            ffmpeg: None,
        }
    }
}

impl VideoLimits {
    fn check(&self, info: &VideoInfo, name: &str) -> Result<()> {
        let fail = |msg: String| Err(Error::Video { file: name.to_string(), msg });
        if info.width == 0 || info.height == 0 {
            return fail(format!("the video stream has no pixels ({}x{})", info.width, info.height));
        }
        if info.width.saturating_mul(info.height) > self.max_frame_pixels {
            return fail(format!("{}x{} frames exceed the limit of {} pixels per frame", info.width, info.height, self.max_frame_pixels));
        }
        if info.frames == 0 {
            return fail("the video has no frames".into());
        }
        if info.frames > self.max_source_frames {
            return fail(format!("{} frames exceed the limit of {}", info.frames, self.max_source_frames));
        }
        if !(info.duration <= self.max_duration) {
            return fail(format!("{:.1} s of video exceed the limit of {:.0} s", info.duration, self.max_duration));
        }
        Ok(())
    }
}

/// A decoded, sampled and processed video.
#[derive(Clone, Debug)]
pub struct Video {
    pub info: VideoInfo,
    /// The source frames kept (the sampled indices).
    pub indices: Vec<usize>,
    pub patches: VideoPatches,
}

/// The container formats read natively; everything else goes to `ffmpeg`.
fn is_gif(b: &[u8]) -> bool {
    b.starts_with(b"GIF87a") || b.starts_with(b"GIF89a")
}

/// Reads, samples and processes a video file: an animated GIF or WebP natively, any other format
/// through `ffmpeg` (see [`VideoLimits::ffmpeg`]). Errors are [`Error::Video`] naming the
/// file (unreadable, over a limit, not a video, corrupt, `ffmpeg` missing or failing) or the
/// processor's [`Error::Limit`].
pub fn load_video(path: &Path, cfg: &VideoConfig, limits: &VideoLimits) -> Result<Video> {
    let name = path.display().to_string();
    let fail = |msg: String| Error::Video { file: name.clone(), msg };
    let meta = std::fs::metadata(path).map_err(|e| fail(format!("cannot read: {}", e)))?;
    if !meta.is_file() {
        return Err(fail("not a file".into()));
    }
    if meta.len() > limits.max_bytes {
        return Err(fail(format!("{} bytes exceed the limit of {}", meta.len(), limits.max_bytes)));
    }
    if meta.len() == 0 {
        return Err(fail("the file is empty".into()));
    }
    let mut head = [0u8; 12];
    let n = std::fs::File::open(path).and_then(|mut f| std::io::Read::read(&mut f, &mut head)).map_err(|e| fail(format!("cannot read: {}", e)))?;
    if is_gif(&head[..n]) || webp::is_webp(&head[..n]) {
        let bytes = std::fs::read(path).map_err(|e| fail(format!("cannot read: {}", e)))?;
        return decode_native(&bytes, &name, cfg, limits);
    }
    let t0 = Instant::now();
    let ff = ffmpeg::Ffmpeg::locate(limits.ffmpeg.as_deref(), &name)?;
    let info = ff.probe(path, &name, limits.timeout)?;
    limits.check(&info, &name)?;
    let plan = Plan::new(&info, cfg)?;
    let left = limits.timeout.checked_sub(t0.elapsed()).unwrap_or_default();
    let mut frames = plan.slots();
    ff.decode(path, &name, &info, left, &mut |i, img| plan.keep(&mut frames, i, img))?;
    plan.finish(info, frames, cfg, &name)
}

/// [`load_video`] on an encoded video in memory: GIF and WebP natively; other formats are written to a
/// temporary file for `ffmpeg` (removed afterwards).
pub fn decode_video(bytes: &[u8], name: &str, cfg: &VideoConfig, limits: &VideoLimits) -> Result<Video> {
    if bytes.len() as u64 > limits.max_bytes {
        return Err(Error::Video { file: name.to_string(), msg: format!("{} bytes exceed the limit of {}", bytes.len(), limits.max_bytes) });
    }
    if is_gif(bytes) || webp::is_webp(bytes) {
        return decode_native(bytes, name, cfg, limits);
    }
    let tmp = TempFile::write(bytes).map_err(|e| Error::Video { file: name.to_string(), msg: format!("cannot write a temporary file for ffmpeg: {}", e) })?;
    load_video(&tmp.0, cfg, limits).map_err(|e| match e {
        Error::Video { msg, .. } => Error::Video { file: name.to_string(), msg },
        other => other,
    })
}

/// GIF and animated WebP, decoded here.
fn decode_native(bytes: &[u8], name: &str, cfg: &VideoConfig, limits: &VideoLimits) -> Result<Video> {
    let gif = is_gif(bytes);
    if !gif && !webp::is_animated(bytes) {
        return Err(Error::Video { file: name.to_string(), msg: "a still WebP image, not a video (send it as an image)".into() });
    }
    let info = if gif { gif::probe(bytes, name, limits)? } else { webp::probe(bytes, name, limits)? };
    limits.check(&info, name)?;
    let plan = Plan::new(&info, cfg)?;
    let mut frames = plan.slots();
    let mut keep = |i: usize, img: RgbImage| plan.keep(&mut frames, i, img);
    if gif {
        gif::decode(bytes, name, &mut keep)?;
    } else {
        webp::decode(bytes, name, (info.width, info.height), &mut keep)?;
    }
    plan.finish(info, frames, cfg, name)
}

/// Which source frames to keep and the size they are resized to.
struct Plan {
    indices: Vec<usize>,
    size: (usize, usize),
}

impl Plan {
    fn new(info: &VideoInfo, cfg: &VideoConfig) -> Result<Plan> {
        let indices = sample_indices(info.frames, info.fps, cfg)?;
        let size = resized_size(indices.len(), info.height, info.width, cfg)?;
        Ok(Plan { indices, size })
    }

    fn slots(&self) -> Vec<Option<RgbImage>> {
        vec![None; self.indices.len()]
    }

    /// Keeps source frame `i` (resized) where the plan samples it (the sampled indices are
    /// strictly increasing: `sample_indices` never takes more frames than the video has); false
    /// once every sampled frame is in (the decoder may stop).
    fn keep(&self, frames: &mut [Option<RgbImage>], i: usize, img: RgbImage) -> bool {
        if let Ok(k) = self.indices.binary_search(&i) {
            let (h, w) = self.size;
            frames[k] = Some(if (img.height, img.width) == (h, w) { img } else { resize_bicubic(&img, w, h) });
        }
        self.indices.last().map_or(false, |&last| i < last)
    }

    /// The patches of the kept frames. Frames the stream did not deliver (it held fewer than
    /// its header said) repeat the last decoded one, with a warning.
    fn finish(&self, info: VideoInfo, frames: Vec<Option<RgbImage>>, cfg: &VideoConfig, name: &str) -> Result<Video> {
        let missing = frames.iter().filter(|f| f.is_none()).count();
        let mut out: Vec<RgbImage> = Vec::with_capacity(frames.len());
        for f in frames {
            let img = match (f, out.last()) {
                (Some(img), _) => img,
                (None, Some(prev)) => prev.clone(),
                (None, None) => return Err(Error::Video { file: name.to_string(), msg: format!("no frame could be decoded (the stream declares {})", info.frames) }),
            };
            out.push(img);
        }
        if missing > 0 {
            log::warn!("{}: {} of {} sampled frames were past the stream's end (it declares {} frames); the last decoded frame stands in", name, missing, out.len(), info.frames);
        }
        let patches = process::patchify_frames(&out, &self.indices, info.fps, cfg)?;
        Ok(Video { info, indices: self.indices.clone(), patches })
    }
}

/// A temporary file removed on drop.
struct TempFile(PathBuf);

impl TempFile {
    fn write(bytes: &[u8]) -> std::io::Result<TempFile> {
        use std::sync::atomic::{AtomicU64, Ordering};
        static N: AtomicU64 = AtomicU64::new(0);
        let path = std::env::temp_dir().join(format!("qwen3-vl-video-{}-{}", std::process::id(), N.fetch_add(1, Ordering::Relaxed)));
        let mut f = std::fs::OpenOptions::new().write(true).create_new(true).open(&path)?;
        let t = TempFile(path);
        std::io::Write::write_all(&mut f, bytes)?;
        Ok(t)
    }
}

impl Drop for TempFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}
