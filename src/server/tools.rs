//! Tool calling: the request's `tools`, `tool_choice` and `parallel_tool_calls`, the history's
//! assistant `tool_calls` and `tool` messages, and the reply's `<tool_call>` blocks (Qwen's
//! Hermes-style format: `<tool_call>\n{"name": ..., "arguments": {...}}\n</tool_call>`) parsed
//! into OpenAI `tool_calls`, whole or as stream deltas.

use super::openai::ApiError;
use crate::template::{json::dumps_json, ToolCall};
use serde_json::{json, Map, Value};

/// The most tools one request may define (OpenAI's limit).
pub const MAX_TOOLS: usize = 128;

/// Whether and how the model may call tools.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ToolChoice {
    /// Never: the reply is text (the tools are still shown to the model, as vLLM does).
    None,
    /// The model decides.
    Auto,
    /// At least one call.
    Required,
    /// A call of this function.
    Function(String),
}

/// The tool fields of a request, checked.
#[derive(Clone, Debug, PartialEq)]
pub struct ToolRequest {
    /// The definitions as sent (`{"type": "function", "function": {name, description,
    /// parameters, strict}}`), passed to the chat template as they are.
    pub tools: Vec<Value>,
    pub choice: ToolChoice,
    /// `parallel_tool_calls` (default true): false keeps at most one call.
    pub parallel: bool,
}

impl Default for ToolRequest {
    fn default() -> ToolRequest {
        ToolRequest { tools: Vec::new(), choice: ToolChoice::Auto, parallel: true }
    }
}

impl ToolRequest {
    /// The tools for the chat template (`None` when there are none).
    pub fn template_tools(&self) -> Option<&[Value]> {
        if self.tools.is_empty() {
            None
        } else {
            Some(&self.tools)
        }
    }

    /// The defined functions' names.
    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.tools.iter().filter_map(|t| t["function"]["name"].as_str())
    }

    /// Whether the reply is read for tool calls.
    pub fn parses_output(&self) -> bool {
        !self.tools.is_empty() && self.choice != ToolChoice::None
    }

    /// Whether the tool `strict` flags ask for arguments that follow the schema.
    pub fn any_strict(&self) -> bool {
        self.tools.iter().any(|t| t["function"]["strict"] == Value::Bool(true))
    }

    /// What reads the reply for calls, or `None` when calls are not looked for.
    pub fn reader(&self) -> Option<CallReader> {
        self.parses_output().then(|| CallReader { names: self.names().map(String::from).collect(), max_calls: if self.parallel { usize::MAX } else { 1 } })
    }
}

/// Makes the parsers of a request's replies (one per choice): the tools' names and how many
/// calls a reply may make.
#[derive(Clone, Debug, PartialEq)]
pub struct CallReader {
    names: Vec<String>,
    max_calls: usize,
}

impl CallReader {
    pub fn parser(&self) -> ToolParser {
        ToolParser::new(self.names.clone(), self.max_calls)
    }
}

fn invalid(param: impl Into<String>, msg: impl Into<String>) -> ApiError {
    ApiError::invalid(param, "invalid_value", msg)
}

fn wrong_type(param: &str, want: &str) -> ApiError {
    ApiError::invalid(param, "invalid_type", format!("'{}' must be {}", param, want))
}

/// A function name as OpenAI takes it: 1 to 64 of `a-z A-Z 0-9 _ -`.
fn valid_name(n: &str) -> bool {
    !n.is_empty() && n.len() <= 64 && n.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
}

/// Parses `tools`, `tool_choice`, `parallel_tool_calls` (and refuses the deprecated
/// `functions` / `function_call`).
pub fn parse_request(o: &Map<String, Value>) -> Result<ToolRequest, ApiError> {
    for key in ["functions", "function_call"] {
        if o.get(key).is_some_and(|v| !v.is_null()) {
            return Err(ApiError::invalid(key, "unsupported_parameter", format!("'{}' is deprecated and not supported: use 'tools' and 'tool_choice'", key)));
        }
    }
    // 1. the definitions
    let mut req = ToolRequest::default();
    match o.get("tools") {
        None | Some(Value::Null) => {}
        Some(Value::Array(a)) => {
            if a.len() > MAX_TOOLS {
                return Err(invalid("tools", format!("at most {} tools are allowed, got {}", MAX_TOOLS, a.len())));
            }
            for (i, t) in a.iter().enumerate() {
                check_tool(t, &format!("tools[{}]", i))?;
                let name = t["function"]["name"].as_str().unwrap_or_default();
                if req.names().any(|n| n == name) {
                    return Err(invalid(format!("tools[{}].function.name", i), format!("two tools are named '{}'", name)));
                }
                req.tools.push(t.clone());
            }
        }
        Some(_) => return Err(wrong_type("tools", "an array of tools")),
    }
    // 2. the choice
    req.choice = match o.get("tool_choice") {
        None | Some(Value::Null) => ToolChoice::Auto,
        Some(Value::String(s)) => match s.as_str() {
            "none" => ToolChoice::None,
            "auto" => ToolChoice::Auto,
            "required" => ToolChoice::Required,
            other => return Err(invalid("tool_choice", format!("tool_choice '{}' is not one of none, auto, required (or an object naming a function)", other.chars().take(40).collect::<String>()))),
        },
        Some(Value::Object(c)) => {
            if c.get("type").and_then(Value::as_str) != Some("function") {
                return Err(ApiError::invalid("tool_choice.type", "unsupported_value", "a tool_choice object must be {\"type\": \"function\", \"function\": {\"name\": ...}}"));
            }
            match c.get("function").and_then(|f| f.get("name")).and_then(Value::as_str) {
                Some(n) => ToolChoice::Function(n.to_string()),
                None => return Err(ApiError::invalid("tool_choice.function.name", "missing_required_parameter", "tool_choice.function.name is required")),
            }
        }
        Some(_) => return Err(wrong_type("tool_choice", "a string or an object")),
    };
    match &req.choice {
        ToolChoice::Required if req.tools.is_empty() => return Err(invalid("tool_choice", "tool_choice 'required' needs tools")),
        ToolChoice::Function(n) if !req.names().any(|t| t == n) => {
            return Err(invalid("tool_choice.function.name", format!("tool_choice names '{}', which is not among the tools", n.chars().take(64).collect::<String>())))
        }
        _ => {}
    }
    req.parallel = match o.get("parallel_tool_calls") {
        None | Some(Value::Null) => true,
        Some(Value::Bool(b)) => *b,
        Some(_) => return Err(wrong_type("parallel_tool_calls", "a boolean")),
    };
    Ok(req)
}

/// One tool definition: `{"type": "function", "function": {"name", "description"?,
/// "parameters"? (a JSON schema object), "strict"?}}`.
fn check_tool(t: &Value, p: &str) -> Result<(), ApiError> {
    let to = t.as_object().ok_or_else(|| wrong_type(p, "an object"))?;
    match to.get("type") {
        Some(Value::String(s)) if s == "function" => {}
        Some(Value::String(s)) => return Err(ApiError::invalid(format!("{}.type", p), "unsupported_value", format!("tool type '{}' is not supported (only 'function' is)", s.chars().take(40).collect::<String>()))),
        Some(_) => return Err(wrong_type(&format!("{}.type", p), "a string")),
        None => return Err(ApiError::invalid(format!("{}.type", p), "missing_required_parameter", format!("{}.type is required", p))),
    }
    let fp = format!("{}.function", p);
    let f = match to.get("function") {
        Some(Value::Object(f)) => f,
        Some(_) => return Err(wrong_type(&fp, "an object")),
        None => return Err(ApiError::invalid(fp.clone(), "missing_required_parameter", format!("{} is required", fp))),
    };
    match f.get("name") {
        Some(Value::String(n)) if valid_name(n) => {}
        Some(Value::String(_)) => return Err(invalid(format!("{}.name", fp), "a function name must have 1 to 64 characters of a-z, A-Z, 0-9, _ and -")),
        Some(_) => return Err(wrong_type(&format!("{}.name", fp), "a string")),
        None => return Err(ApiError::invalid(format!("{}.name", fp), "missing_required_parameter", format!("{}.name is required", fp))),
    }
    if let Some(d) = f.get("description").filter(|d| !d.is_null()) {
        if !d.is_string() {
            return Err(wrong_type(&format!("{}.description", fp), "a string"));
        }
    }
    if let Some(s) = f.get("parameters").filter(|s| !s.is_null()) {
        if !s.is_object() {
            return Err(wrong_type(&format!("{}.parameters", fp), "a JSON schema object"));
        }
    }
    if let Some(s) = f.get("strict").filter(|s| !s.is_null()) {
        if !s.is_boolean() {
            return Err(wrong_type(&format!("{}.strict", fp), "a boolean"));
        }
    }
    Ok(())
}

/// An assistant message's `tool_calls` (each `{"id", "type": "function", "function": {"name",
/// "arguments"}}`, the arguments a JSON string holding an object, or the object itself), and a
/// tool message's `tool_call_id`.
pub fn parse_message_calls(mo: &Map<String, Value>, p: &str, assistant: bool, tool: bool) -> Result<(Vec<ToolCall>, Option<String>), ApiError> {
    let mut calls = Vec::new();
    match mo.get("tool_calls") {
        None | Some(Value::Null) => {}
        Some(Value::Array(a)) if a.is_empty() => {}
        Some(Value::Array(_)) if !assistant => return Err(invalid(format!("{}.tool_calls", p), "only assistant messages have tool_calls")),
        Some(Value::Array(a)) => {
            for (j, c) in a.iter().enumerate() {
                let cp = format!("{}.tool_calls[{}]", p, j);
                let co = c.as_object().ok_or_else(|| wrong_type(&cp, "an object"))?;
                if let Some(t) = co.get("type").filter(|t| !t.is_null()) {
                    if t.as_str() != Some("function") {
                        return Err(ApiError::invalid(format!("{}.type", cp), "unsupported_value", "tool calls must be of type 'function'"));
                    }
                }
                let id = match co.get("id") {
                    None | Some(Value::Null) => None,
                    Some(Value::String(s)) => Some(s.clone()),
                    Some(_) => return Err(wrong_type(&format!("{}.id", cp), "a string")),
                };
                let fp = format!("{}.function", cp);
                let f = co.get("function").and_then(Value::as_object).ok_or_else(|| ApiError::invalid(fp.clone(), "missing_required_parameter", format!("{} (an object with name and arguments) is required", fp)))?;
                let name = f.get("name").and_then(Value::as_str).ok_or_else(|| ApiError::invalid(format!("{}.name", fp), "missing_required_parameter", format!("{}.name (a string) is required", fp)))?;
                let ap = format!("{}.arguments", fp);
                let arguments = match f.get("arguments") {
                    Some(Value::String(s)) => match serde_json::from_str::<Value>(s) {
                        Ok(v @ Value::Object(_)) => v,
                        Ok(_) => return Err(invalid(ap, "the arguments must be a JSON object (as a string)")),
                        Err(e) => return Err(invalid(ap, format!("the arguments are not valid JSON: {}", e))),
                    },
                    Some(v @ Value::Object(_)) => v.clone(),
                    Some(_) => return Err(wrong_type(&ap, "a JSON string")),
                    None => return Err(ApiError::invalid(ap.clone(), "missing_required_parameter", format!("{} is required", ap))),
                };
                calls.push(ToolCall { id, name: name.to_string(), arguments });
            }
        }
        Some(_) => return Err(wrong_type(&format!("{}.tool_calls", p), "an array")),
    }
    let id = match mo.get("tool_call_id") {
        None | Some(Value::Null) if tool => return Err(ApiError::invalid(format!("{}.tool_call_id", p), "missing_required_parameter", format!("{}.tool_call_id is required in a tool message", p))),
        None | Some(Value::Null) => None,
        Some(Value::String(s)) if tool => Some(s.clone()),
        Some(Value::String(_)) => return Err(invalid(format!("{}.tool_call_id", p), "only tool messages have a tool_call_id")),
        Some(_) => return Err(wrong_type(&format!("{}.tool_call_id", p), "a string")),
    };
    Ok((calls, id))
}

/// A call found in the reply.
#[derive(Clone, Debug, PartialEq)]
pub struct ParsedCall {
    pub index: usize,
    pub id: String,
    pub name: String,
    /// The arguments as a JSON string (Python's `json.dumps` spacing, as vLLM writes them).
    pub arguments: String,
}

impl ParsedCall {
    /// The OpenAI message form.
    pub fn to_json(&self) -> Value {
        json!({"id": self.id, "type": "function", "function": {"name": self.name, "arguments": self.arguments}})
    }

    /// The stream deltas: the call's id, type and name, then its arguments.
    pub fn deltas(&self) -> [Value; 2] {
        [
            json!({"tool_calls": [{"index": self.index, "id": self.id, "type": "function", "function": {"name": self.name, "arguments": ""}}]}),
            json!({"tool_calls": [{"index": self.index, "function": {"arguments": self.arguments}}]}),
        ]
    }
}

/// What the parser lets out: text for `content`, or a call.
#[derive(Clone, Debug, PartialEq)]
pub enum Output {
    Content(String),
    Call(ParsedCall),
}

const START: &str = "<tool_call>";
const END: &str = "</tool_call>";

/// A fresh call id: `call_` and 24 letters and digits.
fn call_id() -> String {
    use std::sync::atomic::{AtomicU64, Ordering};
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let t = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_nanos() as u64);
    let mut s = t ^ NEXT.fetch_add(1, Ordering::Relaxed).wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ (std::process::id() as u64) << 32;
    const ABC: &[u8] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789";
    let mut id = String::from("call_");
    for _ in 0..24 {
        // splitmix64
        s = s.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = s;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        id.push(ABC[((z ^ (z >> 31)) % ABC.len() as u64) as usize] as char);
    }
    id
}

/// Reads a reply as it streams, splitting `<tool_call>` blocks from the text around them.
/// Text is let out as soon as it cannot be the start of a block; whitespace next to a block
/// is dropped (the newlines between calls are not content). A block whose inside is not a JSON
/// object with a known tool's `name` (and an object of `arguments`) stays text, as does one the
/// reply leaves open. Past `max_calls` calls, later blocks are dropped.
pub struct ToolParser {
    names: Vec<String>,
    max_calls: usize,
    buf: String,
    in_block: bool,
    /// Whitespace held back: it is dropped when a call follows.
    pending_ws: String,
    /// The whitespace before the open block: dropped if it is a call, kept if it stays text.
    block_ws: String,
    /// A call just closed: leading whitespace is dropped.
    after_block: bool,
    calls: usize,
}

impl ToolParser {
    pub fn new(names: Vec<String>, max_calls: usize) -> ToolParser {
        ToolParser { names, max_calls, buf: String::new(), in_block: false, pending_ws: String::new(), block_ws: String::new(), after_block: false, calls: 0 }
    }

    /// Calls found so far.
    pub fn calls(&self) -> usize {
        self.calls
    }

    /// Text outside blocks; its trailing whitespace is held back.
    fn content(&mut self, text: &str, out: &mut Vec<Output>) {
        let mut text = text;
        if self.after_block {
            text = text.trim_start();
            if text.is_empty() {
                return;
            }
            self.after_block = false;
        }
        let mut all = std::mem::take(&mut self.pending_ws);
        all.push_str(text);
        let body = all.trim_end();
        self.pending_ws = all[body.len()..].to_string();
        if !body.is_empty() {
            out.push(Output::Content(body.to_string()));
        }
    }

    /// A closed block: a call, or text as it was.
    fn block(&mut self, inner: &str, out: &mut Vec<Output>) {
        if self.calls >= self.max_calls {
            self.block_ws.clear();
            self.after_block = true;
            return;
        }
        let parsed = serde_json::from_str::<Value>(inner.trim()).ok().and_then(|v| {
            let name = v.get("name")?.as_str()?.to_string();
            let args = match v.get("arguments") {
                None => Value::Object(Map::new()),
                Some(a @ Value::Object(_)) => a.clone(),
                Some(_) => return None,
            };
            self.names.contains(&name).then_some((name, args))
        });
        match parsed {
            Some((name, args)) => {
                out.push(Output::Call(ParsedCall { index: self.calls, id: call_id(), name, arguments: dumps_json(&args) }));
                self.calls += 1;
                self.block_ws.clear();
                self.after_block = true;
            }
            None => self.unblocked(&format!("{}{}{}", START, inner, END), out),
        }
    }

    /// A block that is not a call: text, with the whitespace before it.
    fn unblocked(&mut self, raw: &str, out: &mut Vec<Output>) {
        self.pending_ws = std::mem::take(&mut self.block_ws);
        self.after_block = false;
        self.content(raw, out);
    }

    /// Takes the next piece of the reply.
    pub fn push(&mut self, text: &str) -> Vec<Output> {
        self.buf.push_str(text);
        let mut out = Vec::new();
        loop {
            if self.in_block {
                match self.buf.find(END) {
                    Some(j) => {
                        let inner = self.buf[..j].to_string();
                        self.buf.drain(..j + END.len());
                        self.in_block = false;
                        self.block(&inner, &mut out);
                    }
                    None => break,
                }
            } else {
                match self.buf.find(START) {
                    Some(i) => {
                        let before = self.buf[..i].to_string();
                        self.buf.drain(..i + START.len());
                        self.content(&before, &mut out);
                        self.block_ws = std::mem::take(&mut self.pending_ws);
                        self.in_block = true;
                    }
                    None => {
                        // hold back an end that may be the start of a block
                        let keep = (1..START.len()).rev().find(|&k| self.buf.len() >= k && self.buf.is_char_boundary(self.buf.len() - k) && START.starts_with(&self.buf[self.buf.len() - k..])).unwrap_or(0);
                        let text = self.buf[..self.buf.len() - keep].to_string();
                        self.buf.drain(..self.buf.len() - keep);
                        self.content(&text, &mut out);
                        break;
                    }
                }
            }
        }
        out
    }

    /// The end of the reply: what was held back (an open block as text).
    pub fn finish(&mut self) -> Vec<Output> {
        let mut out = Vec::new();
        let rest = std::mem::take(&mut self.buf);
        if self.in_block {
            self.in_block = false;
            self.unblocked(&format!("{}{}", START, rest), &mut out);
        } else {
            self.content(&rest, &mut out);
        }
        let ws = std::mem::take(&mut self.pending_ws);
        if self.calls == 0 && !ws.is_empty() {
            out.push(Output::Content(ws));
        }
        out
    }
}

/// A whole reply read for calls: the content (`None` when calls left no text) and the calls.
pub fn parse_reply(parser: &mut ToolParser, text: &str) -> (Option<String>, Vec<ParsedCall>) {
    let mut content = String::new();
    let mut calls = Vec::new();
    for o in parser.push(text).into_iter().chain(parser.finish()) {
        match o {
            Output::Content(t) => content.push_str(&t),
            Output::Call(c) => calls.push(c),
        }
    }
    let content = if content.is_empty() && !calls.is_empty() { None } else { Some(content) };
    (content, calls)
}

/// Sets a whole chat choice's message and finish reason for the calls found in its text.
pub fn apply_to_choice(choice: &mut Value, parser: &mut ToolParser, text: &str) {
    let (content, calls) = parse_reply(parser, text);
    choice["message"]["content"] = content.map_or(Value::Null, Value::String);
    if !calls.is_empty() {
        choice["message"]["tool_calls"] = Value::Array(calls.iter().map(ParsedCall::to_json).collect());
        if choice["finish_reason"] == "stop" {
            choice["finish_reason"] = json!("tool_calls");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parser() -> ToolParser {
        ToolParser::new(vec!["get_weather".into(), "search".into()], usize::MAX)
    }

    fn req(body: Value) -> Result<ToolRequest, ApiError> {
        parse_request(body.as_object().unwrap())
    }

    #[test]
    fn calls_are_parsed_and_text_around_them_kept() {
        let text = "Let me check.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Zürich\"}}\n</tool_call>\n<tool_call>\n{\"name\":\"search\",\"arguments\":{\"query\":\"a\",\"n\":1.0}}\n</tool_call>";
        let (content, calls) = parse_reply(&mut parser(), text);
        assert_eq!(content.as_deref(), Some("Let me check."));
        assert_eq!(calls.len(), 2);
        assert_eq!((calls[0].index, calls[0].name.as_str(), calls[0].arguments.as_str()), (0, "get_weather", r#"{"city": "Zürich"}"#));
        assert_eq!((calls[1].index, calls[1].arguments.as_str()), (1, r#"{"query": "a", "n": 1.0}"#));
        assert!(calls[0].id.starts_with("call_") && calls[0].id.len() == 29 && calls[0].id != calls[1].id);
        // only calls: content null
        let (content, calls) = parse_reply(&mut parser(), "<tool_call>\n{\"name\": \"search\", \"arguments\": {}}\n</tool_call>\n");
        assert_eq!((content, calls.len()), (None, 1));
        // no calls: the text as it is, whitespace included
        assert_eq!(parse_reply(&mut parser(), "Hello \n").0.as_deref(), Some("Hello \n"));
    }

    #[test]
    fn bad_blocks_stay_text() {
        for bad in ["<tool_call>\n{\"name\": \"nope\", \"arguments\": {}}\n</tool_call>", "<tool_call>{not json}</tool_call>", "<tool_call>\n{\"name\": \"search\", \"arguments\": [1]}\n</tool_call>", "x <tool_call>\n{\"name\": \"search\""] {
            let (content, calls) = parse_reply(&mut parser(), bad);
            assert!(calls.is_empty(), "{}", bad);
            assert_eq!(content.as_deref(), Some(bad), "{}", bad);
        }
    }

    #[test]
    fn streamed_pieces_give_what_the_whole_text_gives() {
        let text = "Sure.  <tool_call>\n{\"name\": \"search\", \"arguments\": {\"query\": \"<tool\"}}\n</tool_call>\n\nDone <tool";
        let whole = parse_reply(&mut parser(), text);
        for step in [1, 2, 3, 5, 7] {
            let mut p = parser();
            let chars: Vec<char> = text.chars().collect();
            let mut outs = Vec::new();
            for piece in chars.chunks(step) {
                outs.extend(p.push(&piece.iter().collect::<String>()));
            }
            outs.extend(p.finish());
            let content: String = outs.iter().filter_map(|o| if let Output::Content(t) = o { Some(t.as_str()) } else { None }).collect();
            let calls: Vec<&ParsedCall> = outs.iter().filter_map(|o| if let Output::Call(c) = o { Some(c) } else { None }).collect();
            assert_eq!(Some(content), whole.0, "step {}", step);
            assert_eq!(calls.len(), 1);
            assert_eq!(calls[0].arguments, whole.1[0].arguments);
        }
        assert_eq!(whole.0.as_deref(), Some("Sure.Done <tool"));
    }

    #[test]
    fn without_parallel_calls_one_call_is_kept() {
        let mut p = ToolParser::new(vec!["search".into()], 1);
        let one = "<tool_call>\n{\"name\": \"search\", \"arguments\": {}}\n</tool_call>";
        let (content, calls) = parse_reply(&mut p, &format!("{}\n{}", one, one));
        assert_eq!((content, calls.len()), (None, 1));
    }

    #[test]
    fn request_fields_are_checked() {
        let weather = json!({"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}});
        let r = req(json!({"tools": [weather], "tool_choice": {"type": "function", "function": {"name": "get_weather"}}, "parallel_tool_calls": false})).unwrap();
        assert_eq!((r.choice.clone(), r.parallel, r.parses_output()), (ToolChoice::Function("get_weather".into()), false, true));
        assert_eq!(req(json!({})).unwrap(), ToolRequest::default());
        let param = |b: Value| req(b).unwrap_err().param.unwrap();
        assert_eq!(param(json!({"tools": [{"type": "custom", "custom": {}}]})), "tools[0].type");
        assert_eq!(param(json!({"tools": [{"type": "function", "function": {"name": "a b"}}]})), "tools[0].function.name");
        assert_eq!(param(json!({"tools": [{"type": "function", "function": {"name": "a", "parameters": []}}]})), "tools[0].function.parameters");
        assert_eq!(param(json!({"tools": [weather], "tool_choice": {"type": "function", "function": {"name": "other"}}})), "tool_choice.function.name");
        assert_eq!(param(json!({"tool_choice": "required"})), "tool_choice");
        assert_eq!(param(json!({"tools": [weather], "tool_choice": "sometimes"})), "tool_choice");
        assert_eq!(param(json!({"tools": [weather, weather]})), "tools[1].function.name");
        assert_eq!(param(json!({"functions": [{}]})), "functions");
        assert_eq!(param(json!({"tools": [weather], "parallel_tool_calls": "yes"})), "parallel_tool_calls");
    }

    #[test]
    fn history_calls_take_json_string_arguments() {
        let m = json!({"role": "assistant", "content": null, "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{\"b\": 1, \"a\": [2]}"}}]});
        let (calls, id) = parse_message_calls(m.as_object().unwrap(), "messages[1]", true, false).unwrap();
        assert_eq!(id, None);
        assert_eq!(calls[0].arguments, json!({"b": 1, "a": [2]}));
        assert_eq!(serde_json::to_string(&calls[0].arguments).unwrap(), r#"{"b":1,"a":[2]}"#, "the order is kept");
        let bad = json!({"role": "assistant", "tool_calls": [{"type": "function", "function": {"name": "f", "arguments": "{oops"}}]});
        assert_eq!(parse_message_calls(bad.as_object().unwrap(), "messages[1]", true, false).unwrap_err().param.as_deref(), Some("messages[1].tool_calls[0].function.arguments"));
        let tool = json!({"role": "tool", "content": "42"});
        assert_eq!(parse_message_calls(tool.as_object().unwrap(), "messages[2]", false, true).unwrap_err().param.as_deref(), Some("messages[2].tool_call_id"));
    }
}
