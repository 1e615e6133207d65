//! What is read from a still WebP's RIFF chunks around the `image` crate's decoder (image-webp):
//! the sizes it declares, before anything is decoded, so that the pixel limit is checked
//! against the largest buffer the decoder will allocate; and, for lossy files with alpha, the
//! color bitstream alone.

/// Width and height of a still WebP as its headers declare them: the larger of the extended
/// header's canvas (VP8X) and the bitstream's own frame header (they agree in a valid file, and
/// the decoder refuses a file where they differ, but only after decoding the bitstream at its
/// own size). Animations are refused (their frames each declare a size of their own).
pub(crate) fn dimensions(b: &[u8]) -> Result<(usize, usize), &'static str> {
    let (mut w, mut h) = (0usize, 0usize);
    let mut i = 12;
    while i + 8 <= b.len() {
        let len = u32::from_le_bytes([b[i + 4], b[i + 5], b[i + 6], b[i + 7]]) as usize;
        let data = b.get(i + 8..(i + 8).saturating_add(len)).ok_or("truncated WebP chunk")?;
        let u24 = |d: &[u8]| d[0] as usize | (d[1] as usize) << 8 | (d[2] as usize) << 16;
        match &b[i..i + 4] {
            b"ANIM" | b"ANMF" => return Err("animated WebP is not supported as an image (send it as a video)"),
            b"VP8X" if data.len() >= 10 => {
                w = w.max(u24(&data[4..7]) + 1);
                h = h.max(u24(&data[7..10]) + 1);
            }
            b"VP8 " => {
                if data.len() < 10 || data[3..6] != [0x9d, 0x01, 0x2a] {
                    return Err("the VP8 frame header is missing or malformed");
                }
                let dim = |lo: u8, hi: u8| usize::from(u16::from_le_bytes([lo, hi]) & 0x3fff);
                return Ok((w.max(dim(data[6], data[7])), h.max(dim(data[8], data[9]))));
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

/// For a still lossy WebP with an alpha channel (VP8X + ALPH + VP8): a simple-format file of
/// its VP8 chunk alone. The alpha is dropped after decoding anyway (`convert("RGB")`) and does
/// not change the color samples, so the decoder is spared the alpha plane and the RGBA buffer.
/// `None` for every other file, which is decoded as it is.
pub(crate) fn without_alpha(b: &[u8]) -> Option<Vec<u8>> {
    let (mut alph, mut i) = (false, 12usize);
    while let Some(head) = b.get(i..i + 8) {
        let len = u32::from_le_bytes([head[4], head[5], head[6], head[7]]) as usize;
        let chunk = b.get(i..(i + 8).checked_add(len)?)?;
        match &head[..4] {
            b"ALPH" => alph = true,
            b"VP8 " if alph => {
                let mut f = Vec::with_capacity(12 + chunk.len() + 1);
                f.extend_from_slice(b"RIFF");
                f.extend_from_slice(&u32::try_from(4 + chunk.len() + (len & 1)).ok()?.to_le_bytes());
                f.extend_from_slice(b"WEBP");
                f.extend_from_slice(chunk);
                f.resize(f.len() + (len & 1), 0);
                return Some(f);
            }
            b"VP8 " | b"VP8L" | b"ANIM" | b"ANMF" => return None,
            _ => {}
        }
        i = i.checked_add(8 + len + (len & 1))?;
    }
    None
}
