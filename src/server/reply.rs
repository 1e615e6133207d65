//! A job's events as the client's reply, for both endpoints and any number of choices: one
//! whole object (`chat.completion` / `text_completion`) or its stream chunks, each choice
//! under its `index`, with log-probabilities when asked. The usage counts the prompt once and
//! the generated tokens of every choice. With tools, each chat choice's text is read for
//! `<tool_call>` blocks (`super::tools`): whole, into `message.tool_calls`; streamed, into
//! tool-call deltas, the log-probabilities of text held back going with the next chunk.

use super::logprobs::{chat_json, completion_json, TokenLogprob};
use super::openai;
use super::queue::Event;
use super::tools::{self, CallReader, ToolParser};
use serde_json::{json, Value};

/// Which endpoint's objects.
#[derive(Clone, Debug, PartialEq)]
pub enum Format {
    Chat,
    /// `/v1/completions`; `echo`: the prompt's text, put before each choice's text.
    Completion { echo: Option<String> },
}

/// The reply being made from a job's events.
pub struct Answer {
    id: String,
    created: u64,
    model: String,
    format: Format,
    /// Whether log-probabilities were asked for (`logprobs` is then never null).
    logprobs: bool,
    texts: Vec<String>,
    lps: Vec<Vec<TokenLogprob>>,
    finish: Vec<Option<&'static str>>,
    /// Characters of each choice's text sent so far, the echo included (completions'
    /// `text_offset`).
    sent_chars: Vec<usize>,
    prompt_tokens: usize,
    cached_tokens: usize,
    completion_tokens: usize,
    /// Reads chat choices for tool calls, when the request has tools.
    tools: Option<CallReader>,
    /// Each choice's stream parser (with `tools`), and the log-probabilities of its text held
    /// back.
    parsers: Vec<ToolParser>,
    held_lps: Vec<Vec<TokenLogprob>>,
}

impl Answer {
    pub fn new(id: String, created: u64, model: String, format: Format, n: usize, logprobs: bool) -> Answer {
        let echo_chars = match &format {
            Format::Completion { echo: Some(e) } => e.chars().count(),
            _ => 0,
        };
        Answer {
            id,
            created,
            model,
            format,
            logprobs,
            texts: vec![String::new(); n],
            lps: vec![Vec::new(); n],
            finish: vec![None; n],
            sent_chars: vec![echo_chars; n],
            prompt_tokens: 0,
            cached_tokens: 0,
            completion_tokens: 0,
            tools: None,
            parsers: Vec::new(),
            held_lps: Vec::new(),
        }
    }

    /// Reads the chat choices for tool calls with `reader` (none: plain text).
    pub fn with_tools(mut self, reader: Option<CallReader>) -> Answer {
        if self.format == Format::Chat {
            if let Some(r) = &reader {
                self.parsers = (0..self.texts.len()).map(|_| r.parser()).collect();
                self.held_lps = vec![Vec::new(); self.texts.len()];
            }
            self.tools = reader;
        }
        self
    }

    /// The stream chunks of what a choice's tool parser let out: content, or a call's two
    /// deltas; the held log-probabilities go with the first.
    fn tool_chunks(&mut self, index: usize, outs: Vec<tools::Output>, logprobs: Vec<TokenLogprob>) -> Vec<Value> {
        self.held_lps[index].extend(logprobs);
        let mut chunks = Vec::new();
        for o in outs {
            let lp = if self.logprobs { Some(chat_json(&std::mem::take(&mut self.held_lps[index]))) } else { None };
            match o {
                tools::Output::Content(t) => chunks.push(self.chat_chunk(index, json!({"content": t}), None, lp)),
                tools::Output::Call(c) => {
                    let [head, args] = c.deltas();
                    chunks.push(self.chat_chunk(index, head, None, lp));
                    chunks.push(self.chat_chunk(index, args, None, None));
                }
            }
        }
        chunks
    }

    /// Whether every choice has ended.
    pub fn done(&self) -> bool {
        self.finish.iter().all(Option::is_some)
    }

    /// Takes a `Done`'s counts (the prompt and its cached part once, from the first choice).
    fn count(&mut self, index: usize, finish_reason: &'static str, prompt_tokens: usize, cached_tokens: usize, completion_tokens: usize) {
        if let Some(f) = self.finish.get_mut(index) {
            *f = Some(finish_reason);
        }
        if index == 0 {
            self.prompt_tokens = prompt_tokens;
            self.cached_tokens = cached_tokens;
        }
        self.completion_tokens += completion_tokens;
    }

    fn usage(&self) -> Value {
        openai::usage(self.prompt_tokens, self.cached_tokens, self.completion_tokens)
    }

    /// Adds an event to the whole reply (`Started` and `Failed` are the caller's).
    pub fn absorb(&mut self, ev: Event) {
        match ev {
            Event::Text { index, text, logprobs } if index < self.texts.len() => {
                self.texts[index].push_str(&text);
                self.lps[index].extend(logprobs);
            }
            Event::Done { index, finish_reason, prompt_tokens, cached_tokens, completion_tokens } => self.count(index, finish_reason, prompt_tokens, cached_tokens, completion_tokens),
            _ => {}
        }
    }

    /// The whole reply's object.
    pub fn whole(&self) -> Value {
        let n = self.texts.len();
        match &self.format {
            Format::Chat => {
                let choices = (0..n)
                    .map(|i| {
                        let mut c = openai::choice(i, &self.texts[i], self.finish[i].unwrap_or("stop"), self.logprobs.then(|| chat_json(&self.lps[i])));
                        if let Some(r) = &self.tools {
                            tools::apply_to_choice(&mut c, &mut r.parser(), &self.texts[i]);
                        }
                        c
                    })
                    .collect();
                openai::completion(&self.id, self.created, &self.model, choices, self.usage())
            }
            Format::Completion { echo } => {
                let e = echo.as_deref().unwrap_or("");
                let offset = e.chars().count();
                let lp = |i: usize| if self.logprobs { completion_json(&self.lps[i], offset) } else { Value::Null };
                let choices: Vec<Value> = (0..n).map(|i| completion_choice(i, &format!("{}{}", e, self.texts[i]), lp(i), self.finish[i])).collect();
                json!({"id": self.id, "object": "text_completion", "created": self.created, "model": self.model, "choices": choices, "usage": self.usage()})
            }
        }
    }

    /// The stream's first chunks: each chat choice's role, each completion choice's echo.
    pub fn opening(&mut self) -> Vec<Value> {
        let n = self.texts.len();
        match &self.format {
            Format::Chat => (0..n).map(|i| self.chat_chunk(i, json!({"role": "assistant", "content": ""}), None, None)).collect(),
            Format::Completion { echo: Some(e) } if !e.is_empty() => (0..n).map(|i| self.completion_chunk(i, e, Value::Null, None)).collect(),
            Format::Completion { .. } => Vec::new(),
        }
    }

    /// The chunks of one event (`Started` and `Failed` are the caller's); after the last
    /// choice's `Done`, the usage chunk when `include_usage`.
    pub fn chunks(&mut self, ev: Event, include_usage: bool) -> Vec<Value> {
        match ev {
            Event::Text { index, text, logprobs } if index < self.texts.len() && index < self.parsers.len() => {
                let outs = self.parsers[index].push(&text);
                self.tool_chunks(index, outs, logprobs)
            }
            Event::Text { index, text, logprobs } if index < self.texts.len() => {
                let lp = if self.logprobs { Some(logprobs) } else { None };
                match self.format {
                    Format::Chat => vec![self.chat_chunk(index, json!({"content": text}), None, lp.map(|l| chat_json(&l)))],
                    Format::Completion { .. } => {
                        let lpv = lp.map_or(Value::Null, |l| completion_json(&l, self.sent_chars[index]));
                        self.sent_chars[index] += text.chars().count();
                        vec![self.completion_chunk(index, &text, lpv, None)]
                    }
                }
            }
            Event::Done { index, finish_reason, prompt_tokens, cached_tokens, completion_tokens } => {
                let mut out = Vec::new();
                let mut finish_reason = finish_reason;
                if index < self.parsers.len() {
                    let outs = self.parsers[index].finish();
                    out = self.tool_chunks(index, outs, Vec::new());
                    if self.parsers[index].calls() > 0 && finish_reason == "stop" {
                        finish_reason = "tool_calls";
                    }
                }
                self.count(index, finish_reason, prompt_tokens, cached_tokens, completion_tokens);
                out.push(match self.format {
                    Format::Chat => self.chat_chunk(index, json!({}), Some(finish_reason), None),
                    Format::Completion { .. } => self.completion_chunk(index, "", Value::Null, Some(finish_reason)),
                });
                if self.done() && include_usage {
                    let object = if self.format == Format::Chat { "chat.completion.chunk" } else { "text_completion" };
                    out.push(json!({"id": self.id, "object": object, "created": self.created, "model": self.model, "choices": [], "usage": self.usage()}));
                }
                out
            }
            _ => Vec::new(),
        }
    }

    fn chat_chunk(&self, index: usize, delta: Value, finish: Option<&str>, logprobs: Option<Value>) -> Value {
        openai::chunk(&self.id, self.created, &self.model, index, delta, finish, logprobs)
    }

    fn completion_chunk(&self, index: usize, text: &str, logprobs: Value, finish: Option<&str>) -> Value {
        json!({"id": self.id, "object": "text_completion", "created": self.created, "model": self.model, "choices": [completion_choice(index, text, logprobs, finish)]})
    }
}

fn completion_choice(index: usize, text: &str, logprobs: Value, finish: Option<&str>) -> Value {
    json!({"index": index, "text": text, "logprobs": logprobs, "finish_reason": finish})
}

#[cfg(test)]
mod tests {
    use super::*;

    fn text(index: usize, t: &str) -> Event {
        Event::Text { index, text: t.into(), logprobs: vec![] }
    }

    fn done(index: usize, completion_tokens: usize) -> Event {
        Event::Done { index, finish_reason: "length", prompt_tokens: 9, cached_tokens: if index == 0 { 0 } else { 8 }, completion_tokens }
    }

    #[test]
    fn choices_by_index_and_usage_counts_the_prompt_once() {
        let mut a = Answer::new("x".into(), 1, "m".into(), Format::Chat, 2, false);
        for ev in [text(1, "b"), text(0, "a"), text(0, "c"), done(1, 3)] {
            a.absorb(ev);
        }
        assert!(!a.done());
        a.absorb(done(0, 2));
        let w = a.whole();
        assert_eq!((w["choices"][0]["message"]["content"].as_str(), w["choices"][1]["message"]["content"].as_str()), (Some("ac"), Some("b")));
        assert_eq!((w["choices"][1]["index"].as_u64(), w["choices"][0]["logprobs"].is_null()), (Some(1), true));
        assert_eq!(w["usage"], json!({"prompt_tokens": 9, "completion_tokens": 5, "total_tokens": 14, "prompt_tokens_details": {"cached_tokens": 0}}));
        // completions: the echo before the text, streamed first
        let mut c = Answer::new("y".into(), 1, "m".into(), Format::Completion { echo: Some("P".into()) }, 1, false);
        let open = c.opening();
        assert_eq!((open.len(), open[0]["choices"][0]["text"].as_str()), (1, Some("P")));
        let chunks = c.chunks(text(0, "q"), true);
        assert_eq!(chunks[0]["object"], "text_completion");
        let end = c.chunks(done(0, 1), true);
        assert_eq!((end.len(), end[0]["choices"][0]["finish_reason"].as_str(), end[1]["usage"]["completion_tokens"].as_u64()), (2, Some("length"), Some(1)));
        c.absorb(text(0, "q"));
        assert_eq!(c.whole()["choices"][0]["text"], "Pq");
    }

    #[test]
    fn tool_calls_per_choice_whole_and_streamed() {
        let tools = json!({"tools": [{"type": "function", "function": {"name": "f"}}]});
        let reader = super::super::tools::parse_request(tools.as_object().unwrap()).unwrap().reader();
        let call = "<tool_call>\n{\"name\": \"f\", \"arguments\": {\"x\": 1}}\n</tool_call>";
        let stop = |index| Event::Done { index, finish_reason: "stop", prompt_tokens: 3, cached_tokens: 0, completion_tokens: 2 };
        // whole: choice 0 calls, choice 1 answers in text
        let mut a = Answer::new("x".into(), 1, "m".into(), Format::Chat, 2, false).with_tools(reader.clone());
        for ev in [text(0, "Sure. "), text(0, call), text(1, "No."), stop(0), stop(1)] {
            a.absorb(ev);
        }
        let w = a.whole();
        let (c0, c1) = (&w["choices"][0], &w["choices"][1]);
        assert_eq!((c0["message"]["content"].as_str(), c0["finish_reason"].as_str()), (Some("Sure."), Some("tool_calls")));
        assert_eq!(c0["message"]["tool_calls"][0]["function"], json!({"name": "f", "arguments": "{\"x\": 1}"}));
        assert_eq!((c1["message"]["content"].as_str(), c1["finish_reason"].as_str(), c1["message"].get("tool_calls")), (Some("No."), Some("stop"), None));
        // streamed: the call's two deltas under its choice, then finish_reason tool_calls
        let mut s = Answer::new("y".into(), 1, "m".into(), Format::Chat, 1, false).with_tools(reader);
        let mut chunks = s.chunks(text(0, &call[..5]), false);
        chunks.extend(s.chunks(text(0, &call[5..]), false));
        chunks.extend(s.chunks(stop(0), false));
        let deltas: Vec<&Value> = chunks.iter().map(|c| &c["choices"][0]["delta"]).collect();
        assert_eq!(deltas.len(), 3, "{:?}", deltas);
        assert!(deltas[0]["tool_calls"][0]["id"].as_str().unwrap().starts_with("call_"));
        assert_eq!(deltas[0]["tool_calls"][0]["function"]["name"], "f");
        assert_eq!(deltas[1]["tool_calls"][0], json!({"index": 0, "function": {"arguments": "{\"x\": 1}"}}));
        assert_eq!(chunks[2]["choices"][0]["finish_reason"], "tool_calls");
    }
}
