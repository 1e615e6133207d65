//! What to generate and how to answer, as both `/v1/chat/completions` and `/v1/completions`
//! take it: sampling, stop strings, penalties, `n`, `logprobs`, `logit_bias`, `min_tokens`,
//! `ignore_eos`, streaming and structured output (`structured.rs`). Each value is checked here;
//! an error names the field.

use super::fields::Api;
use super::openai::{boolean, integer, number, wrong_type, ApiError, ParseLimits};
use serde_json::{Map, Value};

/// The most choices one request may ask for (`n`).
pub const MAX_N: usize = 16;
/// The most top log-probabilities per token (`top_logprobs`, completions' `logprobs`), as vLLM.
pub const MAX_TOP_LOGPROBS: usize = 20;
/// The most `logit_bias` entries.
pub const MAX_LOGIT_BIAS: usize = 1024;

/// The generation settings of a request.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Settings {
    pub stream: bool,
    /// `stream_options.include_usage`: a last chunk carries the usage.
    pub include_usage: bool,
    /// `max_completion_tokens`, else `max_tokens` (chat); `max_tokens` (completions).
    pub max_tokens: Option<usize>,
    pub temperature: Option<f32>,
    pub top_p: Option<f32>,
    pub top_k: Option<usize>,
    pub seed: Option<u64>,
    pub stop: Vec<String>,
    pub presence_penalty: f32,
    pub frequency_penalty: f32,
    pub repetition_penalty: Option<f32>,
    /// Choices to generate from one prefill (1 ..= [`MAX_N`]).
    pub n: usize,
    /// Log-probabilities of each token and this many top ones (`None`: not asked).
    pub logprobs: Option<usize>,
    /// Added to these tokens' logits (ids checked against the vocabulary by
    /// [`check_vocab`], once the tokenizer is at hand).
    pub logit_bias: Vec<(u32, f32)>,
    /// No stop token before this many tokens (stop strings apply from there on too).
    pub min_tokens: usize,
    /// The end-of-turn tokens do not stop the generation.
    pub ignore_eos: bool,
    /// `response_format` / `structured_outputs`: what the reply must match.
    pub structured: Option<super::structured::Structured>,
}

/// Reads the settings of body `o` sent to `api`.
pub fn parse(o: &Map<String, Value>, limits: &ParseLimits, api: Api) -> Result<Settings, ApiError> {
    // 1. lengths
    let max_new = |key: &str| -> Result<Option<usize>, ApiError> {
        match integer(o, key, i64::MIN, i64::MAX)? {
            None => Ok(None),
            Some(n) if n >= 1 => Ok(Some(usize::try_from(n).unwrap_or(usize::MAX))),
            Some(n) => Err(ApiError::invalid(key, "invalid_value", format!("'{}' is {}; it must be at least 1", key, n))),
        }
    };
    let max_tokens = match api {
        Api::Chat => match max_new("max_completion_tokens")? {
            Some(n) => Some(n),
            None => max_new("max_tokens")?,
        },
        Api::Completions => max_new("max_tokens")?,
    };
    let min_tokens = integer(o, "min_tokens", 0, i64::MAX)?.map_or(0, |m| usize::try_from(m).unwrap_or(usize::MAX));
    if let Some(max) = max_tokens.filter(|&m| min_tokens > m) {
        return Err(ApiError::invalid("min_tokens", "invalid_value", format!("'min_tokens' is {}, more than max_tokens {}", min_tokens, max)));
    }
    // 2. streaming
    let stream = boolean(o, "stream")?;
    let include_usage = match o.get("stream_options") {
        None | Some(Value::Null) => false,
        Some(Value::Object(so)) => boolean(so, "include_usage").map_err(|e| ApiError { param: Some("stream_options.include_usage".into()), ..e })?,
        Some(v) => return Err(wrong_type("stream_options", "an object", v)),
    };
    // 3. stop strings
    let stop = match o.get("stop") {
        None | Some(Value::Null) => Vec::new(),
        Some(Value::String(s)) => vec![s.clone()],
        Some(Value::Array(a)) => a.iter().enumerate().map(|(i, s)| s.as_str().map(String::from).ok_or_else(|| wrong_type(&format!("stop[{}]", i), "a string", s))).collect::<Result<_, _>>()?,
        Some(v) => return Err(wrong_type("stop", "a string or an array of strings", v)),
    };
    if stop.len() > limits.max_stop {
        return Err(ApiError::invalid("stop", "invalid_value", format!("at most {} stop strings are allowed, got {}", limits.max_stop, stop.len())));
    }
    if let Some(i) = stop.iter().position(|s| s.is_empty() || s.len() > limits.max_stop_len) {
        return Err(ApiError::invalid(format!("stop[{}]", i), "invalid_value", format!("stop strings must have 1 to {} bytes", limits.max_stop_len)));
    }
    // 4. choices and log-probabilities
    let n = integer(o, "n", 1, MAX_N as i64)?.map_or(1, |n| n as usize);
    let logprobs = match api {
        Api::Chat => {
            let top = integer(o, "top_logprobs", 0, MAX_TOP_LOGPROBS as i64)?;
            match (boolean(o, "logprobs")?, top) {
                (true, top) => Some(top.unwrap_or(0) as usize),
                (false, Some(_)) => return Err(ApiError::invalid("top_logprobs", "invalid_value", "'top_logprobs' needs 'logprobs': true")),
                (false, None) => None,
            }
        }
        // the legacy API's logprobs is the number of top ones (0: the sampled token's only;
        // `true` is taken as 0, `false` as none)
        Api::Completions => match o.get("logprobs") {
            Some(Value::Bool(b)) => b.then_some(0),
            _ => integer(o, "logprobs", 0, MAX_TOP_LOGPROBS as i64)?.map(|k| k as usize),
        },
    };
    // 5. sampling
    let top_p = match number(o, "top_p", 0.0, 1.0)? {
        Some(p) if p <= 0.0 => return Err(ApiError::invalid("top_p", "invalid_value", "'top_p' must be above 0 (at most 1)")),
        p => p,
    };
    let repetition_penalty = match number(o, "repetition_penalty", 0.0, 10.0)? {
        Some(r) if r <= 0.0 => return Err(ApiError::invalid("repetition_penalty", "invalid_value", "'repetition_penalty' must be above 0 (at most 10)")),
        r => r,
    };
    // 6. structured output (a complete reply allows only the end of turn, which min_tokens
    //    would forbid)
    let structured = super::structured::parse(o)?;
    if let Some(s) = structured.as_ref().filter(|_| min_tokens > 0) {
        return Err(ApiError::invalid("min_tokens", "unsupported_value", format!("'min_tokens' cannot be combined with structured output ('{}'): a complete reply must be able to end", s.param)));
    }
    Ok(Settings {
        stream,
        include_usage,
        max_tokens,
        temperature: number(o, "temperature", 0.0, 2.0)?,
        top_p,
        top_k: integer(o, "top_k", -1, 1 << 30)?.map(|k| k.max(0) as usize),
        seed: integer(o, "seed", i64::MIN, i64::MAX)?.map(|s| s as u64),
        stop,
        presence_penalty: number(o, "presence_penalty", -2.0, 2.0)?.unwrap_or(0.0),
        frequency_penalty: number(o, "frequency_penalty", -2.0, 2.0)?.unwrap_or(0.0),
        repetition_penalty,
        n,
        logprobs,
        logit_bias: logit_bias(o)?,
        min_tokens,
        ignore_eos: boolean(o, "ignore_eos")?,
        structured,
    })
}

/// `logit_bias`: an object from token ids (as strings) to -100 ..= 100.
fn logit_bias(o: &Map<String, Value>) -> Result<Vec<(u32, f32)>, ApiError> {
    let m = match o.get("logit_bias") {
        None | Some(Value::Null) => return Ok(Vec::new()),
        Some(Value::Object(m)) => m,
        Some(v) => return Err(wrong_type("logit_bias", "an object of token ids to numbers", v)),
    };
    if m.len() > MAX_LOGIT_BIAS {
        return Err(ApiError::invalid("logit_bias", "invalid_value", format!("at most {} logit_bias entries are allowed, got {}", MAX_LOGIT_BIAS, m.len())));
    }
    let mut out = Vec::with_capacity(m.len());
    for (k, v) in m {
        let shown: String = k.chars().take(40).collect();
        let param = format!("logit_bias.{}", shown);
        let id = k.parse::<u32>().ok().filter(|_| k.bytes().all(|b| b.is_ascii_digit())).ok_or_else(|| ApiError::invalid(param.clone(), "invalid_value", format!("logit_bias key '{}' is not a token id", shown)))?;
        let b = v.as_f64().ok_or_else(|| wrong_type(&param, "a number", v))?;
        if !(-100.0..=100.0).contains(&b) {
            return Err(ApiError::invalid(param, "invalid_value", format!("logit_bias for token {} is {}; it must be between -100 and 100", id, b)));
        }
        out.push((id, b as f32));
    }
    Ok(out)
}

/// A seed for a request that sets none: random per request (the process's random hashing keys,
/// a counter and the clock), so that sampled requests differ; `seed` still reproduces.
pub fn fresh_seed() -> u64 {
    use std::hash::{BuildHasher, Hasher};
    static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u64(NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed));
    h.write_u128(std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_nanos()));
    h.finish()
}

/// Checks that every `logit_bias` id is in the vocabulary of `vocab` ids.
pub fn check_vocab(s: &Settings, vocab: usize) -> Result<(), ApiError> {
    match s.logit_bias.iter().find(|(t, _)| *t as usize >= vocab) {
        Some((t, _)) => Err(ApiError::invalid(format!("logit_bias.{}", t), "invalid_value", format!("logit_bias token {} is outside the vocabulary of {} ids", t, vocab))),
        None => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn run(v: Value, api: Api) -> Result<Settings, ApiError> {
        parse(v.as_object().unwrap(), &ParseLimits::default(), api)
    }

    #[test]
    fn the_rest_of_what_clients_send() {
        let s = run(json!({"n": 3, "logprobs": true, "top_logprobs": 5, "logit_bias": {"42": 100, "7": -100.0}, "min_tokens": 2, "ignore_eos": true, "max_tokens": 4}), Api::Chat).unwrap();
        assert_eq!((s.n, s.logprobs, s.min_tokens, s.ignore_eos, s.max_tokens), (3, Some(5), 2, true, Some(4)));
        assert_eq!(s.logit_bias.len(), 2);
        assert!(s.logit_bias.contains(&(42, 100.0)) && s.logit_bias.contains(&(7, -100.0)));
        assert_eq!(run(json!({"logprobs": true}), Api::Chat).unwrap().logprobs, Some(0));
        assert_eq!(run(json!({"logprobs": false}), Api::Chat).unwrap().logprobs, None);
        assert_eq!(run(json!({"logprobs": 3}), Api::Completions).unwrap().logprobs, Some(3));
        assert_eq!(run(json!({}), Api::Completions).unwrap(), Settings { n: 1, ..Settings::default() });
        // errors name the field (and the key)
        let param = |v: Value, api: Api| run(v, api).unwrap_err().param.unwrap();
        assert_eq!(param(json!({"n": 17}), Api::Chat), "n");
        assert_eq!(param(json!({"n": 0}), Api::Chat), "n");
        assert_eq!(param(json!({"logprobs": 3}), Api::Chat), "logprobs");
        assert_eq!(param(json!({"logprobs": true, "top_logprobs": 21}), Api::Chat), "top_logprobs");
        assert_eq!(param(json!({"top_logprobs": 2}), Api::Chat), "top_logprobs");
        assert_eq!(param(json!({"logprobs": 21}), Api::Completions), "logprobs");
        assert_eq!(param(json!({"logit_bias": {"12": 101}}), Api::Chat), "logit_bias.12");
        assert_eq!(param(json!({"logit_bias": {"x1": 1}}), Api::Chat), "logit_bias.x1");
        assert_eq!(param(json!({"logit_bias": {"-3": 1}}), Api::Chat), "logit_bias.-3");
        assert_eq!(param(json!({"logit_bias": {"3": "up"}}), Api::Chat), "logit_bias.3");
        assert_eq!(param(json!({"logit_bias": [1]}), Api::Chat), "logit_bias");
        assert_eq!(param(json!({"min_tokens": 5, "max_tokens": 4}), Api::Chat), "min_tokens");
        assert_eq!(param(json!({"ignore_eos": 1}), Api::Chat), "ignore_eos");
        assert_eq!(param(json!({"max_completion_tokens": 0}), Api::Chat), "max_completion_tokens");
        let s = run(json!({"logit_bias": {"151935": 1, "3": 2}}), Api::Chat).unwrap();
        assert!(check_vocab(&s, 151_936).is_ok());
        assert_eq!(check_vocab(&s, 151_935).unwrap_err().param.as_deref(), Some("logit_bias.151935"));
        assert_ne!(fresh_seed(), fresh_seed());
    }
}
