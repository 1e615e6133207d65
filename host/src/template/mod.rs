//! The model's own chat template, rendered as transformers renders it: Jinja (here
//! `minijinja`, with Python's string and dict methods from `minijinja-contrib`), blocks
//! trimmed (`trim_blocks`, `lstrip_blocks`), `tojson` writing what Python's `json.dumps`
//! writes ([`json`]), and transformers' globals `raise_exception` and `strftime_now`.
//!
//! - [`files`]: where a template comes from (chat_template.jinja, chat_template.json,
//!   tokenizer_config.json, a GGUF file's `tokenizer.chat_template`);
//! - [`conversation`]: the messages, tools and flags a template is given;
//! - [`format`]: a template or, for a model without one, the built-in Qwen3-VL format
//!   ([`crate::generate::chat`]), behind one `render`;
//! - [`media`]: the placeholders the template writes (one `<|image_pad|>` / `<|video_pad|>`
//!   per image or video) expanded as Qwen3-VL's processor expands them.

pub mod conversation;
pub mod files;
pub mod format;
pub mod json;
pub mod media;
pub mod value;

pub use conversation::{Content, Conversation, Piece, ToolCall, Turn};
pub use format::PromptFormat;

use crate::{Error, Result};
use minijinja::value::{Kwargs, Value};
use minijinja::{Environment, ErrorKind};

/// How a template reads a message's `content`: as a string (text and placeholders joined), or
/// as a list of parts (`{"type": "text", "text": ...}`, `{"type": "image"}`,
/// `{"type": "video"}`), as vLLM tells them apart.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ContentFormat {
    String,
    Parts,
}

/// A compiled chat template (one, or several by name as tokenizer_config.json may list them).
#[derive(Clone)]
pub struct ChatTemplate {
    env: Environment<'static>,
    /// The templates' names: `default` for a single one.
    names: Vec<String>,
    /// Where it was read from, for messages (`tokenizer_config.json`, ...).
    pub origin: String,
    pub content: ContentFormat,
    /// `bos_token`, `eos_token`, ... as transformers passes them to the template.
    special: Vec<(String, String)>,
}

impl std::fmt::Debug for ChatTemplate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ChatTemplate").field("origin", &self.origin).field("names", &self.names).field("content", &self.content).finish()
    }
}

fn template_error(origin: &str, e: &minijinja::Error) -> Error {
    let mut msg = e.detail().map_or_else(|| e.kind().to_string(), |d| format!("{}: {}", e.kind(), d));
    if let Some(line) = e.line() {
        msg.push_str(&format!(" (line {})", line));
    }
    Error::Template { origin: origin.to_string(), msg }
}

impl ChatTemplate {
    /// Compiles one template; `origin` names where it came from, for errors and the log.
    pub fn new(source: &str, origin: impl Into<String>) -> Result<ChatTemplate> {
        ChatTemplate::named(vec![("default".to_string(), source.to_string())], origin)
    }

    /// Compiles templates by name (tokenizer_config.json's list form).
    pub fn named(templates: Vec<(String, String)>, origin: impl Into<String>) -> Result<ChatTemplate> {
        let origin = origin.into();
        let mut env = environment().map_err(|e| template_error(&origin, &e))?;
        let mut content = ContentFormat::String;
        let mut names = Vec::new();
        for (name, source) in templates {
            if iterates_over_content(&source) {
                content = ContentFormat::Parts;
            }
            env.add_template_owned(name.clone(), source).map_err(|e| template_error(&format!("{} ({})", origin, name), &e))?;
            names.push(name);
        }
        if names.is_empty() {
            return Err(Error::Template { origin, msg: "holds no template".into() });
        }
        Ok(ChatTemplate { env, names, origin, content, special: Vec::new() })
    }

    /// Adds the special tokens transformers passes to every template (`bos_token`,
    /// `eos_token`, ...).
    pub fn with_special_tokens(mut self, tokens: Vec<(String, String)>) -> ChatTemplate {
        self.special = tokens;
        self
    }

    /// The template a conversation uses: transformers' choice among named ones (`tool_use`
    /// when there are tools and it exists, else `default`, else the only one).
    fn pick(&self, tools: bool) -> Result<&str> {
        if self.names.len() == 1 {
            return Ok(&self.names[0]);
        }
        let has = |n: &str| self.names.iter().any(|x| x == n);
        if tools && has("tool_use") {
            return Ok("tool_use");
        }
        if has("default") {
            return Ok("default");
        }
        Err(Error::Template { origin: self.origin.clone(), msg: format!("holds templates named {} and none is 'default'", self.names.join(", ")) })
    }

    /// Renders `conv`: the prompt text with one placeholder per image and video.
    pub fn render(&self, conv: &Conversation<'_>) -> Result<String> {
        let name = self.pick(conv.tools.is_some_and(|t| !t.is_empty()))?;
        let tmpl = self.env.get_template(name).map_err(|e| template_error(&self.origin, &e))?;
        let ctx = conv.context(self.content, &self.special);
        tmpl.render(ctx).map_err(|e| template_error(&self.origin, &e))
    }
}

/// The environment transformers sets up: trimmed blocks, Python methods, its `tojson`,
/// `raise_exception` and `strftime_now`, loop controls.
fn environment() -> std::result::Result<Environment<'static>, minijinja::Error> {
    let mut env = Environment::new();
    env.set_syntax(minijinja::syntax::SyntaxConfig::builder().trim_blocks(true).lstrip_blocks(true).build()?);
    env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
    env.add_filter("tojson", tojson);
    env.add_function("raise_exception", |msg: String| -> std::result::Result<Value, minijinja::Error> { Err(minijinja::Error::new(ErrorKind::InvalidOperation, msg)) });
    env.add_function("strftime_now", strftime_now);
    // a conversation's templates are small; a runaway one stops here instead of taking the server
    env.set_recursion_limit(200);
    Ok(env)
}

/// `tojson` as transformers defines it: `json.dumps(x, ensure_ascii=False, indent=None,
/// separators=None, sort_keys=False)`; `ensure_ascii` and `indent` by position (in that
/// order) or by name, the others by name.
fn tojson(value: &Value, ensure_ascii: Option<Value>, indent: Option<Value>, kwargs: Kwargs) -> std::result::Result<Value, minijinja::Error> {
    let pick = |pos: Option<Value>, name: &str| -> std::result::Result<Option<Value>, minijinja::Error> {
        match kwargs.get::<Option<Value>>(name)? {
            Some(v) => Ok(Some(v)),
            None => Ok(pos),
        }
    };
    let bad = |what: &str| minijinja::Error::new(ErrorKind::InvalidOperation, format!("tojson: {}", what));
    let mut style = json::Style { ensure_ascii: pick(ensure_ascii, "ensure_ascii")?.is_some_and(|v| v.is_true()), sort_keys: pick(None, "sort_keys")?.is_some_and(|v| v.is_true()), ..json::Style::default() };
    match pick(indent, "indent")? {
        None => {}
        Some(v) if v.is_none() || v.is_undefined() => {}
        Some(v) => {
            style.indent = Some(if let Some(s) = v.as_str() {
                s.to_string()
            } else {
                let n = v.as_i64().ok_or_else(|| bad("indent must be an integer or a string"))?;
                " ".repeat(n.clamp(0, 64) as usize)
            })
        }
    }
    match pick(None, "separators")? {
        None => {}
        Some(v) if v.is_none() || v.is_undefined() => {}
        Some(v) => {
            let parts: Vec<Value> = v.try_iter().map_err(|_| bad("separators must be a pair of strings"))?.collect();
            match parts.as_slice() {
                [a, b] if a.as_str().is_some() && b.as_str().is_some() => {
                    style.item_separator = a.as_str().map(str::to_string);
                    style.key_separator = b.as_str().map(str::to_string);
                }
                _ => return Err(bad("separators must be a pair of strings")),
            }
        }
    }
    kwargs.assert_all_used()?;
    json::dumps(value, &style).map(Value::from_safe_string).map_err(|e| bad(&e.0))
}

/// `strftime_now(format)`: the local time now, formatted as Python's `strftime` does.
fn strftime_now(format: String) -> std::result::Result<Value, minijinja::Error> {
    use chrono::format::{Item, StrftimeItems};
    use std::fmt::Write;
    let items: Vec<Item<'_>> = StrftimeItems::new(&format).collect();
    if items.iter().any(|i| matches!(i, Item::Error)) {
        return Err(minijinja::Error::new(ErrorKind::InvalidOperation, format!("strftime_now: bad format '{}'", format)));
    }
    let mut out = String::new();
    write!(out, "{}", chrono::Local::now().format_with_items(items.into_iter())).map_err(|_| minijinja::Error::new(ErrorKind::InvalidOperation, "strftime_now: cannot format the time"))?;
    Ok(Value::from(out))
}

/// Whether a template loops over a message's `content` (`{% for part in message.content %}`,
/// `message['content']`): then it takes content as a list of parts, as vLLM detects it (vLLM
/// walks the parsed template; this reads its `for` tags).
pub fn iterates_over_content(source: &str) -> bool {
    let mut rest = source;
    while let Some(start) = rest.find("{%") {
        let after = &rest[start + 2..];
        let end = after.find("%}").unwrap_or(after.len());
        let tag = after[..end].trim_matches(|c: char| c == '-' || c == '+' || c == '~' || c.is_whitespace());
        if let Some(body) = tag.strip_prefix("for ") {
            if let Some((_, iterable)) = body.split_once(" in ") {
                // the iterable before any filter, condition or `recursive`
                let expr = iterable.split(['|', ' ']).next().unwrap_or("").trim();
                let expr = expr.trim_end_matches(')');
                if expr.ends_with(".content") || expr.ends_with("['content']") || expr.ends_with("[\"content\"]") {
                    return true;
                }
            }
        }
        rest = &after[end.min(after.len())..];
    }
    false
}

#[cfg(test)]
mod tests {
    use super::*;

    fn render(src: &str, ctx: Value) -> String {
        let env = environment().unwrap();
        env.render_str(src, ctx).unwrap()
    }

    #[test]
    fn blocks_are_trimmed_and_python_methods_work() {
        let ctx = value::map([("s", Value::from("  <a>x</a>\n")), ("d", value::from_json(&serde_json::json!({"k": 1})))]);
        assert_eq!(render("{% if true %}\n  A\n{% endif %}\n", ctx.clone()), "  A\n");
        assert_eq!(render("{{ s.strip() }}|{{ s.lstrip().startswith('<a>') }}|{{ s.split('</a>')[0] }}|{{ d.get('k') }}", ctx.clone()), "<a>x</a>|True|  <a>x|1");
        assert_eq!(render("{% for k, v in d.items() %}{{ k }}={{ v }}{% endfor %}", ctx), "k=1");
    }

    #[test]
    fn tojson_takes_transformers_arguments() {
        let ctx = value::map([("t", value::from_json(&serde_json::json!({"b": "é", "a": [1, 2.0]})))]);
        assert_eq!(render("{{ t | tojson }}", ctx.clone()), r#"{"b": "é", "a": [1, 2.0]}"#);
        assert_eq!(render("{{ t | tojson(indent=2, sort_keys=true) }}", ctx.clone()), "{\n  \"a\": [\n    1,\n    2.0\n  ],\n  \"b\": \"é\"\n}");
        assert_eq!(render("{{ t | tojson(ensure_ascii=true, separators=(',', ':')) }}", ctx.clone()), r#"{"b":"\u00e9","a":[1,2.0]}"#);
        // HTML is not escaped (Jinja's own filter would write \u003c)
        assert_eq!(render("{{ '<&>' | tojson }}", ctx), r#""<&>""#);
    }

    #[test]
    fn raise_exception_and_strftime_now() {
        let env = environment().unwrap();
        let e = env.render_str("{{ raise_exception('no system message here') }}", ()).unwrap_err();
        assert!(e.to_string().contains("no system message here"), "{}", e);
        let year = render("{{ strftime_now('%Y') }}", Value::from(()));
        assert!(year.len() == 4 && year.starts_with('2'), "{}", year);
        assert!(env.render_str("{{ strftime_now('%Q') }}", ()).is_err());
    }

    /// What Qwen3's and Qwen3-VL-Thinking's templates lean on: a macro that counts images in a
    /// namespace, `startswith` / `endswith` / `split` / `rstrip` / `lstrip` / `strip` on its
    /// output, `messages[::-1]`, `loop.index0`, `is string`. The expected text is what
    /// transformers 5.24 renders (`_compile_jinja_template(src).render(...)`).
    #[test]
    fn python_string_methods_on_macro_output_and_namespaces_render_as_transformers_does() {
        let src = r#"{%- set image_count = namespace(value=0) %}
{%- macro render_content(content, do_vision_count) %}
    {%- if content is string %}
        {{- content }}
    {%- else %}
        {%- for item in content %}
            {%- if 'image' in item or 'image_url' in item or item.type == 'image' %}
                {%- if do_vision_count %}
                    {%- set image_count.value = image_count.value + 1 %}
                {%- endif %}
                {%- if add_vision_id %}Picture {{ image_count.value }}: {% endif -%}
                <|vision_start|><|image_pad|><|vision_end|>
            {%- elif 'text' in item %}
                {{- item.text }}
            {%- endif %}
        {%- endfor %}
    {%- endif %}
{%- endmacro %}
{%- set ns = namespace(multi_step_tool=true, last_query_index=messages|length - 1) %}
{%- for message in messages[::-1] %}
    {%- set index = (messages|length - 1) - loop.index0 %}
    {%- if ns.multi_step_tool and message.role == "user" %}
        {%- set content = render_content(message.content, false) %}
        {%- if not(content.startswith('<tool_response>') and content.endswith('</tool_response>')) %}
            {%- set ns.multi_step_tool = false %}
            {%- set ns.last_query_index = index %}
        {%- endif %}
    {%- endif %}
{%- endfor %}
{%- for message in messages %}
    {%- set content = render_content(message.content, True) %}
    {%- if message.role == "assistant" %}
        {%- set reasoning_content = '' %}
        {%- if message.reasoning_content is string %}
            {%- set reasoning_content = message.reasoning_content %}
        {%- elif '</think>' in content %}
            {%- set reasoning_content = content.split('</think>')[0].rstrip('\n').split('<think>')[-1].lstrip('\n') %}
            {%- set content = content.split('</think>')[-1].lstrip('\n') %}
        {%- endif %}
        {{- '[' ~ loop.index0 ~ '>' ~ ns.last_query_index ~ '] ' + reasoning_content.strip('\n') + '|' + content }}
    {%- else %}
        {{- message.role + ':' + content }}
    {%- endif %}
    {{- '\n' }}
{%- endfor %}
{{- image_count.value }}
"#;
        let messages = serde_json::json!([
            {"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "What?"}]},
            {"role": "assistant", "content": "<think>\nhmm\n\n</think>\n\nA cat."},
            {"role": "user", "content": "<tool_response>\nx\n</tool_response>"},
            {"role": "assistant", "content": "ok", "reasoning_content": "\nr\n"}
        ]);
        let ctx = value::map([("messages", value::from_json(&messages)), ("add_vision_id", Value::from(true))]);
        let want = "user:Picture 1: <|vision_start|><|image_pad|><|vision_end|>What?\n[1>0] hmm|A cat.\nuser:<tool_response>\nx\n</tool_response>\n[3>0] r|ok\n1";
        assert_eq!(render(src, ctx), want);
    }

    #[test]
    fn content_format_is_read_from_the_for_tags() {
        assert!(iterates_over_content("{%- for content in message.content %}{{ content.text }}{% endfor %}"));
        assert!(iterates_over_content("{% for c in message['content'] | selectattr('type', 'equalto', 'text') %}{% endfor %}"));
        assert!(!iterates_over_content("{%- for message in messages[::-1] %}{{ message.content }}{% endfor %}"));
        assert!(!iterates_over_content("{{ messages[0]['content'] }}"));
    }
}
