//! WebP decoding as Pillow (libwebp) does it, around two limits of the `image` crate version
//! that builds on our toolchain (0.24.4):
//! - a lossless (VP8L) bitstream inside an extended (VP8X) container without the alpha flag
//!   decodes to garbage there, so the bitstream is rewrapped as a simple-format file first;
//! - its lossy (VP8) output upsamples chroma by pixel repetition and converts to RGB with other
//!   coefficients than libwebp. So only the Y, U and V planes are taken from its VP8 decoder,
//!   and libwebp's "fancy" upsampler (the 9-3-3-1 chroma filter) and fixed-point YUV to RGB
//!   conversion (`src/dsp/upsampling.c`, `src/dsp/yuv.h`) are reproduced here.
//!
//! What remains: the VP8 decoder of `image` 0.24.4 itself is not bit-exact with libwebp (its loop
//! filter diverges; fixed upstream only in `image-webp`, which needs a newer compiler). Measured
//! against Pillow: exact at quality 100 and on some files, otherwise up to about 25 levels on
//! a few percent of the pixels at low quality, 4 to 13 levels at quality 50 to 90.
//!
//! The alpha channel (ALPH chunk or VP8L alpha) is dropped, as `convert("RGB")` does.
//! Animated files (ANIM) go to the `image` crate as they are.

use super::RgbImage;
use ::image::codecs::webp::vp8::{Frame, Vp8Decoder};
use std::io::Cursor;

/// The bitstream chunk of a still WebP file: lossy ("VP8 ") or lossless ("VP8L").
pub(crate) enum Bitstream<'a> {
    Lossy(&'a [u8]),
    Lossless(&'a [u8]),
}

/// Finds the image bitstream of a still WebP; `None` for animations or unparsable files (which
/// are left to the `image` crate and its errors).
pub(crate) fn bitstream(b: &[u8]) -> Option<Bitstream<'_>> {
    let mut i = 12;
    while i + 8 <= b.len() {
        let len = u32::from_le_bytes([b[i + 4], b[i + 5], b[i + 6], b[i + 7]]) as usize;
        let data = b.get(i + 8..(i + 8).checked_add(len)?)?;
        match &b[i..i + 4] {
            b"ANIM" | b"ANMF" => return None,
            b"VP8 " => return Some(Bitstream::Lossy(data)),
            b"VP8L" => return Some(Bitstream::Lossless(data)),
            _ => {}
        }
        i += 8 + len + (len & 1);
    }
    None
}

/// Width and height of a still WebP as its headers declare them: the larger of the extended
/// header's canvas (VP8X) and the bitstream's own frame header, since the decoder allocates
/// from the latter. Animations are refused (their frames each declare a size of their own).
pub(crate) fn dimensions(b: &[u8]) -> Result<(usize, usize), &'static str> {
    let (mut w, mut h) = (0usize, 0usize);
    let mut i = 12;
    while i + 8 <= b.len() {
        let len = u32::from_le_bytes([b[i + 4], b[i + 5], b[i + 6], b[i + 7]]) as usize;
        let data = b.get(i + 8..(i + 8).saturating_add(len)).ok_or("truncated WebP chunk")?;
        let u24 = |d: &[u8]| d[0] as usize | (d[1] as usize) << 8 | (d[2] as usize) << 16;
        match &b[i..i + 4] {
            b"ANIM" | b"ANMF" => return Err("animated WebP is not supported"),
            b"VP8X" if data.len() >= 10 => {
                w = w.max(u24(&data[4..7]) + 1);
                h = h.max(u24(&data[7..10]) + 1);
            }
            b"VP8 " => {
                if data.len() < 10 || data[3..6] != [0x9d, 0x01, 0x2a] {
                    return Err("the VP8 frame header is missing or malformed");
                }
                let dim = |lo: u8, hi: u8| usize::from(u16::from_le_bytes([lo, hi]) & 0x3fff);
                // rounded up to whole macroblocks, as decode_lossy decodes them
                let round = |v: usize| (v + 15) / 16 * 16;
                return Ok((w.max(round(dim(data[6], data[7]))), h.max(round(dim(data[8], data[9])))));
            }
            b"VP8L" => {
                if data.len() < 5 || data[0] != 0x2f {
                    return Err("the VP8L header is missing or malformed");
                }
                let bits = u32::from_le_bytes([data[1], data[2], data[3], data[4]]);
                let (lw, lh) = ((bits & 0x3fff) as usize + 1, ((bits >> 14) & 0x3fff) as usize + 1);
                return Ok((w.max(lw), h.max(lh)));
            }
            _ => {}
        }
        i = i.saturating_add(8 + len + (len & 1));
    }
    Err("no VP8 or VP8L image data found")
}

/// A simple-format WebP file holding only the given VP8L chunk.
pub(crate) fn simple_lossless_file(vp8l: &[u8]) -> Vec<u8> {
    let pad = vp8l.len() & 1;
    let mut f = Vec::with_capacity(20 + vp8l.len() + pad);
    f.extend_from_slice(b"RIFF");
    f.extend_from_slice(&((12 + vp8l.len() + pad) as u32).to_le_bytes());
    f.extend_from_slice(b"WEBPVP8L");
    f.extend_from_slice(&(vp8l.len() as u32).to_le_bytes());
    f.extend_from_slice(vp8l);
    f.resize(f.len() + pad, 0);
    f
}

/// Decodes a VP8 bitstream to RGB the way libwebp does by default.
///
/// The `image` crate's VP8 decoder keeps only the visible part of the macroblocks on the right
/// edge, and then predicts the next macroblock row from wrong pixels when the width is not a
/// multiple of 16. libwebp decodes whole macroblocks and crops afterwards; so is it done here:
/// the size in the key-frame header is rounded up to whole macroblocks (the bitstream depends
/// on the size only through the macroblock count), and the planes are cropped after decoding.
pub(crate) fn decode_lossy(vp8: &[u8]) -> ::image::ImageResult<RgbImage> {
    let mut padded = vp8.to_vec();
    let mut size = None;
    // Key frame: bit 0 of the frame tag clear, then the start code 9d 01 2a, then 14-bit width
    // and height (each with 2 scale bits on top), little-endian.
    if padded.len() >= 10 && padded[0] & 1 == 0 && padded[3..6] == [0x9d, 0x01, 0x2a] {
        let (w, h) = (u16::from_le_bytes([padded[6], padded[7]]), u16::from_le_bytes([padded[8], padded[9]]));
        let round = |v: u16| ((v & 0x3fff) + 15) / 16 * 16;
        if round(w) <= 0x3fff && round(h) <= 0x3fff {
            padded[6..8].copy_from_slice(&(round(w) | (w & 0xc000)).to_le_bytes());
            padded[8..10].copy_from_slice(&(round(h) | (h & 0xc000)).to_le_bytes());
            size = Some((usize::from(w & 0x3fff), usize::from(h & 0x3fff)));
        }
    }
    let mut decoder = Vp8Decoder::new(Cursor::new(&padded[..]));
    let frame = decoder.decode_frame()?;
    let (w, h) = size.unwrap_or((usize::from(frame.width), usize::from(frame.height)));
    if w == 0 || h == 0 || w > usize::from(frame.width) || h > usize::from(frame.height) {
        return Ok(RgbImage { width: 0, height: 0, data: Vec::new() }); // refused by the caller
    }
    Ok(fancy_upsample(&Planes::crop(frame, w, h)))
}

/// Y, U, V planes of a frame, cropped to the visible size.
struct Planes {
    width: usize,
    height: usize,
    y: Vec<u8>,
    u: Vec<u8>,
    v: Vec<u8>,
}

impl Planes {
    fn crop(f: &Frame, width: usize, height: usize) -> Planes {
        let (fw, fcw) = (usize::from(f.width), (usize::from(f.width) + 1) / 2);
        let (cw, ch) = ((width + 1) / 2, (height + 1) / 2);
        let cut = |buf: &[u8], stride: usize, w: usize, h: usize| -> Vec<u8> {
            (0..h).flat_map(|r| buf[r * stride..r * stride + w].iter().copied()).collect()
        };
        Planes { width, height, y: cut(&f.ybuf, fw, width, height), u: cut(&f.ubuf, fcw, cw, ch), v: cut(&f.vbuf, fcw, cw, ch) }
    }
}

/// libwebp's `MultHi` + `VP8Clip8`: the YUV to RGB fixed point with 6 fractional bits.
#[inline]
fn mult_hi(v: i32, coeff: i32) -> i32 {
    (v * coeff) >> 8
}

#[inline]
fn clip8(v: i32) -> u8 {
    if v & !((256 << 6) - 1) == 0 {
        (v >> 6) as u8
    } else if v < 0 {
        0
    } else {
        255
    }
}

#[inline]
fn yuv_to_rgb(y: u8, u: u32, v: u32, dst: &mut [u8]) {
    let (y, u, v) = (i32::from(y), u as i32, v as i32);
    dst[0] = clip8(mult_hi(y, 19077) + mult_hi(v, 26149) - 14234);
    dst[1] = clip8(mult_hi(y, 19077) - mult_hi(u, 6419) - mult_hi(v, 13320) + 8708);
    dst[2] = clip8(mult_hi(y, 19077) + mult_hi(u, 33050) - 17685);
}

/// One output row of libwebp's `UpsampleRgbLinePair`: luma row `y`, interpolating chroma
/// between the `near` chroma row (weight 3) and the `far` one (weight 1).
fn upsample_row(y: &[u8], near: (&[u8], &[u8]), far: (&[u8], &[u8]), dst: &mut [u8]) {
    let len = y.len();
    // The chroma sample at column x of the vertically interpolated row, as libwebp computes
    // it: edges (3 * near + far + 2) / 4; inner pixels from the 2x2 neighbourhood.
    let plane = |n: &[u8], f: &[u8], dst: &mut [u32]| {
        let (n, f) = (|i: usize| u32::from(n[i]), |i: usize| u32::from(f[i]));
        dst[0] = (3 * n(0) + f(0) + 2) >> 2;
        let last_pair = (len - 1) >> 1;
        for x in 1..=last_pair {
            // tl/l are column x - 1, t/c column x, on the near (n) and far (f) rows.
            let avg = n(x - 1) + n(x) + f(x - 1) + f(x) + 8;
            let diag_a = (avg + 2 * (n(x) + f(x - 1))) >> 3;
            let diag_b = (avg + 2 * (n(x - 1) + f(x))) >> 3;
            dst[2 * x - 1] = (diag_a + n(x - 1)) >> 1;
            dst[2 * x] = (diag_b + n(x)) >> 1;
        }
        if len & 1 == 0 {
            dst[len - 1] = (3 * n(last_pair) + f(last_pair) + 2) >> 2;
        }
    };
    let mut u = vec![0u32; len];
    let mut v = vec![0u32; len];
    plane(near.0, far.0, &mut u);
    plane(near.1, far.1, &mut v);
    for x in 0..len {
        yuv_to_rgb(y[x], u[x], v[x], &mut dst[x * 3..x * 3 + 3]);
    }
}

/// libwebp's `EmitFancyRGB` over a whole frame: row 0 and (for even heights) the last row
/// use one chroma row; rows 2k-1 and 2k interpolate chroma rows k-1 and k, each weighting
/// the nearer one by 3.
fn fancy_upsample(f: &Planes) -> RgbImage {
    let (w, h) = (f.width, f.height);
    let cw = (w + 1) / 2;
    let urow = |k: usize| (&f.u[k * cw..(k + 1) * cw], &f.v[k * cw..(k + 1) * cw]);
    let mut data = vec![0u8; w * h * 3];
    for (row, dst) in data.chunks_exact_mut(w * 3).enumerate() {
        let y = &f.y[row * w..(row + 1) * w];
        let (near, far) = if row == 0 {
            (0, 0)
        } else if row % 2 == 1 {
            let k = (row + 1) / 2;
            if k >= (h + 1) / 2 {
                (k - 1, k - 1) // the last row of an even height
            } else {
                (k - 1, k)
            }
        } else {
            (row / 2, row / 2 - 1)
        };
        upsample_row(y, urow(near), urow(far), dst);
    }
    RgbImage { width: w, height: h, data }
}
