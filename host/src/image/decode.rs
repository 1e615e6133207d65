//! Encoded files to upright 8-bit RGB, as transformers' `load_image` gets them from Pillow:
//! decode, `ImageOps.exif_transpose`, `convert("RGB")`.
//!
//! Conversions, as Pillow's `convert("RGB")` does them: gray is repeated into the three
//! channels; an alpha channel is dropped (not composited: `load_image` converts to RGB before
//! the processor's own `convert_to_rgb`, which would composite on white, ever sees the image);
//! palettes are looked up; 16-bit samples keep their high byte, as Pillow does for 16-bit RGB,
//! RGBA and gray+alpha PNGs. For 16-bit grayscale PNGs Pillow instead clips the value to 255
//! (mode "I;16"), which whitens almost every pixel; the high byte is kept there too, a
//! deliberate deviation.
//!
//! One more step comes from the processor: a PNG with a tRNS color key (rather than an alpha
//! channel) keeps that key through `convert("RGB")`, and the processor's `convert_to_rgb` then
//! paints the pixels of the key color white; so does [`decode_image`] (see
//! `meta::png_color_key`).
//!
//! The pixels come from the `image` crate's PNG and WebP decoders (its WebP decoder, image-webp,
//! upsamples chroma and converts YUV to RGB as libwebp does) and, for JPEG, from jpeg-decoder,
//! which `image` used before 0.25: its successor there, zune-jpeg, interpolates chroma past the
//! right and bottom edges and so differs from libjpeg (Pillow) by up to 16 levels at those
//! edges where jpeg-decoder stays within 3. The EXIF orientation and the color key come from
//! `meta.rs`, read as Pillow reads them.

use super::format::{sniff_or_fail, Format};
use super::{meta, webp, RgbImage};
use crate::{Error, Result};
use ::image::{DynamicImage, ImageReader, Limits};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::Path;

/// The most pixels (width × height) an encoded image may declare by default: Pillow's
/// decompression-bomb limit (twice `Image.MAX_IMAGE_PIXELS`), which transformers' `load_image`
/// inherits. Checked from the file's header before any pixel buffer is allocated.
pub const DEFAULT_MAX_PIXELS: usize = 2 * 89_478_485;

/// Reads and decodes an image file (JPEG, PNG or WebP, told apart by content) into upright RGB.
/// Every failure (missing, unreadable or empty file, another format, corrupt or truncated data,
/// more than [`DEFAULT_MAX_PIXELS`]) is an [`Error::Image`] naming the file.
pub fn load_image(path: &Path) -> Result<RgbImage> {
    let name = path.display().to_string();
    let bytes = std::fs::read(path).map_err(|e| Error::Image { file: name.clone(), msg: format!("cannot read: {}", e) })?;
    decode_image(&bytes, &name)
}

/// Decodes an encoded image held in memory (JPEG, PNG or WebP, told apart by content) into
/// upright RGB: the EXIF orientation (all eight values) is applied, alpha dropped, gray, palette
/// and 16-bit images converted. `name` is only used in errors, which are [`Error::Image`].
/// Images of more than [`DEFAULT_MAX_PIXELS`] are refused; see [`decode_image_limited`].
pub fn decode_image(bytes: &[u8], name: &str) -> Result<RgbImage> {
    decode_image_limited(bytes, name, DEFAULT_MAX_PIXELS)
}

/// Width and height as the file's header declares them, read without decoding any pixels.
pub fn image_dimensions(bytes: &[u8], name: &str) -> Result<(usize, usize)> {
    let fail = |msg: String| Error::Image { file: name.to_string(), msg };
    let format = sniff_or_fail(bytes, name)?;
    let dims = match format {
        Format::WebP => webp::dimensions(bytes).map_err(|m| fail(m.to_string()))?,
        Format::Jpeg => {
            let mut d = jpeg_decoder::Decoder::new(bytes);
            catch_unwind(AssertUnwindSafe(|| d.read_info().map(|()| d.info())))
                .map_err(|_| fail("Jpeg decoder failed on a malformed header".into()))?
                .map_err(|e| fail(format!("cannot decode the Jpeg header: {}", e)))?
                .map(|i| (usize::from(i.width), usize::from(i.height)))
                .ok_or_else(|| fail("cannot decode the Jpeg header".into()))?
        }
        Format::Png => {
            let reader = ImageReader::with_format(std::io::Cursor::new(bytes), format.image_format());
            catch_unwind(AssertUnwindSafe(|| reader.into_dimensions()))
                .map_err(|_| fail(format!("{:?} decoder failed on a malformed header", format)))?
                .map(|(w, h)| (w as usize, h as usize))
                .map_err(|e| fail(format!("cannot decode the {:?} header: {}", format, e)))?
        }
    };
    Ok(dims)
}

/// [`decode_image`] refusing images whose header declares more than `max_pixels` pixels, before
/// any pixel buffer is allocated: what a server takes from untrusted clients. The decoders'
/// own allocations are capped to match (8 bytes per pixel, 16-bit RGBA).
pub fn decode_image_limited(bytes: &[u8], name: &str, max_pixels: usize) -> Result<RgbImage> {
    let fail = |msg: String| Error::Image { file: name.to_string(), msg };
    // 1. the format, from the content
    let format = sniff_or_fail(bytes, name)?;
    // 2. the declared size, against the limit
    let (w, h) = image_dimensions(bytes, name)?;
    match w.checked_mul(h) {
        Some(px) if px <= max_pixels => {}
        _ => return Err(fail(format!("{}x{} is more pixels than the limit of {}", w, h, max_pixels))),
    }
    // 3. the pixels. The decoders return errors for bad data, but a decoder panic must not take
    // the engine down either: it becomes an error too.
    let max_alloc = (max_pixels as u64).saturating_mul(8).saturating_add(1 << 20);
    let mut rgb = catch_unwind(AssertUnwindSafe(|| decode_pixels(bytes, format, max_alloc)))
        .map_err(|_| fail(format!("{:?} decoder failed on malformed data", format)))?
        .map_err(|e| fail(format!("cannot decode {:?}: {}", format, e)))?;
    if rgb.width == 0 || rgb.height == 0 {
        return Err(fail(format!("image has no pixels ({}x{})", rgb.width, rgb.height)));
    }
    if format == Format::Png {
        if let Some(key) = meta::png_color_key(bytes) {
            for px in rgb.data.chunks_exact_mut(3).filter(|px| **px == key) {
                px.copy_from_slice(&[255; 3]);
            }
        }
    }
    Ok(orient(rgb, meta::orientation(bytes, format)))
}

/// Decodes with the decoders' allocations capped at `max_alloc` bytes.
fn decode_pixels(bytes: &[u8], format: Format, max_alloc: u64) -> std::result::Result<RgbImage, String> {
    if format == Format::Jpeg {
        return decode_jpeg(bytes, max_alloc).map_err(|e| e.to_string());
    }
    let opaque = if format == Format::WebP { webp::without_alpha(bytes) } else { None };
    let bytes = opaque.as_deref().unwrap_or(bytes);
    let mut reader = ImageReader::with_format(std::io::Cursor::new(bytes), format.image_format());
    let mut limits = Limits::default();
    limits.max_alloc = Some(max_alloc);
    reader.limits(limits);
    reader.decode().map(to_rgb).map_err(|e| e.to_string())
}

/// A JPEG through jpeg-decoder, converted as `to_rgb` does; CMYK (Adobe-inverted or not, as the
/// decoder reads its APP14 marker) to RGB as `image` 0.24 did, within a level of Pillow.
fn decode_jpeg(bytes: &[u8], max_alloc: u64) -> std::result::Result<RgbImage, jpeg_decoder::Error> {
    use jpeg_decoder::PixelFormat;
    let mut d = jpeg_decoder::Decoder::new(bytes);
    d.set_max_decoding_buffer_size(usize::try_from(max_alloc).unwrap_or(usize::MAX));
    let px = d.decode()?;
    let info = d.info().expect("jpeg-decoder knows the frame after decoding it");
    let (width, height) = (usize::from(info.width), usize::from(info.height));
    let data: Vec<u8> = match info.pixel_format {
        PixelFormat::RGB24 => px,
        PixelFormat::L8 => px.iter().flat_map(|&v| [v, v, v]).collect(),
        PixelFormat::L16 => px.chunks_exact(2).flat_map(|p| [(u16::from_ne_bytes([p[0], p[1]]) >> 8) as u8; 3]).collect(),
        PixelFormat::CMYK32 => px
            .chunks_exact(4)
            .flat_map(|p| {
                let k = 255 - u16::from(p[3]);
                [0, 1, 2].map(|c| ((255 - u16::from(p[c])) * k / 255) as u8)
            })
            .collect(),
    };
    if data.len() != width * height * 3 {
        return Err(jpeg_decoder::Error::Format(format!("{} bytes of pixels for {}x{}", data.len(), width, height)));
    }
    Ok(RgbImage { width, height, data })
}

/// Pillow's `convert("RGB")` of whatever the decoder produced (see the module docs).
fn to_rgb(img: DynamicImage) -> RgbImage {
    let (width, height) = (img.width() as usize, img.height() as usize);
    let data: Vec<u8> = match img {
        DynamicImage::ImageRgb8(b) => b.into_raw(),
        DynamicImage::ImageRgba8(b) => b.chunks_exact(4).flat_map(|p| [p[0], p[1], p[2]]).collect(),
        DynamicImage::ImageLuma8(b) => b.iter().flat_map(|&v| [v, v, v]).collect(),
        DynamicImage::ImageLumaA8(b) => b.chunks_exact(2).flat_map(|p| [p[0], p[0], p[0]]).collect(),
        DynamicImage::ImageRgb16(b) => b.iter().map(|&v| (v >> 8) as u8).collect(),
        DynamicImage::ImageRgba16(b) => b.chunks_exact(4).flat_map(|p| [p[0], p[1], p[2]]).map(|v| (v >> 8) as u8).collect(),
        DynamicImage::ImageLuma16(b) => b.iter().flat_map(|&v| [(v >> 8) as u8; 3]).collect(),
        DynamicImage::ImageLumaA16(b) => b.chunks_exact(2).flat_map(|p| [(p[0] >> 8) as u8; 3]).collect(),
        other => other.to_rgb8().into_raw(),
    };
    RgbImage { width, height, data }
}

/// Applies an EXIF orientation as Pillow's `ImageOps.exif_transpose` does: 2 mirror, 3 rotate
/// 180°, 4 flip, 5 transpose, 6 rotate 90° clockwise, 7 transverse, 8 rotate 90° counterclockwise.
pub(crate) fn orient(img: RgbImage, orientation: u8) -> RgbImage {
    if !(2..=8).contains(&orientation) {
        return img;
    }
    let (w, h) = (img.width, img.height);
    let swap = orientation >= 5;
    let (ow, oh) = if swap { (h, w) } else { (w, h) };
    let mut data = vec![0u8; img.data.len()];
    for y in 0..oh {
        for x in 0..ow {
            // The source pixel of output pixel (x, y).
            let (sx, sy) = match orientation {
                2 => (w - 1 - x, y),
                3 => (w - 1 - x, h - 1 - y),
                4 => (x, h - 1 - y),
                5 => (y, x),
                6 => (y, h - 1 - x),
                7 => (w - 1 - y, h - 1 - x),
                _ => (w - 1 - y, x), // 8
            };
            let (s, d) = ((sy * w + sx) * 3, (y * ow + x) * 3);
            data[d..d + 3].copy_from_slice(&img.data[s..s + 3]);
        }
    }
    RgbImage { width: ow, height: oh, data }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn image_orient_round_trips() {
        // 3 wide, 2 high, pixel value = index.
        let img = RgbImage { width: 3, height: 2, data: (0..18).collect() };
        let px = |i: &RgbImage| i.data.chunks(3).map(|p| p[0] / 3).collect::<Vec<_>>();
        assert_eq!(px(&orient(img.clone(), 1)), vec![0, 1, 2, 3, 4, 5]);
        assert_eq!(px(&orient(img.clone(), 2)), vec![2, 1, 0, 5, 4, 3]);
        assert_eq!(px(&orient(img.clone(), 3)), vec![5, 4, 3, 2, 1, 0]);
        assert_eq!(px(&orient(img.clone(), 4)), vec![3, 4, 5, 0, 1, 2]);
        assert_eq!(px(&orient(img.clone(), 5)), vec![0, 3, 1, 4, 2, 5]);
        assert_eq!(px(&orient(img.clone(), 6)), vec![3, 0, 4, 1, 5, 2]);
        assert_eq!(px(&orient(img.clone(), 7)), vec![5, 2, 4, 1, 3, 0]);
        assert_eq!(px(&orient(img.clone(), 8)), vec![2, 5, 1, 4, 0, 3]);
        assert_eq!((orient(img.clone(), 6).width, orient(img, 6).height), (2, 3));
    }

    #[test]
    fn image_decode_rejects_junk() {
        for (bytes, needle) in [(&b""[..], "empty"), (b"GIF89a....", "unsupported"), (b"\xFF\xD8\xFF\xE0", "cannot decode")] {
            match decode_image(bytes, "x.bin") {
                Err(Error::Image { file, msg }) => assert!(file == "x.bin" && msg.contains(needle), "{}", msg),
                other => panic!("{:?}", other.map(|i| (i.width, i.height))),
            }
        }
        // the first bytes in hex that reads as hex, with their text
        match decode_image(b"GIF89a\x01\x02", "x.gif") {
            Err(Error::Image { msg, .. }) => assert!(msg.contains(r#"bytes 0x47 0x49 0x46 0x38 0x39 0x61 0x01 0x02 ("GIF89a..")"#), "{}", msg),
            other => panic!("{:?}", other.map(|i| (i.width, i.height))),
        }
    }
}
