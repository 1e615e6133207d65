//! Attention: tiled flash attention for prefill and the vision tower (`gpu/src/flash.rs`, SIMT,
//! and `gpu/src/flash_mma.rs`, tensor cores on compute_80), dense or block-sparse; split-KV
//! (flash-decoding) attention for a few query rows against the KV cache, reading the positions
//! from the device cursor (so a recorded decode step replays at every context length); and the
//! one-warp-per-(row, head) kernel (`gpu/src/attention.rs`) for head dims the flash kernels do
//! not take.

use super::embedding::gather_rows_f16;
use super::launch::{ceil_div, fits_u32, grid_dim, need, Launcher, MAX_GRID_X, MAX_GRID_Y};
use super::rope::rope_cast_f16;
use super::{CudaBackend, DeviceBuffer};
use crate::backend::{attention_block_sparse_composite, attention_paged_composite, attention_slots_composite, AttnParams, BlockMask, KV_SCALES};
use crate::chunks::{attention_chunks_composite, chunks_dims, Chunks};
use crate::pages::gather_cache_rows_at;
use crate::Pages;
use crate::kernels::{Arch, Kernel};
use crate::{ops, DType, Error, Result, Tensor};
use gpu::params::{attention_tile, attn_paged_mma_tile, attn_paged_tile, attn_split_tile, block_mask, flash_mma_tile, flash_tile, AttentionParams, FlashParams, SplitAttnParams, CURSOR_FIELDS, FLASH_MAX_D};
use std::sync::Once;

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
    /// `[cap, kv_heads, 2]` f32 row scales of `k` and `v` (`crate::backend::KV_SCALES`).
    pub kv_scale: Option<&'a DeviceBuffer>,
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
    if let Some(sc) = b.kv_scale {
        need(kernel, "kv_scale", sc, s.cap * s.kv_heads * KV_SCALES * 4)?;
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
        kv_scale: b.kv_scale.map_or(0, |c| c.addr()),
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

/// Whether the flash kernels take head dim `d`: a multiple of 8 (16-byte rows) up to
/// `FLASH_MAX_D` (128).
pub fn flash_fits(d: usize) -> bool {
    d >= 8 && d % 8 == 0 && d <= FLASH_MAX_D
}

/// What a flash launch adds to [`AttnBuffers`]: a packed block mask with its block counts, and
/// rotary tables for the queries.
#[derive(Default)]
pub struct FlashExtra<'a> {
    pub mask: Option<(&'a DeviceBuffer, usize, usize)>,
    pub rope: Option<(&'a DeviceBuffer, &'a DeviceBuffer)>,
}

/// Whether flash attention runs on tensor cores here, which take f16 K/V only (f32 K/V are
/// narrowed first, with row scales: [`narrow_kv`]).
pub fn flash_mma(l: &Launcher<'_>) -> bool {
    l.kernels.arch() >= Arch::Compute80
}

/// Whether the tensor-core flash attention takes its warpgroup kernels on sm_90a
/// (`QWEN3_VL_FLASH_WGMMA=0` keeps `mma.sync`: an A/B aid; read once).
fn flash_wgmma_enabled() -> bool {
    static SW: crate::switch::Switch = crate::switch::Switch::new("QWEN3_VL_FLASH_WGMMA");
    SW.on()
}

/// Flash attention (see `gpu/src/flash.rs`): the tensor-core kernels when the loaded module is
/// compute_80 (f16 K/V), the SIMT ones otherwise (f32 or f16); head-dim class 64 or 128 by `d`.
pub fn flash_attention(l: &Launcher<'_>, kv_dtype: DType, b: &AttnBuffers<'_>, x: &FlashExtra<'_>, s: &AttnShape, p: &AttnParams) -> Result<()> {
    let mma = flash_mma(l);
    let small = s.d <= 64;
    let kernel = match (mma, small) {
        (false, true) => Kernel::by_kv(kv_dtype, [Kernel::FlashAttentionD64F32, Kernel::FlashAttentionD64F16])?,
        (false, false) => Kernel::by_kv(kv_dtype, [Kernel::FlashAttentionD128F32, Kernel::FlashAttentionD128F16])?,
        (true, true) => Kernel::FlashAttentionMmaD64F16,
        (true, false) => Kernel::FlashAttentionMmaD128F16,
    };
    // on sm_90a the products by warpgroups (`QWEN3_VL_FLASH_WGMMA=0`: `mma.sync`, an A/B aid)
    let kernel = if mma && flash_wgmma_enabled() { l.wgmma_or(kernel) } else { kernel };
    if mma && kv_dtype != DType::F16 {
        return Err(Error::DType { op: kernel.name(), expected: "f16 keys and values (narrowed first)", got: kv_dtype });
    }
    if !flash_fits(s.d) {
        return Err(Error::Limit { op: kernel.name(), msg: format!("head_dim {} is not a multiple of 8 in 8..={}", s.d, FLASH_MAX_D) });
    }
    check_common(kernel, b, s, kv_dtype)?;
    if let Some((m, nqb, nkb)) = x.mask {
        need(kernel, "mask", m, block_mask::words(nqb, nkb) * 4)?;
    }
    if let Some((cos, sin)) = x.rope {
        need(kernel, "cos", cos, s.t * s.d / 2 * 4)?;
        need(kernel, "sin", sin, s.t * s.d / 2 * 4)?;
    }
    let group = s.heads / s.kv_heads;
    // the kernels index vectors and keys in u32 with room for a tile past the end
    if s.t * group > i32::MAX as usize || s.cap > i32::MAX as usize {
        return Err(Error::Limit { op: kernel.name(), msg: format!("{} query vectors or {} cache rows exceed 2^31", s.t * group, s.cap) });
    }
    let params = FlashParams {
        q: b.q.addr(),
        k: b.k.addr(),
        v: b.v.addr(),
        out: b.out.addr(),
        cursor: b.cursor.map_or(0, |c| c.addr()),
        mask: x.mask.map_or(0, |m| m.0.addr()),
        cos: x.rope.map_or(0, |r| r.0.addr()),
        sin: x.rope.map_or(0, |r| r.1.addr()),
        kv_scale: b.kv_scale.map_or(0, |c| c.addr()),
        kv_flag: l.kv_flag,
        t: fits_u32(kernel, "t", s.t)?,
        heads: fits_u32(kernel, "heads", s.heads)?,
        kv_heads: fits_u32(kernel, "kv_heads", s.kv_heads)?,
        d: s.d as u32,
        kv_len: fits_u32(kernel, "kv_len", p.kv_len)?,
        q_pos0: fits_u32(kernel, "q_pos0", p.q_pos0)?,
        causal: p.causal as u32,
        cap: fits_u32(kernel, "cap", s.cap)?,
        scale: p.scale,
        _pad: 0,
    };
    let dc = if small { 64 } else { 128 };
    let wg = kernel.needs_sm90a();
    let vectors = if mma { flash_mma_tile::vectors(dc, wg) } else { flash_tile::vectors(dc) };
    let tiles = ceil_div(s.t * group, vectors);
    if tiles == 0 {
        return Ok(());
    }
    let grid = [grid_dim(kernel, "x", tiles, MAX_GRID_X)?, grid_dim(kernel, "y", s.kv_heads, MAX_GRID_Y)?, 1];
    if mma {
        l.launch_shared(kernel, grid, flash_mma_tile::threads(dc, wg), kernel.large_shared_bytes(), &params)
    } else {
        l.launch_shared(kernel, grid, flash_tile::THREADS, flash_tile::smem_bytes(if small { 64 } else { 128 }) as u32, &params)
    }
}

/// f32 keys and values `[rows, kv_heads, d]` (times `scales` when given) narrowed to f16 with
/// fresh row scales, for the tensor-core flash kernels (keys rotated with `rope` when given):
/// `(k, v, scales)`.
#[allow(clippy::too_many_arguments)]
pub fn narrow_kv(be: &CudaBackend, l: &Launcher<'_>, (k, v): (&DeviceBuffer, &DeviceBuffer), scales: Option<&DeviceBuffer>, rope: Option<(&DeviceBuffer, &DeviceBuffer)>, rows: usize, kv_heads: usize, d: usize) -> Result<(DeviceBuffer, DeviceBuffer, DeviceBuffer)> {
    let (kh, vh) = (be.pool.alloc(rows * kv_heads * d * 2)?, be.pool.alloc(rows * kv_heads * d * 2)?);
    let sc = be.pool.alloc(rows * kv_heads * KV_SCALES * 4)?;
    rope_cast_f16(l, k, rope, scales.map(|s| (s, 0)), (&kh, 0), Some((&sc, 0)), rows, kv_heads, d)?;
    rope_cast_f16(l, v, None, scales.map(|s| (s, 1)), (&vh, 0), Some((&sc, 1)), rows, kv_heads, d)?;
    Ok((kh, vh, sc))
}

/// Logs once per process that paged attention of this shape takes the composite path.
fn log_unpaged(s: &AttnShape) {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| log::warn!("attention_paged: {} rows of heads {} / kv_heads {} / head_dim {} are outside the paged split kernel's range; gathering each row's keys instead", s.t, s.heads, s.kv_heads, s.d));
}

/// Logs once per process that head dims the flash kernels do not take use the slower paths.
fn log_unflashed(d: usize) {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| log::warn!("attention: head_dim {} is outside the flash kernels' range (multiples of 8 up to {}); using the one-warp-per-row kernel", d, FLASH_MAX_D));
}

/// Whether batched decode steps may take `attention_paged_mma_f16` (`QWEN3_VL_PAGED_MMA=0` keeps
/// them on `attention_paged_f16`: an A/B aid for benchmarks; read once).
pub fn paged_mma() -> bool {
    static PAGED_MMA: crate::switch::Switch = crate::switch::Switch::new("QWEN3_VL_PAGED_MMA");
    PAGED_MMA.on()
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

/// The paged mode of [`attention_split`]: `[t, stride]` u32 block ids, `[t]` u32 key counts,
/// `1 << shift` cache rows per block.
pub struct SplitPages<'a> {
    pub table: &'a DeviceBuffer,
    pub lens: &'a DeviceBuffer,
    pub stride: usize,
    pub shift: u32,
}

/// Whether the paged split kernel takes this shape: a head dim of 32, 64, 128 or 256 and at
/// most `MAX_GROUP_QV` query heads per KV head (any number of rows: a block per row and group).
pub fn split_paged_fits(s: &AttnShape) -> bool {
    s.kv_heads > 0 && s.heads % s.kv_heads == 0 && s.heads / s.kv_heads <= attn_split_tile::MAX_GROUP_QV && s.d.is_power_of_two() && (32..=attn_split_tile::MAX_D).contains(&s.d)
}

/// Split-KV attention: chunk states into `partial`, merged into `out` by the last block of
/// each group; `counters` (zero, at least `kv_heads · ceil(qvs / MAX_QV)` u32, or in paged
/// mode `kv_heads · t · ceil(group / MAX_QV)`) are left zero. Contiguous mode reads the
/// positions from the cursor; paged mode (`pages`) from the tables.
#[allow(clippy::too_many_arguments)]
pub fn attention_split(l: &Launcher<'_>, kv_dtype: DType, b: &AttnBuffers<'_>, partial: &DeviceBuffer, counters: &DeviceBuffer, s: &AttnShape, splits: usize, scale: f32, pages: Option<&SplitPages<'_>>) -> Result<()> {
    let kernel = Kernel::by_kv(kv_dtype, [Kernel::AttentionSplitF32, Kernel::AttentionSplitF16])?;
    split_launch(l, kernel, kv_dtype, b, partial, counters, s, splits, scale, pages)
}

/// Paged decode attention by `attention_paged_f16` (compute_80, f16 cache: key and value tiles
/// staged in shared memory, `gpu/src/attention_paged.rs`): the same shapes, partial states and
/// counters as the paged mode of [`attention_split`].
#[allow(clippy::too_many_arguments)]
pub fn attention_paged_staged(l: &Launcher<'_>, b: &AttnBuffers<'_>, partial: &DeviceBuffer, counters: &DeviceBuffer, s: &AttnShape, splits: usize, scale: f32, pages: &SplitPages<'_>) -> Result<()> {
    split_launch(l, Kernel::AttentionPagedF16, DType::F16, b, partial, counters, s, splits, scale, Some(pages))
}

/// The parameters of a split or paged attention launch (checked by the caller).
#[allow(clippy::too_many_arguments)]
fn split_params(kernel: Kernel, b: &AttnBuffers<'_>, s: &AttnShape, splits: usize, scale: f32, cursor: u64, (partial, counters): (&DeviceBuffer, &DeviceBuffer), pages: Option<&SplitPages<'_>>) -> Result<SplitAttnParams> {
    Ok(SplitAttnParams {
        q: b.q.addr(),
        k: b.k.addr(),
        v: b.v.addr(),
        cursor,
        partial: partial.addr(),
        out: b.out.addr(),
        counters: counters.addr(),
        table: pages.map_or(0, |p| p.table.addr()),
        lens: pages.map_or(0, |p| p.lens.addr()),
        kv_scale: b.kv_scale.map_or(0, |c| c.addr()),
        t: fits_u32(kernel, "t", s.t)?,
        heads: fits_u32(kernel, "heads", s.heads)?,
        kv_heads: fits_u32(kernel, "kv_heads", s.kv_heads)?,
        d: s.d as u32,
        cap: fits_u32(kernel, "cap", s.cap)?,
        splits: splits as u32,
        scale,
        table_stride: pages.map_or(Ok(0), |p| fits_u32(kernel, "table stride", p.stride))?,
        block_shift: pages.map_or(0, |p| p.shift),
        _pad: 0,
    })
}

/// Whether `attention_paged_mma_f16` takes this shape: head dim 128, at most 16 query heads per
/// KV head.
pub fn paged_mma_fits(s: &AttnShape) -> bool {
    s.kv_heads > 0 && s.heads % s.kv_heads == 0 && s.heads / s.kv_heads <= attn_paged_mma_tile::MAX_GROUP && s.d == attn_paged_mma_tile::D
}

/// Paged decode attention on tensor cores (`attention_paged_mma_f16`, compute_80, f16 cache;
/// `gpu/src/attention_paged_mma.rs`): a block per query row, KV head and chunk of keys. With
/// `splits` 1 nothing is merged across blocks; with more, the chunks' states go to `partial`
/// (`[t, heads, splits, d + 2]` f32) and the last block of each row and KV head merges them
/// (`counters`: zero, at least `kv_heads · t` u32, left zero), as in the paged mode of
/// [`attention_split`].
#[allow(clippy::too_many_arguments)]
pub fn attention_paged_mma(l: &Launcher<'_>, b: &AttnBuffers<'_>, partial: &DeviceBuffer, counters: &DeviceBuffer, s: &AttnShape, splits: usize, scale: f32, pages: &SplitPages<'_>) -> Result<()> {
    let kernel = Kernel::AttentionPagedMmaF16;
    if !paged_mma_fits(s) {
        return Err(Error::Limit { op: kernel.name(), msg: format!("shape heads={} kv_heads={} d={} is outside the kernel's range (d {}, at most {} query heads per KV head)", s.heads, s.kv_heads, s.d, attn_paged_mma_tile::D, attn_paged_mma_tile::MAX_GROUP) });
    }
    check_common(kernel, b, s, DType::F16)?;
    if b.q.addr() % 8 != 0 {
        return Err(Error::Limit { op: kernel.name(), msg: "the queries must be 8-byte aligned".into() });
    }
    need(kernel, "table", pages.table, s.t * pages.stride * 4)?;
    need(kernel, "lens", pages.lens, s.t * 4)?;
    if splits == 0 || splits > attn_split_tile::MAX_SPLITS {
        return Err(Error::Limit { op: kernel.name(), msg: format!("{} KV splits, at most {}", splits, attn_split_tile::MAX_SPLITS) });
    }
    if splits > 1 {
        need(kernel, "partial", partial, s.t * s.heads * splits * (s.d + 2) * 4)?;
        if s.t * s.kv_heads > counters.len() / 4 {
            return Err(Error::Limit { op: kernel.name(), msg: format!("{} rows × {} KV heads need as many arrival counters, {} there", s.t, s.kv_heads, counters.len() / 4) });
        }
    }
    let params = split_params(kernel, b, s, splits, scale, 0, (partial, counters), Some(pages))?;
    if s.t == 0 {
        return Ok(());
    }
    let grid = [grid_dim(kernel, "x", s.kv_heads, MAX_GRID_X)?, grid_dim(kernel, "y", s.t, MAX_GRID_Y)?, splits as u32];
    l.launch_shared(kernel, grid, attn_paged_mma_tile::THREADS, attn_paged_mma_tile::SHARED_BYTES, &params)
}

/// The checks, parameters and launch shared by the split kernels and the staged paged one.
#[allow(clippy::too_many_arguments)]
fn split_launch(l: &Launcher<'_>, kernel: Kernel, kv_dtype: DType, b: &AttnBuffers<'_>, partial: &DeviceBuffer, counters: &DeviceBuffer, s: &AttnShape, splits: usize, scale: f32, pages: Option<&SplitPages<'_>>) -> Result<()> {
    let staged = kernel == Kernel::AttentionPagedF16;
    let fits = if pages.is_some() { split_paged_fits(s) } else { split_fits(s) && !staged };
    if !fits || splits == 0 || splits > attn_split_tile::MAX_SPLITS {
        return Err(Error::Limit { op: kernel.name(), msg: format!("shape t={} heads={} kv_heads={} d={} splits={} is outside the split kernel's range", s.t, s.heads, s.kv_heads, s.d, splits) });
    }
    check_common(kernel, b, s, kv_dtype)?;
    let cursor = match (b.cursor, pages) {
        (Some(c), _) => c.addr(),
        (None, Some(_)) => 0,
        (None, None) => return Err(Error::Limit { op: kernel.name(), msg: "needs the device cursor".into() }),
    };
    need(kernel, "partial", partial, s.t * s.heads * splits * (s.d + 2) * 4)?;
    let group = s.heads / s.kv_heads;
    let blocks_per_group = match pages {
        Some(_) => s.t * ceil_div(group, attn_split_tile::MAX_QV),
        None => ceil_div(s.t * group, attn_split_tile::MAX_QV),
    };
    need(kernel, "counters", counters, s.kv_heads * blocks_per_group * 4)?;
    if let Some(pg) = pages {
        need(kernel, "table", pg.table, s.t * pg.stride * 4)?;
        need(kernel, "lens", pg.lens, s.t * 4)?;
    }
    let params = split_params(kernel, b, s, splits, scale, cursor, (partial, counters), pages)?;
    if s.t == 0 {
        return Ok(());
    }
    let grid = [splits as u32, grid_dim(kernel, "y", s.kv_heads, 65_535)?, grid_dim(kernel, "z", blocks_per_group, 65_535)?];
    if staged {
        return l.launch_shared(kernel, grid, attn_paged_tile::THREADS, attn_paged_tile::SHARED_BYTES, &params);
    }
    l.launch(kernel, grid, attn_split_tile::THREADS, &params)
}

impl CudaBackend {
    /// The KV chunks split-KV attention uses for a cache of `cap` rows on this device.
    pub fn attention_splits(&self, cap: usize, kv_heads: usize) -> usize {
        split_count(cap, kv_heads, self.sms)
    }

    pub(super) fn attention_op(&self, q: &Tensor, k: &Tensor, v: &Tensor, scales: Option<&Tensor>, p: AttnParams, cursor: Option<&Tensor>) -> Result<Tensor> {
        const OP: &str = "attention";
        let (t, heads, kv_heads, d) = ops::attention_dims(q, k, v, &p)?;
        ops::kv_scale_dims(OP, k, scales)?;
        let l = self.enter()?;
        let out = self.output(t * heads * d)?;
        let mut shape = AttnShape { t, heads, kv_heads, d, cap: k.shape()[0] };
        let sc = scales.map(|s| self.buffer(OP, s)).transpose()?;
        let mut bufs = AttnBuffers { q: self.buffer(OP, q)?, k: self.buffer(OP, k)?, v: self.buffer(OP, v)?, out: &out, cursor: cursor.map(|c| self.buffer(OP, c)).transpose()?, kv_scale: sc };
        if flash_fits(d) {
            // the tensor-core kernels take f16: f32 keys and values narrowed with row scales
            // (the rows a query may see: all with a cursor, else the first kv_len)
            let narrowed;
            let mut kv_dtype = k.dtype();
            if flash_mma(&l) && kv_dtype == DType::F32 {
                let rows = if cursor.is_some() { shape.cap } else { p.kv_len };
                narrowed = narrow_kv(self, &l, (bufs.k, bufs.v), sc, None, rows, kv_heads, d)?;
                bufs = AttnBuffers { k: &narrowed.0, v: &narrowed.1, kv_scale: Some(&narrowed.2), ..bufs };
                shape.cap = rows;
                kv_dtype = DType::F16;
            }
            flash_attention(&l, kv_dtype, &bufs, &FlashExtra::default(), &shape, &p)?;
        } else {
            log_unflashed(d);
            attention(&l, k.dtype(), &bufs, &shape, &p)?;
        }
        Ok(Self::wrap(vec![t, heads, d], DType::F32, out))
    }

    /// Attention over keys at `slots` of a paged cache. An f16 cache's rows (and their scales)
    /// are gathered as stored into contiguous rows for the flash kernels; the composite's
    /// embedding gather would widen them to f32, which the tensor-core kernels narrow back
    /// (three times the traffic).
    pub(super) fn attention_slots_op(&self, q: &Tensor, k: &Tensor, v: &Tensor, scales: Option<&Tensor>, slots: &Tensor, p: AttnParams) -> Result<Tensor> {
        const OP: &str = "attention_slots";
        let (_, _, kv_heads, d) = ops::attention_slots_dims(q, k, v, slots, &p)?;
        ops::kv_scale_dims(OP, k, scales)?;
        let (width, n) = (kv_heads * d, p.kv_len);
        if k.dtype() != DType::F16 || width % 8 != 0 {
            return attention_slots_composite(self, q, k, v, scales, slots, p);
        }
        let l = self.enter()?;
        let ids = self.buffer(OP, slots)?;
        let gather = |pool: &Tensor| Ok::<_, Error>(Self::wrap(vec![n, kv_heads, d], DType::F16, self.gather_f16(&l, pool, ids, n)?));
        let (kk, vv) = (gather(k)?, gather(v)?);
        let sc = scales.map(|s| gather_cache_rows_at(self, s, slots)).transpose()?;
        self.attention_op(q, &kk, &vv, sc.as_ref(), p, None)
    }

    /// The `n` rows `ids` (u32 on the device) of an f16 pool `[cap, kv_heads, d]`, gathered as
    /// stored into a new `[n, kv_heads, d]` buffer.
    fn gather_f16(&self, l: &Launcher<'_>, pool: &Tensor, ids: &DeviceBuffer, n: usize) -> Result<DeviceBuffer> {
        let (cap, width) = (pool.shape()[0], pool.shape()[1..].iter().product::<usize>());
        let out = self.pool.alloc(n * width * 2)?;
        gather_rows_f16(l, self.buffer("gather_f16", pool)?, cap, ids, &out, n, width)?;
        Ok(out)
    }

    /// A step's prefill chunks as one masked flash attention (see `crate::chunks`): every
    /// chunk's keys (f16 rows as stored, and their scales) gathered one after another, the
    /// chunks' block-diagonal mask and per-row cursor. Other caches (f32, rows that are not
    /// whole 16-byte vectors, head dims the flash kernels lack) and a single chunk take the
    /// composite.
    pub(super) fn attention_chunks_op(&self, q: &Tensor, k: &Tensor, v: &Tensor, scales: Option<&Tensor>, chunks: &Chunks, scale: f32) -> Result<Tensor> {
        const OP: &str = "attention_chunks";
        let (t, heads, d) = chunks_dims(q, chunks)?;
        let n = chunks.keys();
        // shapes only: the gathered keys may outnumber the pool's rows (chunks sharing cached
        // prefix blocks gather those rows once each)
        ops::attention_dims(q, k, v, &AttnParams { kv_len: 0, q_pos0: 0, causal: false, scale })?;
        let p = AttnParams { kv_len: n, q_pos0: 0, causal: true, scale };
        ops::kv_scale_dims(OP, k, scales)?;
        let kv_heads = k.shape()[1];
        if chunks.len() == 1 || k.dtype() != DType::F16 || (kv_heads * d) % 8 != 0 || !flash_fits(d) {
            return attention_chunks_composite(self, q, k, v, scales, chunks, scale);
        }
        let l = self.enter()?;
        let ids = self.buffer(OP, chunks.all_ids())?;
        let (kk, vv) = (self.gather_f16(&l, k, ids, n)?, self.gather_f16(&l, v, ids, n)?);
        let sc = scales.map(|s| gather_cache_rows_at(self, s, chunks.all_ids())).transpose()?;
        let out = self.output(t * heads * d)?;
        let bufs = AttnBuffers { q: self.buffer(OP, q)?, k: &kk, v: &vv, out: &out, cursor: Some(self.buffer(OP, chunks.cursor())?), kv_scale: sc.as_ref().map(|s| self.buffer(OP, s)).transpose()? };
        let mask = chunks.mask();
        let extra = FlashExtra { mask: Some((self.buffer(OP, mask.packed())?, mask.q_bounds().len() - 1, mask.k_bounds().len() - 1)), rope: None };
        let shape = AttnShape { t, heads, kv_heads, d, cap: n };
        // causal through the cursor: row i sees gathered keys up to its cursor row (and, by the
        // mask, none of another chunk's)
        flash_attention(&l, DType::F16, &bufs, &extra, &shape, &p)?;
        Ok(Self::wrap(vec![t, heads, d], DType::F32, out))
    }

    pub(super) fn attention_block_sparse_op(&self, q: &Tensor, k: &Tensor, v: &Tensor, mask: &BlockMask, scale: f32, rope: Option<(&Tensor, &Tensor)>) -> Result<Tensor> {
        const OP: &str = "attention_block_sparse";
        let (t, heads, kv_heads, d) = ops::block_sparse_dims(q, k, v, (mask.rows(), mask.keys()), rope)?;
        if !flash_fits(d) {
            log_unflashed(d);
            return attention_block_sparse_composite(self, q, k, v, mask, scale, rope);
        }
        let kv_len = k.shape()[0];
        let l = self.enter()?;
        // keys and values as the kernel reads them: the tensor-core kernels take f16 (keys
        // rotated and narrowed in one pass, values narrowed); the SIMT ones f32 or f16 as given,
        // keys rotated
        let rope_bufs = rope.map(|(c, s)| Ok::<_, Error>((self.buffer(OP, c)?, self.buffer(OP, s)?))).transpose()?;
        let (mut kv_half, mut k_rot) = (None, None);
        if flash_mma(&l) && k.dtype() == DType::F32 {
            kv_half = Some(narrow_kv(self, &l, (self.buffer(OP, k)?, self.buffer(OP, v)?), None, rope_bufs, kv_len, kv_heads, d)?);
        } else if let Some((cos, sin)) = rope {
            k_rot = Some(self.rope_op(k, cos, sin)?);
        }
        let kv_dtype = if kv_half.is_some() { DType::F16 } else { k.dtype() };
        let out = self.output(t * heads * d)?;
        let shape = AttnShape { t, heads, kv_heads, d, cap: kv_len };
        let (kb, vb, sc) = match (&kv_half, &k_rot) {
            (Some((kh, vh, sc)), _) => (kh, vh, Some(sc)),
            (None, Some(kr)) => (self.buffer(OP, kr)?, self.buffer(OP, v)?, None),
            (None, None) => (self.buffer(OP, k)?, self.buffer(OP, v)?, None),
        };
        let bufs = AttnBuffers { q: self.buffer(OP, q)?, k: kb, v: vb, out: &out, cursor: None, kv_scale: sc };
        let nb = (mask.q_bounds().len() - 1, mask.k_bounds().len() - 1);
        let extra = FlashExtra { mask: Some((self.buffer(OP, mask.packed())?, nb.0, nb.1)), rope: rope_bufs };
        let p = AttnParams { kv_len, q_pos0: 0, causal: false, scale };
        flash_attention(&l, kv_dtype, &bufs, &extra, &shape, &p)?;
        Ok(Self::wrap(vec![t, heads, d], DType::F32, out))
    }

    pub(super) fn attention_cached_op(&self, q: &Tensor, k: &Tensor, v: &Tensor, scales: Option<&Tensor>, cursor: &Tensor, scale: f32) -> Result<Tensor> {
        const OP: &str = "attention_cached";
        let t = q.shape().first().copied().unwrap_or(0);
        ops::cursor_dims(OP, cursor, t)?;
        let cap = k.shape().first().copied().unwrap_or(0);
        // host-side bounds for the shape checks; the kernels take the positions from the cursor
        let p = AttnParams { kv_len: cap, q_pos0: cap.saturating_sub(t), causal: true, scale };
        let (t, heads, kv_heads, d) = ops::attention_dims(q, k, v, &p)?;
        ops::kv_scale_dims(OP, k, scales)?;
        let shape = AttnShape { t, heads, kv_heads, d, cap };
        if !split_fits(&shape) {
            return self.attention_op(q, k, v, scales, p, Some(cursor));
        }
        let splits = self.attention_splits(cap, kv_heads);
        let l = self.enter()?;
        let out = self.output(t * heads * d)?;
        let partial = self.output(t * heads * splits * (d + 2))?;
        let kv_scale = scales.map(|s| self.buffer(OP, s)).transpose()?;
        let bufs = AttnBuffers { q: self.buffer(OP, q)?, k: self.buffer(OP, k)?, v: self.buffer(OP, v)?, out: &out, cursor: Some(self.buffer(OP, cursor)?), kv_scale };
        attention_split(&l, k.dtype(), &bufs, &partial, &self.counters, &shape, splits, scale, None)?;
        Ok(Self::wrap(vec![t, heads, d], DType::F32, out))
    }

    pub(super) fn attention_paged_op(&self, q: &Tensor, k: &Tensor, v: &Tensor, scales: Option<&Tensor>, pages: &Pages, scale: f32) -> Result<Tensor> {
        const OP: &str = "attention_paged";
        let (t, heads, kv_heads, d) = ops::paged_dims(q, k, v, pages)?;
        ops::kv_scale_dims(OP, k, scales)?;
        let shape = AttnShape { t, heads, kv_heads, d, cap: k.shape()[0] };
        let zblocks = t * ceil_div(heads / kv_heads, attn_split_tile::MAX_QV);
        if !split_paged_fits(&shape) || kv_heads * zblocks > super::ARRIVAL_COUNTERS || zblocks > 65_535 {
            log_unpaged(&shape);
            if self.pool.is_recording() {
                // its slot lists go up from the host, which a recording cannot hold: refuse
                // before any copy breaks the capture (the caller runs plain launches)
                return Err(Error::Limit { op: OP, msg: format!("heads {} / kv_heads {} / head_dim {} take the gathering path, which cannot be recorded", heads, kv_heads, d) });
            }
            return attention_paged_composite(self, q, k, v, scales, pages, scale);
        }
        let l = self.enter()?;
        let out = self.output(t * heads * d)?;
        let kv_scale = scales.map(|s| self.buffer(OP, s)).transpose()?;
        let bufs = AttnBuffers { q: self.buffer(OP, q)?, k: self.buffer(OP, k)?, v: self.buffer(OP, v)?, out: &out, cursor: None, kv_scale };
        let sp = SplitPages { table: self.buffer(OP, pages.table())?, lens: self.buffer(OP, pages.lens())?, stride: pages.stride(), shift: pages.block().trailing_zeros() };
        // f16 caches on compute_80 take the kernels that stage keys and values in shared memory
        let staged = flash_mma(&l) && k.dtype() == DType::F16;
        // tensor cores (its query loads are 8 bytes wide): a block per row, KV head and chunk,
        // two per multiprocessor; a batch (rows × KV heads at least half the multiprocessors)
        // takes one chunk per row and nothing to merge, fewer rows are split over the keys, no
        // more chunks than the longest row the tables can hold has MIN_KEYS runs (fixed by the
        // table's size, so a recorded step keeps it)
        if staged && paged_mma_fits(&shape) && bufs.q.addr() % 8 == 0 && t * kv_heads <= super::ARRIVAL_COUNTERS && paged_mma() {
            let (blocks, sms) = (t * kv_heads, self.sms as usize);
            let fill = if blocks >= sms / 2 { 1 } else { 2 * sms / blocks.max(1) };
            let splits = fill.min(ceil_div(pages.stride() * pages.block(), attn_paged_mma_tile::MIN_KEYS)).clamp(1, attn_split_tile::MAX_SPLITS);
            // one chunk reads and writes no partial states: the counters stand in for the buffer
            let partial = if splits > 1 { Some(self.output(t * heads * splits * (d + 2))?) } else { None };
            attention_paged_mma(&l, &bufs, partial.as_ref().unwrap_or(&self.counters), &self.counters, &shape, splits, scale, &sp)?;
            return Ok(Self::wrap(vec![t, heads, d], DType::F32, out));
        }
        // chunks: enough blocks for four per multiprocessor over the rows, no more than the
        // longest row the tables can hold has MIN_KEYS runs (fixed by the table's size, so a
        // recorded step keeps it). The staged kernel's four blocks per multiprocessor make one
        // wave (rounded down: a row and KV head per block when the rows alone fill it, no
        // merge); the split kernel rounds up
        let (blocks, want) = (kv_heads * zblocks, 4 * self.sms as usize);
        let (fill, min_keys) = if staged { ((want / blocks).max(1), attn_paged_tile::MIN_KEYS) } else { (ceil_div(want, blocks), attn_split_tile::MIN_KEYS) };
        let splits = fill.min(ceil_div(pages.stride() * pages.block(), min_keys)).clamp(1, attn_split_tile::MAX_SPLITS);
        let partial = self.output(t * heads * splits * (d + 2))?;
        if staged {
            attention_paged_staged(&l, &bufs, &partial, &self.counters, &shape, splits, scale, &sp)?;
        } else {
            attention_split(&l, k.dtype(), &bufs, &partial, &self.counters, &shape, splits, scale, Some(&sp))?;
        }
        Ok(Self::wrap(vec![t, heads, d], DType::F32, out))
    }
}
