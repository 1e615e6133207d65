//! Value parsers for options with a valid range (the CLI's flags, the Python package's
//! options). clap prints their message after the option name and the value: `Invalid value
//! "-1" for '--temperature <TEMPERATURE>': must be a number from 0 to 100`.

/// An integer within `lo..=hi`.
fn int_in(s: &str, lo: usize, hi: usize) -> Result<usize, String> {
    match s.trim().parse::<usize>() {
        Ok(v) if (lo..=hi).contains(&v) => Ok(v),
        _ => Err(format!("must be an integer from {} to {}", lo, hi)),
    }
}

/// A finite number with `ok(value)`; `range` describes the range in the message.
fn float_where(s: &str, ok: impl Fn(f32) -> bool, range: &str) -> Result<f32, String> {
    match s.trim().parse::<f32>() {
        Ok(v) if v.is_finite() && ok(v) => Ok(v),
        _ => Err(format!("must be a number {}", range)),
    }
}

pub fn threads(s: &str) -> Result<usize, String> {
    int_in(s, 1, 1024)
}

pub fn temperature(s: &str) -> Result<f32, String> {
    float_where(s, |v| (0.0..=100.0).contains(&v), "from 0 (greedy) to 100")
}

pub fn top_p(s: &str) -> Result<f32, String> {
    float_where(s, |v| v > 0.0 && v <= 1.0, "above 0 and at most 1")
}

pub fn top_k(s: &str) -> Result<usize, String> {
    int_in(s, 0, 1 << 30)
}

pub fn repetition_penalty(s: &str) -> Result<f32, String> {
    float_where(s, |v| v > 0.0 && v <= 100.0, "above 0 and at most 100 (1 is off)")
}

pub fn max_tokens(s: &str) -> Result<usize, String> {
    int_in(s, 1, 1 << 24)
}

/// `--context` of chat: room for a prompt and a reply.
pub fn context(s: &str) -> Result<usize, String> {
    int_in(s, 16, 1 << 24)
}

/// `--max-pixels`: the floor is one merged patch of Qwen3-VL (32x32); a model with other patch
/// settings is checked again against its preprocessor config.
pub fn max_pixels(s: &str) -> Result<usize, String> {
    int_in(s, 1024, 1 << 28)
}

pub fn port(s: &str) -> Result<u16, String> {
    int_in(s, 0, 65535).map(|p| p as u16)
}

pub fn queue(s: &str) -> Result<usize, String> {
    int_in(s, 1, 4096)
}

pub fn connections(s: &str) -> Result<usize, String> {
    int_in(s, 1, 4096)
}

pub fn images(s: &str) -> Result<usize, String> {
    int_in(s, 0, 256)
}

pub fn seconds(s: &str) -> Result<u64, String> {
    int_in(s, 1, 86_400).map(|v| v as u64)
}

/// `--shutdown-timeout`: 0 ends the requests in flight at once.
pub fn shutdown_seconds(s: &str) -> Result<u64, String> {
    int_in(s, 0, 3600).map(|v| v as u64)
}

/// A size in MiB.
pub fn mib(s: &str) -> Result<usize, String> {
    int_in(s, 1, 4096)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranges_accept_their_bounds_and_name_them() {
        assert_eq!(threads("1"), Ok(1));
        assert_eq!(threads("0").unwrap_err(), "must be an integer from 1 to 1024");
        assert_eq!(temperature("0"), Ok(0.0));
        assert!(temperature("-1").unwrap_err().contains("from 0"));
        assert!(temperature("NaN").is_err());
        assert_eq!(top_p("1"), Ok(1.0));
        assert!(top_p("5").unwrap_err().contains("at most 1"));
        assert!(top_p("0").is_err());
        assert!(max_pixels("1").unwrap_err().contains("1024"));
    }
}

pub fn video_fps(s: &str) -> Result<f64, String> {
    match s.trim().parse::<f64>() {
        Ok(v) if v > 0.0 && v <= 1000.0 => Ok(v),
        _ => Err("must be a number above 0 and at most 1000".into()),
    }
}

pub fn video_max_frames(s: &str) -> Result<usize, String> {
    int_in(s, 2, crate::video::MAX_FRAMES_LIMIT)
}

/// A cache size: 0 or off (no cache), else a size as `--gpu-memory` takes it (2GiB, 512MiB,
/// bytes).
pub fn image_cache(s: &str) -> Result<usize, String> {
    match s.trim() {
        "0" | "off" => Ok(0),
        t => crate::model::placement::parse_size(t),
    }
}
