//! The paged KV cache: per layer one pool of `blocks · block` rows `[rows, kv_heads, head_dim]`
//! (f16 on a device, f32 on the CPU, as the contiguous cache), and one batched forward's view
//! of it ([`PagedStep`]): decode rows, each a sequence of its own reading its blocks through a
//! block table, then prefill chunks, each the next tokens of one sequence.

use crate::backend::{transfer, AttnParams, QkvRope};
use crate::model::config::TextConfig;
use crate::model::kv_cache::{cache_scales, cache_zeros};
use crate::model::text::{copy_rows_to_host, LayerKv};
use crate::chunks::{join_rows, Chunks};
use crate::pages::gather_cache_rows_at;
use gpu::params::{CURSOR_FIELDS, CURSOR_ROW};
use crate::{Backend, DType, Error, Pages, Result, Tensor};

/// Prefill chunks of at most this many rows whose sequence has at least
/// [`CHUNK_PAGED_MIN_KEYS`] keys (a chat's next turn) attend through block tables, row by row
/// as decode rows do, instead of gathering the history into a contiguous copy first.
pub const CHUNK_PAGED_ROWS: usize = 32;
pub const CHUNK_PAGED_MIN_KEYS: usize = 256;

/// Whether short chunks attend through block tables (`QWEN3_VL_CHUNK_PAGED=0`: always gather;
/// an A/B aid).
static CHUNK_PAGED: crate::switch::Switch = crate::switch::Switch::new("QWEN3_VL_CHUNK_PAGED");
/// Whether a step's prefill chunks attend in one [`Backend::attention_chunks`]
/// (`QWEN3_VL_BATCHED_CHUNKS=0`: one attention per chunk, an A/B aid; read once).
static BATCHED_CHUNKS: crate::switch::Switch = crate::switch::Switch::new("QWEN3_VL_BATCHED_CHUNKS");
/// How many keys more than its longest chunk's a step's chunks may gather together to attend in
/// one op (for the 2B model's f16 cache, ~34 MB more of keys and values, a layer at a time).
pub const BATCHED_CHUNK_KEYS: usize = 8192;

pub struct PagedKv {
    /// Per layer: `[blocks · block, kv_heads, head_dim]`.
    k: Vec<Tensor>,
    v: Vec<Tensor>,
    /// Per layer, f16 pools: `[blocks · block, kv_heads, 2]` f32 row scales.
    s: Vec<Option<Tensor>>,
    block: usize,
    blocks: usize,
    dtype: DType,
}

impl PagedKv {
    /// `blocks` blocks of `block` rows (a power of two), layer `l`'s on `per_layer[l]`.
    pub fn new(per_layer: &[&dyn Backend], cfg: &TextConfig, blocks: usize, block: usize, dtype: DType) -> Result<PagedKv> {
        if block == 0 || !block.is_power_of_two() || blocks == 0 {
            return Err(Error::Limit { op: "paged KV cache", msg: format!("{} blocks of {} rows (a power of two)", blocks, block) });
        }
        let rows = blocks.checked_mul(block).filter(|&r| r <= u32::MAX as usize).ok_or_else(|| Error::Limit { op: "paged KV cache", msg: format!("{} blocks of {} rows overflow", blocks, block) })?;
        let shape = [rows, cfg.num_key_value_heads, cfg.head_dim];
        let zeros = |b: &dyn Backend| cache_zeros(b, &shape, dtype, "paged KV cache");
        let (mut k, mut v, mut s) = (Vec::new(), Vec::new(), Vec::new());
        for &b in per_layer {
            k.push(zeros(b)?);
            v.push(zeros(b)?);
            s.push(cache_scales(b, &shape, dtype)?);
        }
        Ok(PagedKv { k, v, s, block, blocks, dtype })
    }

    /// Bytes one token takes over all layers (keys and values, and an f16 cache's row scales).
    pub fn token_bytes(cfg: &TextConfig, dtype: DType) -> usize {
        let scales = if dtype == DType::F16 { crate::backend::KV_SCALES * 4 } else { 0 };
        cfg.num_hidden_layers * cfg.num_key_value_heads * (2 * cfg.head_dim * dtype.size_of() + scales)
    }

    pub fn block(&self) -> usize {
        self.block
    }

    pub fn blocks(&self) -> usize {
        self.blocks
    }

    pub fn dtype(&self) -> DType {
        self.dtype
    }

    /// The last block, which the engine keeps out of its pool: padded rows of a recorded decode
    /// step write their keys there ([`super::graph::padded_rows`]).
    pub fn scratch_block(&self) -> u32 {
        (self.blocks - 1) as u32
    }

    /// The cache row of token `j` of a sequence holding `blocks`.
    pub fn slot(&self, blocks: &[u32], j: usize) -> u32 {
        blocks[j / self.block] * self.block as u32 + (j % self.block) as u32
    }
}

/// One batched forward's rows (see the module docs): `decode[i]` = the blocks of the sequence
/// of row `i` and the keys it sees (its own included); each prefill chunk = its first row, its
/// row count, and the cache rows of all the keys its last row sees (the sequence's earlier
/// tokens, then the chunk's).
pub struct StepRows {
    pub decode: Vec<(Vec<u32>, usize)>,
    pub prefill: Vec<(usize, usize, Vec<u32>)>,
}

/// A [`LayerKv`] over a paged cache for one forward: the step's block tables and gather ids,
/// made per backend on first use (a model split over a device and the host has layers on both),
/// or lent by the caller (a recorded step's tables, rewritten in place before each replay).
pub struct PagedStep<'a> {
    kv: &'a mut PagedKv,
    rows: &'a StepRows,
    made: Vec<Made<'a>>,
}

/// What a [`PagedStep`] uploads to one backend (`key`: the backend's address).
struct Made<'a> {
    key: *const u8,
    /// The decode rows' block tables.
    pages: Tables<'a>,
    /// Per prefill chunk, its slots (u32 `[keys]`).
    ids: Vec<Tensor>,
    /// Per prefill chunk, block tables when it attends through them (a short chunk after a long
    /// history), else `None` (it gathers its keys).
    chunk_pages: Vec<Option<Pages>>,
    /// All chunks as one attention, where they allow it.
    chunks: Option<Chunks>,
}

/// The decode rows' block tables on one backend.
enum Tables<'a> {
    None,
    Made(Pages),
    Lent(&'a Pages),
}

impl Tables<'_> {
    fn get(&self) -> Option<&Pages> {
        match self {
            Tables::None => None,
            Tables::Made(p) => Some(p),
            Tables::Lent(p) => Some(p),
        }
    }
}

impl<'a> PagedStep<'a> {
    pub fn new(kv: &'a mut PagedKv, rows: &'a StepRows) -> PagedStep<'a> {
        PagedStep { kv, rows, made: Vec::new() }
    }

    /// A decode-only step (`rows.prefill` empty) whose block tables on `b` are `pages`, already
    /// written for `rows.decode`.
    pub fn lent(kv: &'a mut PagedKv, rows: &'a StepRows, b: &dyn Backend, pages: &'a Pages) -> PagedStep<'a> {
        let key = b as *const dyn Backend as *const u8;
        PagedStep { kv, rows, made: vec![Made { key, pages: Tables::Lent(pages), ids: Vec::new(), chunk_pages: Vec::new(), chunks: None }] }
    }

    /// The block tables and the prefill chunks' key ids on `b`.
    fn on(&mut self, b: &dyn Backend) -> Result<usize> {
        let key = b as *const dyn Backend as *const u8;
        if let Some(i) = self.made.iter().position(|m| m.key == key) {
            return Ok(i);
        }
        let pages = if self.rows.decode.is_empty() {
            Tables::None
        } else {
            let rows: Vec<(&[u32], usize)> = self.rows.decode.iter().map(|(bl, n)| (bl.as_slice(), *n)).collect();
            Tables::Made(Pages::new(b, self.kv.block, self.kv.blocks * self.kv.block, &rows)?)
        };
        let ids = self.rows.prefill.iter().map(|(_, _, slots)| b.upload_u32(&[slots.len()], slots)).collect::<Result<Vec<_>>>()?;
        // a short chunk after a long history: its rows attend through the block tables, each as
        // a decode row seeing the keys up to its own (no gather of the whole history)
        let block = self.kv.block;
        let chunk_pages = self
            .rows
            .prefill
            .iter()
            .map(|(_, n, slots)| {
                if !CHUNK_PAGED.on() || *n > CHUNK_PAGED_ROWS || slots.len() < CHUNK_PAGED_MIN_KEYS {
                    return Ok(None);
                }
                let blocks: Vec<u32> = slots.iter().step_by(block).map(|&s| s / block as u32).collect();
                let past = slots.len() - n;
                let rows: Vec<(&[u32], usize)> = (0..*n).map(|i| (blocks.as_slice(), past + i + 1)).collect();
                Pages::new(b, block, self.kv.blocks * block, &rows).map(Some)
            })
            .collect::<Result<Vec<_>>>()?;
        // several chunks, each gathering its keys, whose rows follow the decode rows in order:
        // one attention for all of them, unless their keys together would hold more memory than
        // the longest chunk's gather alone and `BATCHED_CHUNK_KEYS` more (the gathers are alive
        // at once, where one after another each was freed)
        let prefill = &self.rows.prefill;
        let (all_keys, most_keys) = prefill.iter().fold((0, 0), |(a, m), (_, _, s)| (a + s.len(), m.max(s.len())));
        let mut follow = prefill.iter().scan(self.rows.decode.len(), |next, &(r0, n, _)| {
            let ok = r0 == *next;
            *next = r0 + n;
            Some(ok)
        });
        let chunks = if BATCHED_CHUNKS.on() && prefill.len() > 1 && all_keys <= most_keys + BATCHED_CHUNK_KEYS && chunk_pages.iter().all(Option::is_none) && follow.all(|ok| ok) {
            let parts: Vec<(usize, &[u32])> = prefill.iter().map(|(_, n, slots)| (*n, slots.as_slice())).collect();
            Some(Chunks::new(b, &parts, ids.clone())?)
        } else {
            None
        };
        self.made.push(Made { key, pages, ids, chunk_pages, chunks });
        Ok(self.made.len() - 1)
    }
}

impl PagedStep<'_> {
    /// Prefill chunk `(r0, n, slots)`'s keys, values (and row scales) of layer `layer`, gathered
    /// from the pool on `b` into `[slots.len(), kv_heads, head_dim]` tensors; `ids` on `b` holds
    /// `slots`.
    fn gather(&self, layer: usize, b: &dyn Backend, ids: &Tensor) -> Result<(Tensor, Tensor, Option<Tensor>)> {
        let gather = |c: &Tensor| gather_cache_rows_at(b, c, ids);
        Ok((gather(&self.kv.k[layer])?, gather(&self.kv.v[layer])?, self.kv.s[layer].as_ref().map(gather).transpose()?))
    }
}

impl LayerKv for PagedStep<'_> {
    /// A streamed host layer (its pool on the host, the forward on the device). Decode rows go
    /// to the host (rope, append and paged attention there: one row each). Each prefill chunk
    /// runs on the device, as a contiguous cache's streamed layer does: its sequence's keys and
    /// values gathered on the host and lent to the device in a cache of its keys' length, the
    /// chunk appended and attended there, and its new rows copied back into their host slots.
    fn attend_streamed(&mut self, layer: usize, at: (&dyn Backend, &QkvRope<'_>, &Tensor), host_at: (&dyn Backend, &QkvRope<'_>, &Tensor), qkv: &Tensor, scale: f32) -> Result<Tensor> {
        let ((dev, shape, _), (host, host_shape, host_cursor)) = (at, host_at);
        let hq = self.on(host)?;
        let cur = host.download_u32(host_cursor)?; // [t, 4]: positions and cache slots
        let t = cur.len() / CURSOR_FIELDS;
        let nd = self.rows.decode.len();
        let mut parts = Vec::with_capacity(self.rows.prefill.len() + 1);
        // 1. decode rows on the host, against their blocks
        if let Some(p) = self.made[hq].pages.get() {
            let q = {
                let (k, v, sc) = (&mut self.kv.k[layer], &mut self.kv.v[layer], &mut self.kv.s[layer]);
                let rows = transfer(dev, host, &dev.take_rows(qkv, 0, nd)?)?;
                let cd = host.upload_u32(&[nd, CURSOR_FIELDS], &cur[..nd * CURSOR_FIELDS])?;
                host.qkv_rope_append(&rows, host_shape, &cd, k, v, sc.as_mut())?
            };
            let (k, v, sc) = (&self.kv.k[layer], &self.kv.v[layer], self.kv.s[layer].as_ref());
            let d = host.attention_paged(&q, k, v, sc, p, scale)?;
            parts.push((0, transfer(host, dev, &d)?));
        }
        // 2. prefill chunks on the device
        for (c, (r0, n, slots)) in self.rows.prefill.iter().enumerate() {
            let (keys, past) = (slots.len(), slots.len() - n);
            // the sequence's keys so far, lent (the chunk's own rows are written over there)
            let (kk, vv, ss) = self.gather(layer, host, &self.made[hq].ids[c])?;
            let dtype = self.kv.dtype;
            let lend = |t: &Tensor| -> Result<Tensor> {
                match dtype {
                    // the gather widened the f16 rows to f32: exactly back
                    DType::F16 => dev.upload_half(t.shape(), DType::F16, &host.download_f32(t)?.iter().map(|&x| gpu::math::f32_to_f16_bits(x)).collect::<Vec<u16>>()),
                    _ => transfer(host, dev, t),
                }
            };
            let (mut kk, mut vv) = (lend(&kk)?, lend(&vv)?);
            let mut ss = ss.map(|s| transfer(host, dev, &s)).transpose()?;
            // the chunk's cursor with rows past .. past + n of the lent cache
            let mut cc = cur[r0 * CURSOR_FIELDS..(r0 + n) * CURSOR_FIELDS].to_vec();
            for (i, row) in cc.chunks_mut(CURSOR_FIELDS).enumerate() {
                row[CURSOR_ROW] = (past + i) as u32;
            }
            let cc = dev.upload_u32(&[*n, CURSOR_FIELDS], &cc)?;
            let qkv_c = if *n == t { qkv.clone() } else { dev.take_rows(qkv, *r0, *n)? };
            let q = dev.qkv_rope_append(&qkv_c, shape, &cc, &mut kk, &mut vv, ss.as_mut())?;
            let o = dev.attention_cached(&q, &kk, &vv, ss.as_ref(), &cc, scale)?;
            // the chunk's rows back into their host slots, a run of consecutive slots at a time
            let mut i0 = past;
            while i0 < keys {
                let mut i1 = i0 + 1;
                while i1 < keys && slots[i1] == slots[i1 - 1] + 1 {
                    i1 += 1;
                }
                let to = slots[i0] as usize;
                copy_rows_to_host(dev, host, &kk, i0, &mut self.kv.k[layer], to, i1 - i0)?;
                copy_rows_to_host(dev, host, &vv, i0, &mut self.kv.v[layer], to, i1 - i0)?;
                if let (Some(d), Some(h)) = (&ss, &mut self.kv.s[layer]) {
                    copy_rows_to_host(dev, host, d, i0, h, to, i1 - i0)?;
                }
                i0 = i1;
            }
            parts.push((*r0, o));
        }
        join_rows(dev, [t, shape.heads, shape.head_dim], parts)
    }

    fn attend(&mut self, layer: usize, b: &dyn Backend, qkv: &Tensor, shape: &QkvRope<'_>, cursor: &Tensor, scale: f32) -> Result<Tensor> {
        let at = self.on(b)?;
        // 1. new keys and values into their cache rows (the cursor's), the queries out
        let q = {
            let (k, v, sc) = (&mut self.kv.k[layer], &mut self.kv.v[layer], &mut self.kv.s[layer]);
            b.qkv_rope_append(qkv, shape, cursor, k, v, sc.as_mut())? // [t, heads, d]
        };
        let (k, v, sc) = (&self.kv.k[layer], &self.kv.v[layer], self.kv.s[layer].as_ref());
        let t = q.shape()[0];
        let nd = self.rows.decode.len();
        let Made { pages, ids, chunk_pages, chunks, .. } = &self.made[at];
        // 2. decode rows: each against its own blocks
        let dec = match pages.get() {
            Some(p) if nd == t => return b.attention_paged(&q, k, v, sc, p, scale),
            Some(p) => Some(b.attention_paged(&b.take_rows(&q, 0, nd)?, k, v, sc, p, scale)?),
            None => None,
        };
        // 3. prefill chunks: causal attention from the chunk's offset over the sequence's keys
        //    (and row scales) at their slots (a device gathers an f16 cache's rows as stored),
        //    all in one op where they allow it
        let mut parts: Vec<(usize, Tensor)> = dec.map(|d| (0, d)).into_iter().collect();
        if let Some(ch) = chunks {
            let qp = if nd == 0 { q.clone() } else { b.take_rows(&q, nd, t - nd)? };
            parts.push((nd, b.attention_chunks(&qp, k, v, sc, ch, scale)?));
        } else {
            for (((r0, n, slots), idt), cp) in self.rows.prefill.iter().zip(ids).zip(chunk_pages) {
                let qp = if *n == t { q.clone() } else { b.take_rows(&q, *r0, *n)? };
                parts.push((*r0, match cp {
                    Some(p) => b.attention_paged(&qp, k, v, sc, p, scale)?,
                    None => b.attention_slots(&qp, k, v, sc, idt, AttnParams { kv_len: slots.len(), q_pos0: slots.len() - n, causal: true, scale })?,
                }));
            }
        }
        join_rows(b, [t, shape.heads, shape.head_dim], parts)
    }
}
