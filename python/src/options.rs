//! The options of `qwen3_vl.Model(...)`, a JSON object from the Python side, turned into the
//! library's [`ServingOptions`] with the CLI's defaults and range checks (the same messages,
//! with the option's Python name).

use qwen3_vl::loading::serving::ServingOptions;
use qwen3_vl::loading::{self, ranges, ModelOptions};
use serde_json::{Map, Value};
use std::path::PathBuf;

/// The options, and the largest image or video file read in MiB.
pub struct Options {
    pub serving: ServingOptions,
    pub max_file_mib: usize,
}

/// Every option the constructor takes besides the model's path (`model`).
const NAMES: &[&str] = &[
    "device", "threads", "kernels", "precision", "kv_cache", "gpu_memory", "gpu_layers", "mmproj", "quant", "tokenizer", "chat_template", "model_name",
    "allowed_image_dir", "max_pixels", "max_image_pixels", "max_images", "max_videos", "max_video_seconds", "max_video_frames", "video_fps", "video_max_frames",
    "video_max_pixels", "ffmpeg", "max_prompt_tokens", "max_output_tokens", "max_batch", "kv_cache_tokens", "max_prefill_tokens", "image_cache", "temperature",
    "top_k",
    "top_p", "repetition_penalty", "seed", "max_file_mib",
];

/// The option `name`'s value, checked by `parse` (one of the CLI's value parsers); `None`
/// when absent or null. Numbers go to the parser as their text, so the limits and messages
/// are the CLI's.
fn value<T>(o: &Map<String, Value>, name: &str, parse: impl Fn(&str) -> Result<T, String>) -> Result<Option<T>, String> {
    let text = match o.get(name) {
        None | Some(Value::Null) => return Ok(None),
        Some(Value::String(s)) => s.clone(),
        Some(Value::Number(n)) => n.to_string(),
        Some(v) => return Err(format!("{}: expected a number or a string, got {}", name, v)),
    };
    parse(&text).map(Some).map_err(|m| format!("{}={}: {}", name, text, m))
}

/// A path option.
fn path(o: &Map<String, Value>, name: &str) -> Result<Option<PathBuf>, String> {
    match o.get(name) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) if !s.is_empty() => Ok(Some(PathBuf::from(s))),
        Some(v) => Err(format!("{}: expected a path, got {}", name, v)),
    }
}

/// A size in bytes: an integer, or a text such as 2GiB or 1500MiB.
fn size(s: &str) -> Result<usize, String> {
    match s.parse::<u64>() {
        Ok(0) => Err("must be above 0".into()),
        Ok(n) => usize::try_from(n).map_err(|_| "too large".to_string()),
        Err(_) => qwen3_vl::model::placement::parse_size(s),
    }
}

fn int(s: &str) -> Result<usize, String> {
    s.parse().map_err(|_| "must be a non-negative integer".to_string())
}

fn seed(s: &str) -> Result<u64, String> {
    s.parse().map_err(|_| "must be an integer from 0 to 2^64-1".to_string())
}

/// The options in `json`, every one checked; an unknown name is refused with the list.
pub fn parse(json: &str) -> Result<Options, String> {
    let v: Value = serde_json::from_str(json).map_err(|e| format!("options: {}", e))?;
    let o = v.as_object().ok_or("options: not an object")?;
    for k in o.keys() {
        if k != "model" && !NAMES.contains(&k.as_str()) {
            return Err(format!("unknown option '{}' (the options: {})", k, NAMES.join(", ")));
        }
    }
    let mut m = ModelOptions::new(path(o, "model")?.ok_or("the model's path is required")?);
    let d = &mut m.device;
    d.device = value(o, "device", |s| s.parse())?.unwrap_or(d.device);
    d.threads = value(o, "threads", ranges::threads)?;
    d.kernels = value(o, "kernels", |s| s.parse())?.unwrap_or(d.kernels);
    d.precision = value(o, "precision", loading::parse_precision)?.flatten();
    d.kv_cache = value(o, "kv_cache", loading::parse_kv_cache)?.flatten();
    d.gpu_memory = value(o, "gpu_memory", size)?;
    d.gpu_layers = value(o, "gpu_layers", int)?;
    m.mmproj = path(o, "mmproj")?;
    m.quant = value(o, "quant", loading::parse_quant)?;
    m.tokenizer = path(o, "tokenizer")?;
    m.chat_template = path(o, "chat_template")?;
    let mut s = ServingOptions::new(m);
    s.model_name = value(o, "model_name", |t| Ok(t.to_string()))?;
    s.allowed_image_dir = path(o, "allowed_image_dir")?;
    s.max_pixels = value(o, "max_pixels", ranges::max_pixels)?;
    s.max_image_pixels = value(o, "max_image_pixels", ranges::max_pixels)?.unwrap_or(s.max_image_pixels);
    s.max_images = value(o, "max_images", ranges::images)?.unwrap_or(s.max_images);
    s.max_videos = value(o, "max_videos", ranges::images)?.unwrap_or(s.max_videos);
    s.max_video_seconds = value(o, "max_video_seconds", ranges::seconds)?.unwrap_or(s.max_video_seconds);
    s.max_video_frames = value(o, "max_video_frames", ranges::max_tokens)?.unwrap_or(s.max_video_frames);
    s.video.video_fps = value(o, "video_fps", ranges::video_fps)?;
    s.video.video_max_frames = value(o, "video_max_frames", ranges::video_max_frames)?;
    s.video.video_max_pixels = value(o, "video_max_pixels", ranges::max_pixels)?;
    s.video.ffmpeg = path(o, "ffmpeg")?;
    s.max_prompt_tokens = value(o, "max_prompt_tokens", ranges::max_tokens)?;
    s.max_output_tokens = value(o, "max_output_tokens", ranges::max_tokens)?;
    s.max_batch = value(o, "max_batch", ranges::queue)?.unwrap_or(s.max_batch);
    s.kv_cache_tokens = value(o, "kv_cache_tokens", ranges::max_tokens)?;
    s.max_prefill_tokens = value(o, "max_prefill_tokens", ranges::max_tokens)?.unwrap_or(s.max_prefill_tokens);
    s.image_cache = value(o, "image_cache", ranges::image_cache)?;
    s.sampling.temperature = value(o, "temperature", ranges::temperature)?;
    s.sampling.top_k = value(o, "top_k", ranges::top_k)?;
    s.sampling.top_p = value(o, "top_p", ranges::top_p)?;
    s.sampling.repetition_penalty = value(o, "repetition_penalty", ranges::repetition_penalty)?;
    s.sampling.seed = value(o, "seed", seed)?.unwrap_or(0);
    let max_file_mib = value(o, "max_file_mib", ranges::mib)?.unwrap_or(32);
    Ok(Options { serving: s, max_file_mib })
}
