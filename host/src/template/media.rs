//! The placeholders a template writes for images and videos, expanded as Qwen3-VL's processor
//! expands them: the n-th `<|image_pad|>` becomes that image's count of `<|image_pad|>`
//! tokens; the n-th `<|video_pad|>` becomes, per temporal patch, `<{t:.1f} seconds>` and
//! `<|vision_start|><|video_pad|>×N<|vision_end|>` (inside the template's own
//! `<|vision_start|>` ... `<|vision_end|>` pair, as [`crate::generate::chat`] renders it).

use crate::generate::chat::Media;

pub const IMAGE_PAD: &str = "<|image_pad|>";
pub const VIDEO_PAD: &str = "<|video_pad|>";
/// What a template writes for one image.
pub const IMAGE_PLACEHOLDER: &str = "<|vision_start|><|image_pad|><|vision_end|>";
/// What a template writes for one video.
pub const VIDEO_PLACEHOLDER: &str = "<|vision_start|><|video_pad|><|vision_end|>";

/// The rendered text's placeholders do not match the images and videos sent (the text itself
/// holds `<|image_pad|>` or `<|video_pad|>`, or the template dropped an image).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Mismatch {
    pub images_in_text: usize,
    pub images: usize,
    pub videos_in_text: usize,
    pub videos: usize,
}

impl std::fmt::Display for Mismatch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
"the rendered prompt holds {} {} and {} {} for {} image(s) and {} video(s): images must be sent as image_url parts, videos as video_url parts, not as these tokens in the text",
            self.images_in_text, IMAGE_PAD, self.videos_in_text, VIDEO_PAD, self.images, self.videos
        )
    }
}

/// `text` with each placeholder expanded for `media` (in order of appearance; images and videos
/// are matched to their own placeholders in order).
pub fn expand(text: &str, media: &[Media]) -> Result<String, Mismatch> {
    let images: Vec<usize> = media.iter().filter_map(|m| if let Media::Image(n) = m { Some(*n) } else { None }).collect();
    let videos: Vec<&crate::generate::chat::VideoPrompt> = media.iter().filter_map(|m| if let Media::Video(v) = m { Some(v) } else { None }).collect();
    let mismatch = Mismatch { images_in_text: text.matches(IMAGE_PAD).count(), images: images.len(), videos_in_text: text.matches(VIDEO_PAD).count(), videos: videos.len() };
    if mismatch.images_in_text != mismatch.images || mismatch.videos_in_text != mismatch.videos {
        return Err(mismatch);
    }
    if media.is_empty() {
        return Ok(text.to_string());
    }
    let extra: usize = media.iter().map(|m| m.tokens() * VIDEO_PAD.len() + 64 * if let Media::Video(v) = m { v.timestamps.len() } else { 0 }).sum();
    let mut out = String::with_capacity(text.len() + extra);
    let (mut img, mut vid) = (images.iter(), videos.iter());
    let mut rest = text;
    loop {
        let next_image = rest.find(IMAGE_PAD);
        let next_video = rest.find(VIDEO_PAD);
        let (at, is_video) = match (next_image, next_video) {
            (None, None) => break,
            (Some(i), None) => (i, false),
            (None, Some(v)) => (v, true),
            (Some(i), Some(v)) => if i < v { (i, false) } else { (v, true) },
        };
        out.push_str(&rest[..at]);
        if is_video {
            let v = vid.next().expect("counted");
            for &t in &v.timestamps {
                out.push_str(&crate::video::timestamp_text(t));
                out.push_str("<|vision_start|>");
                for _ in 0..v.tokens_per_frame {
                    out.push_str(VIDEO_PAD);
                }
                out.push_str("<|vision_end|>");
            }
            rest = &rest[at + VIDEO_PAD.len()..];
        } else {
            let n = *img.next().expect("counted");
            for _ in 0..n {
                out.push_str(IMAGE_PAD);
            }
            rest = &rest[at + IMAGE_PAD.len()..];
        }
    }
    out.push_str(rest);
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::generate::chat::{render, Message, VideoPrompt};

    #[test]
    fn expands_as_the_built_in_format_renders() {
        let v = VideoPrompt { timestamps: vec![0.25, 1.0], tokens_per_frame: 2 };
        let media = vec![Media::Image(3), Media::Video(v), Media::Image(1)];
        let text = format!("<|im_start|>user\n{i}a{v}b{i}c<|im_end|>\n<|im_start|>assistant\n", i = IMAGE_PLACEHOLDER, v = VIDEO_PLACEHOLDER);
        // the built-in format puts the media first; compare piecewise with its own rendering
        let mut m = Message::user("x");
        m.media = media.clone();
        let builtin = render(&[m], true);
        let ours = expand(&text, &media).unwrap();
        let strip = |s: &str| s.replace(['a', 'b', 'c', 'x'], "");
        assert_eq!(strip(&ours), strip(&builtin));
        assert!(ours.contains("<|vision_start|><0.2 seconds><|vision_start|><|video_pad|><|video_pad|><|vision_end|><1.0 seconds>"), "{}", ours);
    }

    #[test]
    fn a_pad_in_the_text_is_a_mismatch() {
        let e = expand(&format!("{}{}", IMAGE_PLACEHOLDER, IMAGE_PAD), &[Media::Image(2)]).unwrap_err();
        assert_eq!((e.images_in_text, e.images), (2, 1));
        assert!(expand("<|video_pad|>", &[]).is_err());
        assert_eq!(expand("plain", &[]).unwrap(), "plain");
    }
}
