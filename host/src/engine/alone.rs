//! One request through the engine on its own: what `generate` and `chat` run (a single stream
//! is the batch of one, the same steps as a served batch).

use super::{Engine, Event, Request};
use crate::generate::{Generated, Stop};
use crate::{Error, Result};
use std::time::Instant;

impl Engine<'_> {
    /// Runs `req` alone (the engine must hold no other sequence) until it ends, and returns
    /// what it generated. `on_token` sees each new token as it is chosen (a stop token
    /// included) and may return `false` to end the generation there; the sequence is then
    /// cancelled and its blocks freed (its written blocks stay in the prefix cache).
    pub fn generate(&mut self, req: Request, on_token: &mut dyn FnMut(u32) -> bool) -> Result<Generated> {
        if self.has_work() {
            return Err(Error::Limit { op: "engine generate", msg: "other sequences are running: generate runs one request alone".into() });
        }
        let (start, prompt_tokens) = (Instant::now(), req.prompt.len());
        let stop_ids = req.stop_ids.clone();
        let hits = self.stats.prefix_hit_tokens;
        let id = self.add(req)?;
        let mut tokens = Vec::new();
        let mut first: Option<Instant> = None;
        loop {
            let events = match self.step() {
                Ok(e) => e,
                Err(e) => {
                    self.abort_all();
                    return Err(e);
                }
            };
            for ev in events {
                match ev {
                    Event::Token { id: i, token, .. } if i == id => {
                        first.get_or_insert_with(Instant::now);
                        tokens.push(token);
                        if !on_token(token) {
                            self.cancel(id);
                            let stop = if stop_ids.contains(&token) { Stop::StopToken(token) } else { Stop::MaxTokens };
                            let f = first.unwrap_or(start);
                            let cached_tokens = (self.stats.prefix_hit_tokens - hits) as usize;
                            return Ok(Generated { tokens, stop, prefill_secs: (f - start).as_secs_f64(), decode_secs: f.elapsed().as_secs_f64(), prompt_tokens, cached_tokens });
                        }
                    }
                    Event::Finished { id: i, stop, prefill_secs, decode_secs, cached_tokens, .. } if i == id => {
                        return Ok(Generated { tokens, stop, prefill_secs, decode_secs, prompt_tokens, cached_tokens });
                    }
                    _ => {}
                }
            }
            if !self.has_work() {
                return Err(Error::Limit { op: "engine generate", msg: "the sequence ended without finishing".into() });
            }
        }
    }
}
