//! The engine: many sequences on one model at once. Between the model (pure functions of
//! weights and inputs) and its callers (the server; the batched bench): sequences, the
//! scheduler and the KV blocks.
//!
//! Every [`Engine::step`] runs one forward over a batch of rows: one decode row for each
//! running sequence past its prompt, then prefill chunks of sequences still reading their
//! prompts (up to `max_prefill_tokens` rows a step with the decode rows, so a long prompt does
//! not freeze the other streams), and samples the next token of every sequence whose rows reach
//! its end. The keys and values live in a paged cache ([`paged`]): fixed-size blocks of one
//! pool, taken as sequences grow ([`blocks`]). A request waits while the blocks for its prompt
//! are not free; when a running sequence needs a block and none is left, the newest running
//! sequence is preempted: its blocks freed, it waits again at the front of the queue and reads
//! its prompt and what it generated again when it comes back (so nothing fails mid-stream).
//!
//! Prefix caching: every block whose rows are all written is registered under the hash of its
//! tokens and all before them ([`blocks`]); a sequence admitted later takes the registered
//! blocks its prompt starts with and computes only the rest (a chat's history, a shared system
//! prompt, a preempted sequence's own blocks). Blocks no sequence holds stay cached until they
//! are needed for new rows, oldest released first. Blocks from a prompt's first image token on
//! are keyed by its images' content too (patches and grids, hashed with this process's random
//! key): a prompt whose cached prefix covers all its image tokens skips the vision tower, one
//! whose prefix ends inside them keeps only the blocks before its first image token.
//!
//! Siblings ([`Engine::add_siblings`], OpenAI's `n`): sequences on one prompt, each with its own
//! sampler. They wait until the first one's prompt is in the cache, then take its whole blocks
//! from the prefix cache: the prompt is computed once, only its last partial block again.

mod alone;
pub mod blocks;
pub mod graph;
mod masks;
pub mod paged;
mod vision;
pub mod vision_cache;

use crate::backend::DeviceSampling;
use crate::generate::logprobs::TokenLogprobs;
use crate::generate::{Sampler, Stop};
use crate::model::positions::multimodal_positions;
use crate::model::text::Deepstack;
use crate::model::vision::VisionOutput;
use crate::model::{Model, Pos3};
use crate::pick::mask_words;
use crate::{Backend, DType, Error, Result, Tensor};
use blocks::{chain, BlockPool};
use graph::{DecodeSteps, Pick, Picked};
use gpu::params::{sample_row, CURSOR_FIELDS};
use paged::{PagedKv, PagedStep, StepRows};
use vision_cache::VisionCache;
use std::collections::hash_map::RandomState;
use std::collections::VecDeque;
use std::hash::{BuildHasher, Hash, Hasher};
use std::sync::Arc;
use std::time::Instant;

/// How the engine batches and how large its cache is.
#[derive(Clone, Debug)]
pub struct EngineConfig {
    /// Running sequences at most (the decode batch).
    pub max_batch: usize,
    /// Rows of a step that reads prompts, at most: its decode rows and, within the rest (at
    /// least half of it), prompt tokens over all sequences (an image prompt is read whole).
    pub max_prefill_tokens: usize,
    /// Cache rows per KV block (a power of two).
    pub block: usize,
    /// Tokens the KV cache holds over all sequences.
    pub kv_tokens: usize,
    pub kv_dtype: DType,
    /// Bytes of vision-tower outputs kept by image content ([`vision_cache`]; 0: none).
    pub vision_cache_bytes: usize,
}

/// Cache rows per KV block unless configured otherwise (the prefix cache's granularity).
pub const DEFAULT_BLOCK: usize = 16;

impl EngineConfig {
    /// [`DEFAULT_BLOCK`]-token blocks, prefill chunks of 2048 tokens, no image-embedding cache.
    pub fn new(max_batch: usize, kv_tokens: usize, kv_dtype: DType) -> EngineConfig {
        EngineConfig { max_batch, max_prefill_tokens: 2048, block: DEFAULT_BLOCK, kv_tokens, kv_dtype, vision_cache_bytes: 0 }
    }

    /// KV blocks the cache takes: `kv_tokens` rounded up to whole blocks.
    pub fn kv_blocks(&self) -> usize {
        (self.kv_tokens.max(1) + self.block.max(1) - 1) / self.block.max(1)
    }

    /// [`EngineConfig::cache_tokens`] of an engine with a cache of `kv_tokens` tokens in
    /// [`DEFAULT_BLOCK`]-token blocks (what a server's memory plan reserves).
    pub fn cache_tokens_for(kv_tokens: usize) -> usize {
        EngineConfig::new(1, kv_tokens, DType::F32).cache_tokens()
    }

    /// Rows the cache takes: [`EngineConfig::kv_blocks`] whole blocks and the scratch block of
    /// padded decode rows ([`PagedKv::scratch_block`]); what a memory plan sizes the KV cache by.
    pub fn cache_tokens(&self) -> usize {
        (self.kv_blocks() + 1) * self.block.max(1)
    }
}

/// A sequence's handle.
pub type SeqId = u64;

/// One image's (or video's) patch rows `[t·h·w, row_len]`, shared with whoever prepared them
/// (the server's cache of prepared images), so handing them to the engine copies nothing.
pub type PatchRows = Arc<dyn AsRef<[f32]> + Send + Sync>;

/// Images of a request, already preprocessed: each one's patch rows and grid, in prompt order.
pub struct ImageInput {
    /// One per grid.
    pub parts: Vec<PatchRows>,
    pub row_len: usize,
    pub grids: Vec<[usize; 3]>,
    /// Each image's content hash ([`image_key`] of its patches and grid), one per grid: what
    /// keys the image-embedding cache and (combined, [`combine_image_keys`]) the prefix cache's
    /// blocks from the first image token on. Empty: [`Engine::add`] hashes the patches (tens
    /// of milliseconds for a large image on the engine's thread; the server hashes each image
    /// where it decodes it and passes the results).
    pub keys: Vec<u64>,
}

impl ImageInput {
    /// The images of `patches [Σ t·h·w, row_len]`, all grids' rows in one buffer (cut into
    /// one part per grid here; a buffer that does not hold the grids' rows stays whole, and
    /// [`Engine::add`] refuses it).
    pub fn flat(patches: Vec<f32>, row_len: usize, grids: Vec<[usize; 3]>) -> ImageInput {
        let rows: Vec<usize> = grids.iter().map(|g| g[0] * g[1] * g[2]).collect();
        let parts: Vec<PatchRows> = if rows.iter().sum::<usize>() * row_len != patches.len() || grids.len() < 2 {
            vec![Arc::new(patches)]
        } else {
            let mut r0 = 0;
            rows.iter().map(|&n| {
                r0 += n;
                Arc::new(patches[(r0 - n) * row_len..r0 * row_len].to_vec()) as PatchRows
            }).collect()
        };
        ImageInput { parts, row_len, grids, keys: Vec::new() }
    }

    /// Image `k`'s patch rows.
    pub fn part(&self, k: usize) -> &[f32] {
        (*self.parts[k]).as_ref()
    }
}

/// The process's random hashing key for image contents (so no client can aim a collision at
/// another's cached blocks).
static IMAGE_KEY_STATE: std::sync::OnceLock<RandomState> = std::sync::OnceLock::new();

/// The hash of preprocessed images (their patches, row length and grids) under this process's
/// random key: equal images give equal keys within a process.
pub fn image_key(patches: &[f32], row_len: usize, grids: &[[usize; 3]]) -> u64 {
    let state = IMAGE_KEY_STATE.get_or_init(RandomState::new);
    let mut h = state.build_hasher();
    (row_len, grids).hash(&mut h);
    // SAFETY: f32 has no padding bytes; the slice's bytes, read only
    h.write(unsafe { std::slice::from_raw_parts(patches.as_ptr() as *const u8, patches.len() * 4) });
    h.finish()
}

/// One key for several images' keys, in order.
pub fn combine_image_keys(keys: &[u64]) -> u64 {
    let mut h = std::collections::hash_map::DefaultHasher::new();
    keys.hash(&mut h);
    h.finish()
}

/// One generation to run.
pub struct Request {
    pub prompt: Vec<u32>,
    pub images: Option<ImageInput>,
    /// Tokens to generate at most.
    pub max_new: usize,
    pub sampler: Sampler,
    /// Token ids that end the generation (the stop token is reported, not fed back).
    pub stop_ids: Vec<u32>,
}

/// What a step did for one sequence.
#[derive(Clone, Debug, PartialEq)]
pub enum Event {
    /// A new token (a stop token included), with its log-probabilities when its sampler
    /// reports them ([`Sampler::with_logprobs`]).
    Token { id: SeqId, token: u32, logprobs: Option<Box<TokenLogprobs>> },
    /// The sequence ended (after its last `Token`); its blocks are free again.
    /// `cached_tokens`: prompt tokens whose keys and values came from the prefix cache.
    Finished { id: SeqId, stop: Stop, prompt_tokens: usize, cached_tokens: usize, generated: usize, prefill_secs: f64, decode_secs: f64 },
}

/// Counts for metrics.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct EngineStats {
    pub running: usize,
    pub waiting: usize,
    pub blocks_used: usize,
    pub blocks_free: usize,
    /// Rows of the last step's forward (decode rows plus prefill rows).
    pub last_batch: usize,
    pub preemptions: u64,
    /// Cached blocks no sequence holds (free for new rows, kept for later prompts).
    pub blocks_cached: usize,
    /// Prompt tokens taken from the prefix cache, and prompt tokens admitted, so far.
    pub prefix_hit_tokens: u64,
    pub prompt_tokens: u64,
    /// Vision tower runs: one per step that runs the tower, over the images of one or more
    /// prompts whose image tokens were not all in the prefix cache (a run makes one pass per
    /// 4,096 merged tokens).
    pub vision_runs: u64,
    /// Images through the tower, and images whose embeddings came from the image-embedding
    /// cache instead.
    pub vision_images: u64,
    pub vision_cache_hits: u64,
    /// Bytes the image-embedding cache holds.
    pub vision_cache_bytes: usize,
    /// Tokens drawn on the host from downloaded logits (a repetition or output penalty in the
    /// step, or a top-k the device does not take); the others were drawn in the step.
    pub host_samples: u64,
    /// Prompt rows computed (prefill chunk rows; rows taken from the prefix cache are not).
    pub prefill_rows: u64,
    /// Decode-only steps run, their wall time in [`Engine::step`] (ns), and the part of it the
    /// host spent blocked on the step's picks or logits (the device's share; the rest is host
    /// work during which the device idles: scheduling, inputs, launch, events).
    pub decode_steps: u64,
    pub decode_step_ns: u64,
    pub decode_wait_ns: u64,
    /// Decode steps recorded (CUDA graphs: one per new batch size, or again for a size whose
    /// recording was dropped), and those steps' wall time (ns).
    pub decode_recordings: u64,
    pub decode_record_ns: u64,
}

struct Seq {
    id: SeqId,
    /// The prompt, then the generated tokens.
    tokens: Vec<u32>,
    /// The rotary position of each token.
    pos: Vec<Pos3>,
    /// The rotary position of the next generated token.
    next_pos: u32,
    prompt_len: usize,
    /// Tokens whose keys and values are in the cache.
    cached: usize,
    blocks: Vec<u32>,
    /// Leading blocks registered in (or taken from) the prefix cache, and the chain hash of
    /// their tokens.
    hashed: usize,
    hash: u64,
    /// Prompt tokens taken from the prefix cache when first admitted.
    reused: Option<usize>,
    /// The prompt's image tokens `first_image .. images_end` (empty without images), and the
    /// hash of its images' content, which keys every block from the first image token on.
    first_image: usize,
    images_end: usize,
    image_key: u64,
    /// Shared with its siblings ([`Engine::add_siblings`]).
    images: Option<Arc<ImageInput>>,
    /// The tower's output for each image (made before the prompt's images are read, dropped
    /// once they are: a preempted sequence takes it from the image-embedding cache or runs
    /// the tower again).
    vision: Option<Vec<VisionOutput>>,
    generated: usize,
    max_new: usize,
    sampler: Sampler,
    stop_ids: Vec<u32>,
    added: Instant,
    first_token: Option<Instant>,
    /// A sibling waits for this sequence's prompt to be in the cache ([`Engine::add_siblings`]).
    after: Option<SeqId>,
}

impl Seq {
    /// Tokens fed in rows still to come (1: a decode row).
    fn pending(&self) -> usize {
        self.tokens.len() - self.cached
    }

    fn has_images(&self) -> bool {
        self.images.as_ref().map_or(false, |im| !im.grids.is_empty())
    }

    /// Whether its prompt's images are still to be read (the rest of the prompt then goes in
    /// one chunk).
    fn images_unread(&self) -> bool {
        self.has_images() && self.cached <= self.first_image
    }

    /// What keys block `k` besides its tokens: its images' content from the block holding the
    /// first image token on.
    fn salt(&self, k: usize, block: usize) -> u64 {
        if self.has_images() && (k + 1) * block > self.first_image {
            self.image_key
        } else {
            0
        }
    }

    /// Whether its next row is a decode row: one known token, against its blocks.
    fn decodes(&self) -> bool {
        self.pending() == 1 && !self.images_unread()
    }
}

/// How a step's rows sample on the device: all with the same settings, or each with its own
/// (`[rows, sample_row::WORDS]` words, ranking the given number of candidates).
enum OnDevice {
    Shared(DeviceSampling),
    Rows(usize, Vec<u32>),
}

/// The draw number of each part's next token: the index, in its sequence, of the token whose
/// logits it comes from (its last row), as [`crate::generate::Session`] numbers draws.
fn draws(parts: &[Part]) -> Vec<u32> {
    parts.iter().map(|p| (p.from + p.n - 1) as u32).collect()
}

/// A row group of one step: a decode row or a prefill chunk of sequence `seq` (an index into
/// `running`), tokens `from .. from + n` of it.
struct Part {
    seq: usize,
    from: usize,
    n: usize,
    /// A decode row (the sequence's last known token, against its blocks), else a prefill chunk.
    decode: bool,
}

pub struct Engine<'a> {
    model: &'a Model,
    backend: &'a dyn Backend,
    cfg: EngineConfig,
    kv: PagedKv,
    pool: BlockPool,
    waiting: VecDeque<Seq>,
    running: Vec<Seq>,
    next_id: SeqId,
    stats: EngineStats,
    /// Decode-only steps, recorded per batch size where the backend records.
    decode_steps: DecodeSteps,
    vision_cache: VisionCache,
    /// Whether tokens may be picked inside the step (see [`Engine::set_device_picks`]).
    device_picks: bool,
}

impl<'a> Engine<'a> {
    /// An engine with a cache of `cfg.kv_tokens` tokens (rounded up to whole blocks), each
    /// layer's part on its layer's backend.
    pub fn new(model: &'a Model, backend: &'a dyn Backend, cfg: EngineConfig) -> Result<Engine<'a>> {
        if cfg.max_batch == 0 || cfg.max_prefill_tokens == 0 {
            return Err(Error::Limit { op: "engine", msg: format!("max batch {} and max prefill tokens {} must be at least 1", cfg.max_batch, cfg.max_prefill_tokens) });
        }
        let blocks = cfg.kv_blocks();
        // one block more than the pool hands out: the scratch block
        let kv = PagedKv::new(&model.text.layer_backends(backend), &model.config.text, blocks + 1, cfg.block, cfg.kv_dtype)?;
        let decode_steps = DecodeSteps::new(!model.is_split());
        let vision_cache = VisionCache::new(cfg.vision_cache_bytes);
        Ok(Engine { model, backend, kv, pool: BlockPool::new(blocks)?, waiting: VecDeque::new(), running: Vec::new(), next_id: 0, stats: EngineStats::default(), cfg, decode_steps, vision_cache, device_picks: true })
    }

    /// Turns recording and replaying of decode-only steps on or off (on by default; never for a
    /// model split over the device and the host). Plain launches give the same tokens.
    pub fn set_recording(&mut self, on: bool) {
        self.decode_steps.set_recording(on && !self.model.is_split());
    }

    /// Turns picking tokens inside the step on or off (on by default). Off, every token is
    /// drawn on the host by its sequence's sampler from the step's downloaded logits (the
    /// reference the device's picks are tested against); the tokens are the same either way.
    pub fn set_device_picks(&mut self, on: bool) {
        self.device_picks = on;
    }

    /// Decode steps recorded now (one per batch size kept).
    pub fn recorded_steps(&self) -> usize {
        self.decode_steps.recorded()
    }

    pub fn config(&self) -> &EngineConfig {
        &self.cfg
    }

    /// Tokens the cache holds over all sequences.
    pub fn kv_tokens(&self) -> usize {
        self.pool.total() * self.kv.block()
    }

    /// Checks `req` (its prompt and images agree, prompt and generation fit the model's context
    /// and the cache) and queues it.
    pub fn add(&mut self, req: Request) -> Result<SeqId> {
        let cfg = &self.model.config;
        if req.prompt.is_empty() {
            return Err(Error::Tokenizer { msg: "nothing to feed: the token list is empty".into() });
        }
        if let Some(&t) = req.prompt.iter().find(|&&t| t as usize >= cfg.text.vocab_size) {
            return Err(Error::Limit { op: "engine", msg: format!("token id {} is outside the vocabulary of {}", t, cfg.text.vocab_size) });
        }
        let need = req.prompt.len() + req.max_new.max(1);
        let limit = cfg.text.max_position_embeddings.min(self.kv_tokens());
        if need > limit {
            return Err(Error::Context { tokens: need, limit, msg: format!("{} prompt + {} to generate exceed the context (max_position_embeddings {}, KV cache {} tokens)", req.prompt.len(), req.max_new, cfg.text.max_position_embeddings, self.kv_tokens()) });
        }
        let grids: &[[usize; 3]] = req.images.as_ref().map_or(&[], |im| &im.grids);
        let (pos, next_pos) = multimodal_positions(&req.prompt, cfg.vision_tokens(), grids, cfg.vision.spatial_merge_size, 0)?;
        let vt = cfg.vision_tokens();
        let first_image = req.prompt.iter().position(|&t| vt.is_vision(t)).filter(|_| !grids.is_empty()).unwrap_or(req.prompt.len());
        let images_end = req.prompt.iter().rposition(|&t| vt.is_vision(t)).filter(|_| !grids.is_empty()).map_or(first_image, |i| i + 1);
        let mut images = req.images;
        let image_key = match &mut images {
            Some(im) if !im.grids.is_empty() => {
                let lens: Vec<usize> = (0..im.parts.len()).map(|k| im.part(k).len()).collect();
                if lens.len() != im.grids.len() || im.grids.iter().zip(&lens).any(|(g, &n)| g[0] * g[1] * g[2] * im.row_len != n) {
                    return Err(Error::shape("engine add", &[&lens], format!("image grids {:?} need one part each of t·h·w rows of {} values", im.grids, im.row_len)));
                }
                if im.keys.len() != im.grids.len() {
                    im.keys = (0..im.grids.len()).map(|k| image_key(im.part(k), im.row_len, &[im.grids[k]])).collect();
                }
                combine_image_keys(&im.keys)
            }
            _ => 0,
        };
        let id = self.next_id;
        self.next_id += 1;
        self.waiting.push_back(Seq {
            id,
            prompt_len: req.prompt.len(),
            tokens: req.prompt,
            pos,
            next_pos,
            cached: 0,
            blocks: Vec::new(),
            hashed: 0,
            hash: 0,
            reused: None,
            first_image,
            images_end,
            image_key,
            images: images.map(Arc::new),
            vision: None,
            generated: 0,
            max_new: req.max_new,
            sampler: req.sampler,
            stop_ids: req.stop_ids,
            added: Instant::now(),
            first_token: None,
            after: None,
        });
        Ok(id)
    }

    /// Queues one more sequence on sequence `of`'s prompt and images for each of `samplers`
    /// (same `max_new` and stop ids, each its own draws): OpenAI's `n`. Call it right after
    /// [`Engine::add`] returned `of`, while it still waits. Each sibling is admitted once `of`'s
    /// prompt is in the cache (or `of` ended) and takes its whole blocks from the prefix cache,
    /// so the prompt is computed once and only its last partial block again per sibling.
    pub fn add_siblings(&mut self, of: SeqId, samplers: Vec<Sampler>) -> Result<Vec<SeqId>> {
        let lead = self.waiting.iter().position(|s| s.id == of).ok_or_else(|| Error::Limit { op: "engine", msg: format!("sequence {} is not waiting: siblings are added right after it", of) })?;
        let mut ids = Vec::with_capacity(samplers.len());
        for sampler in samplers {
            let l = &self.waiting[lead];
            let id = self.next_id;
            self.next_id += 1;
            let s = Seq {
                id,
                tokens: l.tokens.clone(),
                pos: l.pos.clone(),
                next_pos: l.next_pos,
                prompt_len: l.prompt_len,
                cached: 0,
                blocks: Vec::new(),
                hashed: 0,
                hash: 0,
                reused: None,
                first_image: l.first_image,
                images_end: l.images_end,
                image_key: l.image_key,
                images: l.images.clone(),
                vision: None,
                generated: 0,
                max_new: l.max_new,
                sampler,
                stop_ids: l.stop_ids.clone(),
                added: Instant::now(),
                first_token: None,
                after: Some(of),
            };
            self.waiting.push_back(s);
            ids.push(id);
        }
        Ok(ids)
    }

    /// Whether waiting sequence `w` may be admitted: not a sibling, or its first sequence's
    /// prompt is cached (it runs past its prompt, or ended).
    fn may_admit(&self, w: &Seq) -> bool {
        let Some(of) = w.after else { return true };
        if self.waiting.iter().any(|s| s.id == of) {
            return false;
        }
        self.running.iter().find(|s| s.id == of).map_or(true, |s| s.cached >= s.prompt_len)
    }

    /// Ends a sequence now, its blocks freed (no event follows). False when it is unknown
    /// (finished already).
    pub fn cancel(&mut self, id: SeqId) -> bool {
        if let Some(i) = self.waiting.iter().position(|s| s.id == id) {
            let mut s = self.waiting.remove(i).expect("found above");
            self.pool.give(&mut s.blocks);
            return true;
        }
        if let Some(i) = self.running.iter().position(|s| s.id == id) {
            let mut s = self.running.remove(i);
            self.pool.give(&mut s.blocks);
            return true;
        }
        false
    }

    /// Ends every sequence (after a failed step); returns their ids.
    pub fn abort_all(&mut self) -> Vec<SeqId> {
        let mut ids = Vec::new();
        for mut s in self.running.drain(..).chain(self.waiting.drain(..)) {
            self.pool.give(&mut s.blocks);
            ids.push(s.id);
        }
        ids
    }

    /// Whether any sequence runs or waits.
    pub fn has_work(&self) -> bool {
        !self.running.is_empty() || !self.waiting.is_empty()
    }

    pub fn stats(&self) -> EngineStats {
        EngineStats { running: self.running.len(), waiting: self.waiting.len(), blocks_used: self.pool.used(), blocks_free: self.pool.free(), blocks_cached: self.pool.cached_idle(), vision_cache_bytes: self.vision_cache.bytes(), decode_wait_ns: self.decode_steps.wait_ns(), decode_recordings: self.decode_steps.recordings(), ..self.stats }
    }

    /// Frees sequence `i` of `running`'s blocks and queues it again at the front.
    fn preempt(&mut self, i: usize) {
        let mut s = self.running.remove(i);
        log::debug!("engine: preempting sequence {} ({} tokens cached) for KV blocks", s.id, s.cached);
        self.pool.give(&mut s.blocks);
        s.cached = 0;
        s.hashed = 0;
        s.hash = 0;
        self.stats.preemptions += 1;
        self.waiting.push_front(s);
    }

    /// Gives `running[i]` the blocks for its tokens `.. upto`; false when the pool is out.
    fn grow(&mut self, i: usize, upto: usize) -> bool {
        let block = self.kv.block();
        while self.running[i].blocks.len() * block < upto {
            match self.pool.take() {
                Some(b) => self.running[i].blocks.push(b),
                None => return false,
            }
        }
        true
    }

    /// Takes the registered blocks `running[i]`'s tokens start with (whole blocks, leaving at
    /// least its last token to compute, so its logits come out of this step; with images, all
    /// of their tokens or none).
    fn reuse_prefix(&mut self, i: usize) {
        let bsz = self.kv.block();
        let (pool, s) = (&mut self.pool, &mut self.running[i]);
        if !s.blocks.is_empty() {
            s.reused.get_or_insert(0);
            return;
        }
        let (mut parent, mut hashes) = (0, Vec::new());
        for k in 0..(s.tokens.len() - 1) / bsz {
            let toks = &s.tokens[k * bsz..(k + 1) * bsz];
            let keyed = parent ^ s.salt(k, bsz);
            let h = chain(keyed, toks);
            match pool.lookup(h, keyed, toks) {
                Some(b) => s.blocks.push(b),
                None => break,
            }
            hashes.push(h);
            parent = h;
        }
        // a prefix ending inside the image tokens: back to the blocks before the first one
        let n = s.blocks.len();
        if n * bsz > s.first_image && n * bsz < s.images_end {
            let mut extra = s.blocks.split_off(s.first_image / bsz);
            pool.give(&mut extra);
            hashes.truncate(s.blocks.len());
            parent = hashes.last().copied().unwrap_or(0);
        }
        s.cached = s.blocks.len() * bsz;
        s.hashed = s.blocks.len();
        s.hash = parent;
        if s.reused.is_none() {
            s.reused = Some(s.cached.min(s.prompt_len));
            self.stats.prefix_hit_tokens += s.cached.min(s.prompt_len) as u64;
            self.stats.prompt_tokens += s.prompt_len as u64;
        }
    }

    /// Registers `running[i]`'s blocks whose rows are now all written.
    fn register_written(&mut self, i: usize) {
        let bsz = self.kv.block();
        let (pool, s) = (&mut self.pool, &mut self.running[i]);
        while (s.hashed + 1) * bsz <= s.cached {
            let k = s.hashed;
            let toks = &s.tokens[k * bsz..(k + 1) * bsz];
            let keyed = s.hash ^ s.salt(k, bsz);
            let h = chain(keyed, toks);
            pool.register(s.blocks[k], h, keyed, toks);
            s.hash = h;
            s.hashed += 1;
        }
    }

    /// Picks this step's rows: decode rows first (preempting the newest sequences when blocks
    /// run out), then prefill chunks of running sequences, then of newly admitted ones.
    fn schedule(&mut self) -> Vec<Part> {
        // 1. a block for every decode row's token
        let mut i = 0;
        while i < self.running.len() {
            let s = &self.running[i];
            if !s.decodes() {
                i += 1;
                continue;
            }
            let upto = s.cached + 1;
            if self.grow(i, upto) {
                i += 1;
                continue;
            }
            // out of blocks: the newest sequence gives its up (this one, if it is the newest)
            let last = self.running.len() - 1;
            self.preempt(last);
        }
        let mut parts: Vec<Part> = Vec::new();
        for (i, s) in self.running.iter().enumerate() {
            if s.decodes() {
                parts.push(Part { seq: i, from: s.cached, n: 1, decode: true });
            }
        }
        // 2. prefill chunks within the budget: running sequences first, then admissions. The
        //    decode rows take their share of it (at most half), so that a step's rows stay
        //    within `max_prefill_tokens` and the GEMMs' 128-row tiles whole: 64 decode rows on
        //    top of 2,048 prompt rows made a 17th row tile and a second wave of blocks
        let full = self.cfg.max_prefill_tokens;
        let mut budget = if shared_budget() { full.saturating_sub(parts.len()).max(full / 2).max(1) } else { full };
        let mut images_taken = false;
        let mut i = 0;
        loop {
            if i == self.running.len() {
                // admit the next waiting sequence when there is room and its blocks are free
                let fits = match self.waiting.front() {
                    Some(w) => self.running.len() < self.cfg.max_batch && budget > 0 && self.pool.free() * self.kv.block() >= w.tokens.len() && self.may_admit(w),
                    None => false,
                };
                if !fits {
                    break;
                }
                let s = self.waiting.pop_front().expect("checked above");
                self.running.push(s);
                self.reuse_prefix(i);
                let upto = self.running[i].tokens.len();
                let grown = self.grow(i, upto);
                debug_assert!(grown, "the free blocks were counted");
            }
            let s = &self.running[i];
            let pending = s.pending();
            let is_prefill = pending > 1 || s.images_unread();
            if is_prefill && budget > 0 {
                let whole = s.images_unread();
                if whole && images_taken && pending > budget {
                    i += 1;
                    continue; // a second image prompt only within the budget
                }
                // (an image prompt is read whole, past the budget if need be)
                let n = if whole { pending } else { pending.min(budget) };
                images_taken |= whole;
                parts.push(Part { seq: i, from: s.cached, n, decode: false });
                self.stats.prefill_rows += n as u64;
                budget = budget.saturating_sub(n);
            }
            i += 1;
        }
        parts
    }

    /// One step: schedules, runs the forward of its rows, samples, and returns what happened to
    /// each sequence. An error fails the step (the caller may [`Engine::abort_all`]).
    pub fn step(&mut self) -> Result<Vec<Event>> {
        let started = std::time::Instant::now();
        let parts = self.schedule();
        self.stats.last_batch = parts.iter().map(|p| p.n).sum();
        if parts.is_empty() {
            return Ok(Vec::new());
        }
        let (b, m) = (self.backend, self.model);
        let cfg = &m.config;
        // 1. the images of prompts read for the first time: from the image-embedding cache or
        //    through the tower, batched over requests
        self.encode_images(&parts)?;
        // 2. the rows: token ids, cursors (position, cache row), block tables, gather lists
        let rows: usize = parts.iter().map(|p| p.n).sum();
        let (mut ids, mut cur) = (Vec::with_capacity(rows), Vec::with_capacity(rows * CURSOR_FIELDS));
        let mut step_rows = StepRows { decode: Vec::new(), prefill: Vec::new() };
        let mut image_rows: Vec<usize> = Vec::new();
        let mut readers: Vec<usize> = Vec::new(); // sequences whose images this step reads, in row order
        for p in &parts {
            let s = &self.running[p.seq];
            let r0 = ids.len();
            // this chunk reads the prompt's images (all of their tokens: see `schedule`)
            let reads_images = s.vision.is_some() && !p.decode && p.from <= s.first_image;
            for j in p.from..p.from + p.n {
                ids.push(s.tokens[j]);
                let q = s.pos[j];
                cur.extend_from_slice(&[q[0], q[1], q[2], self.kv.slot(&s.blocks, j)]);
                if reads_images && cfg.vision_tokens().is_vision(s.tokens[j]) && j < s.prompt_len {
                    image_rows.push(r0 + j - p.from);
                }
            }
            if reads_images {
                readers.push(p.seq);
            }
            if p.decode {
                step_rows.decode.push((s.blocks.clone(), p.from + 1));
            } else {
                let slots = (0..p.from + p.n).map(|j| self.kv.slot(&s.blocks, j)).collect();
                step_rows.prefill.push((r0, p.n, slots));
            }
        }
        // 3. a decode-only step: recorded per batch size (see `graph`); rows under constraints
        // get their masks computed here while the device runs the forward
        let mut picks: Vec<(usize, Option<u32>)> = Vec::new(); // (part, token; none: its constraint failed)
        if parts.iter().all(|p| p.decode) {
            let (pick, mut settings) = match self.device_sampling(&parts) {
                None => (Pick::Host, Vec::new()),
                Some(OnDevice::Shared(s)) => (Pick::Device(s), Vec::new()),
                Some(OnDevice::Rows(k, w)) => (Pick::Rows { k }, w),
            };
            let masked = pick != Pick::Host && self.any_masked(&parts);
            let seqs: Vec<usize> = parts.iter().map(|p| p.seq).collect();
            // padded to the batch size the step is recorded at (see `graph::padded_rows`):
            // the extra rows feed token 0 into the scratch block and their picks are dropped
            let mut draws = draws(&parts);
            let pad = if self.decode_steps.pads(b) { graph::padded_rows(parts.len(), self.cfg.max_batch) - parts.len() } else { 0 };
            if pad > 0 {
                let slot = self.kv.scratch_block() * self.kv.block() as u32;
                let per_row = settings.len() / parts.len();
                let first: Vec<u32> = settings[..per_row].to_vec();
                for _ in 0..pad {
                    ids.push(0);
                    cur.extend_from_slice(&[0, 0, 0, slot]);
                    step_rows.decode.push((vec![self.kv.scratch_block()], 1));
                    draws.push(0);
                    settings.extend_from_slice(&first);
                }
            }
            let mut failed = vec![false; parts.len()];
            let running = &mut self.running;
            let words = mask_words(m.sampled_vocab());
            let mut fill = |out: &mut [u32]| -> Result<()> {
                let (real, padded) = out.split_at_mut(seqs.len() * words);
                padded.fill(u32::MAX);
                failed = masks::fill_masks(running, &seqs, words, real);
                Ok(())
            };
            let fill: Option<&mut dyn FnMut(&mut [u32]) -> Result<()>> = if masked { Some(&mut fill) } else { None };
            let recorded_before = self.decode_steps.recordings();
            let tokens = match self.decode_steps.run(m, b, &mut self.kv, &step_rows, &ids, &cur, (&draws, &settings), pick, fill)? {
                Picked::Tokens(t) => t.into_iter().zip(failed).map(|(t, f)| (!f).then_some(t)).collect(),
                Picked::Logits(l) if pad > 0 => self.sample_host(&b.take_rows(&l, 0, parts.len())?, &parts)?,
                Picked::Logits(l) => self.sample_host(&l, &parts)?,
            };
            picks.extend(tokens.into_iter().enumerate());
            let events = self.finish_step(&parts, picks);
            let ns = started.elapsed().as_nanos() as u64;
            self.stats.decode_steps += 1;
            self.stats.decode_step_ns += ns;
            if self.decode_steps.recordings() > recorded_before {
                self.stats.decode_record_ns += ns;
            }
            return Ok(events);
        }
        // 4. otherwise the forward over decode rows and prefill chunks
        let x = m.text.embed(b, &ids)?; // [rows, hidden]
        let images: Vec<&VisionOutput> = readers.iter().flat_map(|&i| self.running[i].vision.iter().flatten()).collect();
        let (x, features) = vision::place_images(b, x, &image_rows, &images)?;
        let ds = features.as_ref().map(|f| Deepstack { rows: &image_rows, features: f });
        let cursor = b.upload_u32(&[rows, CURSOR_FIELDS], &cur)?;
        let h = {
            let mut kv = PagedStep::new(&mut self.kv, &step_rows);
            let (mut x, mut h) = (Some(x), None);
            b.within(&mut || {
                let x = x.take().expect("the step runs once");
                h = Some(m.text.forward_kv(b, x, &cursor, &mut kv, ds.as_ref())?); // [rows, hidden]
                Ok(())
            })?;
            h.expect("set by the forward")
        };
        // 5. logits of the rows that end their sequence's known tokens: the decode rows' (the
        // decode parts come first), then each prefill chunk's last row that ends its prompt
        let nd = step_rows.decode.len();
        let mut groups: Vec<(Tensor, std::ops::Range<usize>)> = Vec::new(); // (logits, parts)
        if nd > 0 {
            groups.push((m.text.logits(b, &b.take_rows(&h, 0, nd)?)?, 0..nd)); // [nd, vocab]
        }
        let mut r0 = nd;
        for (k, p) in parts.iter().enumerate().skip(nd) {
            if p.from + p.n == self.running[p.seq].tokens.len() {
                groups.push((m.text.logits(b, &b.take_rows(&h, r0 + p.n - 1, 1)?)?, k..k + 1));
            }
            r0 += p.n;
        }
        // 6. the masks of the rows under constraints that pick on the device, on the host while
        // the device runs the forward; then the picks
        let masked: Vec<bool> = groups.iter().map(|(_, g)| self.any_masked(&parts[g.clone()]) && self.device_sampling(&parts[g.clone()]).is_some()).collect();
        let seqs: Vec<usize> = groups.iter().zip(&masked).filter(|(_, &m)| m).flat_map(|((_, g), _)| parts[g.clone()].iter().map(|p| p.seq)).collect();
        let words = mask_words(m.sampled_vocab());
        let mut all_masks = vec![0u32; seqs.len() * words];
        let failed = masks::fill_masks(&mut self.running, &seqs, words, &mut all_masks);
        let mut at = 0; // the masks' rows taken
        for ((logits, g), is_masked) in groups.iter().zip(masked) {
            let n = if is_masked { g.len() } else { 0 };
            let mask = is_masked.then(|| (&all_masks[at * words..(at + n) * words], &failed[at..at + n]));
            at += n;
            let tokens = self.sample(logits, &parts[g.clone()], mask)?;
            picks.extend(g.clone().zip(tokens));
        }
        Ok(self.finish_step(&parts, picks))
    }

    /// Whether any of the parts' sequences draws under a constraint.
    fn any_masked(&self, parts: &[Part]) -> bool {
        parts.iter().any(|p| self.running[p.seq].sampler.masks())
    }

    /// After a step's forward over `parts`: their rows are cached (and whole blocks registered),
    /// and the `picks` (part, token) become events: new tokens, finished sequences. A part
    /// without a token (its constraint gave no mask) ends with [`Stop::Constraint`].
    fn finish_step(&mut self, parts: &[Part], picks: Vec<(usize, Option<u32>)>) -> Vec<Event> {
        for p in parts {
            let s = &mut self.running[p.seq];
            s.cached = p.from + p.n;
            if !s.images_unread() {
                s.vision = None; // read (the image-embedding cache may keep it)
            }
            self.register_written(p.seq);
        }
        let mut events = Vec::new();
        let mut done: Vec<usize> = Vec::new();
        for (k, t) in picks {
            let s = &mut self.running[parts[k].seq];
            let now = Instant::now();
            s.first_token.get_or_insert(now);
            // the token, told to the constraints with the next step's masks (while the device
            // runs that step's forward; a rejection fails that mask)
            let accepted = match t {
                Some(t) => {
                    s.generated += 1;
                    events.push(Event::Token { id: s.id, token: t, logprobs: s.sampler.take_logprobs().map(Box::new) });
                    match s.sampler.accept_later(t) {
                        Ok(()) => Some(t),
                        Err(e) => {
                            // (the token told before this one, which no mask told yet)
                            log::error!("engine: sequence {}: a constraint rejected the token before {}: {}", s.id, t, e);
                            None
                        }
                    }
                }
                None => None, // its constraints gave no mask (logged then)
            };
            // goes on with the token, or ends
            let next = match accepted {
                None => Err(Stop::Constraint),
                Some(t) if s.stop_ids.contains(&t) => Err(Stop::StopToken(t)),
                Some(_) if s.generated >= s.max_new => Err(Stop::MaxTokens),
                Some(t) => Ok(t),
            };
            match next {
                Err(stop) => {
                    let first = s.first_token.unwrap_or(now);
                    events.push(Event::Finished {
                        id: s.id,
                        stop,
                        prompt_tokens: s.prompt_len,
                        cached_tokens: s.reused.unwrap_or(0),
                        generated: s.generated,
                        prefill_secs: first.duration_since(s.added).as_secs_f64(),
                        decode_secs: now.duration_since(first).as_secs_f64(),
                    });
                    done.push(parts[k].seq);
                }
                Ok(t) => {
                    s.tokens.push(t);
                    s.pos.push([s.next_pos; 3]);
                    s.next_pos += 1;
                }
            }
        }
        done.sort_unstable();
        for &i in done.iter().rev() {
            let mut s = self.running.remove(i);
            self.pool.give(&mut s.blocks);
        }
        events
    }

    /// The next token of each part's sequence from `logits [parts.len(), vocab]`: on the device
    /// when every sequence samples with settings the device takes (`masks`: the rows' masks of
    /// allowed ids, `[rows, ceil(n / 32)]` words, and the rows whose constraint gave none, when
    /// any row is under a constraint), else on the host with each sequence's sampler. Either way
    /// a draw is numbered by the index of the token whose logits these are in its sequence, as
    /// in [`crate::generate::Session`], so a sequence draws the same tokens alone or in any
    /// batch. `None` for a sequence whose constraint failed.
    fn sample(&mut self, logits: &Tensor, parts: &[Part], masks: Option<(&[u32], &[bool])>) -> Result<Vec<Option<u32>>> {
        let (b, n) = (self.backend, self.model.sampled_vocab());
        let rows = parts.len();
        if let Some(on) = self.device_sampling(parts) {
            let mut ids = b.upload_u32(&[rows], &vec![0; rows])?;
            let mut cur = b.upload_u32(&[rows, CURSOR_FIELDS], &graph::draw_cursor(&draws(parts)))?;
            let mask = masks.map(|(w, _)| b.upload_u32(&[rows, mask_words(n)], w)).transpose()?;
            match on {
                OnDevice::Shared(s) => b.sample_step(logits, &s, n, mask.as_ref(), &mut ids, &mut cur)?,
                OnDevice::Rows(k, w) => b.sample_step_rows(logits, &b.upload_u32(&[rows, sample_row::WORDS], &w)?, k, n, mask.as_ref(), &mut ids, &mut cur)?,
            }
            let failed = masks.map_or(&[][..], |(_, f)| f);
            return Ok(b.download_u32(&ids)?.into_iter().enumerate().map(|(r, t)| (!failed.get(r).copied().unwrap_or(false)).then_some(t)).collect());
        }
        self.sample_host(logits, parts)
    }

    /// How the device samples the parts' sequences: with settings they all share (always so
    /// for a lone sequence), or each with its own; `None` (a repetition or output penalty, a
    /// top-k the device does not take, device picks turned off) sends the step to the host.
    fn device_sampling(&self, parts: &[Part]) -> Option<OnDevice> {
        if !self.device_picks {
            return None;
        }
        let max_k = self.backend.max_device_top_k();
        let each = parts.iter().map(|p| self.running[p.seq].sampler.device_sampling(max_k)).collect::<Option<Vec<_>>>()?;
        let first = *each.first()?;
        if each.iter().all(|s| *s == first) {
            return Some(OnDevice::Shared(first));
        }
        let k = each.iter().map(|s| s.candidates()).max().unwrap_or(1).next_power_of_two().min(max_k).min(self.model.sampled_vocab());
        Some(OnDevice::Rows(k, each.iter().flat_map(|s| s.row_words()).collect()))
    }

    /// [`Engine::sample`] on the host, each sequence with its own sampler (its constraints'
    /// mask applied there; `None` for a sequence whose constraint failed).
    fn sample_host(&mut self, logits: &Tensor, parts: &[Part]) -> Result<Vec<Option<u32>>> {
        let (b, n) = (self.backend, self.model.sampled_vocab());
        let rows = parts.len();
        let all = b.download_f32(logits)?;
        let vocab = all.len() / rows.max(1);
        self.stats.host_samples += rows as u64;
        let mut out = Vec::with_capacity(rows);
        for (r, (p, at)) in parts.iter().zip(draws(parts)).enumerate() {
            let s = &mut self.running[p.seq];
            let mut row = all[r * vocab..r * vocab + n.min(vocab)].to_vec();
            out.push(match s.sampler.sample_at(&mut row, &s.tokens, at as u64) {
                Ok(t) => Some(t),
                Err(e) => {
                    log::error!("engine: sequence {}: its constraint gave no mask of allowed tokens: {}", s.id, e);
                    None
                }
            });
        }
        Ok(out)
    }
}

/// Whether a step's decode rows count against its prefill budget (`QWEN3_VL_SHARED_BUDGET=0`:
/// prompt rows get the whole budget on top of them, as before; an A/B aid, read once).
fn shared_budget() -> bool {
    static SHARED: crate::switch::Switch = crate::switch::Switch::new("QWEN3_VL_SHARED_BUDGET");
    SHARED.on()
}
