//! Metadata that changes pixels: the EXIF orientation, and a PNG's transparent color key.
//!
//! The orientation is found where Pillow's `Image.getexif()` looks for it: the first `Exif`
//! APP1 segment of a JPEG, the `eXIf` chunk of a PNG, the `EXIF` chunk of a WebP; and, as
//! Pillow does when the EXIF has no orientation, `tiff:Orientation` in the XMP packet (JPEG APP1
//! `http://ns.adobe.com/xap/1.0/`, uncompressed PNG iTXt `XML:com.adobe.xmp`, WebP `XMP `
//! chunk). Anything malformed counts as no orientation.

use super::format::Format;

/// The EXIF orientation tag.
const ORIENTATION: u16 = 0x0112;

/// The orientation (1 to 8) recorded in the file, 1 when there is none or it is not 1 to 8.
pub(crate) fn orientation(bytes: &[u8], format: Format) -> u8 {
    let (exif, xmp) = match format {
        Format::Jpeg => jpeg_segments(bytes),
        Format::Png => png_chunks(bytes),
        Format::WebP => webp_chunks(bytes),
    };
    let value = exif.and_then(tiff_orientation).or_else(|| xmp.and_then(xmp_orientation));
    match value {
        Some(v @ 1..=8) => v as u8,
        _ => 1,
    }
}

/// The payloads of the first EXIF and first XMP APP1 segments before the image data.
fn jpeg_segments(b: &[u8]) -> (Option<&[u8]>, Option<&[u8]>) {
    const XMP: &[u8] = b"http://ns.adobe.com/xap/1.0/\0";
    let (mut exif, mut xmp) = (None, None);
    let mut i = 2;
    while i + 4 <= b.len() {
        if b[i] != 0xFF {
            break;
        }
        let marker = b[i + 1];
        if marker == 0xFF {
            i += 1; // fill byte
            continue;
        }
        if marker == 0x01 || (0xD0..=0xD8).contains(&marker) {
            i += 2; // no length
            continue;
        }
        if marker == 0xDA || marker == 0xD9 {
            break; // start of scan / end of image
        }
        let len = u16::from_be_bytes([b[i + 2], b[i + 3]]) as usize;
        if len < 2 || i + 2 + len > b.len() {
            break;
        }
        let payload = &b[i + 4..i + 2 + len];
        if marker == 0xE1 {
            if exif.is_none() && payload.starts_with(b"Exif\0\0") {
                exif = Some(payload);
            } else if xmp.is_none() && payload.starts_with(XMP) {
                xmp = Some(&payload[XMP.len()..]);
            }
        }
        i += 2 + len;
    }
    (exif, xmp)
}

/// The color that transformers paints white in a PNG with a tRNS color key.
///
/// `load_image` keeps Pillow's `info["transparency"]` through `convert("RGB")`, so the
/// processor's `convert_to_rgb` sees a transparent image and composites it on white: every pixel
/// of the key color turns white (255, 255, 255). Pillow's key is: for palettes, the color of the
/// one fully transparent entry when tRNS is otherwise all opaque (other palette tRNS are dropped
/// with a warning); for 8-bit-or-less gray, the raw tRNS value repeated (compared with the
/// scaled pixels); for 1-bit gray, black if tRNS is 0; for RGB, the raw tRNS triple (which only
/// matches with values up to 255). 16-bit gray has none (Pillow's "I;16" path differs anyway).
pub(crate) fn png_color_key(b: &[u8]) -> Option<[u8; 3]> {
    let (mut ihdr, mut plte, mut trns) = (None, None, None);
    let mut i = 8;
    while i + 8 <= b.len() {
        let len = u32::from_be_bytes([b[i], b[i + 1], b[i + 2], b[i + 3]]) as usize;
        let data = b.get(i + 8..(i + 8).checked_add(len)?)?;
        match &b[i + 4..i + 8] {
            b"IHDR" => ihdr = Some(data),
            b"PLTE" => plte = Some(data),
            b"tRNS" => trns = Some(data),
            b"IDAT" | b"IEND" => break,
            _ => {}
        }
        i += 12 + len;
    }
    let (ihdr, trns) = (ihdr.filter(|h| h.len() >= 10)?, trns?);
    let (depth, color_type) = (ihdr[8], ihdr[9]);
    let word = |k: usize| trns.get(2 * k..2 * k + 2).map(|s| u16::from_be_bytes([s[0], s[1]]));
    let byte = |v: u16| u8::try_from(v).ok();
    match color_type {
        3 => {
            let zero = trns.iter().position(|&a| a == 0)?;
            if trns.iter().enumerate().any(|(k, &a)| k != zero && a != 255) {
                return None;
            }
            let c = plte?.get(3 * zero..3 * zero + 3)?;
            Some([c[0], c[1], c[2]])
        }
        0 if depth == 1 => (word(0)? == 0).then(|| [0, 0, 0]),
        0 if depth <= 8 => byte(word(0)?).map(|t| [t; 3]),
        2 => Some([byte(word(0)?)?, byte(word(1)?)?, byte(word(2)?)?]),
        _ => None,
    }
}

/// The `eXIf` chunk and the uncompressed `XML:com.adobe.xmp` iTXt chunk, anywhere in the file.
fn png_chunks(b: &[u8]) -> (Option<&[u8]>, Option<&[u8]>) {
    const XMP_KEY: &[u8] = b"XML:com.adobe.xmp\0";
    let (mut exif, mut xmp) = (None, None);
    let mut i = 8;
    while i + 8 <= b.len() {
        let len = u32::from_be_bytes([b[i], b[i + 1], b[i + 2], b[i + 3]]) as usize;
        let kind = &b[i + 4..i + 8];
        let end = match (i + 8).checked_add(len) {
            Some(end) if end <= b.len() => end,
            _ => break,
        };
        let data = &b[i + 8..end];
        if kind == b"eXIf" && exif.is_none() {
            exif = Some(data);
        } else if kind == b"iTXt" && xmp.is_none() && data.starts_with(XMP_KEY) {
            // keyword\0, compression flag, method, language tag\0, translated keyword\0, text
            let rest = &data[XMP_KEY.len()..];
            if rest.len() >= 2 && rest[0] == 0 {
                let mut nul = rest[2..].splitn(3, |&c| c == 0);
                if let (Some(_), Some(_), Some(text)) = (nul.next(), nul.next(), nul.next()) {
                    xmp = Some(text);
                }
            }
        }
        if kind == b"IEND" {
            break;
        }
        i = end + 4; // crc
    }
    (exif, xmp)
}

/// The `EXIF` and `XMP ` chunks of a RIFF WebP file.
fn webp_chunks(b: &[u8]) -> (Option<&[u8]>, Option<&[u8]>) {
    let (mut exif, mut xmp) = (None, None);
    let mut i = 12;
    while i + 8 <= b.len() {
        let len = u32::from_le_bytes([b[i + 4], b[i + 5], b[i + 6], b[i + 7]]) as usize;
        let end = match (i + 8).checked_add(len) {
            Some(end) if end <= b.len() => end,
            _ => break,
        };
        match &b[i..i + 4] {
            b"EXIF" if exif.is_none() => exif = Some(&b[i + 8..end]),
            b"XMP " if xmp.is_none() => xmp = Some(&b[i + 8..end]),
            _ => {}
        }
        i = end + (len & 1); // chunks are padded to even sizes
    }
    (exif, xmp)
}

/// The orientation tag of IFD0 of a TIFF-structured EXIF block (with or without the
/// `Exif\0\0` prefix).
fn tiff_orientation(data: &[u8]) -> Option<u32> {
    let t = data.strip_prefix(b"Exif\0\0").unwrap_or(data);
    let big = match t.get(0..4)? {
        b"II*\0" => false,
        b"MM\0*" => true,
        _ => return None,
    };
    let u16_at = |o: usize| -> Option<u16> {
        let s = t.get(o..o.checked_add(2)?)?;
        Some(if big { u16::from_be_bytes([s[0], s[1]]) } else { u16::from_le_bytes([s[0], s[1]]) })
    };
    let u32_at = |o: usize| -> Option<u32> {
        let s = t.get(o..o.checked_add(4)?)?;
        let a = [s[0], s[1], s[2], s[3]];
        Some(if big { u32::from_be_bytes(a) } else { u32::from_le_bytes(a) })
    };
    let ifd = u32_at(4)? as usize;
    let count = u16_at(ifd)? as usize;
    for n in 0..count {
        let entry = ifd + 2 + n * 12;
        if u16_at(entry)? != ORIENTATION {
            continue;
        }
        return match u16_at(entry + 2)? {
            3 => u16_at(entry + 8).map(u32::from), // SHORT
            4 => u32_at(entry + 8),                // LONG
            _ => None,
        };
    }
    None
}

/// The digit after `tiff:Orientation="` or `tiff:Orientation>` in an XMP packet.
fn xmp_orientation(xmp: &[u8]) -> Option<u32> {
    const KEY: &[u8] = b"tiff:Orientation";
    let mut start = 0;
    while let Some(pos) = find(&xmp[start..], KEY) {
        let after = start + pos + KEY.len();
        let digit = match xmp.get(after..) {
            Some([b'=', b'"', d, ..]) | Some([b'>', d, ..]) => Some(*d),
            _ => None,
        };
        if let Some(d @ b'0'..=b'9') = digit {
            return Some(u32::from(d - b'0'));
        }
        start = after;
    }
    None
}

fn find(haystack: &[u8], needle: &[u8]) -> Option<usize> {
    haystack.windows(needle.len()).position(|w| w == needle)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tiff(big: bool, value: u16) -> Vec<u8> {
        let mut t = Vec::new();
        let w16 = |t: &mut Vec<u8>, v: u16| t.extend_from_slice(&if big { v.to_be_bytes() } else { v.to_le_bytes() });
        t.extend_from_slice(if big { b"MM\0*" } else { b"II*\0" });
        t.extend_from_slice(&if big { 8u32.to_be_bytes() } else { 8u32.to_le_bytes() });
        w16(&mut t, 2); // entries
        for &(tag, v) in &[(0x010F_u16, 7_u16), (ORIENTATION, value)] {
            w16(&mut t, tag);
            w16(&mut t, 3);
            t.extend_from_slice(&if big { 1u32.to_be_bytes() } else { 1u32.to_le_bytes() });
            w16(&mut t, v);
            w16(&mut t, 0);
        }
        t
    }

    #[test]
    fn image_exif_tiff_both_byte_orders() {
        assert_eq!(tiff_orientation(&tiff(false, 6)), Some(6));
        assert_eq!(tiff_orientation(&tiff(true, 8)), Some(8));
        let mut prefixed = b"Exif\0\0".to_vec();
        prefixed.extend(tiff(true, 3));
        assert_eq!(tiff_orientation(&prefixed), Some(3));
        assert_eq!(tiff_orientation(&tiff(false, 6)[..20]), None);
        assert_eq!(tiff_orientation(b"garbage"), None);
    }

    #[test]
    fn image_exif_xmp() {
        assert_eq!(xmp_orientation(b"<x tiff:Orientation=\"6\"/>"), Some(6));
        assert_eq!(xmp_orientation(b"<tiff:Orientation>3</tiff:Orientation>"), Some(3));
        assert_eq!(xmp_orientation(b"tiff:Orientation tiff:Orientation=\"x\""), None);
    }

    #[test]
    fn image_exif_jpeg_segments() {
        let mut j = vec![0xFF, 0xD8, 0xFF, 0xE0, 0, 4, 0, 0, 0xFF, 0xE1];
        let mut payload = b"Exif\0\0".to_vec();
        payload.extend(tiff(false, 5));
        j.extend_from_slice(&((payload.len() + 2) as u16).to_be_bytes());
        j.extend(payload);
        j.extend_from_slice(&[0xFF, 0xDA, 0, 2]);
        assert_eq!(orientation(&j, Format::Jpeg), 5);
        assert_eq!(orientation(&j[..12], Format::Jpeg), 1);
    }
}
