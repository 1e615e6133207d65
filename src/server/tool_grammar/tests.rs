//! The call grammar through llguidance with the real Qwen tokenizer: random logits drawn under
//! its mask give text that `tools::ToolParser` reads into calls of the allowed tools, whose
//! arguments satisfy the tool's parameters schema.

use super::*;
use crate::generate::grammar::GrammarSpec;
use crate::generate::{Sampler, SamplingParams};
use crate::server::tools::{parse_reply, parse_request, ParsedCall};
use host::test_support::{grammars, random_logits, tokenizer};

/// A weather tool (enum, bounded integer, optional boolean, a `$ref` into `$defs` as Pydantic
/// writes it) and a search tool (bounded string and array), both strict.
fn request(extra: Value) -> ToolRequest {
    let weather = json!({"type": "function", "function": {"name": "get_weather", "strict": true, "parameters": {
        "$defs": {"Unit": {"enum": ["celsius", "fahrenheit"], "type": "string"}},
        "type": "object",
        "properties": {"city": {"type": "string", "maxLength": 12}, "unit": {"$ref": "#/$defs/Unit"}, "days": {"type": "integer", "minimum": 1, "maximum": 7}, "hourly": {"type": "boolean"}},
        "required": ["city", "unit", "days"],
        "additionalProperties": false
    }}});
    let search = json!({"type": "function", "function": {"name": "search", "strict": true, "parameters": {
        "type": "object",
        "properties": {"query": {"type": "string", "maxLength": 10}, "tags": {"type": "array", "maxItems": 2, "items": {"type": "string", "maxLength": 4}}},
        "required": ["query"],
        "additionalProperties": false
    }}});
    let mut body = json!({"tools": [weather, search]});
    body.as_object_mut().unwrap().extend(extra.as_object().unwrap().clone());
    parse_request(body.as_object().unwrap()).unwrap()
}

/// Whether `v` satisfies the tool `name`'s parameters (the schemas of [`request`]).
fn check_arguments(name: &str, v: &Value) {
    let o = v.as_object().unwrap_or_else(|| panic!("{} arguments not an object: {}", name, v));
    let short = |k: &str, n: usize| o[k].as_str().is_some_and(|s| s.chars().count() <= n);
    match name {
        "get_weather" => {
            assert!(o.keys().all(|k| ["city", "unit", "days", "hourly"].contains(&k.as_str())), "{}", v);
            assert!(short("city", 12), "{}", v);
            assert!(o["unit"] == "celsius" || o["unit"] == "fahrenheit", "{}", v);
            assert!(o["days"].as_i64().is_some_and(|d| (1..=7).contains(&d)), "{}", v);
            assert!(o.get("hourly").is_none_or(Value::is_boolean), "{}", v);
        }
        "search" => {
            assert!(o.keys().all(|k| ["query", "tags"].contains(&k.as_str())), "{}", v);
            assert!(short("query", 10), "{}", v);
            if let Some(t) = o.get("tags") {
                let t = t.as_array().unwrap();
                assert!(t.len() <= 2 && t.iter().all(|s| s.as_str().is_some_and(|s| s.chars().count() <= 4)), "{}", v);
            }
        }
        other => panic!("a call of unknown tool {}", other),
    }
}

/// Forces `prefix` (its tokens), then draws under `req`'s call grammar with random logits at
/// temperature 1 until the end of sequence; the text (prefix included) and what the parser
/// reads from it.
fn generate(req: &ToolRequest, prefix: &str, seed: u64) -> (String, Option<String>, Vec<ParsedCall>) {
    let g = grammars().compile(&GrammarSpec::Lark(call_grammar(req))).unwrap();
    let params = SamplingParams { temperature: 1.0, top_k: 0, top_p: 1.0, repetition_penalty: 1.0, seed };
    let mut s = Sampler::new(params).with_constraint(g.constraint());
    let mut ids = tokenizer().encode(prefix);
    for &t in &ids {
        s.accept(t).unwrap();
    }
    let mut state = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    for _ in 0..3000 {
        let t = s.sample(&mut random_logits(&mut state), &[]).unwrap();
        s.accept(t).unwrap();
        if t == grammars().eos() {
            let text = tokenizer().decode(&ids, false).unwrap();
            let (content, calls) = parse_reply(&mut req.reader().unwrap().parser(), &text);
            return (text, content, calls);
        }
        ids.push(t);
    }
    panic!("no end within 3000 tokens: {}", tokenizer().decode(&ids, false).unwrap());
}

#[test]
fn required_gives_only_valid_calls() {
    let req = request(json!({"tool_choice": "required"}));
    assert!(constrains(&req));
    let mut most = 0;
    for seed in 1..=6 {
        let (text, content, calls) = generate(&req, "", seed);
        assert_eq!(content, None, "{}", text);
        assert!(!calls.is_empty(), "{}", text);
        for c in &calls {
            check_arguments(&c.name, &serde_json::from_str(&c.arguments).unwrap());
        }
        // written as the template writes calls back: name first, compact JSON
        assert!(text.starts_with("<tool_call>\n{\"name\": \"") && text.ends_with("}\n</tool_call>"), "{}", text);
        assert_eq!(text.matches("<tool_call>").count(), calls.len(), "{}", text);
        most = most.max(calls.len());
    }
    assert!(most > 1, "parallel calls are allowed");
}

#[test]
fn without_parallel_calls_one_call_ends_the_reply() {
    let req = request(json!({"tool_choice": "required", "parallel_tool_calls": false}));
    for seed in 1..=4 {
        let (text, _, calls) = generate(&req, "", seed);
        assert_eq!(calls.len(), 1, "{}", text);
        assert_eq!(text.matches("<tool_call>").count(), 1, "{}", text);
    }
}

#[test]
fn a_named_function_is_the_one_called() {
    for name in ["get_weather", "search"] {
        let req = request(json!({"tool_choice": {"type": "function", "function": {"name": name}}}));
        for seed in 1..=3 {
            let (text, content, calls) = generate(&req, "", seed);
            assert_eq!((content, calls.len()), (None, 1), "{}", text);
            assert_eq!(calls[0].name, name);
            check_arguments(name, &serde_json::from_str(&calls[0].arguments).unwrap());
        }
    }
}

#[test]
fn auto_with_strict_tools_constrains_only_the_calls() {
    let req = request(json!({}));
    assert!(constrains(&req) && !constrains(&request(json!({"tool_choice": "none"}))));
    // text, then a call once "<tool_call>" is written
    for seed in 1..=4 {
        let (text, content, calls) = generate(&req, "Let me look that up.\n<tool_call>", seed);
        assert_eq!(content.as_deref(), Some("Let me look that up."), "{}", text);
        assert!(!calls.is_empty(), "{}", text);
        for c in &calls {
            check_arguments(&c.name, &serde_json::from_str(&c.arguments).unwrap());
        }
    }
    // plain text may end the reply at any point; a call the grammar does not allow is refused
    let g = grammars().compile(&GrammarSpec::Lark(call_grammar(&req))).unwrap();
    let mut m = g.matcher();
    use crate::generate::sampling::Constraint;
    for t in tokenizer().encode("The weather is fine <tool") {
        m.accept(t).unwrap();
    }
    assert!(m.is_accepting());
    let mut m = g.matcher();
    let bad = tokenizer().encode("<tool_call>\n{\"name\": \"nope\"");
    assert!(bad.iter().try_for_each(|&t| m.accept(t)).is_err());
}

#[test]
fn a_tool_without_parameters_takes_any_object() {
    let body = json!({"tools": [{"type": "function", "function": {"name": "ping"}}], "tool_choice": "required"});
    let req = parse_request(body.as_object().unwrap()).unwrap();
    let g = grammars().compile(&GrammarSpec::Lark(call_grammar(&req))).unwrap();
    let mut m = g.matcher();
    use crate::generate::sampling::Constraint;
    for t in tokenizer().encode("<tool_call>\n{\"name\": \"ping\", \"arguments\": {\"x\": [1, 2]}}\n</tool_call>") {
        m.accept(t).unwrap();
    }
    assert!(m.is_accepting());
}

#[test]
fn chat_requests_get_the_grammar_or_a_refusal_naming_the_field() {
    use crate::server::openai::{parse_chat_request, ParseLimits};
    let tool = r#"{"type":"function","function":{"name":"f","strict":true,"parameters":{"type":"object","properties":{"a":{"type":"integer"}}}}}"#;
    let chat = |extra: &str| parse_chat_request(format!(r#"{{"messages":[{{"role":"user","content":"hi"}}],"tools":[{}]{}}}"#, tool, extra).as_bytes(), &ParseLimits::default());
    let st = chat(r#","tool_choice":"required""#).unwrap().settings.structured.unwrap();
    assert!(matches!(st.spec, GrammarSpec::Lark(_)) && st.param == "tools[0].function.parameters");
    assert!(chat("").unwrap().settings.structured.is_some(), "strict under auto");
    assert!(chat(r#","tool_choice":"none""#).unwrap().settings.structured.is_none());
    let e = chat(r#","tool_choice":{"type":"function","function":{"name":"f"}},"response_format":{"type":"json_object"}"#).unwrap_err();
    assert_eq!(e.param.as_deref(), Some("response_format"));
    assert!(e.message.contains("tool_choice"), "{}", e.message);
    let e = chat(r#","structured_outputs":{"regex":"a"}"#).unwrap_err();
    assert_eq!(e.param.as_deref(), Some("structured_outputs"));
    assert!(e.message.contains("tools[0].function.strict"), "{}", e.message);
    assert_eq!(chat(r#","tool_choice":"required","min_tokens":2"#).unwrap_err().param.as_deref(), Some("min_tokens"));
    // a tool that is not strict under auto: free text, no grammar
    let loose = parse_chat_request(br#"{"messages":[{"role":"user","content":"hi"}],"tools":[{"type":"function","function":{"name":"f"}}],"response_format":{"type":"json_object"}}"#, &ParseLimits::default());
    assert_eq!(loose.unwrap().settings.structured.unwrap().spec, GrammarSpec::JsonObject);
}
