//! Animated GIFs: frames composited over the canvas (the `image` crate applies each frame's
//! disposal), alpha dropped as for images, and the frame rate from the frame delays.
//!
//! A delay under 2 hundredths of a second is taken as 10 (100 ms), as ffmpeg's GIF demuxer and
//! browsers do; the frame rate is the frame count over the summed delays. The frame count and
//! delays come from walking the file's blocks (`scan`), so only the one decoding pass, which
//! stops after the last sampled frame, decompresses pixels.

use super::{VideoInfo, VideoLimits};
use crate::image::RgbImage;
use crate::{Error, Result};
use ::image::codecs::gif::GifDecoder;
use std::panic::{catch_unwind, AssertUnwindSafe};

/// Hundredths of a second a frame with a tiny delay is shown for.
const DEFAULT_DELAY_CS: f64 = 10.0;

fn fail(name: &str, msg: String) -> Error {
    Error::Video { file: name.to_string(), msg }
}

fn decoder<'a>(bytes: &'a [u8], name: &str) -> Result<GifDecoder<std::io::Cursor<&'a [u8]>>> {
    // (frame pixels: `decode`; the stream's shape: `scan`)
    catch_unwind(AssertUnwindSafe(|| GifDecoder::new(std::io::Cursor::new(bytes))))
        .map_err(|_| fail(name, "the GIF decoder failed on a malformed header".into()))?
        .map_err(|e| fail(name, format!("cannot decode the GIF header: {}", e)))
}

/// The stream: canvas size, frame count and rate, from the file's block structure alone (the
/// image data is skipped, not decompressed).
pub(super) fn probe(bytes: &[u8], name: &str, limits: &VideoLimits) -> Result<VideoInfo> {
    let (width, height, delays) = scan(bytes, limits.max_source_frames).map_err(|m| fail(name, m))?;
    if width.saturating_mul(height) > limits.max_frame_pixels || width == 0 || height == 0 {
        return Err(fail(name, format!("a {}x{} canvas is empty or exceeds the limit of {} pixels per frame", width, height, limits.max_frame_pixels)));
    }
    let frames = delays.len();
    let cs: f64 = delays.iter().map(|&d| if (d as f64) < 2.0 { DEFAULT_DELAY_CS } else { d as f64 }).sum();
    let duration = cs / 100.0;
    Ok(VideoInfo { width, height, frames, fps: if duration > 0.0 { frames as f64 / duration } else { 0.0 }, duration })
}

/// Walks a GIF's blocks: the canvas size and each frame's delay in hundredths of a second (from
/// the graphic control extension before it; 0 without one). Stops after `max_frames + 1`
/// frames. A file cut inside a frame keeps the frames before it; one with no complete frame is
/// an error.
fn scan(b: &[u8], max_frames: usize) -> std::result::Result<(usize, usize, Vec<u16>), String> {
    if b.len() < 13 || !(b.starts_with(b"GIF87a") || b.starts_with(b"GIF89a")) {
        return Err("not a GIF file (the header is missing or cut)".into());
    }
    let u16le = |i: usize| u16::from_le_bytes([b[i], b[i + 1]]);
    let (width, height) = (u16le(6) as usize, u16le(8) as usize);
    let mut i = 13;
    if b[10] & 0x80 != 0 {
        i += 3 << ((b[10] & 7) + 1); // the global colour table
    }
    // skips data sub-blocks from `i`; the index after the terminator, or None when cut
    let sub_blocks = |mut i: usize| -> Option<usize> {
        loop {
            let n = *b.get(i)? as usize;
            i += 1 + n;
            if n == 0 {
                return if i <= b.len() { Some(i) } else { None };
            }
        }
    };
    let (mut delays, mut delay) = (Vec::new(), 0u16);
    let cut = |delays: Vec<u16>, what: &str| if delays.is_empty() { Err(format!("the GIF ends inside its {} before any complete frame", what)) } else { Ok(delays) };
    let delays = loop {
        match b.get(i) {
            Some(0x3B) | None => break if delays.is_empty() { Err("the GIF has no frames".to_string()) } else { Ok(delays) },
            Some(0x21) => {
                // extension: a graphic control one (label 0xF9, 4 data bytes) carries the delay
                if b.get(i + 1) == Some(&0xF9) && b.get(i + 2) == Some(&4) && i + 6 < b.len() {
                    delay = u16le(i + 4);
                }
                match sub_blocks(i + 2) {
                    Some(j) => i = j,
                    None => break cut(delays, "extension"),
                }
            }
            Some(0x2C) => {
                // image descriptor (10 bytes), a local colour table, the LZW code size, the data
                let flags = match b.get(i + 9) {
                    Some(&f) => f,
                    None => break cut(delays, "frame header"),
                };
                let mut j = i + 10;
                if flags & 0x80 != 0 {
                    j += 3 << ((flags & 7) + 1);
                }
                match sub_blocks(j + 1) {
                    Some(k) => i = k,
                    None => break cut(delays, "frame data"),
                }
                delays.push(delay);
                delay = 0;
                if delays.len() > max_frames {
                    break Ok(delays);
                }
            }
            Some(&other) => break if delays.is_empty() { Err(format!("a block of unknown type 0x{:02x} at byte {}", other, i)) } else { Ok(delays) },
        }
    }?;
    Ok((width, height, delays))
}

/// Decodes the frames in order, handing each (upright RGB) to `visit` with its index until it
/// returns false or the frames end; a corrupt frame ends the video there (with a warning).
pub(super) fn decode(bytes: &[u8], name: &str, visit: &mut dyn FnMut(usize, RgbImage) -> bool) -> Result<()> {
    use ::image::{AnimationDecoder, ImageDecoder, Limits};
    let mut d = decoder(bytes, name)?;
    // the `image` crate's default allocation cap (512 MiB), which its GIF decoder leaves off
    d.set_limits(Limits::default()).map_err(|e| fail(name, format!("cannot decode the GIF: {}", e)))?;
    if let Some(e) = visit_frames(d.into_frames(), visit) {
        log::warn!("{}: stopped at a corrupt GIF frame: {}", name, e);
    }
    Ok(())
}

/// Hands the composited frames of the `image` crate's GIF decoder, as RGB (alpha dropped),
/// to `visit` with their index until it returns false. Returns the message of the first frame
/// that fails to decode (the frames before it were handed out), or of a decoder panic.
fn visit_frames(frames: ::image::Frames<'_>, visit: &mut dyn FnMut(usize, RgbImage) -> bool) -> Option<String> {
    let mut err = None;
    let run = catch_unwind(AssertUnwindSafe(|| {
        for (i, f) in frames.enumerate() {
            match f {
                Ok(f) => {
                    let buf = f.into_buffer();
                    let (w, h) = (buf.width() as usize, buf.height() as usize);
                    let rgb: Vec<u8> = buf.into_raw().chunks_exact(4).flat_map(|p| [p[0], p[1], p[2]]).collect();
                    if !visit(i, RgbImage::new(w, h, rgb).expect("an RGBA frame has w·h pixels")) {
                        break;
                    }
                }
                Err(e) => {
                    err = Some(format!("frame {}: {}", i + 1, e));
                    break;
                }
            }
        }
    }));
    if run.is_err() {
        return Some("the decoder failed on malformed frame data".into());
    }
    err
}
