//! Pillow's bicubic resize of 8-bit images (`Image.resize(size, Image.BICUBIC)`), bit for bit.
//!
//! As in Pillow's `libImaging/Resample.c`: a separable convolution with the cubic kernel of
//! a = -0.5, whose support (2 pixels) is stretched by the scale factor when shrinking (so a
//! downscale averages, an upscale interpolates); per output pixel the weights are computed in
//! f64, normalized to sum 1, then converted to fixed point with 22 fractional bits (rounded
//! away from zero). Each pass is rounded and clipped to 8 bits; a pass whose size does not
//! change is skipped. The order of the passes is Pillow 13's: vertical first when the height
//! shrinks by more than twice as many pixels as the width does, otherwise horizontal first (then
//! only over the source rows the vertical pass reads). Pillow 12 and older always ran the
//! horizontal pass first; the two orders can differ by a few levels where both passes run.

use super::RgbImage;
use rayon::prelude::*;
use std::borrow::Cow;

/// Fractional bits of the fixed-point weights (Pillow: 32 - 8 - 2).
const PRECISION_BITS: u32 = 22;

/// Pillow's bicubic kernel, a = -0.5.
fn bicubic(x: f64) -> f64 {
    const A: f64 = -0.5;
    let x = x.abs();
    if x < 1.0 {
        ((A + 2.0) * x - (A + 3.0)) * x * x + 1.0
    } else if x < 2.0 {
        (((x - 5.0) * x + 8.0) * x - 4.0) * A
    } else {
        0.0
    }
}

/// The fixed-point weights of one axis: output pixel `i` reads input pixels
/// `start[i] .. start[i] + len[i]` with weights `k[i * ksize ..][.. len[i]]`.
struct Weights {
    ksize: usize,
    start: Vec<usize>,
    len: Vec<usize>,
    k: Vec<i32>,
}

/// Pillow's `precompute_coeffs` followed by `normalize_coeffs_8bpc`, for the box (0, in_size).
fn weights(in_size: usize, out_size: usize) -> Weights {
    let scale = in_size as f64 / out_size as f64;
    let filterscale = scale.max(1.0);
    let support = 2.0 * filterscale;
    let ksize = support.ceil() as usize * 2 + 1;
    let mut w = Weights { ksize, start: Vec::with_capacity(out_size), len: Vec::with_capacity(out_size), k: vec![0; out_size * ksize] };
    let ss = 1.0 / filterscale;
    let mut kf = vec![0f64; ksize];
    for xx in 0..out_size {
        let center = (xx as f64 + 0.5) * scale;
        // C's (int) conversion truncates toward zero, as `as` does.
        let xmin = ((center - support + 0.5) as i64).max(0) as usize;
        let xmax = ((center + support + 0.5) as i64).min(in_size as i64) as usize - xmin;
        let mut ww = 0.0;
        for (x, slot) in kf.iter_mut().enumerate().take(xmax) {
            let v = bicubic(((x + xmin) as f64 - center + 0.5) * ss);
            *slot = v;
            ww += v;
        }
        let k = &mut w.k[xx * ksize..xx * ksize + xmax];
        for (dst, &v) in k.iter_mut().zip(&kf) {
            let v = if ww != 0.0 { v / ww } else { v };
            let f = v * f64::from(1u32 << PRECISION_BITS);
            *dst = if v < 0.0 { (f - 0.5) as i32 } else { (f + 0.5) as i32 };
        }
        w.start.push(xmin);
        w.len.push(xmax);
    }
    w
}

/// The accumulated sum back to 8 bits: Pillow's `clip8`.
#[inline]
fn clip8(acc: i32) -> u8 {
    (acc >> PRECISION_BITS).max(0).min(255) as u8
}

const HALF: i32 = 1 << (PRECISION_BITS - 1);

/// Resizes to `width` x `height` exactly as Pillow's `Image.resize((width, height),
/// Image.BICUBIC)` (Pillow 13) does for an RGB image. Sizes must be nonzero. The same size gives
/// a copy.
pub fn resize_bicubic(img: &RgbImage, width: usize, height: usize) -> RgbImage {
    assert!(width > 0 && height > 0 && img.width > 0 && img.height > 0, "resize_bicubic: empty image");
    let need_h = width != img.width;
    let need_v = height != img.height;
    let (dy, dx) = (img.height as i64 - height as i64, img.width as i64 - width as i64);
    let horizontal_first = !(dy > 0 && dy > dx * 2);
    let wv = weights(img.height, height);
    if horizontal_first {
        // Horizontal pass over the source rows that the vertical pass reads, then vertical.
        let (first, last) = (wv.start[0], wv.start[height - 1] + wv.len[height - 1]);
        let mid = if need_h { Cow::Owned(horizontal(img, &weights(img.width, width), first, last)) } else { Cow::Borrowed(img) };
        let offset = if need_h { first } else { 0 };
        if need_v {
            vertical(&mid, &wv, offset)
        } else {
            RgbImage { width: mid.width, height, data: mid.data[..height * mid.width * 3].to_vec() }
        }
    } else {
        let mid = vertical(img, &wv, 0); // need_v holds here: the height shrinks
        if need_h {
            horizontal(&mid, &weights(img.width, width), 0, height)
        } else {
            mid
        }
    }
}

/// The horizontal pass over source rows `first..last`.
fn horizontal(img: &RgbImage, wh: &Weights, first: usize, last: usize) -> RgbImage {
    let width = wh.start.len();
    let mut data = vec![0u8; (last - first) * width * 3];
    data.par_chunks_mut(width * 3).enumerate().for_each(|(r, out)| {
        let row = &img.data[(first + r) * img.width * 3..(first + r + 1) * img.width * 3];
        for xx in 0..width {
            let k = &wh.k[xx * wh.ksize..xx * wh.ksize + wh.len[xx]];
            let px = &row[wh.start[xx] * 3..(wh.start[xx] + wh.len[xx]) * 3];
            let (mut r0, mut g0, mut b0) = (HALF, HALF, HALF);
            for (p, &c) in px.chunks_exact(3).zip(k) {
                r0 += i32::from(p[0]) * c;
                g0 += i32::from(p[1]) * c;
                b0 += i32::from(p[2]) * c;
            }
            out[xx * 3] = clip8(r0);
            out[xx * 3 + 1] = clip8(g0);
            out[xx * 3 + 2] = clip8(b0);
        }
    });
    RgbImage { width, height: last - first, data }
}

/// The vertical pass; `row_offset` is the first source row held by `img`.
fn vertical(img: &RgbImage, wv: &Weights, row_offset: usize) -> RgbImage {
    let stride = img.width * 3;
    let height = wv.start.len();
    let mut data = vec![0u8; height * stride];
    data.par_chunks_mut(stride).enumerate().for_each(|(yy, out)| {
        let k = &wv.k[yy * wv.ksize..yy * wv.ksize + wv.len[yy]];
        let y0 = wv.start[yy] - row_offset;
        let mut acc = vec![HALF; stride];
        for (dy, &c) in k.iter().enumerate() {
            let row = &img.data[(y0 + dy) * stride..(y0 + dy + 1) * stride];
            for (a, &v) in acc.iter_mut().zip(row) {
                *a += i32::from(v) * c;
            }
        }
        for (o, &a) in out.iter_mut().zip(&acc) {
            *o = clip8(a);
        }
    });
    RgbImage { width: img.width, height, data }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn image_resize_weights_sum_to_one() {
        for &(i, o) in &[(10, 3), (3, 10), (300, 160), (7, 7), (1000, 1)] {
            let w = weights(i, o);
            for xx in 0..o {
                let s: i64 = w.k[xx * w.ksize..xx * w.ksize + w.len[xx]].iter().map(|&v| i64::from(v)).sum();
                assert!((s - (1 << PRECISION_BITS)).abs() <= w.len[xx] as i64, "{} -> {}: {}", i, o, s);
            }
        }
    }

    #[test]
    fn image_resize_identity_and_constant() {
        let img = RgbImage { width: 5, height: 4, data: (0..60).map(|v| (v * 4) as u8).collect() };
        assert_eq!(resize_bicubic(&img, 5, 4), img);
        let flat = RgbImage { width: 9, height: 7, data: vec![77; 9 * 7 * 3] };
        let out = resize_bicubic(&flat, 4, 12);
        assert!(out.width == 4 && out.height == 12 && out.data.iter().all(|&v| v == 77));
    }
}
