//! Multimodal rotary positions (transformers' `get_rope_index` for images): text continues 1-D;
//! an image's tokens get `(t = base, h = base + row, w = base + col)` over its merged grid; the
//! text after it starts at `base + max(grid_h, grid_w)`-ish, precisely `max position + 1`.

use super::rope::Pos3;
use crate::{Error, Result};

/// Positions of `ids` whose image tokens (runs of `image_token_id`) belong, in order, to images
/// with patch grids `grids` merged by `merge`; numbering starts at `start`. Returns the positions
/// and the position of the next token (max + 1).
pub fn multimodal_positions(ids: &[u32], image_token_id: u32, grids: &[[usize; 3]], merge: usize, start: u32) -> Result<(Vec<Pos3>, u32)> {
    let mut pos = Vec::with_capacity(ids.len());
    let mut next = start; // max position so far + 1
    let mut st = 0usize;
    for (k, g) in grids.iter().enumerate() {
        let (gt, gh, gw) = (g[0], g[1] / merge, g[2] / merge);
        let n = gt * gh * gw;
        let ed = ids[st..].iter().position(|&t| t == image_token_id).map(|i| i + st).ok_or_else(|| Error::Tokenizer {
            msg: format!("the prompt has fewer image placeholders than images (image {} of {} has none)", k + 1, grids.len()),
        })?;
        if ed + n > ids.len() || ids[ed..ed + n].iter().any(|&t| t != image_token_id) {
            return Err(Error::Tokenizer { msg: format!("image {} needs {} consecutive image tokens at position {}", k + 1, n, ed) });
        }
        for i in 0..(ed - st) as u32 {
            pos.push([next + i; 3]);
        }
        let base = next + (ed - st) as u32;
        for t in 0..gt {
            for r in 0..gh {
                for c in 0..gw {
                    pos.push([base + t as u32, base + r as u32, base + c as u32]);
                }
            }
        }
        next = base + (gt.max(gh).max(gw)) as u32;
        st = ed + n;
    }
    if ids[st..].contains(&image_token_id) {
        return Err(Error::Tokenizer { msg: format!("the prompt has more image tokens than the {} image(s) fill", grids.len()) });
    }
    for i in 0..(ids.len() - st) as u32 {
        pos.push([next + i; 3]);
    }
    next += (ids.len() - st) as u32;
    Ok((pos, next))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn image_positions_follow_the_grid_and_text_resumes_after_the_max() {
        // text(2) image(grid 1x4x6 -> merged 2x3 = 6 tokens) text(2)
        let img = 9;
        let ids = [1, 2, img, img, img, img, img, img, 3, 4];
        let (p, next) = multimodal_positions(&ids, img, &[[1, 4, 6]], 2, 0).unwrap();
        assert_eq!(&p[..2], &[[0, 0, 0], [1, 1, 1]]);
        assert_eq!(&p[2..8], &[[2, 2, 2], [2, 2, 3], [2, 2, 4], [2, 3, 2], [2, 3, 3], [2, 3, 4]]);
        assert_eq!(&p[8..], &[[5, 5, 5], [6, 6, 6]]);
        assert_eq!(next, 7);
    }

    #[test]
    fn text_only_is_one_dimensional_and_mismatches_are_errors() {
        let (p, next) = multimodal_positions(&[5, 6, 7], 9, &[], 2, 10).unwrap();
        assert_eq!(p, vec![[10; 3], [11; 3], [12; 3]]);
        assert_eq!(next, 13);
        assert!(multimodal_positions(&[1, 9, 9], 9, &[[1, 4, 4]], 2, 0).is_err()); // needs 4 tokens
        assert!(multimodal_positions(&[1, 2], 9, &[[1, 2, 2]], 2, 0).is_err()); // no placeholder
        assert!(multimodal_positions(&[9], 9, &[], 2, 0).is_err()); // placeholder without image
    }
}
