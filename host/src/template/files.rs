//! Where a model's chat template is: in its directory `chat_template.jinja` (the template
//! itself), `chat_template.json` (`{"chat_template": "..."}`, the processor's: Qwen3-VL's
//! handles images and videos), or `tokenizer_config.json`'s `chat_template` (a string, or a
//! list of `{"name", "template"}`), looked for in that order, as a vision-language processor
//! does; a GGUF file's `tokenizer.chat_template` otherwise. tokenizer_config.json's special
//! tokens (`bos_token`, `eos_token`, ...) are passed to the template as transformers does.

use super::ChatTemplate;
use crate::{Error, Result};
use serde_json::Value;
use std::path::Path;

fn cfg_err(p: &Path, msg: impl Into<String>) -> Error {
    Error::Config { file: p.display().to_string(), msg: msg.into() }
}

fn read_json(p: &Path) -> Result<Value> {
    let text = std::fs::read_to_string(p).map_err(|e| Error::io(p, e))?;
    serde_json::from_str(&text).map_err(|e| cfg_err(p, format!("not valid JSON: {}", e)))
}

/// The templates a `chat_template` field holds: a string, or a list of named templates.
fn templates_of(p: &Path, v: &Value) -> Result<Vec<(String, String)>> {
    match v {
        Value::String(s) => Ok(vec![("default".into(), s.clone())]),
        Value::Array(items) => items
            .iter()
            .map(|t| match (t.get("name").and_then(Value::as_str), t.get("template").and_then(Value::as_str)) {
                (Some(n), Some(s)) => Ok((n.to_string(), s.to_string())),
                _ => Err(cfg_err(p, "chat_template: each entry of the list needs a string 'name' and 'template'")),
            })
            .collect(),
        _ => Err(cfg_err(p, "chat_template must be a string or a list of {name, template}")),
    }
}

/// The special tokens of a tokenizer_config.json, as the template variables transformers sets
/// (`bos_token`, `eos_token`, `unk_token`, `pad_token`: a string or `{"content": ...}`).
fn special_tokens(config: &Value) -> Vec<(String, String)> {
    ["bos_token", "eos_token", "unk_token", "pad_token"]
        .iter()
        .filter_map(|k| {
            let v = config.get(*k)?;
            let s = v.as_str().or_else(|| v.get("content").and_then(Value::as_str))?;
            Some((k.to_string(), s.to_string()))
        })
        .collect()
}

/// A template file given by name (`--chat-template FILE`): a Jinja file, or a JSON file with a
/// `chat_template` field (chat_template.json, tokenizer_config.json).
pub fn from_file(p: &Path) -> Result<ChatTemplate> {
    let text = std::fs::read_to_string(p).map_err(|e| Error::io(p, e))?;
    if p.extension().is_some_and(|x| x.eq_ignore_ascii_case("json")) {
        let v: Value = serde_json::from_str(&text).map_err(|e| cfg_err(p, format!("not valid JSON: {}", e)))?;
        let field = v.get("chat_template").ok_or_else(|| cfg_err(p, "has no chat_template field"))?;
        return Ok(ChatTemplate::named(templates_of(p, field)?, p.display().to_string())?.with_special_tokens(special_tokens(&v)));
    }
    ChatTemplate::new(&text, p.display().to_string())
}

/// The template in directory `dir`, if it has one (the first of chat_template.jinja,
/// chat_template.json, tokenizer_config.json's `chat_template`).
pub fn in_dir(dir: &Path) -> Result<Option<ChatTemplate>> {
    let config_path = dir.join("tokenizer_config.json");
    let config = if config_path.is_file() { Some(read_json(&config_path)?) } else { None };
    let special = config.as_ref().map(special_tokens).unwrap_or_default();
    let jinja = dir.join("chat_template.jinja");
    if jinja.is_file() {
        let text = std::fs::read_to_string(&jinja).map_err(|e| Error::io(&jinja, e))?;
        return Ok(Some(ChatTemplate::new(&text, jinja.display().to_string())?.with_special_tokens(special)));
    }
    let json = dir.join("chat_template.json");
    if json.is_file() {
        let v = read_json(&json)?;
        let field = v.get("chat_template").ok_or_else(|| cfg_err(&json, "has no chat_template field"))?;
        return Ok(Some(ChatTemplate::named(templates_of(&json, field)?, json.display().to_string())?.with_special_tokens(special)));
    }
    if let Some(field) = config.as_ref().and_then(|c| c.get("chat_template")).filter(|f| !f.is_null()) {
        return Ok(Some(ChatTemplate::named(templates_of(&config_path, field)?, config_path.display().to_string())?.with_special_tokens(special)));
    }
    Ok(None)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_first_file_in_order_wins_and_lists_take_their_default() {
        let dir = std::env::temp_dir().join(format!("tpl-files-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        assert!(in_dir(&dir).unwrap().is_none());
        let cfg = serde_json::json!({"eos_token": {"content": "<E>"}, "chat_template": [{"name": "tool_use", "template": "T{{ eos_token }}"}, {"name": "default", "template": "D{{ eos_token }}"}]});
        std::fs::write(dir.join("tokenizer_config.json"), cfg.to_string()).unwrap();
        let turns = [super::super::Turn::text("user", "hi")];
        let conv = super::super::Conversation::new(&turns);
        let t = in_dir(&dir).unwrap().unwrap();
        assert_eq!(t.render(&conv).unwrap(), "D<E>");
        let tools = [serde_json::json!({"type": "function"})];
        assert_eq!(t.render(&super::super::Conversation { tools: Some(&tools), ..conv }).unwrap(), "T<E>");
        std::fs::write(dir.join("chat_template.json"), r#"{"chat_template": "J"}"#).unwrap();
        assert_eq!(in_dir(&dir).unwrap().unwrap().render(&conv).unwrap(), "J");
        std::fs::write(dir.join("chat_template.jinja"), "K{{ messages[0].content }}").unwrap();
        assert_eq!(in_dir(&dir).unwrap().unwrap().render(&conv).unwrap(), "Khi");
        std::fs::write(dir.join("chat_template.jinja"), "{% if %}").unwrap();
        let e = in_dir(&dir).unwrap_err().to_string();
        assert!(e.contains("chat_template.jinja") && e.contains("line 1"), "{}", e);
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
