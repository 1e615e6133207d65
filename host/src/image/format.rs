//! Which container format an encoded image is in, told from its first bytes (not its name).
//! Both the decoder (`decode.rs`) and the metadata readers (`meta.rs`) use it.

use crate::{Error, Result};

/// The container formats that are read; recognized by content, not by file name.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Format {
    Jpeg,
    Png,
    WebP,
}

impl Format {
    fn sniff(b: &[u8]) -> Option<Format> {
        if b.starts_with(&[0xFF, 0xD8, 0xFF]) {
            Some(Format::Jpeg)
        } else if b.starts_with(b"\x89PNG\r\n\x1a\n") {
            Some(Format::Png)
        } else if b.len() >= 12 && &b[0..4] == b"RIFF" && &b[8..12] == b"WEBP" {
            Some(Format::WebP)
        } else {
            None
        }
    }

    /// The `image` crate's name for it.
    pub(crate) fn image_format(self) -> ::image::ImageFormat {
        match self {
            Format::Jpeg => ::image::ImageFormat::Jpeg,
            Format::Png => ::image::ImageFormat::Png,
            Format::WebP => ::image::ImageFormat::WebP,
        }
    }
}

/// The first bytes of a file in words: `0x47 0x49 0x46 0x38 ("GIF8")`, printable ASCII
/// shown as is and the rest as `.`.
fn head_bytes(bytes: &[u8]) -> String {
    let head = &bytes[..bytes.len().min(8)];
    let hex: Vec<String> = head.iter().map(|b| format!("0x{:02x}", b)).collect();
    let text: String = head.iter().map(|&b| if (0x20..0x7f).contains(&b) { b as char } else { '.' }).collect();
    format!("bytes {} ({:?})", hex.join(" "), text)
}

/// The format of `bytes`, or an error saying what they start with.
pub(crate) fn sniff_or_fail(bytes: &[u8], name: &str) -> Result<Format> {
    let fail = |msg: String| Error::Image { file: name.to_string(), msg };
    if bytes.is_empty() {
        return Err(fail("empty file".into()));
    }
    Format::sniff(bytes).ok_or_else(|| fail(format!("unsupported image format (not JPEG, PNG or WebP; starts with {})", head_bytes(bytes))))
}
