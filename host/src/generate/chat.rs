//! The prompt format of Qwen3-VL's chat template (as transformers renders it): an optional
//! system turn, user turns whose images come first as `<|vision_start|><|image_pad|>×N
//! <|vision_end|>`, and the assistant's opening.

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

/// One turn: text, and for user turns the number of image tokens of each attached image.
#[derive(Clone, Debug, PartialEq)]
pub struct Message {
    pub role: Role,
    pub image_tokens: Vec<usize>,
    pub text: String,
}

impl Message {
    pub fn system(text: &str) -> Message {
        Message { role: Role::System, image_tokens: vec![], text: text.into() }
    }
    pub fn user(text: &str) -> Message {
        Message { role: Role::User, image_tokens: vec![], text: text.into() }
    }
    pub fn assistant(text: &str) -> Message {
        Message { role: Role::Assistant, image_tokens: vec![], text: text.into() }
    }
}

/// Renders one turn: `<|im_start|>{role}\n{images}{text}<|im_end|>\n`.
pub fn render_turn(m: &Message) -> String {
    let mut parts: Vec<Content<'_>> = m.image_tokens.iter().map(|&n| Content::Image(n)).collect();
    parts.push(Content::Text(&m.text));
    render_turn_parts(m.role, &parts)
}

/// A piece of a turn's content: text, or an image of so many `<|image_pad|>` tokens.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Content<'a> {
    Text(&'a str),
    Image(usize),
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
        u.image_tokens = vec![2];
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
}
