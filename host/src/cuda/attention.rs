//! Attention (`gpu/src/attention.rs`): the one-warp-per-(row, head) kernel for prefill and the
//! vision tower, and split-KV (flash-decoding) attention for a few query rows against the KV
//! cache, reading the positions from the device cursor (so a recorded decode step replays at
//! every context length).

use super::launch::{ceil_div, fits_u32, grid_dim, need, Launcher, MAX_GRID_X};
use super::{CudaBackend, DeviceBuffer};
use crate::backend::AttnParams;
use crate::kernels::Kernel;
use crate::{ops, DType, Error, Result, Tensor};
use gpu::params::{attention_tile, attn_split_tile, AttentionParams, SplitAttnParams, CURSOR_FIELDS};

/// Sizes of an attention launch (validated against each other by `crate::ops`).
pub struct AttnShape {
    pub t: usize,
    pub heads: usize,
    pub kv_heads: usize,
    pub d: usize,
    pub cap: usize,
}

/// Buffers of an attention launch.
pub struct AttnBuffers<'a> {
    pub q: &'a DeviceBuffer,
    pub k: &'a DeviceBuffer,
    pub v: &'a DeviceBuffer,
    pub out: &'a DeviceBuffer,
    /// `[t, 4]` u32 cursor, when positions come from the device.
    pub cursor: Option<&'a DeviceBuffer>,
}

fn check_common(kernel: Kernel, b: &AttnBuffers<'_>, s: &AttnShape, kv_dtype: DType) -> Result<()> {
    if s.kv_heads == 0 || s.heads % s.kv_heads != 0 {
        return Err(Error::Limit { op: kernel.name(), msg: format!("heads {} over kv_heads {}", s.heads, s.kv_heads) });
    }
    need(kernel, "q", b.q, s.t * s.heads * s.d * 4)?;
    need(kernel, "k", b.k, s.cap * s.kv_heads * s.d * kv_dtype.size_of())?;
    need(kernel, "v", b.v, s.cap * s.kv_heads * s.d * kv_dtype.size_of())?;
    need(kernel, "out", b.out, s.t * s.heads * s.d * 4)?;
    if let Some(c) = b.cursor {
        need(kernel, "cursor", c, s.t * CURSOR_FIELDS * 4)?;
    }
    Ok(())
}

/// One-warp-per-(row, head) attention; see `gpu/src/attention.rs`.
pub fn attention(l: &Launcher<'_>, kv_dtype: DType, b: &AttnBuffers<'_>, s: &AttnShape, p: &AttnParams) -> Result<()> {
    let kernel = Kernel::by_kv(kv_dtype, [Kernel::AttentionF32, Kernel::AttentionF16])?;
    let max_d = 32 * attention_tile::MAX_PER_LANE;
    if s.d > max_d {
        return Err(Error::Limit { op: kernel.name(), msg: format!("head_dim {} exceeds {}", s.d, max_d) });
    }
    check_common(kernel, b, s, kv_dtype)?;
    let params = AttentionParams {
        q: b.q.addr(),
        k: b.k.addr(),
        v: b.v.addr(),
        out: b.out.addr(),
        t: fits_u32(kernel, "t", s.t)?,
        heads: fits_u32(kernel, "heads", s.heads)?,
        kv_heads: fits_u32(kernel, "kv_heads", s.kv_heads)?,
        d: fits_u32(kernel, "d", s.d)?,
        kv_len: fits_u32(kernel, "kv_len", p.kv_len)?,
        q_pos0: fits_u32(kernel, "q_pos0", p.q_pos0)?,
        causal: p.causal as u32,
        scale: p.scale,
        cursor: b.cursor.map_or(0, |c| c.addr()),
        cap: fits_u32(kernel, "cap", s.cap)?,
        _pad: 0,
    };
    let items = s.t * s.heads;
    if items == 0 {
        return Ok(());
    }
    l.launch(kernel, [grid_dim(kernel, "x", ceil_div(items, attention_tile::WARPS as usize), MAX_GRID_X)?, 1, 1], attention_tile::THREADS, &params)
}

/// Whether the split kernel takes this shape: few query vectors per KV group and a head dim
/// of 32, 64, 128 or 256 (a key row in whole 32-element steps, 8 elements per lane in PV).
pub fn split_fits(s: &AttnShape) -> bool {
    s.kv_heads > 0 && s.t <= attn_split_tile::MAX_ROWS && s.t * (s.heads / s.kv_heads) <= attn_split_tile::MAX_GROUP_QV && s.d.is_power_of_two() && (32..=attn_split_tile::MAX_D).contains(&s.d)
}

/// The number of KV chunks launched for a cache of `cap` rows: enough blocks for four per
/// multiprocessor, no more than the cache has `MIN_KEYS` runs. The kernel activates only as
/// many as the current context needs, so this depends on the cache size alone and a recorded
/// step keeps it at every context length.
pub fn split_count(cap: usize, kv_heads: usize, sms: u32) -> usize {
    let fill = ceil_div(4 * sms as usize, kv_heads.max(1));
    fill.min(ceil_div(cap, attn_split_tile::MIN_KEYS)).clamp(1, attn_split_tile::MAX_SPLITS)
}

/// Split-KV attention: chunk states into `partial`, merged into `out` by the last block of
/// each group; `counters` (zero, at least `kv_heads · ceil(qvs / MAX_QV)` u32) are left zero.
#[allow(clippy::too_many_arguments)]
pub fn attention_split(l: &Launcher<'_>, kv_dtype: DType, b: &AttnBuffers<'_>, partial: &DeviceBuffer, counters: &DeviceBuffer, s: &AttnShape, splits: usize, scale: f32) -> Result<()> {
    let kernel = Kernel::by_kv(kv_dtype, [Kernel::AttentionSplitF32, Kernel::AttentionSplitF16])?;
    if !split_fits(s) || splits == 0 || splits > attn_split_tile::MAX_SPLITS {
        return Err(Error::Limit { op: kernel.name(), msg: format!("shape t={} heads={} kv_heads={} d={} splits={} is outside the split kernel's range", s.t, s.heads, s.kv_heads, s.d, splits) });
    }
    check_common(kernel, b, s, kv_dtype)?;
    let cursor = b.cursor.ok_or_else(|| Error::Limit { op: kernel.name(), msg: "needs the device cursor".into() })?;
    need(kernel, "partial", partial, s.t * s.heads * splits * (s.d + 2) * 4)?;
    let blocks_per_group = ceil_div(s.t * (s.heads / s.kv_heads), attn_split_tile::MAX_QV);
    need(kernel, "counters", counters, s.kv_heads * blocks_per_group * 4)?;
    let params = SplitAttnParams {
        q: b.q.addr(),
        k: b.k.addr(),
        v: b.v.addr(),
        cursor: cursor.addr(),
        partial: partial.addr(),
        out: b.out.addr(),
        counters: counters.addr(),
        t: s.t as u32,
        heads: fits_u32(kernel, "heads", s.heads)?,
        kv_heads: fits_u32(kernel, "kv_heads", s.kv_heads)?,
        d: s.d as u32,
        cap: fits_u32(kernel, "cap", s.cap)?,
        splits: splits as u32,
        scale,
        _pad: 0,
    };
    if s.t == 0 {
        return Ok(());
    }
    l.launch(kernel, [splits as u32, grid_dim(kernel, "y", s.kv_heads, 65_535)?, blocks_per_group as u32], attn_split_tile::THREADS, &params)
}

impl CudaBackend {
    /// The KV chunks split-KV attention uses for a cache of `cap` rows on this device.
    pub fn attention_splits(&self, cap: usize, kv_heads: usize) -> usize {
        split_count(cap, kv_heads, self.sms)
    }

    pub(super) fn attention_op(&self, q: &Tensor, k: &Tensor, v: &Tensor, p: AttnParams, cursor: Option<&Tensor>) -> Result<Tensor> {
        const OP: &str = "attention";
        let (t, heads, kv_heads, d) = ops::attention_dims(q, k, v, &p)?;
        let l = self.enter()?;
        let out = self.output(t * heads * d)?;
        let shape = AttnShape { t, heads, kv_heads, d, cap: k.shape()[0] };
        let bufs = AttnBuffers { q: self.buffer(OP, q)?, k: self.buffer(OP, k)?, v: self.buffer(OP, v)?, out: &out, cursor: cursor.map(|c| self.buffer(OP, c)).transpose()? };
        attention(&l, k.dtype(), &bufs, &shape, &p)?;
        Ok(Self::wrap(vec![t, heads, d], DType::F32, out))
    }

    pub(super) fn attention_cached_op(&self, q: &Tensor, k: &Tensor, v: &Tensor, cursor: &Tensor, scale: f32) -> Result<Tensor> {
        const OP: &str = "attention_cached";
        let t = q.shape().first().copied().unwrap_or(0);
        ops::cursor_dims(OP, cursor, t)?;
        let cap = k.shape().first().copied().unwrap_or(0);
        // host-side bounds for the shape checks; the kernels take the positions from the cursor
        let p = AttnParams { kv_len: cap, q_pos0: cap.saturating_sub(t), causal: true, scale };
        let (t, heads, kv_heads, d) = ops::attention_dims(q, k, v, &p)?;
        let shape = AttnShape { t, heads, kv_heads, d, cap };
        if !split_fits(&shape) {
            return self.attention_op(q, k, v, p, Some(cursor));
        }
        let splits = self.attention_splits(cap, kv_heads);
        let l = self.enter()?;
        let out = self.output(t * heads * d)?;
        let partial = self.output(t * heads * splits * (d + 2))?;
        let bufs = AttnBuffers { q: self.buffer(OP, q)?, k: self.buffer(OP, k)?, v: self.buffer(OP, v)?, out: &out, cursor: Some(self.buffer(OP, cursor)?) };
        attention_split(&l, k.dtype(), &bufs, &partial, &self.counters, &shape, splits, scale)?;
        Ok(Self::wrap(vec![t, heads, d], DType::F32, out))
    }
}
