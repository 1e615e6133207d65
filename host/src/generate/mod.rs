//! Text generation over a [`Model`]: a session that owns the KV cache and the rotary position
//! counter, prefill then incremental decode, sampling, stop tokens and streaming.

pub mod chat;
pub mod sampling;

pub use sampling::{Sampler, SamplingParams};

use crate::model::positions::multimodal_positions;
use crate::model::text::Deepstack;
use crate::model::{Images, KvCache, Model};
use crate::{Backend, Error, Result};

/// One conversation's state on one backend.
pub struct Session<'a> {
    model: &'a Model,
    backend: &'a dyn Backend,
    cache: KvCache,
    /// Rotary position of the next token (equals the cache length for text-only context).
    next_pos: u32,
    /// Every token fed so far (the repetition penalty's context).
    tokens: Vec<u32>,
}

/// Why generation ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Stop {
    /// A stop token was produced (it is not fed back into the cache).
    StopToken(u32),
    /// The token budget ran out.
    MaxTokens,
}

/// What one [`Session::generate`] call did.
#[derive(Clone, Debug, PartialEq)]
pub struct Generated {
    pub tokens: Vec<u32>,
    pub stop: Stop,
    /// Seconds spent on the prompt (prefill) and on the generated tokens (decode).
    pub prefill_secs: f64,
    pub decode_secs: f64,
    pub prompt_tokens: usize,
}

impl<'a> Session<'a> {
    /// A session whose context holds at most `capacity` tokens (prompt and generated).
    pub fn new(model: &'a Model, backend: &'a dyn Backend, capacity: usize) -> Result<Session<'a>> {
        let limit = model.config.text.max_position_embeddings;
        if capacity > limit {
            return Err(Error::Context { tokens: capacity, limit, msg: "requested context exceeds max_position_embeddings".into() });
        }
        Ok(Session { model, backend, cache: KvCache::new(backend, &model.config.text, capacity)?, next_pos: 0, tokens: Vec::new() })
    }

    /// Tokens in the context so far.
    pub fn len(&self) -> usize {
        self.cache.len()
    }

    pub fn is_empty(&self) -> bool {
        self.cache.is_empty()
    }

    pub fn capacity(&self) -> usize {
        self.cache.capacity()
    }

    /// Appends text tokens to the context and returns the logits `[vocab]` after the last one.
    pub fn feed(&mut self, ids: &[u32]) -> Result<Vec<f32>> {
        self.feed_with_images(ids, None)
    }

    /// Appends tokens whose image placeholders (runs of the image token, one run per image, in
    /// order) are filled by `images`: the vision tower's embeddings replace those rows, its
    /// DeepStack features join them after the first decoder layers, and the rotary positions
    /// follow the image grids. Returns the logits `[vocab]` after the last token.
    pub fn feed_with_images(&mut self, ids: &[u32], images: Option<&Images<'_>>) -> Result<Vec<f32>> {
        if ids.is_empty() {
            return Err(Error::Tokenizer { msg: "nothing to feed: the token list is empty".into() });
        }
        if self.cache.len() + ids.len() > self.cache.capacity() {
            return Err(Error::Context {
                tokens: self.cache.len() + ids.len(),
                limit: self.cache.capacity(),
                msg: "the prompt does not fit the context".into(),
            });
        }
        let (b, m) = (self.backend, self.model);
        let cfg = &m.config;
        let grids: &[[usize; 3]] = images.map_or(&[], |im| im.grids);
        // 1. rotary positions (fails if placeholders and images disagree)
        let (pos, next_pos) = multimodal_positions(ids, cfg.image_token_id, grids, cfg.vision.spatial_merge_size, self.next_pos)?;
        // 2. token embeddings [t, hidden], image rows replaced by the vision tower's output
        let mut x = m.text.embed(b, ids)?;
        let rows: Vec<usize> = ids.iter().enumerate().filter(|(_, &t)| t == cfg.image_token_id).map(|(i, _)| i).collect();
        let vis = match images {
            Some(im) if !im.grids.is_empty() => {
                let n = im.patches.len() / im.row_len.max(1);
                let out = m.vision.forward(b, &b.upload_f32(&[n, im.row_len], im.patches)?, im.grids)?;
                x = b.scatter_rows(&x, &rows, &out.embeds, false)?;
                Some(out)
            }
            _ => None,
        };
        // 3. the decoder, with DeepStack features on the image rows
        let ds = vis.as_ref().map(|v| Deepstack { rows: &rows, features: &v.deepstack });
        let h = m.text.forward(b, x, &pos, &mut self.cache, ds.as_ref())?; // [t, hidden]
        let last = b.take_rows(&h, ids.len() - 1, 1)?; // [1, hidden]
        let logits = b.download_f32(&m.text.logits(b, &last)?)?; // [vocab]
        self.next_pos = next_pos;
        self.tokens.extend_from_slice(ids);
        Ok(logits)
    }

    /// Feeds `prompt`, then samples up to `max_new` tokens, feeding each back, until a token
    /// of `stop_ids`. `on_token` sees each new token as it is chosen (stop token included) and
    /// may return `false` to end early.
    pub fn generate(&mut self, prompt: &[u32], max_new: usize, sampler: &mut Sampler, stop_ids: &[u32], on_token: &mut dyn FnMut(u32) -> bool) -> Result<Generated> {
        self.generate_with_images(prompt, None, max_new, sampler, stop_ids, on_token)
    }

    /// [`Session::generate`] for a prompt with image placeholders filled by `images`.
    pub fn generate_with_images(
        &mut self,
        prompt: &[u32],
        images: Option<&Images<'_>>,
        max_new: usize,
        sampler: &mut Sampler,
        stop_ids: &[u32],
        on_token: &mut dyn FnMut(u32) -> bool,
    ) -> Result<Generated> {
        let start = std::time::Instant::now();
        if self.cache.len() + prompt.len() + max_new > self.cache.capacity() {
            return Err(Error::Context {
                tokens: self.cache.len() + prompt.len() + max_new,
                limit: self.cache.capacity(),
                msg: format!("{} in context + {} prompt + {} to generate", self.cache.len(), prompt.len(), max_new),
            });
        }
        let mut logits = self.feed_with_images(prompt, images)?;
        let prefill_secs = start.elapsed().as_secs_f64();
        let start = std::time::Instant::now();
        let mut out = Vec::new();
        let mut stop = Stop::MaxTokens;
        for i in 0..max_new {
            let t = sampler.sample(&mut logits, &self.tokens);
            out.push(t);
            let go_on = on_token(t);
            if stop_ids.contains(&t) {
                stop = Stop::StopToken(t);
                break;
            }
            if !go_on || i + 1 == max_new {
                break;
            }
            logits = self.feed(&[t])?;
        }
        Ok(Generated { tokens: out, stop, prefill_secs, decode_secs: start.elapsed().as_secs_f64(), prompt_tokens: prompt.len() })
    }
}
