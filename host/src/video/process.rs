//! The Qwen3-VL video processor: settings, frame sampling, the joint resize, timestamps and the
//! patches, as transformers' `Qwen3VLVideoProcessor` and `Qwen3VLProcessor` compute them.

use super::VideoPatches;
use crate::image::preprocess::{check_mean_std, round_half_even, value_table, Fields};
use crate::image::{resize_bicubic, RgbImage};
use crate::{Error, Result};
use rayon::prelude::*;
use serde_json::Value;
use std::path::Path;

/// Video processing settings, as in a `video_preprocessor_config.json`.
#[derive(Clone, Debug, PartialEq)]
pub struct VideoConfig {
    /// Side of a square vision patch in pixels (16).
    pub patch_size: usize,
    /// Patches merged per side into one token (2).
    pub merge_size: usize,
    /// Frames per temporal patch (2): consecutive sampled frames go through the tower together.
    pub temporal_patch_size: usize,
    /// Fewest pixels over all sampled frames after resizing (`size.shortest_edge`).
    pub min_pixels: usize,
    /// Most pixels over all sampled frames after resizing (`size.longest_edge`): the budget the
    /// joint resize of every frame keeps to.
    pub max_pixels: usize,
    /// Frames sampled per second of video.
    pub fps: f64,
    /// Fewest and most frames sampled (never more than the video has).
    pub min_frames: usize,
    pub max_frames: usize,
    /// transformers' `cap_pixels_per_frame` (off unless the file sets it): each frame's share
    /// of the budget is at most 768 merged patches and at least 1.05 × `min_pixels`.
    pub cap_pixels_per_frame: bool,
    pub image_mean: [f32; 3],
    pub image_std: [f32; 3],
    /// The factor of `do_rescale` (1/255), applied in f64 and rounded to f32 as transformers does.
    pub rescale_factor: f64,
    pub do_resize: bool,
    pub do_rescale: bool,
    pub do_normalize: bool,
}

impl Default for VideoConfig {
    fn default() -> Self {
        VideoConfig::qwen3_vl_default()
    }
}

impl VideoConfig {
    /// The class defaults of `Qwen3VLVideoProcessor`: patch 16, merge 2, temporal 2, 2 frames
    /// per second, 4 to 768 frames, 131072 to 786432 pixels over the sampled frames, mean =
    /// std = 0.5, rescale 1/255.
    pub fn qwen3_vl_default() -> VideoConfig {
        VideoConfig {
            patch_size: 16,
            merge_size: 2,
            temporal_patch_size: 2,
            min_pixels: 128 * 32 * 32,
            max_pixels: 32 * 32 * 768,
            fps: 2.0,
            min_frames: 4,
            max_frames: 768,
            cap_pixels_per_frame: false,
            image_mean: [0.5; 3],
            image_std: [0.5; 3],
            rescale_factor: 1.0 / 255.0,
            do_resize: true,
            do_rescale: true,
            do_normalize: true,
        }
    }

    /// Reads a `video_preprocessor_config.json`; keys that are absent keep
    /// [`VideoConfig::qwen3_vl_default`]'s values. Errors: [`Error::Io`] when unreadable,
    /// [`Error::Config`] naming the file and key when malformed.
    pub fn from_file(path: &Path) -> Result<VideoConfig> {
        let text = std::fs::read_to_string(path).map_err(|e| Error::io(path, e))?;
        VideoConfig::from_json_str(&text, &path.display().to_string())
    }

    /// [`VideoConfig::from_file`] on JSON text; `file` names it in errors.
    pub fn from_json_str(text: &str, file: &str) -> Result<VideoConfig> {
        let r = Fields { file };
        let bad = |msg: String| r.bad(msg);
        let obj = r.object(text)?;
        let mut c = VideoConfig::qwen3_vl_default();
        let (count, number, flag, triple) = (|k: &str, v: &Value| r.count(k, v), |k: &str, v: &Value| r.number(k, v), |k: &str, v: &Value| r.flag(k, v), |k: &str, v: &Value| r.triple(k, v));
        if let Some(size) = obj.get("size").filter(|s| !s.is_null()) {
            let size = size.as_object().ok_or_else(|| bad(format!("size: expected an object, got {}", size)))?;
            for (key, value) in size {
                match key.as_str() {
                    "shortest_edge" => c.min_pixels = count("size.shortest_edge", value)?,
                    "longest_edge" => c.max_pixels = count("size.longest_edge", value)?,
                    _ => return Err(bad(format!("size.{}: unsupported (expected shortest_edge and longest_edge)", key))),
                }
            }
        }
        for (key, value) in &obj {
            if value.is_null() {
                continue;
            }
            match key.as_str() {
                "patch_size" => c.patch_size = count(key, value)?,
                "merge_size" => c.merge_size = count(key, value)?,
                "temporal_patch_size" => c.temporal_patch_size = count(key, value)?,
                "fps" => c.fps = number(key, value)?,
                "min_frames" => c.min_frames = count(key, value)?,
                "max_frames" => c.max_frames = count(key, value)?,
                "cap_pixels_per_frame" => c.cap_pixels_per_frame = flag(key, value)?,
                "image_mean" => c.image_mean = triple(key, value)?,
                "image_std" => c.image_std = triple(key, value)?,
                "rescale_factor" => c.rescale_factor = number(key, value)?,
                "do_resize" => c.do_resize = flag(key, value)?,
                "do_rescale" => c.do_rescale = flag(key, value)?,
                "do_normalize" => c.do_normalize = flag(key, value)?,
                "do_sample_frames" if !flag(key, value)? => return Err(bad("do_sample_frames false: unsupported (frames are always sampled)".into())),
                "num_frames" => return Err(bad("num_frames: unsupported (frames are sampled by fps)".into())),
                "resample" if value.as_u64() != Some(3) => return Err(bad(format!("resample {}: only 3 (bicubic) is supported", value))),
                _ => {}
            }
        }
        c.validate().map_err(bad)?;
        Ok(c)
    }

    /// Checks the settings; the message names what is out of range.
    pub fn validate(&self) -> std::result::Result<(), String> {
        let (p, m, t) = (self.patch_size, self.merge_size, self.temporal_patch_size);
        if p == 0 || m == 0 || t == 0 || p > 256 || m > 16 || t > 16 {
            return Err(format!("patch_size {} (1 to 256), merge_size {} (1 to 16) and temporal_patch_size {} (1 to 16) are out of range", p, m, t));
        }
        if !(self.fps > 0.0 && self.fps <= 1000.0) {
            return Err(format!("fps {} must be above 0 and at most 1000", self.fps));
        }
        if self.min_frames == 0 || self.max_frames < self.min_frames || self.max_frames > MAX_FRAMES_LIMIT {
            return Err(format!("min_frames {} and max_frames {} must satisfy 1 <= min <= max <= {}", self.min_frames, self.max_frames, MAX_FRAMES_LIMIT));
        }
        if self.max_pixels == 0 || self.max_pixels > MAX_VIDEO_PIXELS || self.min_pixels > MAX_VIDEO_PIXELS {
            return Err(format!("size.longest_edge {} and size.shortest_edge {} must be at most {} (longest positive)", self.max_pixels, self.min_pixels, MAX_VIDEO_PIXELS));
        }
        check_mean_std(&self.image_mean, &self.image_std)
    }
}

/// The most frames a configuration may sample (`max_frames`).
pub const MAX_FRAMES_LIMIT: usize = 4096;
/// The largest pixel budget over all frames a configuration may set: 2^32 (4096 frames of
/// 1024²).
pub const MAX_VIDEO_PIXELS: usize = 1 << 32;

/// The source frames to keep: transformers' `sample_frames` with `fps` sampling. With `total`
/// frames at `video_fps` frames per second, `int(total / video_fps · fps)` frames, clamped to
/// `[min_frames, max_frames]` and to `total`, at `linspace(0, total - 1, n)` rounded half to
/// even (numpy's `round`). Errors when the video has no frames or no positive frame rate.
pub fn sample_indices(total: usize, video_fps: f64, cfg: &VideoConfig) -> Result<Vec<usize>> {
    if total == 0 {
        return Err(Error::Limit { op: "video sampling", msg: "the video has no frames".into() });
    }
    if !(video_fps > 0.0 && video_fps.is_finite()) {
        return Err(Error::Limit { op: "video sampling", msg: format!("the video's frame rate {} is not a positive number", video_fps) });
    }
    let want = (total as f64 / video_fps * cfg.fps) as usize; // Python's int(): toward zero
    let n = want.max(cfg.min_frames).min(cfg.max_frames).min(total);
    Ok(linspace_round(total - 1, n))
}

/// `np.linspace(0, last, n).round().astype(int)`: numpy computes `i · step` (step = last /
/// (n - 1)) and sets the final element to `last` exactly.
fn linspace_round(last: usize, n: usize) -> Vec<usize> {
    match n {
        0 => Vec::new(),
        1 => vec![0],
        _ => {
            let step = last as f64 / (n - 1) as f64;
            (0..n).map(|i| if i == n - 1 { last } else { round_half_even(i as f64 * step) as usize }).collect()
        }
    }
}

/// The time in seconds of each temporal patch of frames `indices` from a video of `video_fps`
/// frames per second: `Qwen3VLProcessor._calculate_timestamps` (indices padded to a multiple
/// of `temporal` with the last, then the mean of each patch's first and last frame time).
pub fn timestamps(indices: &[usize], video_fps: f64, temporal: usize) -> Vec<f64> {
    let mut idx = indices.to_vec();
    let temporal = temporal.max(1);
    while idx.len() % temporal != 0 {
        idx.push(*idx.last().unwrap_or(&0));
    }
    let t: Vec<f64> = idx.iter().map(|&i| i as f64 / video_fps).collect();
    t.chunks(temporal).map(|c| (c[0] + c[c.len() - 1]) / 2.0).collect()
}

/// A timestamp as the processor prints it, `f"<{t:.1f} seconds>"`: Python's rounding of the
/// binary value, ties (only odd multiples of 1/4 are exact ties at one decimal) to even.
pub fn timestamp_text(t: f64) -> String {
    let q = t * 4.0; // exact
    let v = if q.fract() == 0.0 && (q as i64) % 2 != 0 {
        // m / 4 with m odd: t · 10 = 2.5 m is halfway; Python rounds to the even tenth
        round_half_even(t * 10.0) / 10.0
    } else {
        t
    };
    format!("<{:.1} seconds>", v)
}

/// transformers' video `smart_resize`: the (height, width) every frame is resized to, both
/// multiples of `factor`, for `frames` sampled frames of `height × width`, with the pixels of
/// all frames (frames rounded to the temporal patch) within `[min_pixels, max_pixels]` where
/// reachable. Frames smaller than `factor` are first scaled up to it. Errors ([`Error::Limit`])
/// as transformers raises: fewer frames than `temporal`, an aspect ratio above 200.
pub fn smart_resize_video(frames: usize, height: usize, width: usize, temporal: usize, factor: usize, min_pixels: usize, max_pixels: usize) -> Result<(usize, usize)> {
    let limit = |msg: String| Error::Limit { op: "video smart_resize", msg };
    if frames < temporal {
        return Err(limit(format!("{} sampled frames: at least temporal_patch_size = {} are needed", frames, temporal)));
    }
    if height == 0 || width == 0 || factor == 0 {
        return Err(limit(format!("cannot resize {}x{} frames with factor {}", width, height, factor)));
    }
    let (mut h, mut w, f) = (height as f64, width as f64, factor as f64);
    if h < f || w < f {
        let scale = (f / h).max(f / w);
        h = (h * scale).trunc();
        w = (w * scale).trunc();
    }
    let ratio = h.max(w) / h.min(w);
    if ratio > 200.0 {
        return Err(limit(format!("absolute aspect ratio must be smaller than 200, got {} ({}x{})", ratio, width, height)));
    }
    let mut h_bar = round_half_even(h / f) * f;
    let mut w_bar = round_half_even(w / f) * f;
    let t_bar = round_half_even(frames as f64 / temporal as f64) * temporal as f64;
    let n = frames as f64;
    if t_bar * h_bar * w_bar > max_pixels as f64 {
        let beta = (n * h * w / max_pixels as f64).sqrt();
        h_bar = f.max((h / beta / f).floor() * f);
        w_bar = f.max((w / beta / f).floor() * f);
    } else if t_bar * h_bar * w_bar < min_pixels as f64 {
        let beta = (min_pixels as f64 / (n * h * w)).sqrt();
        h_bar = (h * beta / f).ceil() * f;
        w_bar = (w * beta / f).ceil() * f;
    }
    if h_bar < f || w_bar < f {
        return Err(limit(format!("{}x{} frames are too small: they would be resized to {}x{}", width, height, w_bar, h_bar)));
    }
    Ok((h_bar as usize, w_bar as usize))
}

/// The (height, width) `cfg` resizes `frames` sampled frames of `height × width` to (with
/// `cap_pixels_per_frame`, the budget is first capped per frame as transformers does).
pub fn resized_size(frames: usize, height: usize, width: usize, cfg: &VideoConfig) -> Result<(usize, usize)> {
    let factor = cfg.patch_size * cfg.merge_size;
    if !cfg.do_resize {
        return Ok((height, width));
    }
    let mut max_pixels = cfg.max_pixels;
    if cfg.cap_pixels_per_frame {
        let frame_cap = 768 * factor * factor;
        let per_frame = frame_cap.min(cfg.max_pixels / frames.max(1)).max((cfg.min_pixels as f64 * 1.05) as usize);
        max_pixels = per_frame * frames;
    }
    smart_resize_video(frames, height, width, cfg.temporal_patch_size, factor, cfg.min_pixels, max_pixels)
}

/// Turns sampled frames (all of one size) into the vision tower's input as the processor
/// does: the joint resize ([`resized_size`], Pillow-exact bicubic per frame), rescale and
/// normalize, the frame count padded to a multiple of `temporal_patch_size` with the last
/// frame, and patches in merge-window order with each row `(C, T, P, P)` over the frames of
/// its temporal patch. `indices` and `video_fps` give the timestamps.
pub fn preprocess_video(frames: &[RgbImage], indices: &[usize], video_fps: f64, cfg: &VideoConfig) -> Result<VideoPatches> {
    cfg.validate().map_err(|msg| Error::Config { file: "VideoConfig".into(), msg })?;
    let first = frames.first().ok_or_else(|| Error::Limit { op: "video preprocess", msg: "no frames".into() })?;
    if frames.iter().any(|f| (f.width, f.height) != (first.width, first.height)) {
        return Err(Error::Limit { op: "video preprocess", msg: "the frames differ in size".into() });
    }
    let factor = cfg.patch_size * cfg.merge_size;
    let (h, w) = resized_size(frames.len(), first.height, first.width, cfg)?;
    if h == 0 || w == 0 || h % factor != 0 || w % factor != 0 {
        let msg = format!("{}x{} is not a multiple of patch_size * merge_size = {} (do_resize is off)", w, h, factor);
        return Err(Error::Limit { op: "video preprocess", msg });
    }
    let resized: Vec<RgbImage> = frames.par_iter().map(|f| if (f.height, f.width) == (h, w) { f.clone() } else { resize_bicubic(f, w, h) }).collect();
    patchify_frames(&resized, indices, video_fps, cfg)
}

/// The patches and timestamps of frames already at their processed size (multiples of
/// `patch_size · merge_size`, all alike): rescale, normalize, pair into temporal patches.
pub(crate) fn patchify_frames(resized: &[RgbImage], indices: &[usize], video_fps: f64, cfg: &VideoConfig) -> Result<VideoPatches> {
    let (p, m, t) = (cfg.patch_size, cfg.merge_size, cfg.temporal_patch_size);
    let (h, w) = match resized.first() {
        Some(f) if resized.iter().all(|g| (g.width, g.height) == (f.width, f.height)) && f.height % (p * m) == 0 && f.width % (p * m) == 0 && f.height > 0 && f.width > 0 => (f.height, f.width),
        _ => return Err(Error::Limit { op: "video preprocess", msg: "the frames are missing, differ in size or are not multiples of patch_size * merge_size".into() }),
    };
    if indices.len() != resized.len() {
        return Err(Error::Limit { op: "video preprocess", msg: format!("{} frames with {} frame indices", resized.len(), indices.len()) });
    }
    let table = value_table(cfg.do_rescale, cfg.rescale_factor, cfg.do_normalize, &cfg.image_mean, &cfg.image_std);
    let grid_t = (resized.len() + t - 1) / t;
    let (gh, gw) = (h / p, w / p);
    let row_len = 3 * t * p * p;
    let per_t = gh * gw;
    let mut patches = vec![0f32; grid_t * per_t * row_len];
    // rows (t, h / m, w / m, m, m); within a row (channel, frame of the patch, p, p)
    patches.par_chunks_exact_mut(row_len).enumerate().for_each(|(r, row)| {
        let (ti, r) = (r / per_t, r % per_t);
        let (mw, mh) = (r % m, (r / m) % m);
        let (bw, bh) = ((r / (m * m)) % (gw / m), r / (m * m) / (gw / m));
        let (y0, x0) = ((bh * m + mh) * p, (bw * m + mw) * p);
        for k in 0..t {
            let src = &resized[(ti * t + k).min(resized.len() - 1)]; // the last frame pads
            for c in 0..3 {
                let plane = &mut row[(c * t + k) * p * p..(c * t + k + 1) * p * p];
                for py in 0..p {
                    let line = &src.data[((y0 + py) * w + x0) * 3..((y0 + py) * w + x0 + p) * 3];
                    for (dst, px) in plane[py * p..(py + 1) * p].iter_mut().zip(line.chunks_exact(3)) {
                        *dst = table[c][px[c] as usize];
                    }
                }
            }
        }
    });
    Ok(VideoPatches { patches, grid_thw: [grid_t, gh, gw], row_len, timestamps: timestamps(indices, video_fps, t) })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn video_sampling_follows_the_processor() {
        let cfg = VideoConfig::qwen3_vl_default();
        // 30 s at 30 fps, 2 fps: 60 frames at linspace(0, 899, 60)
        let idx = sample_indices(900, 30.0, &cfg).unwrap();
        assert_eq!(idx.len(), 60);
        assert_eq!((idx[0], idx[1], idx[2], idx[59]), (0, 15, 30, 899));
        // short: at least min_frames, never more than the video has
        assert_eq!(sample_indices(10, 10.0, &cfg).unwrap(), vec![0, 3, 6, 9]);
        assert_eq!(sample_indices(3, 10.0, &cfg).unwrap(), vec![0, 1, 2]);
        // numpy rounds halves to even: linspace(0, 5, 3) = 0, 2.5, 5
        assert_eq!(linspace_round(5, 3), vec![0, 2, 5]);
        assert!(sample_indices(0, 10.0, &cfg).is_err());
        assert!(sample_indices(10, 0.0, &cfg).is_err());
    }

    #[test]
    fn video_timestamps_average_each_temporal_patch_and_print_as_python() {
        assert_eq!(timestamps(&[0, 5, 10], 10.0, 2), vec![0.25, 1.0]);
        assert_eq!(timestamp_text(0.25), "<0.2 seconds>");
        assert_eq!(timestamp_text(0.75), "<0.8 seconds>");
        assert_eq!(timestamp_text(1.25), "<1.2 seconds>");
        assert_eq!(timestamp_text(0.35), "<0.3 seconds>"); // 0.34999... in binary
        assert_eq!(timestamp_text(14.95), "<14.9 seconds>"); // 14.949999...
        assert_eq!(timestamp_text(1.0), "<1.0 seconds>");
    }

    #[test]
    fn video_smart_resize_keeps_the_budget_over_all_frames() {
        // 60 frames of 360x640 in 786432 pixels: beta = sqrt(60·360·640 / 786432)
        let (h, w) = smart_resize_video(60, 360, 640, 2, 32, 131072, 786432).unwrap();
        assert_eq!((h, w), (64, 128)); // floor(360 / 4.19 / 32) · 32, floor(640 / 4.19 / 32) · 32
        assert!(60 * h * w <= 786432);
        // tiny frames are scaled up, then up to min_pixels
        let (h, w) = smart_resize_video(4, 10, 20, 2, 32, 131072, 786432).unwrap();
        assert!(h % 32 == 0 && w % 32 == 0 && 4 * h * w >= 131072);
        assert!(smart_resize_video(1, 64, 64, 2, 32, 0, 1 << 20).is_err());
        assert!(smart_resize_video(4, 1, 500, 2, 32, 0, 1 << 20).is_err());
    }

    #[test]
    fn video_patches_pair_frames_and_pad_with_the_last() {
        let mut cfg = VideoConfig::qwen3_vl_default();
        cfg.do_resize = false;
        cfg.do_normalize = false;
        cfg.do_rescale = false;
        let frame = |v: u8| RgbImage::new(32, 32, vec![v; 32 * 32 * 3]).unwrap();
        let out = preprocess_video(&[frame(1), frame(2), frame(3)], &[0, 1, 2], 1.0, &cfg).unwrap();
        assert_eq!(out.grid_thw, [2, 2, 2]);
        assert_eq!(out.row_len, 3 * 2 * 16 * 16);
        let row = |i: usize| &out.patches[i * out.row_len..(i + 1) * out.row_len];
        // row 0: channel 0 frames 1 then 2; row 4 (second temporal patch): frame 3 twice
        assert_eq!((row(0)[0], row(0)[256]), (1.0, 2.0));
        assert_eq!((row(4)[0], row(4)[256]), (3.0, 3.0));
        assert_eq!(out.timestamps, vec![0.5, 2.0]);
        assert!(preprocess_video(&[frame(1)], &[0, 1], 1.0, &cfg).is_err());
    }

    #[test]
    fn video_config_from_json() {
        let c = VideoConfig::from_json_str(r#"{"size": {"longest_edge": 25165824, "shortest_edge": 4096}, "fps": 1.5, "max_frames": 64}"#, "v.json").unwrap();
        assert_eq!((c.max_pixels, c.min_pixels, c.fps, c.max_frames), (25165824, 4096, 1.5, 64));
        for bad in [r#"{"fps": 0}"#, r#"{"min_frames": 9, "max_frames": 4}"#, r#"{"num_frames": 8}"#, r#"{"size": {"height": 1}}"#, "[]"] {
            assert!(matches!(VideoConfig::from_json_str(bad, "v.json"), Err(Error::Config { .. })), "{}", bad);
        }
    }
}
