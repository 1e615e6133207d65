//! Which top-level request fields the server takes. Every field of `/v1/chat/completions` and
//! `/v1/completions` is either accepted (and then implemented, or harmless: see below) or
//! refused with a 400 naming it; nothing is silently ignored. A refused field may still be sent
//! with `null` or its neutral value (the value that asks for nothing: `min_p: 0`,
//! `use_beam_search: false`, ...), as client libraries fill in defaults.
//!
//! Harmless fields are accepted and change nothing: `user`, `safety_identifier` and
//! `prompt_cache_key` (identifiers; prefix caching is automatic), `metadata` (this server
//! stores nothing), `store: false`, `service_tier` `auto` / `default`, `modalities: ["text"]`.

use super::openai::ApiError;
use serde_json::{Map, Value};

/// Which endpoint a body was sent to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Api {
    Chat,
    Completions,
}

/// Fields of both endpoints that are implemented (or harmless).
const COMMON: &[&str] = &[
    "model",
    "stream",
    "stream_options",
    "max_tokens",
    "temperature",
    "top_p",
    "top_k",
    "seed",
    "stop",
    "presence_penalty",
    "frequency_penalty",
    "repetition_penalty",
    "n",
    "logprobs",
    "logit_bias",
    "min_tokens",
    "ignore_eos",
    "user",
    "metadata",
    "safety_identifier",
    "prompt_cache_key",
    // structured output (response_format, vLLM's structured_outputs; the removed guided_* names
    // are answered with a message that names structured_outputs)
    "response_format",
    "structured_outputs",
    "guided_json",
    "guided_regex",
    "guided_choice",
    "guided_grammar",
    "guided_decoding_backend",
    "guided_whitespace_pattern",
];

/// Fields only `/v1/chat/completions` takes.
const CHAT: &[&str] = &["messages", "max_completion_tokens", "top_logprobs", "tools", "tool_choice", "parallel_tool_calls", "functions", "chat_template_kwargs"];

/// Fields only `/v1/completions` takes (`best_of` up to `n`: see the completions parser).
const COMPLETIONS: &[&str] = &["prompt", "echo", "best_of", "suffix"];

/// Whether a value asks for nothing.
type Neutral = fn(&Value) -> bool;

fn is_false(v: &Value) -> bool {
    v == &Value::Bool(false)
}
fn is_true(v: &Value) -> bool {
    v == &Value::Bool(true)
}
fn is_zero(v: &Value) -> bool {
    v.as_f64() == Some(0.0)
}
fn is_one(v: &Value) -> bool {
    v.as_f64() == Some(1.0)
}
fn is_empty(v: &Value) -> bool {
    v.as_array().map_or(false, |a| a.is_empty()) || v.as_object().map_or(false, |o| o.is_empty()) || v.as_str() == Some("")
}
fn never(_: &Value) -> bool {
    false
}
fn text_only(v: &Value) -> bool {
    v.as_array().map_or(false, |a| a.iter().all(|m| m.as_str() == Some("text")))
}
fn auto_tier(v: &Value) -> bool {
    matches!(v.as_str(), Some("auto" | "default"))
}

/// Fields refused unless neutral: name, what asks for nothing, why.
const REFUSED: &[(&str, Neutral, &str)] = &[
    ("store", is_false, "this server stores no completions"),
    ("service_tier", auto_tier, "this server has one service tier"),
    ("modalities", text_only, "this server answers with text only"),
    ("audio", never, "audio output is not supported"),
    ("prediction", never, "predicted outputs are not supported"),
    ("web_search_options", never, "web search is not supported"),
    ("reasoning_effort", never, "this model has no reasoning setting"),
    ("verbosity", never, "this model has no verbosity setting"),
    ("function_call", never, "'function_call' is deprecated; use 'tool_choice'"),
    ("min_p", is_zero, "min_p sampling is not supported (use top_p or top_k)"),
    ("use_beam_search", is_false, "beam search is not supported"),
    ("length_penalty", is_one, "length_penalty applies to beam search, which is not supported"),
    ("prompt_logprobs", never, "prompt logprobs are not supported"),
    ("stop_token_ids", is_empty, "stop_token_ids are not supported (use 'stop' strings)"),
    ("bad_words", is_empty, "bad_words are not supported (use 'logit_bias')"),
    ("allowed_token_ids", never, "allowed_token_ids are not supported (use 'logit_bias')"),
    ("skip_special_tokens", is_true, "special tokens are always skipped in the output"),
    ("spaces_between_special_tokens", is_true, "special tokens are always skipped in the output"),
    ("include_stop_str_in_output", is_false, "stop strings are never included in the output"),
    ("return_tokens_as_token_ids", is_false, "tokens are returned as text"),
    ("truncate_prompt_tokens", never, "prompts are never truncated; a prompt over the limit is a 400"),
    ("add_generation_prompt", is_true, "the generation prompt is always added"),
    ("continue_final_message", is_false, "continuing the final message is not supported"),
    ("add_special_tokens", is_false, "no special tokens are added to prompts"),
    ("chat_template", never, "the model's own chat template is used"),
    ("documents", never, "documents are not supported"),
    ("mm_processor_kwargs", is_empty, "image processor arguments are not supported"),
    ("logits_processors", is_empty, "custom logits processors are not supported"),
    ("priority", is_zero, "request priorities are not supported"),
    ("cache_salt", never, "cache salts are not supported"),
    ("request_id", never, "client request ids are not supported"),
    ("kv_transfer_params", never, "KV transfer is not supported"),
    ("vllm_xargs", never, "vllm_xargs are not supported"),
];

/// Checks every top-level field of a request body to `api`: an accepted one passes (its value
/// is checked by its parser), a refused one must be null or neutral, anything else is a 400
/// naming it.
pub fn check(o: &Map<String, Value>, api: Api) -> Result<(), ApiError> {
    let own = if api == Api::Chat { CHAT } else { COMPLETIONS };
    for (key, v) in o {
        if COMMON.contains(&key.as_str()) || own.contains(&key.as_str()) {
            continue;
        }
        if let Some((_, neutral, why)) = REFUSED.iter().find(|(name, _, _)| name == key) {
            if v.is_null() || neutral(v) {
                continue;
            }
            return Err(ApiError::invalid(key.clone(), "unsupported_parameter", format!("'{}' is not supported: {}", key, why)));
        }
        let other = if api == Api::Chat { COMPLETIONS } else { CHAT };
        let hint = if other.contains(&key.as_str()) {
            format!(" (it belongs to {})", if api == Api::Chat { "/v1/completions" } else { "/v1/chat/completions" })
        } else {
            String::new()
        };
        let shown: String = key.chars().take(64).collect();
        return Err(ApiError::invalid(shown.clone(), "unknown_parameter", format!("unrecognized request field '{}'{}", shown, hint)));
    }
    Ok(())
}

/// The accepted fields of `api`, for documentation and tests.
pub fn accepted(api: Api) -> impl Iterator<Item = &'static str> {
    COMMON.iter().chain(if api == Api::Chat { CHAT } else { COMPLETIONS }).copied()
}

/// The refused fields and why, for documentation and tests.
pub fn refused() -> impl Iterator<Item = (&'static str, &'static str)> {
    REFUSED.iter().map(|(n, _, why)| (*n, *why))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn run(v: Value, api: Api) -> Result<(), ApiError> {
        check(v.as_object().unwrap(), api)
    }

    #[test]
    fn accepted_neutral_refused_and_unknown() {
        assert!(run(json!({"model": "m", "messages": [], "user": "u", "metadata": {"a": "b"}, "tools": [], "min_p": 0, "store": false, "use_beam_search": null}), Api::Chat).is_ok());
        let e = run(json!({"messages": [], "min_p": 0.1}), Api::Chat).unwrap_err();
        assert_eq!((e.param.as_deref(), e.code), (Some("min_p"), "unsupported_parameter"));
        let e = run(json!({"messages": [], "frobnicate": 1}), Api::Chat).unwrap_err();
        assert_eq!((e.param.as_deref(), e.code), (Some("frobnicate"), "unknown_parameter"));
        let e = run(json!({"messages": [], "echo": true}), Api::Chat).unwrap_err();
        assert!(e.message.contains("/v1/completions"), "{}", e.message);
        let e = run(json!({"prompt": "x", "messages": []}), Api::Completions).unwrap_err();
        assert_eq!(e.param.as_deref(), Some("messages"));
        assert!(run(json!({"prompt": "x", "echo": false, "best_of": 1, "logprobs": 2}), Api::Completions).is_ok());
        // every refused field has a reason, and no field is both accepted and refused
        for (name, why) in refused() {
            assert!(!why.is_empty() && !accepted(Api::Chat).any(|a| a == name) && !accepted(Api::Completions).any(|a| a == name), "{}", name);
        }
    }
}
