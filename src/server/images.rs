//! Images and videos of a request: `image_url` and `video_url` parts to preprocessed patches.
//!
//! Accepted URLs: `data:image/{jpeg,png,webp};base64,...` for images,
//! `data:{video/mp4,video/webm,video/quicktime,video/x-matroska,image/gif,image/webp};base64,...` for
//! videos, and, only when the server was given an allowed directory, `file://` URLs or absolute
//! paths of files inside it (after resolving symbolic links and `..`). The server fetches
//! nothing from the network: `http(s)://` URLs are refused with a message saying to send the
//! file inline. Videos are decoded under the policy's limits on bytes, duration, frames and
//! time (`crate::video::VideoLimits`), each answered with an OpenAI-style error.

use super::openai::ApiError;
use crate::generate::chat::{Media, VideoPrompt};
use crate::image::{decode_image_limited, preprocess, PreprocessConfig};
use crate::video::{decode_video, VideoConfig, VideoLimits};
use std::path::{Path, PathBuf};

/// How images are taken.
#[derive(Clone, Debug)]
pub struct ImagePolicy {
    /// Local files are read only from inside this directory (canonical), if any.
    pub allowed_dir: Option<PathBuf>,
    /// Most pixels (width × height) an image may declare before it is decoded.
    pub max_source_pixels: usize,
    /// Most bytes of one image file (encoded).
    pub max_file_bytes: usize,
    /// The model's preprocessing (with the server's pixel cap for resizing).
    pub preprocess: PreprocessConfig,
    /// The model's video processing.
    pub video: VideoConfig,
    /// Bounds on videos (bytes, duration, frames, decoding time; `max_bytes` is also the bound on
    /// a video's encoded size).
    pub video_limits: VideoLimits,
}

impl ImagePolicy {
    /// A policy with the model's image and video processing and the given image bounds; videos
    /// take [`VideoLimits`]' defaults with `max_file_bytes` as their byte bound.
    pub fn new(preprocess: PreprocessConfig, video: VideoConfig, allowed_dir: Option<PathBuf>, max_source_pixels: usize, max_file_bytes: usize) -> ImagePolicy {
        let video_limits = VideoLimits { max_bytes: max_file_bytes as u64, ..VideoLimits::default() };
        ImagePolicy { allowed_dir, max_source_pixels, max_file_bytes, preprocess, video, video_limits }
    }
}

/// One image, ready for the vision tower.
#[derive(Clone, Debug)]
pub struct PreparedImage {
    pub patches: Vec<f32>,
    pub row_len: usize,
    pub grid: [usize; 3],
    /// Placeholder tokens it takes in the prompt (`<|image_pad|>`, or a video's
    /// `<|video_pad|>` over all its temporal patches).
    pub tokens: usize,
    /// A video's timestamps and tokens per temporal patch; `None` for an image.
    pub video: Option<VideoPrompt>,
    /// Its content's hash for the engine's prefix cache (`engine::image_key`), made here on the
    /// connection's thread rather than on the engine's.
    pub key: u64,
}

impl AsRef<[f32]> for PreparedImage {
    fn as_ref(&self) -> &[f32] {
        &self.patches
    }
}

/// The preprocessing settings of a model directory (Qwen3-VL's defaults without a
/// preprocessor_config.json), with `max_pixels` lowering the resize cap. `max_pixels` below one
/// merged patch is refused, naming the option.
pub fn preprocess_config(model_dir: &Path, max_pixels: Option<usize>) -> crate::Result<PreprocessConfig> {
    preprocess_config_or(model_dir, None, max_pixels)
}

/// [`preprocess_config`] with `fallback` (a GGUF mmproj's settings) in place of Qwen3-VL's
/// defaults when the directory has no preprocessor_config.json.
pub fn preprocess_config_or(model_dir: &Path, fallback: Option<&PreprocessConfig>, max_pixels: Option<usize>) -> crate::Result<PreprocessConfig> {
    let path = model_dir.join("preprocessor_config.json");
    let base = if path.exists() { PreprocessConfig::from_file(&path)? } else { fallback.cloned().unwrap_or_else(PreprocessConfig::qwen3_vl_default) };
    cap_pixels(base, max_pixels)
}

/// `cfg` with `max_pixels` lowering its resize cap (below one merged patch: refused, naming
/// the option).
pub fn cap_pixels(mut cfg: PreprocessConfig, max_pixels: Option<usize>) -> crate::Result<PreprocessConfig> {
    if let Some(m) = max_pixels {
        let side = cfg.patch_size * cfg.merge_size;
        if m < side * side {
            return Err(crate::Error::Limit {
                op: "--max-pixels",
                msg: format!("{} is below one merged patch: it must be at least {} ({}x{} pixels) for this model", m, side * side, side, side),
            });
        }
        cfg.max_pixels = m;
        cfg.min_pixels = cfg.min_pixels.min(m);
    }
    Ok(cfg)
}

/// Strict standard base64 (RFC 4648 alphabet, `=` padding optional; whitespace skipped, as
/// line-wrapped encoders produce it). The error says where the first bad character is.
pub fn decode_base64(text: &str) -> Result<Vec<u8>, String> {
    fn value(c: u8) -> Option<u32> {
        match c {
            b'A'..=b'Z' => Some((c - b'A') as u32),
            b'a'..=b'z' => Some((c - b'a') as u32 + 26),
            b'0'..=b'9' => Some((c - b'0') as u32 + 52),
            b'+' => Some(62),
            b'/' => Some(63),
            _ => None,
        }
    }
    let mut out = Vec::with_capacity(text.len() / 4 * 3 + 3);
    let (mut acc, mut bits, mut padding) = (0u32, 0u32, 0usize);
    for (i, c) in text.bytes().enumerate() {
        if c.is_ascii_whitespace() {
            continue;
        }
        if c == b'=' {
            padding += 1;
            if padding > 2 {
                return Err(format!("too much '=' padding at byte {}", i));
            }
            continue;
        }
        if padding > 0 {
            return Err(format!("data after '=' padding at byte {}", i));
        }
        let v = value(c).ok_or_else(|| format!("invalid base64 character {:?} at byte {}", c as char, i))?;
        acc = (acc << 6) | v;
        bits += 6;
        if bits >= 8 {
            bits -= 8;
            out.push((acc >> bits) as u8);
            acc &= (1 << bits) - 1;
        }
    }
    // 6 leftover bits cannot come from whole bytes (one stray character)
    if bits >= 6 {
        return Err("truncated base64: the last group has a single character".into());
    }
    Ok(out)
}

/// The encoded bytes an `image_url` points to.
pub fn fetch(url: &str, param: &str, policy: &ImagePolicy) -> Result<Vec<u8>, ApiError> {
    fetch_kind(url, param, policy, false)
}

/// The encoded bytes a `video_url` points to.
pub fn fetch_video(url: &str, param: &str, policy: &ImagePolicy) -> Result<Vec<u8>, ApiError> {
    fetch_kind(url, param, policy, true)
}

fn fetch_kind(url: &str, param: &str, policy: &ImagePolicy, video: bool) -> Result<Vec<u8>, ApiError> {
    // the error codes name the kind: `unsupported_image_type` / `unsupported_video_type`, ...
    let code = |image: &'static str, vid: &'static str| if video { vid } else { image };
    let what = if video { "video" } else { "image" };
    let max_bytes = if video { (policy.video_limits.max_bytes as usize).min(policy.max_file_bytes) } else { policy.max_file_bytes };
    let bad = |code: &'static str, msg: String| ApiError::invalid(param, code, msg);
    if let Some(rest) = url.strip_prefix("data:") {
        // data:[<mime>][;base64],<data>
        let comma = rest.find(',').ok_or_else(|| bad(code("invalid_image_url", "invalid_video_url"), "a data: URL needs a ',' before its data".into()))?;
        let (meta, data) = (&rest[..comma], &rest[comma + 1..]);
        let mut fields = meta.split(';');
        let mime = fields.next().unwrap_or("").trim().to_ascii_lowercase();
        let known = if video {
            matches!(mime.as_str(), "video/mp4" | "video/webm" | "video/quicktime" | "video/x-matroska" | "image/gif" | "image/webp" | "")
        } else {
            matches!(mime.as_str(), "image/jpeg" | "image/jpg" | "image/png" | "image/webp" | "")
        };
        if !known {
            let list = if video { "video/mp4, video/webm, video/quicktime, video/x-matroska, image/gif, image/webp" } else { "image/jpeg, image/png, image/webp" };
            return Err(bad(code("unsupported_image_type", "unsupported_video_type"), format!("{} data: URLs of type '{}' are not supported ({})", what, mime.chars().take(40).collect::<String>(), list)));
        }
        if !fields.any(|f| f.trim().eq_ignore_ascii_case("base64")) {
            return Err(bad(code("invalid_image_url", "invalid_video_url"), format!("{} data: URLs must be base64 (data:{};base64,...)", what, if video { "video/mp4" } else { "image/png" })));
        }
        if data.len() / 4 * 3 > max_bytes {
            return Err(bad(code("image_too_large", "video_too_large"), format!("the {} is larger than {} bytes", what, max_bytes)));
        }
        return decode_base64(data).map_err(|e| bad("invalid_base64", format!("the {}'s base64 data is broken: {}", what, e)));
    }
    let lower = url.get(..8).unwrap_or(url).to_ascii_lowercase();
    if lower.starts_with("http://") || lower.starts_with("https://") {
        return Err(bad(code("unsupported_image_url", "unsupported_video_url"), format!("this server fetches nothing from the network: send the {} inline as a data: URL (data:{};base64,...)", what, if video { "video/mp4" } else { "image/png" })));
    }
    let path = url.strip_prefix("file://").unwrap_or(url);
    let dir = policy.allowed_dir.as_ref().ok_or_else(|| {
        bad(code("unsupported_image_url", "unsupported_video_url"), format!("local {} files are not enabled on this server (start it with --allowed-image-dir DIR), send the {} inline as a data: URL", what, what))
    })?;
    if !path.starts_with('/') {
        return Err(bad(code("invalid_image_url", "invalid_video_url"), format!("{} URLs must be data: URLs, or absolute paths / file:// URLs inside the allowed directory", what)));
    }
    let outside = || bad(code("image_not_allowed", "video_not_allowed"), format!("{} is not a file inside the allowed image directory", path.chars().take(200).collect::<String>()));
    let real = std::fs::canonicalize(path).map_err(|_| outside())?;
    if !real.starts_with(dir) || !real.is_file() {
        return Err(outside());
    }
    let len = std::fs::metadata(&real).map_err(|_| outside())?.len();
    if len > max_bytes as u64 {
        return Err(bad(code("image_too_large", "video_too_large"), format!("the {} file is larger than {} bytes", what, max_bytes)));
    }
    std::fs::read(&real).map_err(|e| bad(code("image_unreadable", "video_unreadable"), format!("cannot read the {} file: {}", what, e)))
}

/// The `<|image_pad|>` tokens an image will take, from the size its header declares, before
/// any pixel is decoded: lets a request whose images cannot fit the prompt limit be refused
/// without the memory and time of decoding them.
pub fn predicted_tokens(bytes: &[u8], param: &str, policy: &ImagePolicy) -> Result<usize, ApiError> {
    let (w, h) = crate::image::image_dimensions(bytes, param).map_err(|e| ApiError::invalid(param, "invalid_image", e.to_string()))?;
    if w.checked_mul(h).map_or(true, |px| px > policy.max_source_pixels) {
        return Err(ApiError::invalid(param, "image_too_large", format!("{}: {}x{} is more pixels than the limit of {}", param, w, h, policy.max_source_pixels)));
    }
    let c = &policy.preprocess;
    let factor = c.patch_size * c.merge_size;
    let (rh, rw) = if c.do_resize { crate::image::smart_resize(h, w, factor, c.min_pixels, c.max_pixels).map_err(|e| ApiError::invalid(param, "invalid_image", format!("{}: {}", param, e)))? } else { (h, w) };
    Ok((rh / factor) * (rw / factor))
}

/// A counting semaphore: how many requests may decode and preprocess images at once (each
/// holds its pixels and patches meanwhile, and competes with the model for the CPU).
pub struct Slots {
    free: std::sync::Mutex<usize>,
    freed: std::sync::Condvar,
}

/// A taken slot, given back when dropped.
pub struct Slot<'a>(&'a Slots);

impl Slots {
    pub fn new(n: usize) -> Slots {
        Slots { free: std::sync::Mutex::new(n.max(1)), freed: std::sync::Condvar::new() }
    }

    pub fn take(&self) -> Slot<'_> {
        let mut free = self.free.lock().unwrap_or_else(|p| p.into_inner());
        while *free == 0 {
            free = self.freed.wait(free).unwrap_or_else(|p| p.into_inner());
        }
        *free -= 1;
        Slot(self)
    }
}

impl Drop for Slot<'_> {
    fn drop(&mut self) {
        *self.0.free.lock().unwrap_or_else(|p| p.into_inner()) += 1;
        self.0.freed.notify_one();
    }
}

/// Prepared images by the hash of their request bytes (under this process's random key), so a
/// chat that sends the same image every turn decodes and hashes it once: least recently used
/// out first past `capacity` bytes of patches.
pub struct Cache {
    state: std::sync::Mutex<CacheState>,
    capacity: usize,
    keys: std::collections::hash_map::RandomState,
}

#[derive(Default)]
struct CacheState {
    map: std::collections::HashMap<u64, (std::sync::Arc<PreparedImage>, u64)>,
    bytes: usize,
    tick: u64,
    hits: u64,
}

impl Cache {
    /// A cache of up to `capacity` bytes of patches (0: none kept).
    pub fn new(capacity: usize) -> Cache {
        Cache { state: Default::default(), capacity, keys: Default::default() }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, CacheState> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Requests answered from the cache so far.
    pub fn hits(&self) -> u64 {
        self.lock().hits
    }

    /// The prepared image of `bytes`: from the cache, or made with `make` and kept.
    pub fn get_or_prepare(&self, bytes: &[u8], make: impl FnOnce() -> Result<PreparedImage, ApiError>) -> Result<std::sync::Arc<PreparedImage>, ApiError> {
        use std::hash::{BuildHasher, Hasher};
        let mut h = self.keys.build_hasher();
        h.write(bytes);
        let key = h.finish();
        {
            let mut st = self.lock();
            st.tick += 1;
            let tick = st.tick;
            if let Some(e) = st.map.get_mut(&key) {
                e.1 = tick;
                let img = std::sync::Arc::clone(&e.0);
                st.hits += 1;
                return Ok(img);
            }
        }
        let img = std::sync::Arc::new(make()?);
        let size = img.patches.len() * 4;
        if size <= self.capacity {
            let mut st = self.lock();
            while st.bytes + size > self.capacity {
                let oldest = st.map.iter().min_by_key(|(_, e)| e.1).map(|(k, _)| *k);
                match oldest.and_then(|k| st.map.remove(&k)) {
                    Some((old, _)) => st.bytes -= old.patches.len() * 4,
                    None => break,
                }
            }
            let tick = st.tick;
            if st.map.insert(key, (std::sync::Arc::clone(&img), tick)).is_none() {
                st.bytes += size;
            }
        }
        Ok(img)
    }
}

/// Decodes and preprocesses one image's bytes.
pub fn prepare(bytes: &[u8], param: &str, policy: &ImagePolicy) -> Result<PreparedImage, ApiError> {
    let img = decode_image_limited(bytes, param, policy.max_source_pixels).map_err(|e| {
        let msg = e.to_string();
        let code = if msg.contains("more pixels than the limit") { "image_too_large" } else { "invalid_image" };
        ApiError::invalid(param, code, msg)
    })?;
    let p = preprocess(&img, &policy.preprocess).map_err(|e| ApiError::invalid(param, "invalid_image", format!("{}: {}", param, e)))?;
    let tokens = p.num_tokens(policy.preprocess.merge_size);
    let key = crate::engine::image_key(&p.patches, p.row_len, &[p.grid_thw]);
    Ok(PreparedImage { row_len: p.row_len, grid: p.grid_thw, tokens, key, patches: p.patches, video: None })
}

/// Decodes, samples and preprocesses one video's bytes under the policy's limits.
pub fn prepare_video(bytes: &[u8], param: &str, policy: &ImagePolicy) -> Result<PreparedImage, ApiError> {
    let v = decode_video(bytes, param, &policy.video, &policy.video_limits).map_err(|e| {
        let msg = e.to_string();
        let code = if msg.contains("exceed the limit") || msg.contains("time limit") { "video_too_large" } else if msg.contains("ffmpeg") && msg.contains("install") { "video_unsupported" } else { "invalid_video" };
        ApiError::invalid(param, code, msg)
    })?;
    let p = v.patches;
    let merge = policy.video.merge_size;
    let prompt = VideoPrompt { timestamps: p.timestamps.clone(), tokens_per_frame: p.tokens_per_frame(merge) };
    let tokens = Media::Video(prompt.clone()).tokens();
    let key = crate::engine::image_key(&p.patches, p.row_len, &[p.grid_thw]);
    Ok(PreparedImage { row_len: p.row_len, grid: p.grid_thw, tokens, key, patches: p.patches, video: Some(prompt) })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn image(n: usize, v: f32) -> PreparedImage {
        PreparedImage { patches: vec![v; n], row_len: 1, grid: [1, 1, n], tokens: n / 4, key: v as u64, video: None }
    }

    #[test]
    fn the_cache_answers_repeats_and_drops_the_least_recent_past_its_bytes() {
        let c = Cache::new(100 * 4);
        let a = c.get_or_prepare(b"a", || Ok(image(60, 1.0))).unwrap();
        let again = c.get_or_prepare(b"a", || panic!("a is cached")).unwrap();
        assert!(std::sync::Arc::ptr_eq(&a, &again));
        assert_eq!(c.hits(), 1);
        // b does not fit beside a: a goes
        c.get_or_prepare(b"b", || Ok(image(50, 2.0))).unwrap();
        let a2 = c.get_or_prepare(b"a", || Ok(image(60, 3.0))).unwrap();
        assert_eq!(a2.patches[0], 3.0, "made again");
        // larger than the whole cache: made, not kept; errors are not kept either
        c.get_or_prepare(b"c", || Ok(image(200, 4.0))).unwrap();
        assert_eq!(c.get_or_prepare(b"c", || Ok(image(200, 5.0))).unwrap().patches[0], 5.0);
        assert!(c.get_or_prepare(b"d", || Err(ApiError::invalid("p", "invalid_image", "bad"))).is_err());
        assert!(c.get_or_prepare(b"d", || Ok(image(1, 6.0))).is_ok());
        assert_eq!(c.hits(), 1);
    }

    #[test]
    fn base64_round_trips_and_names_bad_bytes() {
        assert_eq!(decode_base64("aGVsbG8=").unwrap(), b"hello");
        assert_eq!(decode_base64("aGVsbG8").unwrap(), b"hello");
        assert_eq!(decode_base64("aGVs\nbG8h").unwrap(), b"hello!");
        assert_eq!(decode_base64("").unwrap(), b"");
        assert!(decode_base64("aGV$bG8=").unwrap_err().contains("at byte 3"));
        assert!(decode_base64("aGVsbG8=x").unwrap_err().contains("after '='"));
        assert!(decode_base64("aGVsb").unwrap_err().contains("truncated"));
    }

    #[test]
    fn urls_other_than_data_and_allowed_files_are_refused() {
        let policy = ImagePolicy::new(PreprocessConfig::qwen3_vl_default(), VideoConfig::qwen3_vl_default(), None, 1 << 20, 1 << 20);
        let code = |u: &str| fetch(u, "p", &policy).unwrap_err().code;
        assert_eq!(code("https://example.com/cat.png"), "unsupported_image_url");
        assert_eq!(code("/etc/passwd"), "unsupported_image_url");
        assert_eq!(code("data:image/gif;base64,R0lG"), "unsupported_image_type");
        assert_eq!(code("data:image/png,rawbytes"), "invalid_image_url");
        assert_eq!(code("data:image/png;base64,@@@@"), "invalid_base64");
        let dir = std::env::temp_dir().join(format!("qwen3-vl-allowed-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("a.png"), b"x").unwrap();
        let policy = ImagePolicy { allowed_dir: Some(std::fs::canonicalize(&dir).unwrap()), ..policy };
        assert_eq!(fetch(&format!("file://{}/a.png", dir.display()), "p", &policy).unwrap(), b"x");
        assert_eq!(fetch(&format!("{}/../{}/a.png", dir.display(), dir.file_name().unwrap().to_string_lossy()), "p", &policy).unwrap(), b"x");
        assert_eq!(fetch(&format!("{}/../", dir.display()), "p", &policy).unwrap_err().code, "image_not_allowed");
        assert_eq!(fetch("/etc/hostname", "p", &policy).unwrap_err().code, "image_not_allowed");
        let _ = std::fs::remove_dir_all(&dir);
        // videos: their own types and codes
        let vcode = |u: &str| fetch_video(u, "p", &policy).unwrap_err().code;
        assert_eq!(vcode("data:image/png;base64,AAAA"), "unsupported_video_type");
        assert_eq!(vcode("https://example.com/a.mp4"), "unsupported_video_url");
        assert_eq!(fetch_video("data:video/mp4;base64,aGk=", "p", &policy).unwrap(), b"hi");
        assert_eq!(fetch_video("data:image/gif;base64,aGk=", "p", &policy).unwrap(), b"hi");
    }
}
