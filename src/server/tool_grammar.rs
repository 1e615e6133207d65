//! The Lark grammar (llguidance's dialect) that constrains a reply to tool calls, for
//! `tool_choice` `required` or a named function, and for `strict: true` tools under `auto`.
//!
//! Each call is written as Qwen's template writes one back in the history and as
//! `tools::ToolParser` reads it: `<tool_call>\n{"name": "NAME", "arguments": {...}}\n</tool_call>`,
//! the JSON compact with `", "` / `": "` separators, `name` first. The arguments follow the
//! tool's `parameters` schema (any object when it has none; under `auto`, any object for a tool
//! that is not strict). Several calls are separated by `"\n"`, as the template separates them.
//! After the last call the grammar is complete, so only the end of turn may follow.

use super::openai::ApiError;
use super::settings::Settings;
use super::structured::Structured;
use super::tools::{ToolChoice, ToolRequest};
use crate::generate::grammar::GrammarSpec;
use serde_json::{json, Map, Value};

/// Whether the request's tool fields constrain the reply: `required`, a named function, or
/// `auto` with a `strict: true` tool.
pub fn constrains(req: &ToolRequest) -> bool {
    if req.tools.is_empty() {
        return false;
    }
    match req.choice {
        ToolChoice::Required | ToolChoice::Function(_) => true,
        ToolChoice::Auto => req.any_strict(),
        ToolChoice::None => false,
    }
}

/// The field that asks for the constraint: `tool_choice`, or the first strict tool's
/// `tools[i].function.strict` under `auto`.
fn asking_field(req: &ToolRequest) -> String {
    match req.choice {
        ToolChoice::Auto => req.tools.iter().position(|t| t["function"]["strict"] == Value::Bool(true)).map_or("tools".into(), |i| format!("tools[{}].function.strict", i)),
        _ => "tool_choice".into(),
    }
}

/// Makes the call grammar the request's structured output when its tool fields constrain the
/// reply. Refused (400): together with `response_format` / `structured_outputs` (one reply
/// cannot follow both), or with `min_tokens` (a complete call must be able to end the reply).
/// A tool schema llguidance cannot compile is a 400 later, when the grammar is compiled,
/// naming the tool's `parameters` when one tool is callable, else `tools`.
pub fn apply(req: &ToolRequest, st: &mut Settings) -> Result<(), ApiError> {
    if !constrains(req) {
        return Ok(());
    }
    let field = asking_field(req);
    if let Some(s) = &st.structured {
        let top = s.param.split('.').next().unwrap_or(&s.param).to_string();
        return Err(ApiError::invalid(top.clone(), "unsupported_value", format!("'{}' cannot be combined with '{}', which constrains the reply to tool calls", top, field)));
    }
    if st.min_tokens > 0 {
        return Err(ApiError::invalid("min_tokens", "unsupported_value", format!("'min_tokens' cannot be combined with '{}', which constrains the reply to tool calls: a complete call must be able to end it", field)));
    }
    let param = match &req.choice {
        ToolChoice::Function(n) => req.tools.iter().position(|t| t["function"]["name"].as_str() == Some(n)).map_or("tools".into(), |i| format!("tools[{}].function.parameters", i)),
        _ if req.tools.len() == 1 => "tools[0].function.parameters".into(),
        _ => "tools".into(),
    };
    st.structured = Some(Structured { spec: GrammarSpec::Lark(call_grammar(req)), param });
    Ok(())
}

/// The JSON schema of one call of the tool `t`: `{"name": const, "arguments": parameters}`,
/// both required, nothing else. With `any_arguments`, the arguments are any object.
/// `$defs` / `definitions` of the parameters move to the call's root, where their `#/$defs/...`
/// references (as Pydantic writes them) point.
fn call_schema(t: &Value, any_arguments: bool) -> Value {
    let f = &t["function"];
    let mut params = match f.get("parameters") {
        Some(Value::Object(p)) if !any_arguments => p.clone(),
        _ => Map::from_iter([("type".to_string(), json!("object"))]),
    };
    let mut root = Map::new();
    for key in ["$defs", "definitions"] {
        if let Some(d) = params.remove(key) {
            root.insert(key.to_string(), d);
        }
    }
    root.insert("type".into(), json!("object"));
    root.insert("properties".into(), json!({"name": {"const": f["name"]}, "arguments": Value::Object(params)}));
    root.insert("required".into(), json!(["name", "arguments"]));
    root.insert("additionalProperties".into(), json!(false));
    // compact JSON as Python's json.dumps writes it (what the template writes back)
    root.insert("x-guidance".into(), json!({"whitespace_flexible": false, "item_separator": ", ", "key_separator": ": "}));
    Value::Object(root)
}

/// The Lark grammar of the calls `req` allows (see the module doc). Meant for requests where
/// [`constrains`] is true; for others it is the `auto` form.
pub fn call_grammar(req: &ToolRequest) -> String {
    // 1. which tools may be called, and whether their arguments follow their schema
    let tools: Vec<(&Value, bool)> = match &req.choice {
        ToolChoice::Function(name) => req.tools.iter().filter(|t| t["function"]["name"].as_str() == Some(name)).map(|t| (t, false)).collect(),
        ToolChoice::Auto | ToolChoice::None => req.tools.iter().map(|t| (t, t["function"]["strict"] != Value::Bool(true))).collect(),
        ToolChoice::Required => req.tools.iter().map(|t| (t, false)).collect(),
    };
    // 2. one rule per tool's JSON (each its own schema root: their lexemes merge, so the
    //    choice is made by the name inside), and a call of any of them
    let bodies: Vec<String> = (0..tools.len()).map(|i| format!("call_{}", i)).collect();
    let body = bodies.join(" | ");
    let mut rules = format!("call: \"<tool_call>\\n\" ({}) \"\\n</tool_call>\"\n", body);
    for (name, (t, any)) in bodies.iter().zip(&tools) {
        rules.push_str(&format!("{}: %json {}\n", name, call_schema(t, *any)));
    }
    // 3. how many calls, and what may come before them
    let more = req.parallel && !matches!(req.choice, ToolChoice::Function(_));
    let tail = if more { " (\"\\n\" call)*" } else { "" };
    let start = match req.choice {
        ToolChoice::Required | ToolChoice::Function(_) => format!("start: call{}\n", tail),
        // free text without "<tool_call>", or text up to the first "<tool_call>" (the lazy
        // head ends there), which must then be a call
        ToolChoice::Auto | ToolChoice::None => format!(
            "start: TEXT | head \"\\n\" ({}) \"\\n</tool_call>\"{}\nTEXT: /(?s:.*)/ & ~/(?s:.*)<tool_call>(?s:.*)/\nhead[lazy]: /(?s:.*)<tool_call>/\n",
            body, tail
        ),
    };
    format!("{}{}", start, rules)
}

#[cfg(test)]
mod tests;
