//! The OpenAI chat-completions wire format: request bodies checked field by field (each error
//! names the parameter and what it must be; the accepted fields in `fields`, the generation
//! settings in `settings`), errors as `{"error": {message, type, param, code}}`, and the
//! response and stream-chunk objects.

use super::fields::{self, Api};
use super::settings::{self, Settings};
use serde_json::{json, Map, Value};

/// An error answered to the client: HTTP status and the OpenAI error object.
#[derive(Clone, Debug, PartialEq)]
pub struct ApiError {
    pub status: u16,
    /// `invalid_request_error`, `rate_limit_error`, `server_error`, ...
    pub kind: &'static str,
    /// A stable machine-readable code (`invalid_value`, `context_length_exceeded`, ...).
    pub code: &'static str,
    /// The request parameter at fault (`messages[0].content[1].image_url`), when one is.
    pub param: Option<String>,
    pub message: String,
    /// Seconds for a Retry-After header (429, 503).
    pub retry_after: Option<u64>,
    /// The methods a 405 allows.
    pub allow: Option<&'static str>,
}

impl ApiError {
    /// An error of `status`; the type follows from it.
    pub fn new(status: u16, code: &'static str, message: impl Into<String>) -> ApiError {
        let kind = match status {
            401 => "authentication_error",
            429 => "rate_limit_error",
            500..=599 => "server_error",
            _ => "invalid_request_error",
        };
        ApiError { status, kind, code, param: None, message: message.into(), retry_after: None, allow: None }
    }

    /// 400 without a parameter.
    pub fn bad_request(message: impl Into<String>) -> ApiError {
        ApiError::new(400, "bad_request", message)
    }

    /// 400 for parameter `param`.
    pub fn invalid(param: impl Into<String>, code: &'static str, message: impl Into<String>) -> ApiError {
        ApiError { param: Some(param.into()), ..ApiError::new(400, code, message) }
    }

    pub fn to_json(&self) -> Value {
        json!({"error": {"message": self.message, "type": self.kind, "param": self.param, "code": self.code}})
    }
}

/// Who speaks a message.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Speaker {
    System,
    User,
    Assistant,
    /// A tool's result (`tool_call_id` names the call).
    Tool,
}

/// One content part, in order.
#[derive(Clone, Debug, PartialEq)]
pub enum Part {
    Text(String),
    /// An `image_url` part: the URL, and the parameter path for errors.
    Image { url: String, param: String },
    /// A `video_url` part (as vLLM takes them): the URL, and the parameter path for errors.
    Video { url: String, param: String },
}

#[derive(Clone, Debug, PartialEq)]
pub struct ChatMessage {
    pub role: Speaker,
    pub parts: Vec<Part>,
    /// An assistant's calls (see `tools`).
    pub tool_calls: Vec<crate::template::ToolCall>,
    /// A tool message's call id.
    pub tool_call_id: Option<String>,
    /// `content` was null or absent (an assistant message that only calls tools).
    pub null_content: bool,
    /// `content` was an array of parts (not a string): a template that reads content as parts
    /// gets them as sent, text-only lists included, as vLLM and transformers pass them.
    pub content_parts: bool,
}

/// A checked chat-completions request.
#[derive(Clone, Debug, PartialEq)]
pub struct ChatRequest {
    pub messages: Vec<ChatMessage>,
    /// Sampling, lengths, choices, logprobs, streaming.
    pub settings: Settings,
    /// `tools`, `tool_choice`, `parallel_tool_calls`.
    pub tools: super::tools::ToolRequest,
    /// `chat_template_kwargs`: more variables for the chat template.
    pub template_kwargs: Option<Map<String, Value>>,
}

impl ChatRequest {
    /// The number of image parts over all messages.
    pub fn image_count(&self) -> usize {
        self.messages.iter().flat_map(|m| &m.parts).filter(|p| matches!(p, Part::Image { .. })).count()
    }
}

/// Limits that parsing enforces.
#[derive(Clone, Copy, Debug)]
pub struct ParseLimits {
    pub max_images: usize,
    pub max_videos: usize,
    pub max_stop: usize,
    pub max_stop_len: usize,
    pub max_messages: usize,
}

impl Default for ParseLimits {
    fn default() -> ParseLimits {
        ParseLimits { max_images: 8, max_videos: 2, max_stop: 4, max_stop_len: 256, max_messages: 1024 }
    }
}

/// The JSON type of a value, for messages.
fn type_name(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

pub(crate) fn wrong_type(param: &str, want: &str, got: &Value) -> ApiError {
    ApiError::invalid(param, "invalid_type", format!("'{}' must be {}, not {}", param, want, type_name(got)))
}

/// A number parameter within `lo..=hi` (`None` when absent or null).
pub(crate) fn number(o: &Map<String, Value>, key: &str, lo: f64, hi: f64) -> Result<Option<f32>, ApiError> {
    match o.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(v) => {
            let x = v.as_f64().ok_or_else(|| wrong_type(key, "a number", v))?;
            if !(lo..=hi).contains(&x) {
                return Err(ApiError::invalid(key, "invalid_value", format!("'{}' is {}; it must be between {} and {}", key, x, lo, hi)));
            }
            Ok(Some(x as f32))
        }
    }
}

/// An integer parameter within `lo..=hi`.
pub(crate) fn integer(o: &Map<String, Value>, key: &str, lo: i64, hi: i64) -> Result<Option<i64>, ApiError> {
    match o.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(v) => {
            let x = v.as_i64().or_else(|| v.as_f64().filter(|f| f.fract() == 0.0 && f.abs() < 9e15).map(|f| f as i64)).ok_or_else(|| wrong_type(key, "an integer", v))?;
            if x < lo || x > hi {
                return Err(ApiError::invalid(key, "invalid_value", format!("'{}' is {}; it must be between {} and {}", key, x, lo, hi)));
            }
            Ok(Some(x))
        }
    }
}

pub(crate) fn boolean(o: &Map<String, Value>, key: &str) -> Result<bool, ApiError> {
    match o.get(key) {
        None | Some(Value::Null) => Ok(false),
        Some(Value::Bool(b)) => Ok(*b),
        Some(v) => Err(wrong_type(key, "a boolean", v)),
    }
}

/// Parses and checks a chat-completions body.
pub fn parse_chat_request(body: &[u8], limits: &ParseLimits) -> Result<ChatRequest, ApiError> {
    // 1. JSON object (serde_json limits nesting to 128 levels)
    let v: Value = serde_json::from_slice(body).map_err(|e| ApiError::new(400, "invalid_json", format!("the body is not valid JSON: {}", e)))?;
    let o = v.as_object().ok_or_else(|| ApiError::new(400, "invalid_json", format!("the body must be a JSON object, not {}", type_name(&v))))?;
    // 2. what we cannot do is refused rather than ignored: unknown fields too
    fields::check(o, Api::Chat)?;
    let tools = super::tools::parse_request(o)?;
    let template_kwargs = super::prompt::parse_template_kwargs(o)?;
    if let Some(m) = o.get("model") {
        if !m.is_string() && !m.is_null() {
            return Err(wrong_type("model", "a string", m));
        }
    }
    // 3. messages
    let messages = parse_messages(o.get("messages"), limits)?;
    // 4. generation settings
    let mut settings = settings::parse(o, limits, Api::Chat)?;
    // 5. tool_choice required / a named function / strict tools: the reply is constrained to calls
    super::tool_grammar::apply(&tools, &mut settings)?;
    Ok(ChatRequest { messages, settings, tools, template_kwargs })
}

/// Parses and checks `messages` (also for `/tokenize`).
pub fn parse_messages(v: Option<&Value>, limits: &ParseLimits) -> Result<Vec<ChatMessage>, ApiError> {
    let list = match v {
        None | Some(Value::Null) => return Err(ApiError::invalid("messages", "missing_required_parameter", "'messages' is required")),
        Some(Value::Array(a)) => a,
        Some(other) => return Err(wrong_type("messages", "an array", other)),
    };
    if list.is_empty() {
        return Err(ApiError::invalid("messages", "invalid_value", "'messages' must not be empty"));
    }
    if list.len() > limits.max_messages {
        return Err(ApiError::invalid("messages", "invalid_value", format!("at most {} messages are allowed", limits.max_messages)));
    }
    let (mut images, mut videos) = (0, 0);
    let mut out = Vec::with_capacity(list.len());
    for (i, m) in list.iter().enumerate() {
        let p = format!("messages[{}]", i);
        let mo = m.as_object().ok_or_else(|| wrong_type(&p, "an object", m))?;
        let role = match mo.get("role") {
            Some(Value::String(r)) => match r.as_str() {
                "system" | "developer" => Speaker::System,
                "user" => Speaker::User,
                "assistant" => Speaker::Assistant,
                "tool" => Speaker::Tool,
                "function" => return Err(ApiError::invalid(format!("{}.role", p), "unsupported_value", "role 'function' is deprecated and not supported: use 'tool' messages")),
                other => {
                    return Err(ApiError::invalid(format!("{}.role", p), "invalid_value", format!("unknown role '{}' (expected system, developer, user, assistant or tool)", other.chars().take(40).collect::<String>())))
                }
            },
            Some(other) => return Err(wrong_type(&format!("{}.role", p), "a string", other)),
            None => return Err(ApiError::invalid(format!("{}.role", p), "missing_required_parameter", format!("{}.role is required", p))),
        };
        let (tool_calls, tool_call_id) = super::tools::parse_message_calls(mo, &p, role == Speaker::Assistant, role == Speaker::Tool)?;
        let null_content = matches!(mo.get("content"), None | Some(Value::Null));
        let content_parts = matches!(mo.get("content"), Some(Value::Array(_)));
        let cp = format!("{}.content", p);
        let parts = match mo.get("content") {
            Some(Value::String(s)) => vec![Part::Text(s.clone())],
            Some(Value::Null) | None if role == Speaker::Assistant => Vec::new(),
            None => return Err(ApiError::invalid(cp.clone(), "missing_required_parameter", format!("{} is required", cp))),
            Some(Value::Array(items)) => {
                let mut parts = Vec::with_capacity(items.len());
                for (j, item) in items.iter().enumerate() {
                    let pp = format!("{}[{}]", cp, j);
                    let io = item.as_object().ok_or_else(|| wrong_type(&pp, "an object", item))?;
                    match io.get("type").and_then(|t| t.as_str()) {
                        Some("text") => match io.get("text") {
                            Some(Value::String(t)) => parts.push(Part::Text(t.clone())),
                            Some(other) => return Err(wrong_type(&format!("{}.text", pp), "a string", other)),
                            None => return Err(ApiError::invalid(format!("{}.text", pp), "missing_required_parameter", format!("{}.text is required", pp))),
                        },
                        Some(kind @ ("image_url" | "video_url")) => {
                            let (what, video) = if kind == "image_url" { ("images", false) } else { ("videos", true) };
                            if role != Speaker::User {
                                return Err(ApiError::invalid(pp, "invalid_value", format!("{} are only accepted in user messages", what)));
                            }
                            let up = format!("{}.{}", pp, kind);
                            let url = match io.get(kind) {
                                Some(Value::String(u)) => u.clone(),
                                Some(Value::Object(uo)) => match uo.get("url") {
                                    Some(Value::String(u)) => u.clone(),
                                    Some(other) => return Err(wrong_type(&format!("{}.url", up), "a string", other)),
                                    None => return Err(ApiError::invalid(format!("{}.url", up), "missing_required_parameter", format!("{}.url is required", up))),
                                },
                                Some(other) => return Err(wrong_type(&up, "an object with a url", other)),
                                None => return Err(ApiError::invalid(up.clone(), "missing_required_parameter", format!("{} is required", up))),
                            };
                            if video {
                                videos += 1;
                                if videos > limits.max_videos {
                                    return Err(ApiError::invalid(up, "too_many_videos", format!("at most {} videos per request are allowed", limits.max_videos)));
                                }
                                parts.push(Part::Video { url, param: up });
                            } else {
                                images += 1;
                                if images > limits.max_images {
                                    return Err(ApiError::invalid(up, "too_many_images", format!("at most {} images per request are allowed", limits.max_images)));
                                }
                                parts.push(Part::Image { url, param: up });
                            }
                        }
                        Some(other) => {
                            return Err(ApiError::invalid(
                                format!("{}.type", pp),
                                "unsupported_value",
                                format!("content part type '{}' is not supported (text, image_url and video_url are)", other.chars().take(40).collect::<String>()),
                            ))
                        }
                        None => return Err(ApiError::invalid(format!("{}.type", pp), "missing_required_parameter", format!("{}.type is required", pp))),
                    }
                }
                parts
            }
            Some(other) => return Err(wrong_type(&cp, "a string or an array of content parts", other)),
        };
        out.push(ChatMessage { role, parts, tool_calls, tool_call_id, null_content, content_parts });
    }
    Ok(out)
}

/// The usage object; `cached` prompt tokens came from the prefix cache.
pub fn usage(prompt: usize, cached: usize, completion: usize) -> Value {
    json!({"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion, "prompt_tokens_details": {"cached_tokens": cached}})
}

/// A whole (non-streamed) chat completion of `choices` ([`choice`]).
pub fn completion(id: &str, created: u64, model: &str, choices: Vec<Value>, usage: Value) -> Value {
    json!({"id": id, "object": "chat.completion", "created": created, "model": model, "choices": choices, "usage": usage})
}

/// One choice of a whole chat completion; `logprobs`: `{"content": [...]}` when asked.
pub fn choice(index: usize, content: &str, finish_reason: &str, logprobs: Option<Value>) -> Value {
    json!({"index": index, "message": {"role": "assistant", "content": content}, "finish_reason": finish_reason, "logprobs": logprobs})
}

/// One stream chunk of choice `index` with a delta (`{"role": ...}` or `{"content": ...}`), an
/// optional finish reason and the delta's tokens' logprobs (`{"content": [...]}`) when asked.
pub fn chunk(id: &str, created: u64, model: &str, index: usize, delta: Value, finish_reason: Option<&str>, logprobs: Option<Value>) -> Value {
    json!({
        "id": id,
        "object": "chat.completion.chunk",
        "created": created,
        "model": model,
        "choices": [{"index": index, "delta": delta, "finish_reason": finish_reason, "logprobs": logprobs}],
    })
}

/// The last chunk of a stream with `include_usage`: no choices, the usage.
pub fn usage_chunk(id: &str, created: u64, model: &str, prompt: usize, cached: usize, completion_tokens: usize) -> Value {
    json!({"id": id, "object": "chat.completion.chunk", "created": created, "model": model, "choices": [], "usage": usage(prompt, cached, completion_tokens)})
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(s: &str) -> Result<ChatRequest, ApiError> {
        parse_chat_request(s.as_bytes(), &ParseLimits::default())
    }

    #[test]
    fn parses_text_and_image_parts_in_order() {
        let r = parse(
            r#"{"model":"m","messages":[{"role":"system","content":"Be brief."},
              {"role":"user","content":[{"type":"text","text":"a"},{"type":"image_url","image_url":{"url":"data:x"}},{"type":"text","text":"b"}]}],
              "max_tokens":5,"max_completion_tokens":7,"temperature":0,"top_k":-1,"seed":-3,"stop":"x","stream":true,"stream_options":{"include_usage":true}}"#,
        )
        .unwrap();
        assert_eq!(r.messages.len(), 2);
        assert_eq!(r.messages[1].parts, vec![Part::Text("a".into()), Part::Image { url: "data:x".into(), param: "messages[1].content[1].image_url".into() }, Part::Text("b".into())]);
        let s = &r.settings;
        assert_eq!((s.max_tokens, s.temperature, s.top_k, s.seed), (Some(7), Some(0.0), Some(0), Some((-3i64) as u64)));
        assert!(s.stream && s.include_usage && s.stop == ["x"] && s.n == 1);
    }

    #[test]
    fn errors_name_the_parameter() {
        let e = |s: &str| parse(s).unwrap_err();
        let m = r#""messages":[{"role":"user","content":"hi"}]"#;
        assert_eq!(e("{nope").code, "invalid_json");
        assert_eq!(e("[]").code, "invalid_json");
        assert_eq!(e("{}").param.as_deref(), Some("messages"));
        assert_eq!(e(r#"{"messages":[]}"#).param.as_deref(), Some("messages"));
        assert_eq!(e(&format!("{{{},\"temperature\":\"hot\"}}", m)).code, "invalid_type");
        assert_eq!(e(&format!("{{{},\"temperature\":3}}", m)).param.as_deref(), Some("temperature"));
        assert_eq!(e(&format!("{{{},\"top_p\":0}}", m)).param.as_deref(), Some("top_p"));
        assert_eq!(e(&format!("{{{},\"n\":17}}", m)).param.as_deref(), Some("n"));
        assert_eq!(e(&format!("{{{},\"suffix\":\"x\"}}", m)).code, "unknown_parameter");
        assert_eq!(e(&format!("{{{},\"max_tokens\":0}}", m)).param.as_deref(), Some("max_tokens"));
        assert_eq!(e(&format!("{{{},\"stop\":[\"a\",\"b\",\"c\",\"d\",\"e\"]}}", m)).param.as_deref(), Some("stop"));
        assert_eq!(e(r#"{"messages":[{"role":"tool","content":"x"}]}"#).param.as_deref(), Some("messages[0].tool_call_id"));
        assert_eq!(e(r#"{"messages":[{"role":"function","content":"x"}]}"#).param.as_deref(), Some("messages[0].role"));
        assert_eq!(e(r#"{"messages":[{"role":"user","content":[{"type":"input_audio"}]}]}"#).param.as_deref(), Some("messages[0].content[0].type"));
        assert_eq!(e(r#"{"messages":[{"role":"user","content":[{"type":"image_url","image_url":{"url":5}}]}]}"#).param.as_deref(), Some("messages[0].content[0].image_url.url"));
        let many: Vec<String> = (0..9).map(|_| r#"{"type":"image_url","image_url":"data:x"}"#.to_string()).collect();
        let err = e(&format!(r#"{{"messages":[{{"role":"user","content":[{}]}}]}}"#, many.join(",")));
        assert_eq!((err.status, err.code), (400, "too_many_images"));
        assert!(err.to_json()["error"]["message"].as_str().unwrap().contains("at most 8"));
    }
}
