//! Text generation over a [`Model`]: a session that owns a contiguous KV cache and the rotary
//! position counter, prefill then incremental decode, sampling, stop tokens and streaming.
//!
//! The CLI's `generate` and `chat` and the server run requests through the engine
//! ([`crate::engine`]; a lone request with [`crate::engine::Engine::generate`]). The session is
//! the model-level runner below it: the tests' reference, what `logits` and the single-stream
//! `bench` run, and the draw numbering the engine follows.

pub mod chat;
pub mod grammar;
pub mod logprobs;
pub mod min_tokens;
pub mod sampling;

pub use sampling::{Sampler, SamplingParams};

use crate::backend::{run_recorded, DeviceSampling, Recording};
use crate::model::positions::multimodal_positions;
use crate::model::text::{cursor, Deepstack};
use crate::model::vision::VisionOutput;
use crate::model::{Images, KvCache, Model};
use crate::{Backend, DType, Error, Result, Tensor};
use gpu::params::CURSOR_FIELDS;

/// One conversation's state on one backend.
pub struct Session<'a> {
    model: &'a Model,
    backend: &'a dyn Backend,
    cache: KvCache,
    /// Rotary position of the next token (equals the cache length for text-only context).
    next_pos: u32,
    /// Every token fed so far (the repetition penalty's context).
    tokens: Vec<u32>,
    /// The decode step's device-resident state and recordings, made on the first decode step.
    step: Option<DecodeStep>,
    /// Whether decode steps may be recorded and replayed (CUDA graphs).
    record: bool,
}

/// What a decode step ends with: a token chosen on the device, or logits for the host sampler.
#[derive(Clone, Copy, Debug, PartialEq)]
enum StepKind {
    Device(DeviceSampling),
    Logits,
}

/// The inputs and outputs of one decode step, in tensors that live as long as the session, so
/// that the step can be recorded once and replayed: the step reads the token id and the cursor
/// (rotary position, cache row) from them, and a device-sampled step writes the next token and
/// the advanced cursor back into them, so consecutive steps need nothing from the host.
struct DecodeStep {
    /// `[1]` u32: the token fed by the next step.
    ids: Tensor,
    /// `[1, 4]` u32: its (t, h, w) position and cache row.
    cursor: Tensor,
    /// The logits of the last [`StepKind::Logits`] step.
    logits: Option<Tensor>,
    /// `[1, ceil(n / 32)]` u32: the sampler's mask of allowed ids for a masked device pick
    /// (made on the first such step).
    mask: Option<Tensor>,
    /// The token whose inputs `ids` / `cursor` already hold (written by the device sampler).
    holds: Option<u32>,
    recording: Option<(StepKind, Recording)>,
    /// Kinds whose recording failed (not retried; plain launches instead).
    unrecordable: Vec<StepKind>,
}

/// Why generation ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Stop {
    /// A stop token was produced (it is not fed back into the cache).
    StopToken(u32),
    /// The token budget ran out.
    MaxTokens,
    /// A constraint of the sampler (a grammar) rejected the token drawn or failed; the token is
    /// reported, not fed back. (Never expected: the mask allows only what the grammar takes.)
    Constraint,
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
    /// Prompt tokens whose keys and values were not computed: the engine's prefix cache held
    /// them (0 for a session, which feeds every token it is given).
    pub cached_tokens: usize,
}

impl<'a> Session<'a> {
    /// A session whose context holds at most `capacity` tokens (prompt and generated).
    pub fn new(model: &'a Model, backend: &'a dyn Backend, capacity: usize) -> Result<Session<'a>> {
        let limit = model.config.text.max_position_embeddings;
        if capacity > limit {
            return Err(Error::Context { tokens: capacity, limit, msg: "requested context exceeds max_position_embeddings".into() });
        }
        Session::with_kv_dtype(model, backend, capacity, backend.default_kv_dtype())
    }

    /// [`Session::new`] with a KV cache of `kv_dtype` (f32 or f16).
    pub fn with_kv_dtype(model: &'a Model, backend: &'a dyn Backend, capacity: usize, kv_dtype: DType) -> Result<Session<'a>> {
        let limit = model.config.text.max_position_embeddings;
        if capacity > limit {
            return Err(Error::Context { tokens: capacity, limit, msg: "requested context exceeds max_position_embeddings".into() });
        }
        let cache = model.text.new_cache(backend, capacity, kv_dtype)?;
        // a split model's step crosses to the host and back, which a recording cannot hold
        // (the loader logs that the decode runs as plain launches)
        Ok(Session { model, backend, cache, next_pos: 0, tokens: Vec::new(), step: None, record: !model.is_split() })
    }

    /// Turns recording and replaying of decode steps on or off (on by default; the CPU backend
    /// records nothing either way). Plain launches give the same tokens; tests compare them.
    /// A model split over the device and the host is never recorded.
    pub fn set_recording(&mut self, on: bool) {
        self.record = on && !self.model.is_split();
        if !on {
            if let Some(st) = &mut self.step {
                st.recording = None;
            }
        }
    }

    /// The KV cache's element type.
    pub fn kv_dtype(&self) -> DType {
        self.cache.dtype()
    }

    /// Forgets the conversation (the cache is reused, recorded decode steps are kept).
    pub fn reset(&mut self) {
        self.cache.clear();
        self.next_pos = 0;
        self.tokens.clear();
        if let Some(st) = &mut self.step {
            st.holds = None;
        }
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
    /// follow the image grids. All the images go through the tower in one pass. Returns the
    /// logits `[vocab]` after the last token.
    pub fn feed_with_images(&mut self, ids: &[u32], images: Option<&Images<'_>>) -> Result<Vec<f32>> {
        let grids: &[[usize; 3]] = images.map_or(&[], |im| im.grids);
        self.check_feed(ids, grids)?;
        let (b, m) = (self.backend, self.model);
        let vis = match images {
            Some(im) if !im.grids.is_empty() => Some(m.vision.encode(b, im.patches, im.row_len, im.grids)?),
            _ => None,
        };
        self.feed_encoded(ids, grids, vis.as_ref())
    }

    /// [`Session::feed_with_images`] with the images already through the vision tower:
    /// `vision` holds the embeddings and DeepStack features of the images of patch grids
    /// `grids`, in order (`None` for a text-only feed).
    pub fn feed_encoded(&mut self, ids: &[u32], grids: &[[usize; 3]], vision: Option<&VisionOutput>) -> Result<Vec<f32>> {
        self.check_feed(ids, grids)?;
        let (b, m) = (self.backend, self.model);
        let cfg = &m.config;
        if grids.is_empty() != vision.is_none() {
            return Err(Error::Limit { op: "feed", msg: format!("{} image grids given with {} vision output", grids.len(), if vision.is_some() { "a" } else { "no" }) });
        }
        // 1. rotary positions (fails if placeholders and images disagree)
        let (pos, next_pos) = multimodal_positions(ids, cfg.vision_tokens(), grids, cfg.vision.spatial_merge_size, self.next_pos)?;
        // 2. token embeddings [t, hidden], image rows replaced by the vision tower's output
        let mut x = m.text.embed(b, ids)?;
        let vt = cfg.vision_tokens();
        let rows: Vec<usize> = ids.iter().enumerate().filter(|(_, &t)| vt.is_vision(t)).map(|(i, _)| i).collect();
        if let Some(out) = vision {
            x = b.scatter_rows(&x, &rows, &out.embeds, false)?;
        }
        // 3. the decoder, with DeepStack features on the image rows
        let ds = vision.map(|v| Deepstack { rows: &rows, features: &v.deepstack });
        let cur = cursor(b, &pos, self.cache.len())?; // [t, 4]
        let (cache, mut x, mut h) = (&mut self.cache, Some(x), None);
        b.within(&mut || {
            let x = x.take().expect("the step runs once");
            h = Some(m.text.forward(b, x, &cur, cache, ds.as_ref())?); // [t, hidden]
            Ok(())
        })?;
        let h = h.expect("set by the forward");
        self.cache.advance(ids.len());
        let last = b.take_rows(&h, ids.len() - 1, 1)?; // [1, hidden]
        let logits = b.download_f32(&m.text.logits(b, &last)?)?; // [vocab]
        self.next_pos = next_pos;
        self.tokens.extend_from_slice(ids);
        if let Some(st) = &mut self.step {
            st.holds = None; // the device state no longer describes the next token
        }
        Ok(logits)
    }

    /// The checks before a feed: tokens to feed, room in the context, placeholders that match
    /// the images' grids.
    fn check_feed(&self, ids: &[u32], grids: &[[usize; 3]]) -> Result<()> {
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
        let cfg = &self.model.config;
        multimodal_positions(ids, cfg.vision_tokens(), grids, cfg.vision.spatial_merge_size, self.next_pos).map(|_| ())
    }

    /// Feeds one generated token through the decode step (recorded and replayed where the
    /// backend can) and returns the next token, chosen on the device when the sampler's
    /// settings allow, else by `sampler` on the host from the step's logits.
    ///
    /// A sampler with constraints ([`Sampler::masks`]) picks on the device too: the step's
    /// forward and logits are launched (the recording of [`StepKind::Logits`]), its mask is
    /// computed on the host while the device runs them, then the masked pick runs after them.
    pub fn decode(&mut self, token: u32, sampler: &mut Sampler) -> Result<u32> {
        let (b, m) = (self.backend, self.model);
        if token as usize >= m.config.text.vocab_size {
            return Err(Error::Limit { op: "decode", msg: format!("token id {} is outside the vocabulary of {}", token, m.config.text.vocab_size) });
        }
        self.cache.reserve(1)?;
        let on_device = sampler.device_sampling(b.max_device_top_k());
        let masked = on_device.filter(|_| sampler.masks());
        let kind = match on_device {
            Some(s) if masked.is_none() => StepKind::Device(s),
            _ => StepKind::Logits,
        };
        // 1. the step's inputs: already in place after a device-sampled step, else written
        if self.step.is_none() {
            let ids = b.upload_u32(&[1], &[0])?;
            let cursor = b.upload_u32(&[1, CURSOR_FIELDS], &[0; CURSOR_FIELDS])?;
            self.step = Some(DecodeStep { ids, cursor, logits: None, mask: None, holds: None, recording: None, unrecordable: Vec::new() });
        }
        let st = self.step.as_mut().expect("made above");
        if st.holds != Some(token) {
            let (p, row) = (self.next_pos, self.cache.len() as u32);
            b.write_u32(&mut st.ids, &[token])?;
            b.write_u32(&mut st.cursor, &[p, p, p, row])?;
        }
        // 2. the step: replayed, recorded then replayed, or run as plain launches
        let cache = &mut self.cache;
        let mut body = || -> Result<()> {
            let x = m.text.embed_ids(b, &st.ids)?; // [1, hidden]
            let h = m.text.forward(b, x, &st.cursor, cache, None)?;
            let logits = m.text.logits(b, &h)?; // [1, vocab]
            match kind {
                StepKind::Device(s) => b.sample_step(&logits, &s, m.sampled_vocab(), None, &mut st.ids, &mut st.cursor),
                StepKind::Logits => {
                    st.logits = Some(logits);
                    Ok(())
                }
            }
        };
        run_recorded(b, self.record, &mut st.recording, &mut st.unrecordable, kind, &mut body)?;
        // 3. bookkeeping, then the next token
        self.cache.advance(1);
        self.next_pos += 1;
        self.tokens.push(token);
        let st = self.step.as_mut().expect("made above");
        let n = m.sampled_vocab();
        match (kind, masked) {
            (StepKind::Device(_), _) => {
                let next = b.download_u32(&st.ids)?[0];
                st.holds = Some(next);
                Ok(next)
            }
            (StepKind::Logits, Some(s)) => {
                // the mask, on the host while the device runs the forward, then the pick
                let mut words = vec![0u32; sampling::mask_words(n)];
                sampler.fill_mask(&mut words)?;
                match &mut st.mask {
                    Some(t) => b.write_u32(t, &words)?,
                    none => *none = Some(b.upload_u32(&[1, words.len()], &words)?),
                }
                let t = st.logits.as_ref().ok_or_else(|| Error::Device { op: "decode", msg: "the step produced no logits".into() })?;
                b.sample_step(t, &s, n, st.mask.as_ref(), &mut st.ids, &mut st.cursor)?;
                let next = b.download_u32(&st.ids)?[0];
                st.holds = Some(next);
                Ok(next)
            }
            (StepKind::Logits, None) => {
                st.holds = None;
                let t = st.logits.as_ref().ok_or_else(|| Error::Device { op: "decode", msg: "the step produced no logits".into() })?;
                let mut logits = b.download_f32(t)?;
                logits.truncate(m.sampled_vocab());
                sampler.sample_at(&mut logits, &self.tokens, (self.cache.len() - 1) as u64)
            }
        }
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
        logits.truncate(self.model.sampled_vocab());
        let prefill_secs = start.elapsed().as_secs_f64();
        let start = std::time::Instant::now();
        let mut out = Vec::new();
        let mut stop = Stop::MaxTokens;
        // the first token from the prompt's logits, drawn as the device would (counter: the cache row)
        let mut t = sampler.sample_at(&mut logits, &self.tokens, (self.cache.len() - 1) as u64)?;
        for i in 0..max_new {
            out.push(t);
            let go_on = on_token(t);
            if let Err(e) = sampler.accept(t) {
                log::error!("generate: a constraint rejected token {}: {}", t, e);
                stop = Stop::Constraint;
                break;
            }
            if stop_ids.contains(&t) {
                stop = Stop::StopToken(t);
                break;
            }
            if !go_on || i + 1 == max_new {
                break;
            }
            t = self.decode(t, sampler)?;
        }
        Ok(Generated { tokens: out, stop, prefill_secs, decode_secs: start.elapsed().as_secs_f64(), prompt_tokens: prompt.len(), cached_tokens: 0 })
    }
}
