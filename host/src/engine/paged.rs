//! The paged KV cache: per layer one pool of `blocks · block` rows `[rows, kv_heads, head_dim]`
//! (f16 on a device, f32 on the CPU, as the contiguous cache), and one batched forward's view
//! of it ([`PagedStep`]): decode rows, each a sequence of its own reading its blocks through a
//! block table, then prefill chunks, each the next tokens of one sequence.

use crate::backend::AttnParams;
use crate::backend::QkvRope;
use crate::model::config::TextConfig;
use crate::model::kv_cache::{cache_scales, cache_zeros};
use crate::model::text::LayerKv;
use crate::{Backend, DType, Error, Pages, Result, Tensor};

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
    made: Vec<(*const u8, Tables<'a>, Vec<Tensor>)>,
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
        PagedStep { kv, rows, made: vec![(key, Tables::Lent(pages), Vec::new())] }
    }

    /// The block tables and the prefill chunks' key ids on `b`.
    fn on(&mut self, b: &dyn Backend) -> Result<usize> {
        let key = b as *const dyn Backend as *const u8;
        if let Some(i) = self.made.iter().position(|m| m.0 == key) {
            return Ok(i);
        }
        let pages = if self.rows.decode.is_empty() {
            Tables::None
        } else {
            let rows: Vec<(&[u32], usize)> = self.rows.decode.iter().map(|(bl, n)| (bl.as_slice(), *n)).collect();
            Tables::Made(Pages::new(b, self.kv.block, self.kv.blocks * self.kv.block, &rows)?)
        };
        let ids = self.rows.prefill.iter().map(|(_, _, slots)| b.upload_u32(&[slots.len()], slots)).collect::<Result<Vec<_>>>()?;
        self.made.push((key, pages, ids));
        Ok(self.made.len() - 1)
    }
}

impl LayerKv for PagedStep<'_> {
    fn attend(&mut self, layer: usize, b: &dyn Backend, qkv: &Tensor, shape: &QkvRope<'_>, cursor: &Tensor, scale: f32) -> Result<Tensor> {
        let at = self.on(b)?;
        let (k, v, sc) = (&mut self.kv.k[layer], &mut self.kv.v[layer], &mut self.kv.s[layer]);
        // 1. new keys and values into their cache rows (the cursor's), the queries out
        let q = b.qkv_rope_append(qkv, shape, cursor, k, v, sc.as_mut())?; // [t, heads, d]
        let sc = sc.as_ref();
        let t = q.shape()[0];
        let nd = self.rows.decode.len();
        let (_, pages, ids) = &self.made[at];
        // 2. decode rows: each against its own blocks
        let dec = match pages.get() {
            Some(p) if nd == t => return b.attention_paged(&q, k, v, sc, p, scale),
            Some(p) => Some(b.attention_paged(&b.take_rows(&q, 0, nd)?, k, v, sc, p, scale)?),
            None => None,
        };
        // 3. prefill chunks: the sequence's keys (and row scales) gathered, causal attention from
        //    the chunk's offset
        let mut out = if dec.is_none() && self.rows.prefill.len() == 1 { None } else { Some(b.zeros(&[t, shape.heads, shape.head_dim])?) };
        if let (Some(o), Some(d)) = (&mut out, &dec) {
            b.write_rows(o, 0, d)?;
        }
        for ((r0, n, slots), idt) in self.rows.prefill.iter().zip(ids) {
            let gather = |c: &Tensor| -> Result<Tensor> {
                let s = c.shape();
                b.embedding_gather(&c.reshape(&[s[0], s[1] * s[2]])?, idt)?.reshape(&[slots.len(), s[1], s[2]])
            };
            let (kk, vv, ss) = (gather(k)?, gather(v)?, sc.map(gather).transpose()?);
            let past = slots.len() - n;
            let qp = if *n == t { q.clone() } else { b.take_rows(&q, *r0, *n)? };
            let o = b.attention_scaled(&qp, &kk, &vv, ss.as_ref(), AttnParams { kv_len: slots.len(), q_pos0: past, causal: true, scale })?;
            match &mut out {
                Some(all) => b.write_rows(all, *r0, &o)?,
                None => return Ok(o),
            }
        }
        out.ok_or_else(|| Error::Limit { op: "paged attention", msg: "a step with no rows".into() })
    }
}
