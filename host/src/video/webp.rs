//! Animated WebP: the frame count, canvas and durations from the RIFF chunks (VP8X, ANMF), the
//! frames through the `image` crate's animation decoder (each frame composited on the canvas by
//! its offset, blending and disposal), alpha dropped as for images.
//!
//! As for GIF, a duration under 20 ms counts as 100 ms. The `image` crate decodes every frame
//! before handing out the first, so the decoded frames (canvas-sized RGBA each) are bounded up
//! front by [`MAX_DECODED_BYTES`]. Its lossy (VP8) decoder is not bit-exact with libwebp's (see
//! `image/webp.rs`); lossless frames are exact.

use super::{VideoInfo, VideoLimits};
use crate::image::RgbImage;
use crate::{Error, Result};
use ::image::codecs::webp::WebPDecoder;
use ::image::AnimationDecoder;
use std::panic::{catch_unwind, AssertUnwindSafe};

/// The most bytes of decoded frames (`frames × canvas × 4`) an animated WebP may need.
pub const MAX_DECODED_BYTES: usize = 2 << 30;

fn fail(name: &str, msg: String) -> Error {
    Error::Video { file: name.to_string(), msg }
}

/// Whether `b` is a WebP file with an animation chunk.
pub(super) fn is_animated(b: &[u8]) -> bool {
    b.len() >= 12 && &b[0..4] == b"RIFF" && &b[8..12] == b"WEBP" && chunks(b).any(|(id, _)| id == b"ANIM")
}

/// Whether `b` is a WebP file (still or animated).
pub(super) fn is_webp(b: &[u8]) -> bool {
    b.len() >= 12 && &b[0..4] == b"RIFF" && &b[8..12] == b"WEBP"
}

/// The top-level chunks (fourcc, data) until the first one that does not fit.
fn chunks(b: &[u8]) -> impl Iterator<Item = (&[u8], &[u8])> {
    let mut i = 12usize;
    std::iter::from_fn(move || {
        let head = b.get(i..i + 8)?;
        let len = u32::from_le_bytes([head[4], head[5], head[6], head[7]]) as usize;
        let data = b.get(i + 8..(i + 8).checked_add(len)?)?;
        let id = &b[i..i + 4];
        i += 8 + len + (len & 1);
        Some((id, data))
    })
}

/// The stream's canvas, frame count, rate and duration.
pub(super) fn probe(bytes: &[u8], name: &str, limits: &VideoLimits) -> Result<VideoInfo> {
    let u24 = |d: &[u8]| d[0] as usize | (d[1] as usize) << 8 | (d[2] as usize) << 16;
    let (mut width, mut height, mut ms, mut frames) = (0usize, 0usize, 0f64, 0usize);
    for (id, data) in chunks(bytes) {
        match id {
            b"VP8X" if data.len() >= 10 => {
                width = u24(&data[4..7]) + 1;
                height = u24(&data[7..10]) + 1;
            }
            b"ANMF" if data.len() >= 16 => {
                let d = u24(&data[12..15]) as f64;
                ms += if d < 20.0 { 100.0 } else { d };
                frames += 1;
            }
            _ => {}
        }
    }
    if width == 0 || height == 0 || frames == 0 {
        return Err(fail(name, "an animated WebP without a canvas (VP8X) or frames (ANMF)".into()));
    }
    if width.saturating_mul(height) > limits.max_frame_pixels {
        return Err(fail(name, format!("a {}x{} canvas exceeds the limit of {} pixels per frame", width, height, limits.max_frame_pixels)));
    }
    if frames.saturating_mul(width * height * 4) > MAX_DECODED_BYTES {
        return Err(fail(name, format!("{} frames of {}x{} exceed the {} bytes an animated WebP may decode to", frames, width, height, MAX_DECODED_BYTES)));
    }
    let duration = ms / 1000.0;
    Ok(VideoInfo { width, height, frames, fps: frames as f64 / duration, duration })
}

/// Decodes the frames in order, handing each (RGB) to `visit` until it returns false.
pub(super) fn decode(bytes: &[u8], name: &str, visit: &mut dyn FnMut(usize, RgbImage) -> bool) -> Result<()> {
    let d = catch_unwind(AssertUnwindSafe(|| WebPDecoder::new(std::io::Cursor::new(bytes))))
        .map_err(|_| fail(name, "the WebP decoder failed on malformed data".into()))?
        .map_err(|e| fail(name, format!("cannot decode the animated WebP: {}", e)))?;
    match super::visit_frames(d.into_frames(), visit) {
        Some(e) => Err(fail(name, e)),
        None => Ok(()),
    }
}
