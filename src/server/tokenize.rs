//! `POST /tokenize` and `POST /detokenize`, in vLLM's shapes.
//!
//! - `/tokenize` takes `messages` (with `tools`, `add_generation_prompt` (default true),
//!   `chat_template_kwargs`, `add_special_tokens`) and gives exactly the ids a chat request with
//!   them runs (images and videos included: they are fetched and sized as for a chat), or a
//!   `prompt` string (with `add_special_tokens`) and gives its ids; `return_token_strs` adds the
//!   tokens' strings. The answer: `{count, max_model_len, tokens, token_strs}`.
//! - `/detokenize` takes `{tokens}` and gives `{prompt}` (special tokens kept, as vLLM decodes).

use super::conn::{blocking, intake, ClientGone, Intake};
use super::http::{self, Reply};
use super::io::Conn;
use super::openai::{self, ApiError, ChatMessage};
use super::prompt::{self, ChatInput};
use hyper::body::Incoming;
use hyper::Request;
use serde_json::{json, Map, Value};
use std::sync::Arc;

/// A checked `/tokenize` body.
#[derive(Debug, PartialEq)]
pub enum TokenizeRequest {
    Chat { messages: Vec<ChatMessage>, tools: Vec<Value>, kwargs: Option<Map<String, Value>>, add_generation_prompt: bool, token_strs: bool },
    Prompt { prompt: String, token_strs: bool },
}

const CHAT_FIELDS: &[&str] = &["model", "messages", "tools", "add_generation_prompt", "add_special_tokens", "return_token_strs", "chat_template_kwargs", "continue_final_message", "chat_template", "mm_processor_kwargs"];
const PROMPT_FIELDS: &[&str] = &["model", "prompt", "add_special_tokens", "return_token_strs"];

fn flag(o: &Map<String, Value>, key: &str, default: bool) -> Result<bool, ApiError> {
    match o.get(key) {
        None | Some(Value::Null) => Ok(default),
        Some(Value::Bool(b)) => Ok(*b),
        Some(_) => Err(ApiError::invalid(key, "invalid_type", format!("'{}' must be a boolean", key))),
    }
}

fn object(body: &[u8]) -> Result<Map<String, Value>, ApiError> {
    match serde_json::from_slice::<Value>(body) {
        Ok(Value::Object(o)) => Ok(o),
        Ok(_) => Err(ApiError::new(400, "invalid_json", "the body must be a JSON object")),
        Err(e) => Err(ApiError::new(400, "invalid_json", format!("the body is not valid JSON: {}", e))),
    }
}

/// Parses a `/tokenize` body.
pub fn parse_tokenize(body: &[u8], limits: &openai::ParseLimits) -> Result<TokenizeRequest, ApiError> {
    let o = object(body)?;
    let chat = match (o.get("messages").filter(|v| !v.is_null()), o.get("prompt").filter(|v| !v.is_null())) {
        (Some(_), Some(_)) => return Err(ApiError::invalid("prompt", "invalid_value", "give either 'messages' or 'prompt', not both")),
        (None, None) => return Err(ApiError::invalid("messages", "missing_required_parameter", "'messages' (a conversation) or 'prompt' (a string) is required")),
        (m, _) => m.is_some(),
    };
    let known = if chat { CHAT_FIELDS } else { PROMPT_FIELDS };
    if let Some(k) = o.keys().find(|k| !known.contains(&k.as_str())) {
        return Err(ApiError::invalid(k.clone(), "unsupported_parameter", format!("'{}' is not supported here (this request takes {})", k.chars().take(60).collect::<String>(), known.join(", "))));
    }
    if let Some(m) = o.get("model") {
        if !m.is_string() && !m.is_null() {
            return Err(ApiError::invalid("model", "invalid_type", "'model' must be a string"));
        }
    }
    // our tokenizer adds no special tokens either way (Qwen's has no BOS); the flag is checked
    flag(&o, "add_special_tokens", !chat)?;
    let token_strs = flag(&o, "return_token_strs", false)?;
    if !chat {
        return match o.get("prompt") {
            Some(Value::String(s)) => Ok(TokenizeRequest::Prompt { prompt: s.clone(), token_strs }),
            _ => Err(ApiError::invalid("prompt", "invalid_type", "'prompt' must be a string")),
        };
    }
    if flag(&o, "continue_final_message", false)? {
        return Err(ApiError::invalid("continue_final_message", "unsupported_value", "continue_final_message is not supported"));
    }
    for key in ["chat_template", "mm_processor_kwargs"] {
        if o.get(key).is_some_and(|v| !v.is_null()) {
            return Err(ApiError::invalid(key, "unsupported_parameter", format!("'{}' is not supported: the server uses the model's own chat template (serve --chat-template FILE sets another)", key)));
        }
    }
    let messages = openai::parse_messages(o.get("messages"), limits)?;
    let tools = super::tools::parse_request(&o)?.tools;
    let kwargs = prompt::parse_template_kwargs(&o)?;
    Ok(TokenizeRequest::Chat { messages, tools, kwargs, add_generation_prompt: flag(&o, "add_generation_prompt", true)?, token_strs })
}

/// Parses a `/detokenize` body: the ids, each below `vocab`.
pub fn parse_detokenize(body: &[u8], vocab: usize) -> Result<Vec<u32>, ApiError> {
    let o = object(body)?;
    if let Some(k) = o.keys().find(|k| !["model", "tokens"].contains(&k.as_str())) {
        return Err(ApiError::invalid(k.clone(), "unsupported_parameter", format!("'{}' is not supported here (this request takes model, tokens)", k.chars().take(60).collect::<String>())));
    }
    let list = match o.get("tokens") {
        Some(Value::Array(a)) => a,
        Some(_) => return Err(ApiError::invalid("tokens", "invalid_type", "'tokens' must be an array of token ids")),
        None => return Err(ApiError::invalid("tokens", "missing_required_parameter", "'tokens' is required")),
    };
    list.iter()
        .enumerate()
        .map(|(i, t)| match t.as_u64() {
            Some(id) if (id as usize) < vocab => Ok(id as u32),
            _ => Err(ApiError::invalid(format!("tokens[{}]", i), "invalid_value", format!("tokens[{}] is {}; token ids are integers from 0 to {}", i, t.to_string().chars().take(40).collect::<String>(), vocab - 1))),
        })
        .collect()
}

/// `POST /tokenize`.
pub(crate) async fn tokenize(req: Request<Incoming>, conn: &Arc<Conn>) -> Result<Reply, ClientGone> {
    let shared = Arc::clone(&conn.shared);
    let Intake { body, place: _place, .. } = match intake(req, &shared).await {
        Ok(i) => i,
        Err(reply) => return reply,
    };
    let answer = blocking(move || {
        let ready = shared.ready.get().expect("checked above");
        let tok = &ready.tokenizer;
        let (ids, token_strs) = match parse_tokenize(&body, &shared.cfg.parse)? {
            TokenizeRequest::Prompt { prompt, token_strs } => (tok.encode(&prompt), token_strs),
            TokenizeRequest::Chat { messages, tools, kwargs, add_generation_prompt, token_strs } => {
                let input = ChatInput { messages: &messages, tools: if tools.is_empty() { None } else { Some(&tools) }, kwargs: kwargs.as_ref(), add_generation_prompt };
                let s = &shared;
                let (ids, _) = prompt::ids(&input, tok, ready.image_token, &ready.format, &s.cfg.images, &s.cfg.tokens, Some(&s.image_slots), Some(&s.image_cache))?;
                (ids, token_strs)
            }
        };
        let strs = token_strs.then(|| ids.iter().map(|&i| tok.id_to_token(i).unwrap_or_default().to_string()).collect::<Vec<_>>());
        Ok(json!({"count": ids.len(), "max_model_len": shared.cfg.tokens.context, "tokens": ids, "token_strs": strs}))
    })
    .await;
    Ok(match answer {
        Ok(v) => http::json(200, &v),
        Err(e) => http::error(&e),
    })
}

/// `POST /detokenize`.
pub(crate) async fn detokenize(req: Request<Incoming>, conn: &Arc<Conn>) -> Result<Reply, ClientGone> {
    let shared = Arc::clone(&conn.shared);
    let Intake { body, place: _place, .. } = match intake(req, &shared).await {
        Ok(i) => i,
        Err(reply) => return reply,
    };
    let answer = blocking(move || {
        let tok = &shared.ready.get().expect("checked above").tokenizer;
        let ids = parse_detokenize(&body, tok.vocab_size())?;
        let text = tok.decode(&ids, false).map_err(|e| ApiError::invalid("tokens", "invalid_value", e.to_string()))?;
        Ok(json!({"prompt": text}))
    })
    .await;
    Ok(match answer {
        Ok(v) => http::json(200, &v),
        Err(e) => http::error(&e),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(s: &str) -> Result<TokenizeRequest, ApiError> {
        parse_tokenize(s.as_bytes(), &openai::ParseLimits::default())
    }

    #[test]
    fn tokenize_takes_messages_or_a_prompt() {
        match parse(r#"{"model": "m", "messages": [{"role": "user", "content": "hi"}], "tools": [{"type": "function", "function": {"name": "f"}}], "add_generation_prompt": false, "return_token_strs": true}"#).unwrap() {
            TokenizeRequest::Chat { messages, tools, add_generation_prompt, token_strs, .. } => assert!(messages.len() == 1 && tools.len() == 1 && !add_generation_prompt && token_strs),
            other => panic!("{:?}", other),
        }
        assert_eq!(parse(r#"{"prompt": "hi", "add_special_tokens": true}"#).unwrap(), TokenizeRequest::Prompt { prompt: "hi".into(), token_strs: false });
        let param = |s: &str| parse(s).unwrap_err().param.unwrap();
        assert_eq!(param(r#"{}"#), "messages");
        assert_eq!(param(r#"{"prompt": "a", "messages": []}"#), "prompt");
        assert_eq!(param(r#"{"prompt": 5}"#), "prompt");
        assert_eq!(param(r#"{"prompt": "a", "tools": []}"#), "tools");
        assert_eq!(param(r#"{"messages": [{"role": "user", "content": "a"}], "continue_final_message": true}"#), "continue_final_message");
        assert_eq!(param(r#"{"messages": [{"role": "user", "content": "a"}], "chat_template": "x"}"#), "chat_template");
        assert_eq!(param(r#"{"messages": [{"role": "user", "content": "a"}], "chat_template_kwargs": {"messages": 1}}"#), "chat_template_kwargs.messages");
        assert_eq!(param(r#"{"messages": [{"role": "user", "content": "a"}], "add_generation_prompt": "yes"}"#), "add_generation_prompt");
    }

    #[test]
    fn detokenize_checks_the_ids() {
        assert_eq!(parse_detokenize(br#"{"tokens": [1, 2]}"#, 10).unwrap(), vec![1, 2]);
        assert_eq!(parse_detokenize(br#"{"tokens": [1, 10]}"#, 10).unwrap_err().param.as_deref(), Some("tokens[1]"));
        assert_eq!(parse_detokenize(br#"{"tokens": [-1]}"#, 10).unwrap_err().param.as_deref(), Some("tokens[0]"));
        assert_eq!(parse_detokenize(br#"{"prompt": "x"}"#, 10).unwrap_err().param.as_deref(), Some("prompt"));
        assert_eq!(parse_detokenize(br#"{}"#, 10).unwrap_err().param.as_deref(), Some("tokens"));
    }
}
