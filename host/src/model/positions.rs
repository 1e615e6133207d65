//! Multimodal rotary positions (transformers' `get_rope_index` for Qwen3-VL): text continues
//! 1-D; an image's tokens get `(t = base, h = base + row, w = base + col)` over its merged grid,
//! and the text after it starts at `max position + 1`. A video of `t` temporal patches is `t`
//! such grids of one temporal patch each (transformers splits `video_grid_thw` the same way):
//! its frames' placeholder runs are separated by their timestamps and vision markers, which are
//! text.

use super::rope::Pos3;
use crate::{Error, Result};

/// The placeholder token ids of vision inputs: `<|image_pad|>` and `<|video_pad|>`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct VisionTokens {
    pub image: u32,
    pub video: u32,
}

impl VisionTokens {
    /// Whether `t` is an image or a video placeholder.
    pub fn is_vision(&self, t: u32) -> bool {
        t == self.image || t == self.video
    }
}

/// Positions of `ids` whose vision placeholders belong, in order, to the images and videos of
/// patch grids `grids` (t, h, w) merged by `merge`; numbering starts at `start`. An item placed
/// at a run of image tokens takes `t·h·w / merge²` consecutive image tokens; one placed at video
/// tokens takes `t` runs of `h·w / merge²` video tokens (one per temporal patch), with any text
/// between them. Returns the positions and the position of the next token (max + 1). Errors
/// ([`Error::Tokenizer`]) when the placeholders and the grids disagree.
pub fn multimodal_positions(ids: &[u32], vt: VisionTokens, grids: &[[usize; 3]], merge: usize, start: u32) -> Result<(Vec<Pos3>, u32)> {
    let mut pos = Vec::with_capacity(ids.len());
    let mut next = start; // max position so far + 1
    let mut st = 0usize;
    let text = |pos: &mut Vec<Pos3>, next: &mut u32, n: usize| {
        for i in 0..n as u32 {
            pos.push([*next + i; 3]);
        }
        *next += n as u32;
    };
    for (k, g) in grids.iter().enumerate() {
        let (gt, gh, gw) = (g[0], g[1] / merge, g[2] / merge);
        let ed = ids[st..].iter().position(|&t| vt.is_vision(t)).map(|i| i + st).ok_or_else(|| Error::Tokenizer {
            msg: format!("the prompt has fewer vision placeholders than images and videos (item {} of {} has none)", k + 1, grids.len()),
        })?;
        let token = ids[ed];
        // an image is one run of all its tokens; a video one run per temporal patch
        let (runs, per_run, grid_t) = if token == vt.image { (1, gt * gh * gw, gt) } else { (gt, gh * gw, 1) };
        let what = if token == vt.image { "image" } else { "video" };
        for run in 0..runs {
            let ed = if run == 0 {
                ed
            } else {
                ids[st..].iter().position(|&t| vt.is_vision(t)).map(|i| i + st).ok_or_else(|| Error::Tokenizer {
                    msg: format!("{} {} needs {} runs of {} video tokens; the prompt has {}", what, k + 1, runs, per_run, run),
                })?
            };
            if ed + per_run > ids.len() || ids[ed..ed + per_run].iter().any(|&t| t != token) {
                return Err(Error::Tokenizer { msg: format!("{} {} needs {} consecutive {} tokens at position {}", what, k + 1, per_run, what, ed) });
            }
            text(&mut pos, &mut next, ed - st);
            let base = next;
            for t in 0..grid_t {
                for r in 0..gh {
                    for c in 0..gw {
                        pos.push([base + t as u32, base + r as u32, base + c as u32]);
                    }
                }
            }
            next = base + (grid_t.max(gh).max(gw)) as u32;
            st = ed + per_run;
        }
    }
    if ids[st..].iter().any(|&t| vt.is_vision(t)) {
        return Err(Error::Tokenizer { msg: format!("the prompt has more vision placeholders than the {} image(s) and video(s) fill", grids.len()) });
    }
    text(&mut pos, &mut next, ids.len() - st);
    Ok((pos, next))
}

#[cfg(test)]
mod tests {
    use super::*;

    const VT: VisionTokens = VisionTokens { image: 9, video: 8 };

    #[test]
    fn image_positions_follow_the_grid_and_text_resumes_after_the_max() {
        // text(2) image(grid 1x4x6 -> merged 2x3 = 6 tokens) text(2)
        let img = 9;
        let ids = [1, 2, img, img, img, img, img, img, 3, 4];
        let (p, next) = multimodal_positions(&ids, VT, &[[1, 4, 6]], 2, 0).unwrap();
        assert_eq!(&p[..2], &[[0, 0, 0], [1, 1, 1]]);
        assert_eq!(&p[2..8], &[[2, 2, 2], [2, 2, 3], [2, 2, 4], [2, 3, 2], [2, 3, 3], [2, 3, 4]]);
        assert_eq!(&p[8..], &[[5, 5, 5], [6, 6, 6]]);
        assert_eq!(next, 7);
    }

    #[test]
    fn text_only_is_one_dimensional_and_mismatches_are_errors() {
        let (p, next) = multimodal_positions(&[5, 6, 7], VT, &[], 2, 10).unwrap();
        assert_eq!(p, vec![[10; 3], [11; 3], [12; 3]]);
        assert_eq!(next, 13);
        assert!(multimodal_positions(&[1, 9, 9], VT, &[[1, 4, 4]], 2, 0).is_err()); // needs 4 tokens
        assert!(multimodal_positions(&[1, 2], VT, &[[1, 2, 2]], 2, 0).is_err()); // no placeholder
        assert!(multimodal_positions(&[9], VT, &[], 2, 0).is_err()); // placeholder without image
    }

    #[test]
    fn a_video_is_one_grid_per_temporal_patch_with_text_between() {
        // text(1), video of grid 2x2x4 (merged 1x2 = 2 tokens per temporal patch): each patch's
        // run after 2 timestamp tokens, then text(1)
        let v = 8;
        let ids = [1, 50, 51, v, v, 52, 53, v, v, 2];
        let (p, next) = multimodal_positions(&ids, VT, &[[2, 2, 4]], 2, 0).unwrap();
        assert_eq!(&p[..3], &[[0; 3], [1; 3], [2; 3]]);
        assert_eq!(&p[3..5], &[[3, 3, 3], [3, 3, 4]]);
        assert_eq!(&p[5..7], &[[5; 3], [6; 3]]); // after max(1, 1, 2) = 2
        assert_eq!(&p[7..9], &[[7, 7, 7], [7, 7, 8]]);
        assert_eq!(&p[9..], &[[9; 3]]);
        assert_eq!(next, 10);
        // a video needs every run; an image grid cannot take video runs of another length
        assert!(multimodal_positions(&ids[..6], VT, &[[2, 2, 4]], 2, 0).is_err());
        assert!(multimodal_positions(&[1, v, v, v, 2], VT, &[[2, 2, 4]], 2, 0).is_err());
        // an image then a video, in prompt order
        let mixed = [9, 9, 1, v, v, 3, v, v];
        let (p, _) = multimodal_positions(&mixed, VT, &[[1, 2, 4], [2, 2, 4]], 2, 0).unwrap();
        assert_eq!(p[2], [2; 3]);
        assert_eq!(&p[3..5], &[[3, 3, 3], [3, 3, 4]]);
        assert_eq!(p[5], [5; 3]);
        assert_eq!(&p[6..8], &[[6, 6, 6], [6, 6, 7]]);
    }
}
