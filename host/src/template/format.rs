//! How prompts are written: the model's chat template, or for a model without one the
//! built-in Qwen3-VL format ([`crate::generate::chat`]), which knows system, user and
//! assistant text and nothing of tools.

use super::{files, ChatTemplate, Conversation};
use crate::generate::chat::{render_turn_parts, Content, Role, GENERATION_PROMPT};
use crate::{Error, Result};
use std::path::Path;

/// The prompt format of a loaded model (cloned for each replica of `serve --data-parallel`).
#[derive(Clone, Debug)]
pub enum PromptFormat {
    Template(Box<ChatTemplate>),
    /// No template was found: Qwen3-VL's format, written by hand.
    Builtin,
}

impl PromptFormat {
    /// The format for a model: `explicit` (`--chat-template FILE`) when given, else the first
    /// directory of `dirs` that has a template, else `gguf` (a GGUF file's
    /// `tokenizer.chat_template`), else the built-in format.
    pub fn find(explicit: Option<&Path>, dirs: &[&Path], gguf: Option<&str>) -> Result<PromptFormat> {
        if let Some(p) = explicit {
            return Ok(PromptFormat::Template(Box::new(files::from_file(p)?)));
        }
        for d in dirs {
            if let Some(t) = files::in_dir(d)? {
                return Ok(PromptFormat::Template(Box::new(t)));
            }
        }
        if let Some(src) = gguf {
            return Ok(PromptFormat::Template(Box::new(ChatTemplate::new(src, "the GGUF file's tokenizer.chat_template")?)));
        }
        Ok(PromptFormat::Builtin)
    }

    /// Where prompts come from, in words (for the log).
    pub fn describe(&self) -> String {
        match self {
            PromptFormat::Template(t) => format!("the chat template of {}", t.origin),
            PromptFormat::Builtin => "the built-in Qwen3-VL format: the model has no chat template (chat_template.jinja, chat_template.json, tokenizer_config.json or GGUF metadata; --chat-template FILE gives one); tools are refused".into(),
        }
    }

    pub fn is_template(&self) -> bool {
        matches!(self, PromptFormat::Template(_))
    }

    /// The prompt text of `conv`, with one placeholder per image and video
    /// ([`super::media::expand`] expands them).
    pub fn render(&self, conv: &Conversation<'_>) -> Result<String> {
        match self {
            PromptFormat::Template(t) => t.render(conv),
            PromptFormat::Builtin => builtin(conv),
        }
    }
}

fn no_template(what: &str) -> Error {
    Error::Template { origin: "the built-in format".into(), msg: format!("{} need the model's chat template, and this model has none (give one with --chat-template FILE)", what) }
}

/// The built-in format: system (and developer), user and assistant turns.
fn builtin(conv: &Conversation<'_>) -> Result<String> {
    if conv.tools.is_some_and(|t| !t.is_empty()) {
        return Err(no_template("tools"));
    }
    if conv.kwargs.is_some_and(|k| !k.is_empty()) {
        return Err(no_template("chat template variables"));
    }
    let mut s = String::new();
    for t in conv.turns {
        let role = match t.role.as_str() {
            "system" | "developer" => Role::System,
            "user" => Role::User,
            "assistant" => Role::Assistant,
            _ => return Err(no_template(&format!("'{}' messages", t.role))),
        };
        if !t.tool_calls.is_empty() {
            return Err(no_template("tool calls"));
        }
        s.push_str(&render_turn_parts(role, &[Content::Text(&t.joined())]));
    }
    if conv.add_generation_prompt {
        s.push_str(GENERATION_PROMPT);
    }
    Ok(s)
}

#[cfg(test)]
mod tests {
    use super::super::{Piece, Turn};
    use super::*;
    use crate::generate::chat::{render, Media, Message};

    #[test]
    fn the_builtin_format_is_the_hand_written_one() {
        let mut u = Message::user("What is this?");
        u.media = vec![Media::Image(1)];
        let want = render(&[Message::system("Be brief."), u, Message::assistant("A cat."), Message::user("Sure?")], true);
        let turns = [Turn::text("system", "Be brief."), Turn::parts("user", vec![Piece::Image, Piece::Text("What is this?".into())]), Turn::text("assistant", "A cat."), Turn::text("user", "Sure?")];
        assert_eq!(PromptFormat::Builtin.render(&Conversation::new(&turns)).unwrap(), want);
        let tools = [serde_json::json!({})];
        let e = PromptFormat::Builtin.render(&Conversation { tools: Some(&tools), ..Conversation::new(&turns) }).unwrap_err();
        assert!(e.to_string().contains("--chat-template"), "{}", e);
        assert!(PromptFormat::Builtin.render(&Conversation::new(&[Turn::text("tool", "42")])).is_err());
    }
}
