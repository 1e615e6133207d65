//! WebP decoding as Pillow (libwebp) does it, around two limits of the `image` crate version
//! that builds on our toolchain (0.24.4):
//! - a lossless (VP8L) bitstream inside an extended (VP8X) container without the alpha flag
//!   decodes to garbage there, so the bitstream is rewrapped as a simple-format file first;
//! - its lossy (VP8) output upsamples chroma by pixel repetition and converts to RGB with other
//!   coefficients than libwebp. So only the Y, U and V planes are taken from its VP8 decoder,
//!   and libwebp's "fancy" upsampler (the 9-3-3-1 chroma filter) and fixed-point YUV to RGB
//!   conversion (`src/dsp/upsampling.c`, `src/dsp/yuv.h`) are reproduced here.
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
pub(crate) fn decode_lossy(vp8: &[u8]) -> ::image::ImageResult<RgbImage> {
    let mut decoder = Vp8Decoder::new(Cursor::new(vp8));
    let frame = decoder.decode_frame()?;
    Ok(fancy_upsample(frame))
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
fn fancy_upsample(f: &Frame) -> RgbImage {
    let (w, h) = (usize::from(f.width), usize::from(f.height));
    let cw = (w + 1) / 2;
    let urow = |k: usize| (&f.ubuf[k * cw..(k + 1) * cw], &f.vbuf[k * cw..(k + 1) * cw]);
    let mut data = vec![0u8; w * h * 3];
    for (row, dst) in data.chunks_exact_mut(w * 3).enumerate() {
        let y = &f.ybuf[row * w..(row + 1) * w];
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
