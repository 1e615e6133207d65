//! Animated GIFs: frames composited over the canvas (the `image` crate applies each frame's
//! disposal), alpha dropped as for images, and the frame rate from the frame delays.
//!
//! A delay under 2 hundredths of a second is taken as 10 (100 ms), as ffmpeg's GIF demuxer and
//! browsers do; the frame rate is the frame count over the summed delays.

use super::{VideoInfo, VideoLimits};
use crate::image::RgbImage;
use crate::{Error, Result};
use ::image::codecs::gif::GifDecoder;
use ::image::{AnimationDecoder, ImageDecoder};
use std::panic::{catch_unwind, AssertUnwindSafe};

/// Hundredths of a second a frame with a tiny delay is shown for.
const DEFAULT_DELAY_CS: f64 = 10.0;

fn fail(name: &str, msg: String) -> Error {
    Error::Video { file: name.to_string(), msg }
}

fn decoder<'a>(bytes: &'a [u8], name: &str) -> Result<GifDecoder<std::io::Cursor<&'a [u8]>>> {
    catch_unwind(AssertUnwindSafe(|| GifDecoder::new(std::io::Cursor::new(bytes))))
        .map_err(|_| fail(name, "the GIF decoder failed on a malformed header".into()))?
        .map_err(|e| fail(name, format!("cannot decode the GIF header: {}", e)))
}

/// The stream: canvas size, frame count and rate (one pass over the frames, pixels dropped).
pub(super) fn probe(bytes: &[u8], name: &str, limits: &VideoLimits) -> Result<VideoInfo> {
    let d = decoder(bytes, name)?;
    let (w, h) = d.dimensions();
    let (width, height) = (w as usize, h as usize);
    if width.saturating_mul(height) > limits.max_frame_pixels || width == 0 || height == 0 {
        return Err(fail(name, format!("a {}x{} canvas is empty or exceeds the limit of {} pixels per frame", width, height, limits.max_frame_pixels)));
    }
    let (mut frames, mut cs) = (0usize, 0f64);
    let mut err = None;
    catch_unwind(AssertUnwindSafe(|| {
        for f in d.into_frames() {
            match f {
                Ok(f) => {
                    let (num, den) = f.delay().numer_denom_ms();
                    let delay = num as f64 / den.max(1) as f64 / 10.0;
                    cs += if delay < 2.0 { DEFAULT_DELAY_CS } else { delay };
                    frames += 1;
                    if frames > limits.max_source_frames {
                        break;
                    }
                }
                Err(e) => {
                    err = Some(e.to_string());
                    break;
                }
            }
        }
    }))
    .map_err(|_| fail(name, "the GIF decoder failed on malformed frame data".into()))?;
    if let Some(e) = err {
        if frames == 0 {
            return Err(fail(name, format!("cannot decode the first GIF frame: {}", e)));
        }
        log::warn!("{}: GIF frame {} is corrupt ({}); the {} frames before it are used", name, frames + 1, e, frames);
    }
    let duration = cs / 100.0;
    Ok(VideoInfo { width, height, frames, fps: if duration > 0.0 { frames as f64 / duration } else { 0.0 }, duration })
}

/// Decodes the frames in order, handing each (upright RGB) to `visit` with its index until it
/// returns false or the frames end.
pub(super) fn decode(bytes: &[u8], name: &str, visit: &mut dyn FnMut(usize, RgbImage) -> bool) -> Result<()> {
    let d = decoder(bytes, name)?;
    let mut err = None;
    catch_unwind(AssertUnwindSafe(|| {
        for (i, f) in d.into_frames().enumerate() {
            match f {
                Ok(f) => {
                    let buf = f.into_buffer();
                    let (w, h) = (buf.width() as usize, buf.height() as usize);
                    let rgb: Vec<u8> = buf.into_raw().chunks_exact(4).flat_map(|p| [p[0], p[1], p[2]]).collect();
                    let img = RgbImage::new(w, h, rgb).expect("an RGBA frame has w·h pixels");
                    if !visit(i, img) {
                        break;
                    }
                }
                Err(e) => {
                    err = Some(e.to_string());
                    break;
                }
            }
        }
    }))
    .map_err(|_| fail(name, "the GIF decoder failed on malformed frame data".into()))?;
    if let Some(e) = err {
        log::warn!("{}: stopped at a corrupt GIF frame: {}", name, e);
    }
    Ok(())
}
