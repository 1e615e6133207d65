//! The prompt format of Qwen3-VL's chat template (as transformers renders it): an optional
//! system turn, user turns whose images and videos come first (an image as
//! `<|vision_start|><|image_pad|>×N<|vision_end|>`, a video as the processor expands the
//! template's `<|vision_start|><|video_pad|><|vision_end|>`: see [`Content::Video`]), and the
//! assistant's opening.

/// Who speaks a turn.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Role {
    System,
    User,
    Assistant,
}

impl Role {
    fn tag(self) -> &'static str {
        match self {
            Role::System => "system",
            Role::User => "user",
            Role::Assistant => "assistant",
        }
    }
}

/// One turn: text, and for user turns the images and videos attached before it, in order.
#[derive(Clone, Debug, PartialEq)]
pub struct Message {
    pub role: Role,
    pub media: Vec<Media>,
    pub text: String,
}

/// An attachment's placeholder: an image of so many `<|image_pad|>` tokens, or a video.
#[derive(Clone, Debug, PartialEq)]
pub enum Media {
    Image(usize),
    Video(VideoPrompt),
}

/// What a video's placeholder needs: each temporal patch's time and its token count.
#[derive(Clone, Debug, PartialEq)]
pub struct VideoPrompt {
    /// Seconds of each temporal patch.
    pub timestamps: Vec<f64>,
    /// `<|video_pad|>` tokens per temporal patch.
    pub tokens_per_frame: usize,
}

impl Media {
    /// The placeholder tokens it stands for in the prompt.
    pub fn tokens(&self) -> usize {
        match self {
            Media::Image(n) => *n,
            Media::Video(v) => v.timestamps.len() * v.tokens_per_frame,
        }
    }
}

impl Message {
    pub fn system(text: &str) -> Message {
        Message { role: Role::System, media: vec![], text: text.into() }
    }
    pub fn user(text: &str) -> Message {
        Message { role: Role::User, media: vec![], text: text.into() }
    }
    pub fn assistant(text: &str) -> Message {
        Message { role: Role::Assistant, media: vec![], text: text.into() }
    }
}

/// Renders one turn: `<|im_start|>{role}\n{images}{text}<|im_end|>\n`.
pub fn render_turn(m: &Message) -> String {
    let mut parts: Vec<Content<'_>> = m
        .media
        .iter()
        .map(|x| match x {
            Media::Image(n) => Content::Image(*n),
            Media::Video(v) => Content::Video(v),
        })
        .collect();
    parts.push(Content::Text(&m.text));
    render_turn_parts(m.role, &parts)
}

/// A piece of a turn's content: text, an image of so many `<|image_pad|>` tokens, or a video.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Content<'a> {
    Text(&'a str),
    Image(usize),
    /// `<|vision_start|>`, then per temporal patch `<{t:.1f} seconds><|vision_start|>
    /// <|video_pad|>×N<|vision_end|>`, then `<|vision_end|>`: the template's outer pair kept
    /// around the processor's expansion, as `Qwen3VLProcessor` renders it.
    Video(&'a VideoPrompt),
}

/// Renders one turn whose texts and images interleave, in order, as the template renders a
/// content list: `<|im_start|>{role}\n{parts}<|im_end|>\n`, an image being
/// `<|vision_start|><|image_pad|>×N<|vision_end|>`.
pub fn render_turn_parts(role: Role, parts: &[Content<'_>]) -> String {
    let mut s = format!("<|im_start|>{}\n", role.tag());
    for part in parts {
        match *part {
            Content::Text(t) => s.push_str(t),
            Content::Image(n) => {
                s.push_str("<|vision_start|>");
                for _ in 0..n {
                    s.push_str("<|image_pad|>");
                }
                s.push_str("<|vision_end|>");
            }
            Content::Video(v) => {
                s.push_str("<|vision_start|>");
                for &t in &v.timestamps {
                    s.push_str(&crate::video::timestamp_text(t));
                    s.push_str("<|vision_start|>");
                    for _ in 0..v.tokens_per_frame {
                        s.push_str("<|video_pad|>");
                    }
                    s.push_str("<|vision_end|>");
                }
                s.push_str("<|vision_end|>");
            }
        }
    }
    s.push_str("<|im_end|>\n");
    s
}

/// The opening of the assistant's reply that generation continues from.
pub const GENERATION_PROMPT: &str = "<|im_start|>assistant\n";

/// Renders a conversation and, with `add_generation_prompt`, the assistant's opening.
pub fn render(messages: &[Message], add_generation_prompt: bool) -> String {
    let mut s: String = messages.iter().map(render_turn).collect();
    if add_generation_prompt {
        s.push_str(GENERATION_PROMPT);
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renders_like_the_qwen3_vl_template() {
        let mut u = Message::user("What is this?");
        u.media = vec![Media::Image(2)];
        assert_eq!(
            render(&[u], true),
            "<|im_start|>user\n<|vision_start|><|image_pad|><|image_pad|><|vision_end|>What is this?<|im_end|>\n<|im_start|>assistant\n"
        );
        assert_eq!(
            render(&[Message::system("Be brief."), Message::user("Hi"), Message::assistant("Hello!"), Message::user("Bye")], true),
            "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\nHello!<|im_end|>\n<|im_start|>user\nBye<|im_end|>\n<|im_start|>assistant\n"
        );
    }

    #[test]
    fn content_parts_render_in_order() {
        assert_eq!(
            render_turn_parts(Role::User, &[Content::Text("A "), Content::Image(1), Content::Text(" B")]),
            "<|im_start|>user\nA <|vision_start|><|image_pad|><|vision_end|> B<|im_end|>\n"
        );
    }

    #[test]
    fn a_video_renders_its_timestamps_inside_the_outer_pair() {
        let v = VideoPrompt { timestamps: vec![0.25, 1.0], tokens_per_frame: 2 };
        let mut u = Message::user("?");
        u.media = vec![Media::Video(v)];
        let pad = "<|video_pad|><|video_pad|>";
        assert_eq!(
            render_turn(&u),
            format!("<|im_start|>user\n<|vision_start|><0.2 seconds><|vision_start|>{p}<|vision_end|><1.0 seconds><|vision_start|>{p}<|vision_end|><|vision_end|>?<|im_end|>\n", p = pad)
        );
        assert_eq!(u.media[0].tokens(), 4);
    }
}
