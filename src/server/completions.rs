//! `POST /v1/completions`, the legacy endpoint that evaluation and benchmark harnesses use: a
//! raw prompt (text, or token ids) continued with no chat template, answered with
//! `text_completion` objects. One prompt per request: a list of several is refused (send one
//! request each; they batch in the engine anyway). `max_tokens` defaults to 16 as OpenAI's.
//! `echo` puts the prompt's text before each choice's; with `logprobs` it would need the
//! prompt's log-probabilities, which are not computed, so that pair is refused. `suffix` and
//! `best_of` above `n` are refused.

use super::fields::{self, Api};
use super::openai::{boolean, integer, wrong_type, ApiError, ParseLimits};
use super::prompt::{self, Prompt, TokenLimits};
use super::settings::{self, Settings};
use crate::Tokenizer;
use serde_json::{Map, Value};

/// `max_tokens` when a completions request sets none (OpenAI's default).
pub const DEFAULT_MAX_TOKENS: usize = 16;

/// What to continue.
#[derive(Clone, Debug, PartialEq)]
pub enum PromptInput {
    Text(String),
    Ids(Vec<u32>),
}

/// A checked completions request.
#[derive(Clone, Debug, PartialEq)]
pub struct CompletionRequest {
    pub prompt: PromptInput,
    /// Put the prompt's text before the completion.
    pub echo: bool,
    pub settings: Settings,
}

/// Parses and checks a completions body.
pub fn parse_completion_request(body: &[u8], limits: &ParseLimits) -> Result<CompletionRequest, ApiError> {
    // 1. a JSON object of known fields
    let v: Value = serde_json::from_slice(body).map_err(|e| ApiError::new(400, "invalid_json", format!("the body is not valid JSON: {}", e)))?;
    let o = v.as_object().ok_or_else(|| ApiError::new(400, "invalid_json", "the body must be a JSON object"))?;
    fields::check(o, Api::Completions)?;
    if let Some(m) = o.get("model").filter(|m| !m.is_null() && !m.is_string()) {
        return Err(wrong_type("model", "a string", m));
    }
    // 2. the prompt, then what we cannot do
    let prompt = parse_prompt(o)?;
    let settings = settings::parse(o, limits, Api::Completions)?;
    let echo = boolean(o, "echo")?;
    if echo && settings.logprobs.is_some() {
        return Err(ApiError::invalid("echo", "unsupported_value", "'echo' with 'logprobs' needs the prompt's log-probabilities, which this server does not compute"));
    }
    match o.get("suffix") {
        None | Some(Value::Null) => {}
        Some(Value::String(s)) if s.is_empty() => {}
        Some(Value::String(_)) => return Err(ApiError::invalid("suffix", "unsupported_parameter", "'suffix' (insertion) is not supported")),
        Some(v) => return Err(wrong_type("suffix", "a string", v)),
    }
    if let Some(b) = integer(o, "best_of", 1, i64::MAX)? {
        let b = usize::try_from(b).unwrap_or(usize::MAX);
        if b < settings.n {
            return Err(ApiError::invalid("best_of", "invalid_value", format!("'best_of' is {}; it must be at least n ({})", b, settings.n)));
        }
        if b > settings.n {
            return Err(ApiError::invalid("best_of", "unsupported_value", format!("'best_of' is {}; only best_of equal to n ({}) is supported", b, settings.n)));
        }
    }
    Ok(CompletionRequest { prompt, echo, settings })
}

/// `prompt`: a string, token ids, or a list of one of either.
fn parse_prompt(o: &Map<String, Value>) -> Result<PromptInput, ApiError> {
    let ids = |a: &[Value], param: &str| -> Result<Vec<u32>, ApiError> {
        a.iter().enumerate().map(|(i, t)| t.as_u64().filter(|&t| t <= u32::MAX as u64).map(|t| t as u32).ok_or_else(|| wrong_type(&format!("{}[{}]", param, i), "a token id (a non-negative integer)", t))).collect()
    };
    let p = match o.get("prompt") {
        None | Some(Value::Null) => return Err(ApiError::invalid("prompt", "missing_required_parameter", "'prompt' is required")),
        Some(Value::String(s)) => PromptInput::Text(s.clone()),
        Some(Value::Array(a)) if a.iter().all(Value::is_number) && !a.is_empty() => PromptInput::Ids(ids(a, "prompt")?),
        Some(Value::Array(a)) if a.len() > 1 => {
            return Err(ApiError::invalid("prompt", "unsupported_value", format!("one prompt per request is supported, got {} (send them as separate requests)", a.len())));
        }
        Some(Value::Array(a)) => match a.first() {
            Some(Value::String(s)) => PromptInput::Text(s.clone()),
            Some(Value::Array(inner)) => PromptInput::Ids(ids(inner, "prompt[0]")?),
            Some(v) => return Err(wrong_type("prompt[0]", "a string or an array of token ids", v)),
            None => return Err(ApiError::invalid("prompt", "invalid_value", "'prompt' must not be empty")),
        },
        Some(v) => return Err(wrong_type("prompt", "a string, an array of token ids, or a list of one of either", v)),
    };
    let empty = match &p {
        PromptInput::Text(s) => s.is_empty(),
        PromptInput::Ids(ids) => ids.is_empty(),
    };
    if empty {
        return Err(ApiError::invalid("prompt", "invalid_value", "'prompt' must not be empty"));
    }
    Ok(p)
}

/// The prompt's ids (checked against the vocabulary and the limits), the output budget and the
/// text to echo.
pub fn build(req: &CompletionRequest, tok: &Tokenizer, image_tokens: &[u32], limits: &TokenLimits) -> Result<(Prompt, Option<String>), ApiError> {
    // 1. ids within the prompt limit (text longer than can fit refused before tokenizing)
    let too_long = || ApiError::invalid("prompt", "context_length_exceeded", format!("the prompt takes more than this server's limit of {} tokens", limits.max_prompt));
    let ids = match &req.prompt {
        PromptInput::Text(t) => {
            if t.len() > prompt::max_text_bytes(tok, limits.max_prompt) {
                return Err(too_long());
            }
            tok.encode_within(t, limits.max_prompt).ok_or_else(too_long)?
        }
        PromptInput::Ids(ids) => {
            if ids.len() > limits.max_prompt {
                return Err(too_long());
            }
            if let Some((i, t)) = ids.iter().enumerate().find(|(_, &t)| t as usize >= tok.vocab_size()) {
                return Err(ApiError::invalid(format!("prompt[{}]", i), "invalid_value", format!("token id {} is outside the vocabulary of {} ids", t, tok.vocab_size())));
            }
            ids.clone()
        }
    };
    if ids.iter().any(|t| image_tokens.contains(t)) {
        return Err(ApiError::invalid("prompt", "invalid_value", "the prompt holds image or video placeholder tokens; send images to /v1/chat/completions as image_url parts"));
    }
    settings::check_vocab(&req.settings, tok.vocab_size())?;
    // 2. the budget and the echo
    let max_tokens = prompt::output_budget(ids.len(), req.settings.max_tokens, DEFAULT_MAX_TOKENS, limits, "prompt")?;
    let echo = match (&req.prompt, req.echo) {
        (_, false) => None,
        (PromptInput::Text(t), true) => Some(t.clone()),
        (PromptInput::Ids(ids), true) => Some(tok.decode(ids, false).map_err(|e| ApiError::invalid("prompt", "invalid_value", e.to_string()))?),
    };
    Ok((Prompt { ids, images: Vec::new(), max_tokens }, echo))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(s: serde_json::Value) -> Result<CompletionRequest, ApiError> {
        parse_completion_request(s.to_string().as_bytes(), &ParseLimits::default())
    }

    #[test]
    fn prompts_and_refusals() {
        use serde_json::json;
        assert_eq!(parse(json!({"prompt": "Hi"})).unwrap().prompt, PromptInput::Text("Hi".into()));
        assert_eq!(parse(json!({"prompt": ["Hi"]})).unwrap().prompt, PromptInput::Text("Hi".into()));
        assert_eq!(parse(json!({"prompt": [1, 2, 3]})).unwrap().prompt, PromptInput::Ids(vec![1, 2, 3]));
        assert_eq!(parse(json!({"prompt": [[4, 5]], "n": 2, "best_of": 2, "logprobs": 5})).unwrap().settings.logprobs, Some(5));
        let r = parse(json!({"prompt": "Hi", "echo": true, "max_tokens": 3, "stream": true})).unwrap();
        assert!(r.echo && r.settings.stream && r.settings.max_tokens == Some(3));
        let param = |v: serde_json::Value| parse(v).unwrap_err().param.unwrap();
        assert_eq!(param(json!({})), "prompt");
        assert_eq!(param(json!({"prompt": ""})), "prompt");
        assert_eq!(param(json!({"prompt": []})), "prompt");
        assert_eq!(param(json!({"prompt": ["a", "b"]})), "prompt");
        assert_eq!(param(json!({"prompt": [1, -2]})), "prompt[1]");
        assert_eq!(param(json!({"prompt": [[1, "x"]]})), "prompt[0][1]");
        assert_eq!(param(json!({"prompt": 5})), "prompt");
        assert_eq!(param(json!({"prompt": "a", "suffix": "b"})), "suffix");
        assert_eq!(param(json!({"prompt": "a", "best_of": 3})), "best_of");
        assert_eq!(param(json!({"prompt": "a", "echo": true, "logprobs": 1})), "echo");
        assert_eq!(param(json!({"prompt": "a", "messages": []})), "messages");
        assert_eq!(param(json!({"prompt": "a", "logprobs": 21})), "logprobs");
    }
}
