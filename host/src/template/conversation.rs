//! A conversation as a chat template is given it: the messages (as transformers and vLLM pass
//! them: `role`, `content`, an assistant's `tool_calls` with their arguments as JSON objects, a
//! tool result's `tool_call_id`), the tools' JSON schemas, `add_generation_prompt`, and extra
//! template variables (`enable_thinking`, ...).

use super::media::{IMAGE_PLACEHOLDER, VIDEO_PLACEHOLDER};
use super::value::{from_json, map};
use super::ContentFormat;
use minijinja::Value;

/// A piece of a message's content, in order.
#[derive(Clone, Debug, PartialEq)]
pub enum Piece {
    Text(String),
    /// An image: the template writes its placeholder, expanded afterwards.
    Image,
    /// A video: the same.
    Video,
}

/// A message's content as the client sent it.
#[derive(Clone, Debug, PartialEq)]
pub enum Content {
    /// `null` or absent (an assistant message that only calls tools): `""` to the template, as
    /// vLLM passes it.
    Null,
    /// A plain string: passed as is.
    Text(String),
    /// A list of parts: joined into one string, or passed as a list of
    /// `{"type": "text", "text": ...}` / `{"type": "image"}` / `{"type": "video"}`, as the
    /// template reads content ([`ContentFormat`]).
    Parts(Vec<Piece>),
}

/// A call an assistant message made.
#[derive(Clone, Debug, PartialEq)]
pub struct ToolCall {
    pub id: Option<String>,
    pub name: String,
    /// The arguments as a JSON value (an object), parsed from the client's JSON string.
    pub arguments: serde_json::Value,
}

/// One message.
#[derive(Clone, Debug, PartialEq)]
pub struct Turn {
    /// `system`, `user`, `assistant` or `tool`.
    pub role: String,
    pub content: Content,
    pub tool_calls: Vec<ToolCall>,
    /// A tool message's call id.
    pub tool_call_id: Option<String>,
    pub name: Option<String>,
    /// An assistant's reasoning, when the client sends it back (`reasoning_content`).
    pub reasoning_content: Option<String>,
}

impl Turn {
    /// A message of `role` with plain text.
    pub fn text(role: &str, text: &str) -> Turn {
        Turn { role: role.into(), content: Content::Text(text.into()), tool_calls: vec![], tool_call_id: None, name: None, reasoning_content: None }
    }

    /// A message of `role` with parts (text, images, videos) in order.
    pub fn parts(role: &str, parts: Vec<Piece>) -> Turn {
        Turn { content: Content::Parts(parts), ..Turn::text(role, "") }
    }

    /// The images and videos, in order (`true`: a video).
    pub fn media(&self) -> impl Iterator<Item = bool> + '_ {
        let parts: &[Piece] = match &self.content {
            Content::Parts(p) => p,
            _ => &[],
        };
        parts.iter().filter_map(|p| match p {
            Piece::Image => Some(false),
            Piece::Video => Some(true),
            Piece::Text(_) => None,
        })
    }

    /// The content joined into one string, images and videos as their placeholders.
    pub fn joined(&self) -> String {
        match &self.content {
            Content::Null => String::new(),
            Content::Text(t) => t.clone(),
            Content::Parts(parts) => parts
                .iter()
                .map(|p| match p {
                    Piece::Text(t) => t.as_str(),
                    Piece::Image => IMAGE_PLACEHOLDER,
                    Piece::Video => VIDEO_PLACEHOLDER,
                })
                .collect(),
        }
    }

    fn content_value(&self, format: ContentFormat) -> Value {
        match (&self.content, format) {
            (Content::Parts(parts), ContentFormat::Parts) => Value::from(
                parts
                    .iter()
                    .map(|p| match p {
                        Piece::Text(t) => map([("type", Value::from("text")), ("text", Value::from(t.as_str()))]),
                        Piece::Image => map([("type", Value::from("image"))]),
                        Piece::Video => map([("type", Value::from("video"))]),
                    })
                    .collect::<Vec<_>>(),
            ),
            _ => Value::from(self.joined()),
        }
    }

    /// The message as the template sees it.
    pub fn to_value(&self, format: ContentFormat) -> Value {
        let mut fields: Vec<(&str, Value)> = vec![("role", Value::from(self.role.as_str())), ("content", self.content_value(format))];
        if !self.tool_calls.is_empty() {
            let calls: Vec<Value> = self
                .tool_calls
                .iter()
                .map(|c| {
                    let function = map([("name", Value::from(c.name.as_str())), ("arguments", from_json(&c.arguments))]);
                    let mut f: Vec<(&str, Value)> = Vec::new();
                    if let Some(id) = &c.id {
                        f.push(("id", Value::from(id.as_str())));
                    }
                    f.push(("type", Value::from("function")));
                    f.push(("function", function));
                    map(f)
                })
                .collect();
            fields.push(("tool_calls", Value::from(calls)));
        }
        if let Some(id) = &self.tool_call_id {
            fields.push(("tool_call_id", Value::from(id.as_str())));
        }
        if let Some(n) = &self.name {
            fields.push(("name", Value::from(n.as_str())));
        }
        if let Some(r) = &self.reasoning_content {
            fields.push(("reasoning_content", Value::from(r.as_str())));
        }
        map(fields)
    }
}

/// What a template renders.
#[derive(Clone, Copy, Debug)]
pub struct Conversation<'a> {
    pub turns: &'a [Turn],
    /// The tools' definitions as the client sent them (`{"type": "function", "function":
    /// {...}}`); `None`: no tools (the template sees `none`).
    pub tools: Option<&'a [serde_json::Value]>,
    /// End with the opening of the assistant's reply.
    pub add_generation_prompt: bool,
    /// More template variables (vLLM's `chat_template_kwargs`).
    pub kwargs: Option<&'a serde_json::Map<String, serde_json::Value>>,
}

impl<'a> Conversation<'a> {
    /// `turns`, no tools, with the generation prompt.
    pub fn new(turns: &'a [Turn]) -> Conversation<'a> {
        Conversation { turns, tools: None, add_generation_prompt: true, kwargs: None }
    }

    /// The template's variables, as transformers passes them: the special tokens, the extra
    /// variables, then `messages`, `tools`, `documents` and `add_generation_prompt`.
    pub(super) fn context(&self, format: ContentFormat, special: &[(String, String)]) -> Value {
        let mut vars: Vec<(&str, Value)> = special.iter().map(|(k, v)| (k.as_str(), Value::from(v.as_str()))).collect();
        if let Some(kw) = self.kwargs {
            vars.extend(kw.iter().map(|(k, v)| (k.as_str(), from_json(v))));
        }
        vars.push(("messages", Value::from(self.turns.iter().map(|t| t.to_value(format)).collect::<Vec<_>>())));
        vars.push(("tools", self.tools.map_or(Value::from(()), |t| Value::from(t.iter().map(from_json).collect::<Vec<_>>()))));
        vars.push(("documents", Value::from(())));
        vars.push(("add_generation_prompt", Value::from(self.add_generation_prompt)));
        map(vars)
    }

    /// The number of images and of videos over all messages.
    pub fn media_counts(&self) -> (usize, usize) {
        let (mut images, mut videos) = (0, 0);
        for v in self.turns.iter().flat_map(Turn::media) {
            if v {
                videos += 1
            } else {
                images += 1
            }
        }
        (images, videos)
    }
}
