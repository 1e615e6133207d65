//! Log-probabilities as clients see them: each token's text and bytes (from the engine's
//! [`TokenLogprobs`]), in the chat shape (`{"content": [{token, logprob, bytes,
//! top_logprobs}]}`) and the legacy completions shape (`{tokens, token_logprobs, top_logprobs,
//! text_offset}`). The values are those of the distribution the token was drawn from (see
//! [`host::generate::logprobs`]).

use crate::generate::logprobs::TokenLogprobs;
use crate::Tokenizer;
use serde_json::{json, Map, Value};

/// What JSON gets for a log-probability of negative infinity (a token a mask excluded), as
/// vLLM writes it.
const NEG_INF: f32 = -9999.0;

/// One token: its text (special tokens as written, e.g. `<|im_end|>`; a partial character as
/// U+FFFD), its bytes and its log-probability.
#[derive(Clone, Debug, PartialEq)]
pub struct Tok {
    pub text: String,
    pub bytes: Vec<u8>,
    pub logprob: f32,
}

/// A generated token with the most likely ones at its position.
#[derive(Clone, Debug, PartialEq)]
pub struct TokenLogprob {
    pub tok: Tok,
    pub top: Vec<Tok>,
}

fn tok(t: &Tokenizer, id: u32, logprob: f32) -> Tok {
    let bytes = t.token_bytes(id, false).map(<[u8]>::to_vec).unwrap_or_default();
    Tok { text: String::from_utf8_lossy(&bytes).into_owned(), bytes, logprob: if logprob.is_finite() { logprob } else { NEG_INF } }
}

/// The engine's log-probabilities of one token, with texts.
pub fn describe(t: &Tokenizer, lp: &TokenLogprobs) -> TokenLogprob {
    TokenLogprob { tok: tok(t, lp.token, lp.logprob), top: lp.top.iter().map(|&(id, l)| tok(t, id, l)).collect() }
}

/// The chat shape: `{"content": [...]}`.
pub fn chat_json(lps: &[TokenLogprob]) -> Value {
    let one = |t: &Tok| json!({"token": t.text, "logprob": t.logprob, "bytes": t.bytes});
    let content: Vec<Value> = lps
        .iter()
        .map(|l| {
            let mut v = one(&l.tok);
            v["top_logprobs"] = l.top.iter().map(one).collect();
            v
        })
        .collect();
    json!({ "content": content })
}

/// The legacy completions shape; `offset`: characters of text before the first token (the
/// echoed prompt, or the text of earlier chunks). `top_logprobs` holds the sampled token too,
/// as OpenAI's did (so up to `logprobs + 1` entries).
pub fn completion_json(lps: &[TokenLogprob], mut offset: usize) -> Value {
    let mut text_offset = Vec::with_capacity(lps.len());
    for l in lps {
        text_offset.push(offset);
        offset += l.tok.text.chars().count();
    }
    let top: Vec<Value> = lps
        .iter()
        .map(|l| {
            let mut m = Map::new();
            for t in l.top.iter().chain(std::iter::once(&l.tok)) {
                m.insert(t.text.clone(), json!(t.logprob));
            }
            Value::Object(m)
        })
        .collect();
    json!({
        "tokens": lps.iter().map(|l| l.tok.text.clone()).collect::<Vec<_>>(),
        "token_logprobs": lps.iter().map(|l| l.tok.logprob).collect::<Vec<_>>(),
        "top_logprobs": top,
        "text_offset": text_offset,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(text: &str, logprob: f32) -> Tok {
        Tok { text: text.into(), bytes: text.as_bytes().to_vec(), logprob }
    }

    #[test]
    fn chat_and_completion_shapes() {
        let lps = vec![TokenLogprob { tok: t("Hé", -0.5), top: vec![t("Hé", -0.5), t("A", -1.5)] }, TokenLogprob { tok: t("!", -0.1), top: vec![t("!", -0.1), t("?", -2.5)] }];
        let c = chat_json(&lps);
        assert_eq!(c["content"][0]["token"], "Hé");
        assert_eq!(c["content"][0]["bytes"], json!([72, 195, 169]));
        assert_eq!(c["content"][1]["top_logprobs"][1], json!({"token": "?", "logprob": -2.5, "bytes": [63]}));
        let l = completion_json(&lps, 3);
        assert_eq!(l["tokens"], json!(["Hé", "!"]));
        assert_eq!(l["token_logprobs"], json!([-0.5, -0.1f32]));
        assert_eq!(l["text_offset"], json!([3, 5]));
        assert_eq!(l["top_logprobs"][0], json!({"Hé": -0.5, "A": -1.5}));
    }
}
