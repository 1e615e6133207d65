//! Structured output in a request (chat and completions): OpenAI's `response_format` (`text`,
//! `json_object`, `json_schema`) and vLLM's `structured_outputs` (`json`, `regex`, `choice`,
//! `grammar`, `json_object`; exactly one), checked into a [`GrammarSpec`], then compiled
//! (cached) into the grammar each of the request's choices is constrained by. vLLM's removed
//! `guided_*` fields are refused with a message that names `structured_outputs`, and a schema,
//! regex or grammar that does not compile is a 400 that names the problem.

use super::openai::ApiError;
use crate::generate::grammar::{Grammar, GrammarSpec, Grammars};
use crate::Tokenizer;
use serde_json::{Map, Value};
use std::sync::{Arc, OnceLock};

/// What a request's reply must match, and the parameter that asked for it (for errors).
#[derive(Clone, Debug, PartialEq)]
pub struct Structured {
    pub spec: GrammarSpec,
    pub param: String,
}

/// vLLM's fields before `structured_outputs` (removed in vLLM 0.12).
const REMOVED: [&str; 6] = ["guided_json", "guided_regex", "guided_choice", "guided_grammar", "guided_decoding_backend", "guided_whitespace_pattern"];

/// The fields of `structured_outputs`, one of which is given.
const KINDS: [&str; 5] = ["json", "regex", "choice", "grammar", "json_object"];

fn wrong_type(param: &str, want: &str) -> ApiError {
    ApiError::invalid(param, "invalid_type", format!("'{}' must be {}", param, want))
}

/// The structured-output fields of a request body (`None`: free text).
pub fn parse(o: &Map<String, Value>) -> Result<Option<Structured>, ApiError> {
    // 1. the removed names
    if let Some(key) = REMOVED.iter().find(|k| o.get(**k).map_or(false, |v| !v.is_null())) {
        return Err(ApiError::invalid(
            *key,
            "unsupported_parameter",
            format!("'{}' was removed (as in vLLM 0.12); use 'structured_outputs' ({{\"json\": ...}}, {{\"regex\": ...}}, {{\"choice\": [...]}} or {{\"grammar\": ...}}) or 'response_format'", key),
        ));
    }
    // 2. each of the two fields
    let from_format = match o.get("response_format") {
        None | Some(Value::Null) => None,
        Some(Value::Object(rf)) => response_format(rf)?,
        Some(_) => return Err(wrong_type("response_format", "an object")),
    };
    let from_outputs = match o.get("structured_outputs") {
        None | Some(Value::Null) => None,
        Some(Value::Object(so)) => structured_outputs(so)?,
        Some(_) => return Err(wrong_type("structured_outputs", "an object")),
    };
    match (from_format, from_outputs) {
        (Some(_), Some(_)) => Err(ApiError::invalid("structured_outputs", "invalid_value", "give either 'response_format' (json_object or json_schema) or 'structured_outputs', not both")),
        (a, b) => Ok(a.or(b)),
    }
}

/// `response_format`: `{type: text}`, `{type: json_object}` or `{type: json_schema,
/// json_schema: {name, schema, strict, description}}`.
fn response_format(rf: &Map<String, Value>) -> Result<Option<Structured>, ApiError> {
    let t = match rf.get("type") {
        Some(Value::String(t)) => t.as_str(),
        Some(_) => return Err(wrong_type("response_format.type", "a string")),
        None => return Err(ApiError::invalid("response_format.type", "missing_required_parameter", "'response_format.type' is required")),
    };
    match t {
        "text" => Ok(None),
        "json_object" => Ok(Some(Structured { spec: GrammarSpec::JsonObject, param: "response_format".into() })),
        "json_schema" => {
            let p = "response_format.json_schema";
            let js = match rf.get("json_schema") {
                Some(Value::Object(js)) => js,
                Some(_) => return Err(wrong_type(p, "an object")),
                None => return Err(ApiError::invalid(p, "missing_required_parameter", format!("'{}' is required with type json_schema", p))),
            };
            match js.get("name") {
                Some(Value::String(n)) if !n.is_empty() && n.len() <= 64 && n.chars().all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-') => {}
                Some(Value::String(_)) => return Err(ApiError::invalid(format!("{}.name", p), "invalid_value", format!("'{}.name' must be 1 to 64 letters, digits, underscores or dashes", p))),
                Some(_) => return Err(wrong_type(&format!("{}.name", p), "a string")),
                None => return Err(ApiError::invalid(format!("{}.name", p), "missing_required_parameter", format!("'{}.name' is required", p))),
            }
            if js.get("strict").map_or(false, |v| !v.is_null() && !v.is_boolean()) {
                return Err(wrong_type(&format!("{}.strict", p), "a boolean"));
            }
            if js.get("description").map_or(false, |v| !v.is_null() && !v.is_string()) {
                return Err(wrong_type(&format!("{}.description", p), "a string"));
            }
            let sp = format!("{}.schema", p);
            match js.get("schema") {
                Some(s @ Value::Object(_)) => Ok(Some(Structured { spec: GrammarSpec::json_schema(s), param: sp })),
                Some(_) => Err(wrong_type(&sp, "an object (a JSON schema)")),
                None => Err(ApiError::invalid(sp.clone(), "missing_required_parameter", format!("'{}' is required", sp))),
            }
        }
        other => Err(ApiError::invalid(
            "response_format.type",
            "unsupported_value",
            format!("response_format type '{}' is not supported (text, json_object and json_schema are)", other.chars().take(40).collect::<String>()),
        )),
    }
}

/// vLLM's `structured_outputs`: exactly one of `json` (a schema, or its JSON text), `regex`,
/// `choice` (strings), `grammar` (Lark) and `json_object` (true).
fn structured_outputs(so: &Map<String, Value>) -> Result<Option<Structured>, ApiError> {
    if let Some(k) = so.keys().find(|k| !KINDS.contains(&k.as_str()) && !so[k.as_str()].is_null()) {
        return Err(ApiError::invalid(
            format!("structured_outputs.{}", k),
            "unsupported_parameter",
            format!("'structured_outputs.{}' is not supported (json, regex, choice, grammar and json_object are)", k.chars().take(40).collect::<String>()),
        ));
    }
    let given: Vec<&str> = KINDS.iter().copied().filter(|k| so.get(*k).map_or(false, |v| !v.is_null() && *v != Value::Bool(false))).collect();
    let kind = match given.as_slice() {
        [] => return Ok(None),
        [one] => *one,
        many => return Err(ApiError::invalid("structured_outputs", "invalid_value", format!("give exactly one of json, regex, choice, grammar and json_object in 'structured_outputs', not {}", many.join(" and ")))),
    };
    let param = format!("structured_outputs.{}", kind);
    let v = &so[kind];
    let spec = match kind {
        "json" => match v {
            Value::Object(_) => GrammarSpec::json_schema(v),
            Value::String(s) => GrammarSpec::json_schema_text(s).map_err(|e| ApiError::invalid(param.clone(), "invalid_value", format!("'{}': {}", param, e)))?,
            _ => return Err(wrong_type(&param, "a JSON schema (an object or its JSON text)")),
        },
        "regex" => GrammarSpec::Regex(v.as_str().ok_or_else(|| wrong_type(&param, "a string"))?.to_string()),
        "grammar" => GrammarSpec::Lark(v.as_str().ok_or_else(|| wrong_type(&param, "a string (a Lark grammar)"))?.to_string()),
        "choice" => {
            let list = v.as_array().ok_or_else(|| wrong_type(&param, "an array of strings"))?;
            if list.is_empty() {
                return Err(ApiError::invalid(param, "invalid_value", "'structured_outputs.choice' must not be empty"));
            }
            let mut out = Vec::with_capacity(list.len());
            for (i, c) in list.iter().enumerate() {
                match c {
                    Value::String(s) if !s.is_empty() => out.push(s.clone()),
                    Value::String(_) => return Err(ApiError::invalid(format!("{}[{}]", param, i), "invalid_value", "choices must not be empty strings")),
                    _ => return Err(wrong_type(&format!("{}[{}]", param, i), "a string")),
                }
            }
            GrammarSpec::Choice(out)
        }
        _ => match v {
            Value::Bool(true) => GrammarSpec::JsonObject,
            _ => return Err(wrong_type(&param, "true")),
        },
    };
    Ok(Some(Structured { spec, param }))
}

/// The server's grammar compiler, built on the first structured request (its token trie takes
/// about half a second), with the cache of compiled grammars.
#[derive(Default)]
pub struct LazyGrammars(OnceLock<Result<Grammars, String>>);

impl LazyGrammars {
    /// The compiler for `tok` (a 500 if it cannot be built).
    pub fn get(&self, tok: &Tokenizer) -> Result<&Grammars, ApiError> {
        self.0.get_or_init(|| Grammars::new(tok).map_err(|e| e.to_string())).as_ref().map_err(|e| ApiError::new(500, "grammar_unavailable", format!("structured output is unavailable: {}", e)))
    }

    /// The grammar of one request: `s` compiled (or taken from the cache); each choice makes its
    /// constraint from it. A spec that does not compile is a 400 naming its parameter and
    /// llguidance's reason.
    pub fn compile(&self, tok: &Tokenizer, s: &Structured) -> Result<Arc<Grammar>, ApiError> {
        let g = self.get(tok)?.compile(&s.spec).map_err(|e| ApiError::invalid(s.param.clone(), "invalid_value", format!("'{}' cannot be used: {}", s.param, e)))?;
        log::debug!("{}: grammar compiled in {:.1} ms (cached after)", s.param, g.compile_secs() * 1e3);
        Ok(g)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn p(v: Value) -> Result<Option<Structured>, ApiError> {
        parse(v.as_object().unwrap())
    }

    #[test]
    fn reads_both_fields() {
        assert_eq!(p(json!({})).unwrap(), None);
        assert_eq!(p(json!({"response_format": {"type": "text"}})).unwrap(), None);
        assert_eq!(p(json!({"response_format": {"type": "json_object"}})).unwrap().unwrap().spec, GrammarSpec::JsonObject);
        let schema = json!({"type": "object", "properties": {"a": {"type": "integer"}}});
        let s = p(json!({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": schema, "strict": true}}})).unwrap().unwrap();
        assert_eq!((s.spec, s.param.as_str()), (GrammarSpec::json_schema(&schema), "response_format.json_schema.schema"));
        assert_eq!(p(json!({"structured_outputs": {"json": schema.to_string()}})).unwrap().unwrap().spec, GrammarSpec::json_schema(&schema));
        assert_eq!(p(json!({"structured_outputs": {"regex": "a+"}})).unwrap().unwrap().spec, GrammarSpec::Regex("a+".into()));
        assert_eq!(p(json!({"structured_outputs": {"choice": ["a", "b"]}})).unwrap().unwrap().spec, GrammarSpec::Choice(vec!["a".into(), "b".into()]));
        assert_eq!(p(json!({"structured_outputs": {"grammar": "start: \"x\""}})).unwrap().unwrap().spec, GrammarSpec::Lark("start: \"x\"".into()));
        let s = p(json!({"structured_outputs": {"json_object": true, "regex": null}})).unwrap().unwrap();
        assert_eq!((s.spec, s.param.as_str()), (GrammarSpec::JsonObject, "structured_outputs.json_object"));
    }

    #[test]
    fn refusals_name_the_field() {
        let e = |v: Value| p(v).unwrap_err();
        for key in REMOVED {
            let err = e(json!({key: {"type": "object"}}));
            assert_eq!(err.param.as_deref(), Some(key));
            assert!(err.message.contains("structured_outputs"), "{}", err.message);
        }
        assert_eq!(e(json!({"structured_outputs": {"regex": "a", "choice": ["b"]}})).param.as_deref(), Some("structured_outputs"));
        assert_eq!(e(json!({"structured_outputs": {"structural_tag": "x"}})).param.as_deref(), Some("structured_outputs.structural_tag"));
        assert_eq!(e(json!({"structured_outputs": {"choice": []}})).param.as_deref(), Some("structured_outputs.choice"));
        assert_eq!(e(json!({"structured_outputs": {"choice": ["a", 1]}})).param.as_deref(), Some("structured_outputs.choice[1]"));
        assert_eq!(e(json!({"structured_outputs": {"json": "{nope"}})).param.as_deref(), Some("structured_outputs.json"));
        assert_eq!(e(json!({"response_format": {"type": "json_schema"}})).param.as_deref(), Some("response_format.json_schema"));
        assert_eq!(e(json!({"response_format": {"type": "json_schema", "json_schema": {"schema": {}}}})).param.as_deref(), Some("response_format.json_schema.name"));
        assert_eq!(e(json!({"response_format": {"type": "json_schema", "json_schema": {"name": "n"}}})).param.as_deref(), Some("response_format.json_schema.schema"));
        assert_eq!(e(json!({"response_format": {"type": "structural_tag"}})).param.as_deref(), Some("response_format.type"));
        assert_eq!(e(json!({"response_format": {"type": "json_object"}, "structured_outputs": {"regex": "a"}})).param.as_deref(), Some("structured_outputs"));
    }

    #[test]
    fn both_endpoints_take_it_and_min_tokens_is_refused_with_it() {
        use super::super::{completions, openai, openai::ParseLimits};
        let chat = openai::parse_chat_request(br#"{"messages":[{"role":"user","content":"hi"}],"structured_outputs":{"choice":["a","b"]}}"#, &ParseLimits::default()).unwrap();
        assert_eq!(chat.settings.structured.unwrap().spec, GrammarSpec::Choice(vec!["a".into(), "b".into()]));
        let c = completions::parse_completion_request(br#"{"prompt":"hi","response_format":{"type":"json_object"}}"#, &ParseLimits::default()).unwrap();
        assert_eq!(c.settings.structured.unwrap().spec, GrammarSpec::JsonObject);
        let e = openai::parse_chat_request(br#"{"messages":[{"role":"user","content":"hi"}],"min_tokens":3,"structured_outputs":{"regex":"a+"}}"#, &ParseLimits::default()).unwrap_err();
        assert_eq!(e.param.as_deref(), Some("min_tokens"));
        let e = openai::parse_chat_request(br#"{"messages":[{"role":"user","content":"hi"}],"guided_choice":["a"]}"#, &ParseLimits::default()).unwrap_err();
        assert!(e.message.contains("structured_outputs"), "{}", e.message);
    }
}
