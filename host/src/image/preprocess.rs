//! The Qwen2-VL image processor that Qwen3-VL uses: settings, `smart_resize`, and the patches.

use super::{resize_bicubic, ImagePatches, RgbImage};
use crate::{Error, Result};
use rayon::prelude::*;
use serde_json::Value;
use std::path::Path;

/// Preprocessing settings, as in a Qwen2-VL-style `preprocessor_config.json`.
#[derive(Clone, Debug, PartialEq)]
pub struct PreprocessConfig {
    /// Side of a square vision patch in pixels (16 for Qwen3-VL).
    pub patch_size: usize,
    /// Patches merged per side into one language-model token (2).
    pub merge_size: usize,
    /// Frames per temporal patch; an image is repeated this many times (2).
    pub temporal_patch_size: usize,
    /// Fewest pixels after resizing (`size.shortest_edge` or `min_pixels`).
    pub min_pixels: usize,
    /// Most pixels after resizing (`size.longest_edge` or `max_pixels`); lower it to bound the
    /// number of image tokens.
    pub max_pixels: usize,
    pub image_mean: [f32; 3],
    pub image_std: [f32; 3],
    /// The factor of `do_rescale` (1/255). Kept in f64: transformers multiplies in float64 and
    /// rounds to float32 afterwards.
    pub rescale_factor: f64,
    pub do_resize: bool,
    pub do_rescale: bool,
    pub do_normalize: bool,
}

impl Default for PreprocessConfig {
    fn default() -> Self {
        PreprocessConfig::qwen3_vl_default()
    }
}

impl PreprocessConfig {
    /// The settings published with Qwen3-VL-2B-Instruct: patch 16, merge 2, temporal 2,
    /// 65536 to 16777216 pixels (256² to 4096²), mean = std = 0.5, rescale 1/255.
    pub fn qwen3_vl_default() -> PreprocessConfig {
        PreprocessConfig {
            patch_size: 16,
            merge_size: 2,
            temporal_patch_size: 2,
            min_pixels: 65536,
            max_pixels: 16_777_216,
            image_mean: [0.5; 3],
            image_std: [0.5; 3],
            rescale_factor: 1.0 / 255.0,
            do_resize: true,
            do_rescale: true,
            do_normalize: true,
        }
    }

    /// Reads a `preprocessor_config.json`. The pixel bounds come from `size.shortest_edge` /
    /// `size.longest_edge` (or `size.min_pixels` / `size.max_pixels`), overridden by top-level
    /// `min_pixels` / `max_pixels` as transformers does; keys that are absent keep the values of
    /// [`PreprocessConfig::qwen3_vl_default`]. Errors: [`Error::Io`] when unreadable,
    /// [`Error::Config`] naming the file and key when malformed or unsupported (a `resample`
    /// other than 3, bicubic).
    pub fn from_file(path: &Path) -> Result<PreprocessConfig> {
        let text = std::fs::read_to_string(path).map_err(|e| Error::io(path, e))?;
        PreprocessConfig::from_json_str(&text, &path.display().to_string())
    }

    /// [`PreprocessConfig::from_file`] on JSON text; `file` names it in errors.
    pub fn from_json_str(text: &str, file: &str) -> Result<PreprocessConfig> {
        let r = Fields { file };
        let bad = |msg: String| r.bad(msg);
        let obj = r.object(text)?;
        let mut c = PreprocessConfig::qwen3_vl_default();
        let (count, flag, triple) = (|k: &str, v: &Value| r.count(k, v), |k: &str, v: &Value| r.flag(k, v), |k: &str, v: &Value| r.triple(k, v));
        if let Some(size) = obj.get("size").filter(|s| !s.is_null()) {
            let size = size.as_object().ok_or_else(|| bad(format!("size: expected an object, got {}", size)))?;
            for (key, value) in size {
                match key.as_str() {
                    "shortest_edge" | "min_pixels" => c.min_pixels = count("size.shortest_edge", value)?,
                    "longest_edge" | "max_pixels" => c.max_pixels = count("size.longest_edge", value)?,
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
                "min_pixels" => c.min_pixels = count(key, value)?,
                "max_pixels" => c.max_pixels = count(key, value)?,
                "image_mean" => c.image_mean = triple(key, value)?,
                "image_std" => c.image_std = triple(key, value)?,
                "rescale_factor" => c.rescale_factor = r.number(key, value)?,
                "do_resize" => c.do_resize = flag(key, value)?,
                "do_rescale" => c.do_rescale = flag(key, value)?,
                "do_normalize" => c.do_normalize = flag(key, value)?,
                "do_convert_rgb" => {
                    flag(key, value)?;
                }
                "resample" if value.as_u64() != Some(3) => return Err(bad(format!("resample {}: only 3 (bicubic) is supported", value))),
                _ => {}
            }
        }
        c.validate().map_err(bad)?;
        Ok(c)
    }

    fn validate(&self) -> std::result::Result<(), String> {
        if self.patch_size == 0 || self.merge_size == 0 || self.temporal_patch_size == 0 {
            let (p, m, t) = (self.patch_size, self.merge_size, self.temporal_patch_size);
            return Err(format!("patch_size {}, merge_size {} and temporal_patch_size {} must be positive", p, m, t));
        }
        // bounds far above any published processor, so that sizes computed from them cannot
        // overflow or ask for absurd memory
        if self.patch_size > 256 || self.merge_size > 16 || self.temporal_patch_size > 16 {
            let (p, m, t) = (self.patch_size, self.merge_size, self.temporal_patch_size);
            return Err(format!("patch_size {} (at most 256), merge_size {} (at most 16) or temporal_patch_size {} (at most 16) is out of range", p, m, t));
        }
        if self.max_pixels == 0 || self.max_pixels > MAX_PIXELS_LIMIT || self.min_pixels > MAX_PIXELS_LIMIT {
            return Err(format!("size.longest_edge (max_pixels) {} and shortest_edge (min_pixels) {} must be at most {} (and max_pixels positive)", self.max_pixels, self.min_pixels, MAX_PIXELS_LIMIT));
        }
        check_mean_std(&self.image_mean, &self.image_std)
    }
}

/// Reads the fields of a processor's JSON settings, naming the file and key in errors
/// ([`Error::Config`]); shared by the image and video processors.
pub(crate) struct Fields<'a> {
    pub file: &'a str,
}

impl Fields<'_> {
    pub fn bad(&self, msg: String) -> Error {
        Error::Config { file: self.file.to_string(), msg }
    }
    /// The top-level object of `text`.
    pub fn object(&self, text: &str) -> Result<serde_json::Map<String, Value>> {
        match serde_json::from_str::<Value>(text).map_err(|e| self.bad(format!("not valid JSON: {}", e)))? {
            Value::Object(o) => Ok(o),
            _ => Err(self.bad("not a JSON object".into())),
        }
    }
    pub fn count(&self, key: &str, v: &Value) -> Result<usize> {
        v.as_u64().map(|n| n as usize).ok_or_else(|| self.bad(format!("{}: expected a non-negative integer, got {}", key, v)))
    }
    pub fn number(&self, key: &str, v: &Value) -> Result<f64> {
        v.as_f64().filter(|x| x.is_finite()).ok_or_else(|| self.bad(format!("{}: expected a number, got {}", key, v)))
    }
    pub fn flag(&self, key: &str, v: &Value) -> Result<bool> {
        v.as_bool().ok_or_else(|| self.bad(format!("{}: expected true or false, got {}", key, v)))
    }
    /// A number for all three channels, or three numbers.
    pub fn triple(&self, key: &str, v: &Value) -> Result<[f32; 3]> {
        let err = || self.bad(format!("{}: expected a number or 3 numbers, got {}", key, v));
        match v {
            Value::Number(n) => Ok([n.as_f64().ok_or_else(err)? as f32; 3]),
            Value::Array(a) if a.len() == 3 => {
                let mut out = [0f32; 3];
                for (o, x) in out.iter_mut().zip(a) {
                    *o = x.as_f64().ok_or_else(err)? as f32;
                }
                Ok(out)
            }
            _ => Err(err()),
        }
    }
}

/// Whether a mean and std are usable: finite, std nonzero; the message names both.
pub(crate) fn check_mean_std(mean: &[f32; 3], std: &[f32; 3]) -> std::result::Result<(), String> {
    if std.iter().any(|&s| s == 0.0 || !s.is_finite()) || mean.iter().any(|m| !m.is_finite()) {
        return Err(format!("image_mean {:?} / image_std {:?}: std must be nonzero, both finite", mean, std));
    }
    Ok(())
}

/// Every processed value as a function of one 8-bit sample and its channel:
/// `(f32(v · rescale) - mean) / std` in f32 (each step where enabled), the product in f64 as
/// transformers computes it.
pub(crate) fn value_table(do_rescale: bool, rescale_factor: f64, do_normalize: bool, mean: &[f32; 3], std: &[f32; 3]) -> [[f32; 256]; 3] {
    let mut table = [[0f32; 256]; 3];
    for (c, row) in table.iter_mut().enumerate() {
        for (v, out) in row.iter_mut().enumerate() {
            let mut x = if do_rescale { (v as f64 * rescale_factor) as f32 } else { v as f32 };
            if do_normalize {
                x = (x - mean[c]) / std[c];
            }
            *out = x;
        }
    }
    table
}

/// The largest `min_pixels` / `max_pixels` accepted: 2^28 pixels (16384²), 16 times the
/// published Qwen3-VL maximum.
pub const MAX_PIXELS_LIMIT: usize = 1 << 28;

/// Python's `round()` of a float: to the nearest integer, ties to even.
pub(crate) fn round_half_even(q: f64) -> f64 {
    let fl = q.floor();
    let diff = q - fl;
    if diff > 0.5 || (diff == 0.5 && fl % 2.0 != 0.0) {
        fl + 1.0
    } else {
        fl
    }
}

/// transformers' `smart_resize`: the (height, width) an image is resized to, both multiples of
/// `factor` (`patch_size * merge_size`), close to the original aspect ratio, with
/// `min_pixels <= h * w <= max_pixels` where that is reachable.
///
/// Each side is first rounded to the nearest multiple of `factor` (ties to even, Python's
/// `round`). If that is more than `max_pixels`, both sides are scaled by
/// `beta = sqrt(h * w / max_pixels)` and floored to multiples (at least `factor`); if fewer
/// than `min_pixels`, scaled by `beta = sqrt(min_pixels / (h * w))` and ceiled. Errors
/// ([`Error::Limit`]) where transformers raises: an aspect ratio above 200, an empty image (or
/// `factor` or `max_pixels` zero); also when the result would have no pixels (possible only with
/// `min_pixels` below `factor² / 4`).
pub fn smart_resize(height: usize, width: usize, factor: usize, min_pixels: usize, max_pixels: usize) -> Result<(usize, usize)> {
    let limit = |msg: String| Error::Limit { op: "smart_resize", msg };
    if height == 0 || width == 0 || factor == 0 || max_pixels == 0 {
        return Err(limit(format!("cannot resize a {}x{} image with factor {} and max_pixels {}", width, height, factor, max_pixels)));
    }
    let (h, w, f) = (height as f64, width as f64, factor as f64);
    let ratio = h.max(w) / h.min(w);
    if ratio > 200.0 {
        return Err(limit(format!("absolute aspect ratio must be smaller than 200, got {} ({}x{})", ratio, width, height)));
    }
    let mut h_bar = round_half_even(h / f) * f;
    let mut w_bar = round_half_even(w / f) * f;
    if h_bar * w_bar > max_pixels as f64 {
        let beta = (h * w / max_pixels as f64).sqrt();
        h_bar = f.max((h / beta / f).floor() * f);
        w_bar = f.max((w / beta / f).floor() * f);
    } else if h_bar * w_bar < min_pixels as f64 {
        let beta = (min_pixels as f64 / (h * w)).sqrt();
        h_bar = (h * beta / f).ceil() * f;
        w_bar = (w * beta / f).ceil() * f;
    }
    if h_bar < f || w_bar < f {
        return Err(limit(format!("a {}x{} image is too small: it would be resized to {}x{}", width, height, w_bar, h_bar)));
    }
    Ok((h_bar as usize, w_bar as usize))
}

/// Turns an image into the vision encoder's input, as transformers' Qwen2-VL image processor
/// does with `cfg`: [`smart_resize`] and Pillow's bicubic resize (if `do_resize`), rescale and
/// normalize each value as `(f32(v * rescale_factor) - mean) / std` in f32, repeat the frame
/// `temporal_patch_size` times, and cut it into patches in merge-window order (see
/// [`ImagePatches`]). Errors: [`Error::Limit`] from `smart_resize`, or (without `do_resize`)
/// for sides that are not multiples of `patch_size * merge_size`; [`Error::Config`] for an
/// invalid `cfg`.
pub fn preprocess(img: &RgbImage, cfg: &PreprocessConfig) -> Result<ImagePatches> {
    cfg.validate().map_err(|msg| Error::Config { file: "PreprocessConfig".into(), msg })?;
    let (p, m, t) = (cfg.patch_size, cfg.merge_size, cfg.temporal_patch_size);
    let factor = p * m;
    let (h, w) = if cfg.do_resize {
        smart_resize(img.height, img.width, factor, cfg.min_pixels, cfg.max_pixels)?
    } else {
        (img.height, img.width)
    };
    if h == 0 || w == 0 || h % factor != 0 || w % factor != 0 {
        let msg = format!("{}x{} is not a multiple of patch_size * merge_size = {} (do_resize is off)", w, h, factor);
        return Err(Error::Limit { op: "image preprocess", msg });
    }
    let resized;
    let src = if (h, w) == (img.height, img.width) {
        img
    } else {
        resized = resize_bicubic(img, w, h);
        &resized
    };

    let table = value_table(cfg.do_rescale, cfg.rescale_factor, cfg.do_normalize, &cfg.image_mean, &cfg.image_std);

    let (gh, gw) = (h / p, w / p);
    let row_len = 3 * t * p * p;
    let mut patches = vec![0f32; gh * gw * row_len];
    // Row order (h / m, w / m, m, m); within a row (channel, t, p, p).
    patches.par_chunks_exact_mut(row_len).enumerate().for_each(|(r, row)| {
        let (mw, mh) = (r % m, (r / m) % m);
        let (bw, bh) = ((r / (m * m)) % (gw / m), r / (m * m) / (gw / m));
        let (y0, x0) = ((bh * m + mh) * p, (bw * m + mw) * p);
        for c in 0..3 {
            let frame = &mut row[c * t * p * p..(c * t + 1) * p * p];
            for py in 0..p {
                let line = &src.data[((y0 + py) * w + x0) * 3..((y0 + py) * w + x0 + p) * 3];
                for (dst, px) in frame[py * p..(py + 1) * p].iter_mut().zip(line.chunks_exact(3)) {
                    *dst = table[c][px[c] as usize];
                }
            }
            for k in 1..t {
                row.copy_within(c * t * p * p..(c * t + 1) * p * p, (c * t + k) * p * p);
            }
        }
    });
    Ok(ImagePatches { patches, grid_thw: [1, gh, gw], row_len })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn image_round_half_even() {
        let r: Vec<f64> = [0.5, 1.5, 2.5, 3.5, -0.5, 2.4999, 2.5001].iter().map(|&q| round_half_even(q)).collect();
        assert_eq!(r, vec![0.0, 2.0, 2.0, 4.0, 0.0, 2.0, 3.0]);
    }

    #[test]
    fn image_config_from_json() {
        let c = PreprocessConfig::from_json_str(r#"{"min_pixels": 3136, "max_pixels": 12845056, "patch_size": 14,
            "image_mean": [0.48145466, 0.4578275, 0.40821073], "resample": 3, "size": null}"#, "p.json").unwrap();
        assert_eq!((c.min_pixels, c.max_pixels, c.patch_size), (3136, 12845056, 14));
        assert_eq!(c.image_mean[0], 0.48145466f64 as f32);
        for bad in [r#"{"resample": 2}"#, r#"{"size": {"height": 3}}"#, r#"{"patch_size": 0}"#, r#"{"image_std": [1, 0, 1]}"#, "[1]", "{"] {
            match PreprocessConfig::from_json_str(bad, "p.json") {
                Err(Error::Config { file, .. }) => assert_eq!(file, "p.json"),
                other => panic!("{}: {:?}", bad, other),
            }
        }
    }
}
