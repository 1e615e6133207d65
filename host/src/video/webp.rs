//! Animated WebP: the frame count, canvas and durations from the RIFF chunks (VP8X, ANMF); each
//! frame's bitstream decoded by the `image` crate's WebP decoder (image-webp) as a still image,
//! and composited onto the canvas here the way libwebp's `WebPAnimDecoder` (Pillow's) does it:
//! key frames, offsets, blending of non-opaque pixels only and disposal to transparent. (The
//! `image` crate's own animation decoder blends opaque pixels too, which takes one level off
//! them.) Alpha is dropped afterwards, as for images.
//!
//! As for GIF, a duration under 20 ms counts as 100 ms. Frames are decoded one at a time and
//! decoding stops after the last sampled frame. Each frame's bitstream must declare the size its
//! ANMF header gives it (checked in [`probe`], before any pixel is decoded).

use super::{VideoInfo, VideoLimits};
use crate::image::RgbImage;
use crate::{Error, Result};
use std::panic::{catch_unwind, AssertUnwindSafe};

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

/// The size the VP8 or VP8L bitstream among a frame's sub-chunks (after an optional ALPH) declares.
fn bitstream_size(sub: &[u8]) -> Option<(usize, usize)> {
    let mut i = 0usize;
    while let Some(head) = sub.get(i..i + 8) {
        let len = u32::from_le_bytes([head[4], head[5], head[6], head[7]]) as usize;
        let data = &sub[i + 8..];
        match &head[..4] {
            b"VP8 " if data.len() >= 10 => {
                let dim = |lo: u8, hi: u8| usize::from(u16::from_le_bytes([lo, hi]) & 0x3fff);
                return Some((dim(data[6], data[7]), dim(data[8], data[9])));
            }
            b"VP8L" if data.len() >= 5 => {
                let bits = u32::from_le_bytes([data[1], data[2], data[3], data[4]]);
                return Some(((bits & 0x3fff) as usize + 1, ((bits >> 14) & 0x3fff) as usize + 1));
            }
            b"ALPH" => i = i.checked_add(8 + len + (len & 1))?,
            _ => return None,
        }
    }
    None
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
                let size = (u24(&data[6..9]) + 1, u24(&data[9..12]) + 1);
                if let Some(bits) = bitstream_size(&data[16..]).filter(|&b| b != size) {
                    return Err(fail(name, format!("frame {}: its bitstream declares {}x{}, its frame header {}x{}", frames, bits.0, bits.1, size.0, size.1)));
                }
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
    let duration = ms / 1000.0;
    Ok(VideoInfo { width, height, frames, fps: frames as f64 / duration, duration })
}

/// One ANMF chunk: where the frame goes, how it is blended and disposed, and its bitstream.
struct AnimFrame<'a> {
    x: usize,
    y: usize,
    w: usize,
    h: usize,
    /// Alpha-blend onto the canvas (else overwrite).
    blend: bool,
    /// Clear the frame's rectangle to transparent after showing it.
    dispose: bool,
    /// The ALPH chunk (header included), if any.
    alph: Option<&'a [u8]>,
    /// The VP8 or VP8L chunk, header included.
    bits: &'a [u8],
}

impl<'a> AnimFrame<'a> {
    fn parse(data: &'a [u8]) -> std::result::Result<AnimFrame<'a>, String> {
        let u24 = |d: &[u8]| d[0] as usize | (d[1] as usize) << 8 | (d[2] as usize) << 16;
        if data.len() < 16 {
            return Err("a frame header (ANMF) is cut".into());
        }
        let (mut alph, mut i) = (None, 16usize);
        while let Some(head) = data.get(i..i + 8) {
            let len = u32::from_le_bytes([head[4], head[5], head[6], head[7]]) as usize;
            let chunk = data.get(i..(i + 8).checked_add(len).ok_or("a frame chunk is too long")?).ok_or("a frame's bitstream is cut")?;
            match &head[..4] {
                b"ALPH" => alph = Some(chunk),
                b"VP8 " | b"VP8L" => {
                    let flags = data[15];
                    return Ok(AnimFrame { x: 2 * u24(&data[0..3]), y: 2 * u24(&data[3..6]), w: u24(&data[6..9]) + 1, h: u24(&data[9..12]) + 1, blend: flags & 2 == 0, dispose: flags & 1 != 0, alph: alph.filter(|_| head[3] == b' '), bits: chunk });
                }
                _ => {}
            }
            i = i.checked_add(8 + len + (len & 1)).ok_or("a frame chunk is too long")?;
        }
        Err("a frame without a VP8 or VP8L bitstream".into())
    }

    /// The frame as a still WebP file (simple format, or VP8X with the alpha flag for
    /// ALPH + VP8), for the `image` crate's decoder.
    fn still_file(&self) -> Vec<u8> {
        let pad = |c: &[u8]| c.len() & 1;
        let mut body = Vec::with_capacity(4 + 18 + self.alph.map_or(0, |a| a.len() + 1) + self.bits.len() + 1);
        body.extend_from_slice(b"WEBP");
        if let Some(a) = self.alph {
            let (w, h) = ((self.w - 1) as u32, (self.h - 1) as u32);
            body.extend_from_slice(b"VP8X\x0a\0\0\0\x10\0\0\0");
            body.extend_from_slice(&w.to_le_bytes()[..3]);
            body.extend_from_slice(&h.to_le_bytes()[..3]);
            body.extend_from_slice(a);
            body.resize(body.len() + pad(a), 0);
        }
        body.extend_from_slice(self.bits);
        body.resize(body.len() + pad(self.bits), 0);
        let mut f = Vec::with_capacity(8 + body.len());
        f.extend_from_slice(b"RIFF");
        f.extend_from_slice(&(body.len() as u32).to_le_bytes());
        f.extend(body);
        f
    }

    /// The decoded frame: RGBA, `w * h * 4` bytes, and whether the bitstream has alpha.
    fn decode(&self) -> std::result::Result<(Vec<u8>, bool), String> {
        use ::image::{DynamicImage, ImageReader, Limits};
        let file = self.still_file();
        let mut reader = ImageReader::with_format(std::io::Cursor::new(&file[..]), ::image::ImageFormat::WebP);
        let mut limits = Limits::default();
        limits.max_alloc = Some((self.w as u64 * self.h as u64).saturating_mul(8).saturating_add(1 << 20));
        reader.limits(limits);
        let (rgba, alpha) = match reader.decode().map_err(|e| e.to_string())? {
            DynamicImage::ImageRgba8(b) => (b, true),
            other => (other.to_rgba8(), false),
        };
        if (rgba.width() as usize, rgba.height() as usize) != (self.w, self.h) {
            return Err(format!("a {}x{} bitstream in a {}x{} frame", rgba.width(), rgba.height(), self.w, self.h));
        }
        Ok((rgba.into_raw(), alpha))
    }
}

/// libwebp's `BlendPixelNonPremult`: `src` over `dst`, both RGBA, not premultiplied.
fn blend_pixel(src: &mut [u8], dst: &[u8]) {
    let src_a = u32::from(src[3]);
    if src_a == 0 {
        src.copy_from_slice(dst);
        return;
    }
    let dst_factor_a = (u32::from(dst[3]) * (256 - src_a)) >> 8;
    let blend_a = src_a + dst_factor_a;
    let scale = (1u32 << 24) / blend_a;
    for c in 0..3 {
        src[c] = ((u32::from(src[c]) * src_a + u32::from(dst[c]) * dst_factor_a) * scale >> 24) as u8;
    }
    src[3] = blend_a as u8;
}

/// Decodes the frames in order onto a canvas of the size [`probe`] found (and the limits
/// passed), handing each (RGB) to `visit` until it returns false.
pub(super) fn decode(bytes: &[u8], name: &str, (cw, ch): (usize, usize), visit: &mut dyn FnMut(usize, RgbImage) -> bool) -> Result<()> {
    // libwebp's two canvases: the frame being made, and the previous one after its disposal
    let mut curr = vec![0u8; cw * ch * 4];
    let mut prev = vec![0u8; cw * ch * 4];
    // the previous frame's rectangle, disposal and whether it was a key frame
    let mut last: Option<((usize, usize, usize, usize), bool, bool)> = None;
    for (i, (_, data)) in chunks(bytes).filter(|(id, _)| *id == b"ANMF").enumerate() {
        let f = AnimFrame::parse(data).map_err(|m| fail(name, format!("frame {}: {}", i + 1, m)))?;
        if f.x + f.w > cw || f.y + f.h > ch {
            return Err(fail(name, format!("frame {}: {}x{} at ({}, {}) is outside the {}x{} canvas", i + 1, f.w, f.h, f.x, f.y, cw, ch)));
        }
        let (px, alpha) = catch_unwind(AssertUnwindSafe(|| f.decode()))
            .map_err(|_| fail(name, format!("frame {}: the WebP decoder failed on malformed data", i + 1)))?
            .map_err(|m| fail(name, format!("frame {}: {}", i + 1, m)))?;
        let full = (f.w, f.h) == (cw, ch);
        let key = match last {
            None => true,
            Some(_) if (!alpha || !f.blend) && full => true,
            Some((r, disposed, was_key)) => disposed && ((r.2, r.3) == (cw, ch) || was_key),
        };
        if key {
            curr.fill(0);
        } else {
            curr.copy_from_slice(&prev);
        }
        for row in 0..f.h {
            let at = ((f.y + row) * cw + f.x) * 4;
            curr[at..at + f.w * 4].copy_from_slice(&px[row * f.w * 4..(row + 1) * f.w * 4]);
        }
        if f.blend && !key {
            // non-opaque pixels over the previous canvas; where the previous frame was disposed,
            // over transparent, which leaves them as they are
            let cleared = |x: usize, y: usize| match last {
                Some(((lx, ly, lw, lh), true, _)) => (lx..lx + lw).contains(&x) && (ly..ly + lh).contains(&y),
                _ => false,
            };
            for y in f.y..f.y + f.h {
                for x in f.x..f.x + f.w {
                    let at = (y * cw + x) * 4;
                    if curr[at + 3] != 255 && !cleared(x, y) {
                        blend_pixel(&mut curr[at..at + 4], &prev[at..at + 4]);
                    }
                }
            }
        }
        prev.copy_from_slice(&curr);
        if f.dispose {
            for row in f.y..f.y + f.h {
                prev[(row * cw + f.x) * 4..(row * cw + f.x + f.w) * 4].fill(0);
            }
        }
        last = Some(((f.x, f.y, f.w, f.h), f.dispose, key));
        let rgb: Vec<u8> = curr.chunks_exact(4).flat_map(|p| [p[0], p[1], p[2]]).collect();
        if !visit(i, RgbImage::new(cw, ch, rgb).expect("a canvas of cw·ch pixels")) {
            break;
        }
    }
    Ok(())
}
