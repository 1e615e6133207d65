//! A checked request to what the model reads: images fetched and preprocessed, messages
//! rendered with the model's chat template (text, images, tools, tool calls and results in
//! their order; the placeholders expanded as Qwen3-VL's processor does), the token ids, and
//! the token budget, each limit answered with a 400 that names it.

use super::images::{self, ImagePolicy, PreparedImage};
use super::openai::{ApiError, ChatMessage, ChatRequest, Part, Speaker};
use crate::generate::chat::Media;
use crate::template::{media, Content, Conversation, Piece, PromptFormat, Turn};
use crate::Tokenizer;
use serde_json::{Map, Value};

/// Token limits of the server.
#[derive(Clone, Copy, Debug)]
pub struct TokenLimits {
    /// Most prompt tokens (image tokens included).
    pub max_prompt: usize,
    /// Most tokens to generate; also the default when a request sets none.
    pub max_output: usize,
    /// The model's context (max_position_embeddings): prompt + output must fit.
    pub context: usize,
}

/// What the model thread needs of one request.
pub struct Prompt {
    pub ids: Vec<u32>,
    pub images: Vec<std::sync::Arc<PreparedImage>>,
    pub max_tokens: usize,
}

/// How much NFC normalization may shorten text, at most, in bytes (3: a Hangul syllable's three
/// 3-byte jamo become one 3-byte syllable; no composition shrinks more), rounded up.
const NFC_SHRINK: usize = 4;

/// Text bytes that surely take more than `max_prompt` tokens: no token stands for more than
/// the tokenizer's longest token of normalized text, and normalization shortens text at most
/// [`NFC_SHRINK`] times. A sound bound (no prompt that could fit is refused by it), checked
/// before anything is decoded or tokenized.
pub fn max_text_bytes(tok: &Tokenizer, max_prompt: usize) -> usize {
    max_prompt.saturating_add(1).saturating_mul(tok.longest_token_bytes()).saturating_mul(NFC_SHRINK)
}

/// What a prompt is made of: the conversation, the tools, more template variables, and
/// whether it ends with the assistant's opening.
#[derive(Clone, Copy)]
pub struct ChatInput<'a> {
    pub messages: &'a [ChatMessage],
    pub tools: Option<&'a [Value]>,
    pub kwargs: Option<&'a Map<String, Value>>,
    pub add_generation_prompt: bool,
}

impl ChatRequest {
    /// The prompt's parts of a chat request (with the assistant's opening).
    pub fn input(&self) -> ChatInput<'_> {
        ChatInput { messages: &self.messages, tools: self.tools.template_tools(), kwargs: self.template_kwargs.as_ref(), add_generation_prompt: true }
    }
}

/// Variables a template is always given, which `chat_template_kwargs` may not replace.
const RESERVED_VARIABLES: [&str; 4] = ["messages", "tools", "documents", "add_generation_prompt"];

/// `chat_template_kwargs` (as vLLM takes it): an object of more template variables
/// (`enable_thinking`, ...).
pub fn parse_template_kwargs(o: &Map<String, Value>) -> Result<Option<Map<String, Value>>, ApiError> {
    match o.get("chat_template_kwargs") {
        None | Some(Value::Null) => Ok(None),
        Some(Value::Object(m)) => {
            if let Some(k) = m.keys().find(|k| RESERVED_VARIABLES.contains(&k.as_str())) {
                return Err(ApiError::invalid(format!("chat_template_kwargs.{}", k), "invalid_value", format!("'{}' is set by the server; use the request's own fields", k)));
            }
            Ok(Some(m.clone()))
        }
        Some(_) => Err(ApiError::invalid("chat_template_kwargs", "invalid_type", "'chat_template_kwargs' must be an object")),
    }
}

/// The messages as the template takes them: string content as a string, an array of parts as
/// parts (images and videos as pieces, in order; joined into one string for a template that
/// reads content as a string).
fn turns(messages: &[ChatMessage]) -> Vec<Turn> {
    messages
        .iter()
        .map(|m| {
            let role = match m.role {
                Speaker::System => "system",
                Speaker::User => "user",
                Speaker::Assistant => "assistant",
                Speaker::Tool => "tool",
            };
            let content = if m.null_content {
                Content::Null
            } else if !m.content_parts {
                Content::Text(m.parts.iter().map(|p| if let Part::Text(t) = p { t.as_str() } else { "" }).collect())
            } else {
                Content::Parts(
                    m.parts
                        .iter()
                        .map(|p| match p {
                            Part::Text(t) => Piece::Text(t.clone()),
                            Part::Image { .. } => Piece::Image,
                            Part::Video { .. } => Piece::Video,
                        })
                        .collect(),
                )
            };
            Turn { content, tool_calls: m.tool_calls.clone(), tool_call_id: m.tool_call_id.clone(), ..Turn::text(role, "") }
        })
        .collect()
}

/// Fetches and preprocesses the images, renders and tokenizes the conversation, and fixes the
/// output budget. With `slots`, images are decoded only while holding one; with `cache`, an
/// image sent before is taken from it, not decoded again.
///
/// Size comes first: text longer than [`max_text_bytes`] is refused before any image is
/// fetched, and the tokenizer stops as soon as the prompt passes `limits.max_prompt` tokens
/// ([`Tokenizer::encode_within`]), so a huge prompt costs time in proportion to the limit, not
/// to its length.
#[allow(clippy::too_many_arguments)]
pub fn build(req: &ChatRequest, tok: &Tokenizer, image_token: u32, format: &PromptFormat, policy: &ImagePolicy, limits: &TokenLimits, slots: Option<&images::Slots>, cache: Option<&images::Cache>) -> Result<Prompt, ApiError> {
    let (ids, prepared) = ids(&req.input(), tok, image_token, format, policy, limits, slots, cache)?;
    // 4. the output budget
    let max_tokens = output_budget(ids.len(), req.settings.max_tokens, limits.max_output, limits, "messages")?;
    Ok(Prompt { ids, images: prepared, max_tokens })
}

/// The token ids of a conversation (and its images and videos, prepared): what a chat request
/// runs, and what `/tokenize` answers.
#[allow(clippy::too_many_arguments)]
pub fn ids(
    input: &ChatInput<'_>,
    tok: &Tokenizer,
    image_token: u32,
    format: &PromptFormat,
    policy: &ImagePolicy,
    limits: &TokenLimits,
    slots: Option<&images::Slots>,
    cache: Option<&images::Cache>,
) -> Result<(Vec<u32>, Vec<std::sync::Arc<PreparedImage>>), ApiError> {
    // 0. text that cannot fit, by its length alone
    let text_bytes: usize = input.messages.iter().flat_map(|m| &m.parts).map(|p| if let Part::Text(t) = p { t.len() } else { 0 }).sum();
    let bound = max_text_bytes(tok, limits.max_prompt);
    if text_bytes > bound {
        return Err(ApiError::invalid(
            "messages",
            "context_length_exceeded",
            format!("the messages' text is {} bytes, more than can fit in this server's prompt limit of {} tokens (at most {} bytes)", text_bytes, limits.max_prompt, bound),
        ));
    }
    // 1. images, in order of appearance: their token counts from their headers first (a
    // request that cannot fit is refused before decoding anything), then the pixels
    let mut encoded = Vec::new();
    let mut predicted = 0usize;
    for m in input.messages {
        for p in &m.parts {
            if let Part::Video { url, param } = p {
                // a video's tokens are known once it is sampled (its limits bound that work)
                encoded.push((images::fetch_video(url, param, policy)?, param, true));
                continue;
            }
            if let Part::Image { url, param } = p {
                let bytes = images::fetch(url, param, policy)?;
                predicted = predicted.saturating_add(images::predicted_tokens(&bytes, param, policy)?);
                if predicted > limits.max_prompt {
                    return Err(ApiError::invalid(
                        param.clone(),
                        "context_length_exceeded",
                        format!("the images up to {} take {} tokens, more than this server's prompt limit of {}", param, predicted, limits.max_prompt),
                    ));
                }
                encoded.push((bytes, param, false));
            }
        }
    }
    let mut prepared = Vec::new();
    if !encoded.is_empty() {
        let _slot = slots.map(|s| s.take());
        for (bytes, param, video) in &encoded {
            let make = || if *video { images::prepare_video(bytes, param, policy) } else { images::prepare(bytes, param, policy) };
            prepared.push(match cache {
                Some(c) => c.get_or_prepare(bytes, make)?,
                None => std::sync::Arc::new(make()?),
            });
        }
        let total: usize = prepared.iter().map(|i| i.tokens).sum();
        if total > limits.max_prompt {
            return Err(ApiError::invalid("messages", "context_length_exceeded", format!("the images and videos take {} tokens, more than this server's prompt limit of {}", total, limits.max_prompt)));
        }
    }
    drop(encoded);
    // 2. the template, its placeholders expanded for the images and videos
    let turns = turns(input.messages);
    let conv = Conversation { turns: &turns, tools: input.tools, add_generation_prompt: input.add_generation_prompt, kwargs: input.kwargs };
    let text = format.render(&conv).map_err(|e| ApiError::invalid("messages", "template_error", e.to_string()))?;
    let media: Vec<Media> = prepared.iter().map(|p| p.video.clone().map_or(Media::Image(p.tokens), Media::Video)).collect();
    let text = media::expand(&text, &media).map_err(|e| ApiError::invalid("messages", "invalid_value", e.to_string()))?;
    // 3. tokens, up to the limit; the image and video placeholders must be exactly the images'
    //    and videos'
    let ids = tok.encode_within(&text, limits.max_prompt).ok_or_else(|| {
        ApiError::invalid("messages", "context_length_exceeded", format!("the prompt takes more than this server's limit of {} tokens", limits.max_prompt))
    })?;
    let video_token = tok.token_to_id("<|video_pad|>");
    let placeholders = ids.iter().filter(|&&t| t == image_token || Some(t) == video_token).count();
    let image_tokens: usize = prepared.iter().map(|i| i.tokens).sum();
    if placeholders != image_tokens {
        return Err(ApiError::invalid("messages", "invalid_value", "the message text contains <|image_pad|> or <|video_pad|> tokens; images must be sent as image_url parts, videos as video_url parts"));
    }
    Ok((ids, prepared))
}

/// The tokens to generate after a prompt of `prompt` tokens: `requested` (`max_tokens`) when it
/// fits the server's limit and the model's context, else a 400 naming `max_tokens`; unset,
/// `default` (at most what the context leaves). A prompt that leaves no room is a 400 naming
/// `prompt_param`.
pub fn output_budget(prompt: usize, requested: Option<usize>, default: usize, limits: &TokenLimits, prompt_param: &str) -> Result<usize, ApiError> {
    let room = limits.context.saturating_sub(prompt);
    let max_tokens = match requested {
        Some(n) if n > limits.max_output => {
            return Err(ApiError::invalid("max_tokens", "invalid_value", format!("max_tokens is {}; this server generates at most {} tokens per request", n, limits.max_output)));
        }
        Some(n) if n > room => {
            return Err(ApiError::invalid("max_tokens", "context_length_exceeded", format!("the prompt of {} tokens plus max_tokens {} exceeds the model's context of {} tokens", prompt, n, limits.context)));
        }
        Some(n) => n,
        None => default.min(limits.max_output).min(room),
    };
    if max_tokens == 0 {
        return Err(ApiError::invalid(prompt_param, "context_length_exceeded", format!("the prompt of {} tokens leaves no room in the model's context of {}", prompt, limits.context)));
    }
    Ok(max_tokens)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::server::openai::{parse_chat_request, ParseLimits};

    #[test]
    fn content_reaches_the_template_as_sent_a_string_or_parts() {
        let body = r#"{"messages":[{"role":"system","content":[{"type":"text","text":"a"},{"type":"text","text":"b"}]},
            {"role":"user","content":"hi"},{"role":"assistant","content":null,"tool_calls":[{"id":"c","type":"function","function":{"name":"f","arguments":"{}"}}]},
            {"role":"tool","tool_call_id":"c","content":[]}]}"#;
        let r = parse_chat_request(body.as_bytes(), &ParseLimits::default()).unwrap();
        let t = turns(&r.messages);
        assert_eq!(t[0].content, Content::Parts(vec![Piece::Text("a".into()), Piece::Text("b".into())]));
        assert_eq!(t[1].content, Content::Text("hi".into()));
        assert_eq!(t[2].content, Content::Null);
        assert_eq!(t[3].content, Content::Parts(vec![]));
    }
}
