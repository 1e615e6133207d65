//! Rotary embeddings (`gpu/src/rope.rs`): the rotate-half `rope_f32` with host tables (the
//! vision tower), the decoder's fused `qkv_rope_append_*` (q/k RMSNorm, interleaved MRoPE
//! from the device cursor, KV-cache append), and `rope_cast_f16` (keys and values narrowed to
//! f16 with row scales, rotated or not: for the tensor-core attention and f16 cache writes).

use super::launch::{ceil_div, fits_u32, grid_dim, need, Launcher, MAX_GRID_X};
use super::{CudaBackend, DeviceBuffer};
use crate::backend::{QkvRope, KV_SCALES};
use crate::kernels::Kernel;
use crate::{ops, DType, Error, Result, Tensor};
use gpu::params::{qkv_rope_tile, QkvRopeParams, RopeCastParams, RopeParams, CURSOR_FIELDS, ROW_THREADS};

/// Rotate-half RoPE of `x [rows, heads, d]` with `cos`, `sin` `[rows, d / 2]`.
#[allow(clippy::too_many_arguments)]
pub fn rope(l: &Launcher<'_>, x: &DeviceBuffer, cos: &DeviceBuffer, sin: &DeviceBuffer, out: &DeviceBuffer, rows: usize, heads: usize, d: usize) -> Result<()> {
    let kernel = Kernel::RopeF32;
    if d % 2 != 0 {
        return Err(Error::Limit { op: kernel.name(), msg: format!("head_dim {} is odd", d) });
    }
    need(kernel, "x", x, rows * heads * d * 4)?;
    need(kernel, "cos", cos, rows * d / 2 * 4)?;
    need(kernel, "sin", sin, rows * d / 2 * 4)?;
    need(kernel, "out", out, rows * heads * d * 4)?;
    let p = RopeParams { x: x.addr(), cos: cos.addr(), sin: sin.addr(), out: out.addr(), rows: fits_u32(kernel, "rows", rows)?, heads: fits_u32(kernel, "heads", heads)?, d: fits_u32(kernel, "d", d)?, _pad: 0 };
    if rows == 0 || heads == 0 || d == 0 {
        return Ok(());
    }
    l.launch(kernel, [grid_dim(kernel, "x", rows, MAX_GRID_X)?, 1, 1], ROW_THREADS, &p)
}

/// Buffers of one `qkv_rope_append` launch.
pub struct QkvBuffers<'a> {
    pub qkv: &'a DeviceBuffer,
    pub q_norm: &'a DeviceBuffer,
    pub k_norm: &'a DeviceBuffer,
    pub inv_freq: &'a DeviceBuffer,
    pub cursor: &'a DeviceBuffer,
    pub q_out: &'a DeviceBuffer,
    pub k_cache: &'a DeviceBuffer,
    pub v_cache: &'a DeviceBuffer,
    /// `[cap, kv_heads, 2]` f32 row scales of an f16 cache (`crate::backend::KV_SCALES`).
    pub kv_scale: Option<&'a DeviceBuffer>,
}

/// QKV norm + MRoPE + cache append for `t` rows into caches of `cap` rows of `cache_dtype`.
pub fn qkv_rope_append(l: &Launcher<'_>, cache_dtype: DType, b: &QkvBuffers<'_>, p: &QkvRope<'_>, t: usize, cap: usize) -> Result<()> {
    let kernel = Kernel::by_kv(cache_dtype, [Kernel::QkvRopeAppendF32, Kernel::QkvRopeAppendF16])?;
    let (h, kv, d) = (p.heads, p.kv_heads, p.head_dim);
    if d > qkv_rope_tile::MAX_D || d % 2 != 0 {
        return Err(Error::Limit { op: kernel.name(), msg: format!("head_dim {} must be even and at most {}", d, qkv_rope_tile::MAX_D) });
    }
    need(kernel, "qkv", b.qkv, t * (h + 2 * kv) * d * 4)?;
    need(kernel, "q_norm", b.q_norm, d * 4)?;
    need(kernel, "k_norm", b.k_norm, d * 4)?;
    need(kernel, "inv_freq", b.inv_freq, d / 2 * 4)?;
    need(kernel, "cursor", b.cursor, t * CURSOR_FIELDS * 4)?;
    need(kernel, "q_out", b.q_out, t * h * d * 4)?;
    need(kernel, "k_cache", b.k_cache, cap * kv * d * cache_dtype.size_of())?;
    need(kernel, "v_cache", b.v_cache, cap * kv * d * cache_dtype.size_of())?;
    if let Some(sc) = b.kv_scale {
        need(kernel, "kv_scale", sc, cap * kv * KV_SCALES * 4)?;
    }
    let s = |i: usize| fits_u32(kernel, "mrope section", p.section[i]);
    let params = QkvRopeParams {
        qkv: b.qkv.addr(),
        q_norm: b.q_norm.addr(),
        k_norm: b.k_norm.addr(),
        inv_freq: b.inv_freq.addr(),
        cursor: b.cursor.addr(),
        q_out: b.q_out.addr(),
        k_cache: b.k_cache.addr(),
        v_cache: b.v_cache.addr(),
        kv_scale: b.kv_scale.map_or(0, |s| s.addr()),
        kv_flag: l.kv_flag,
        t: fits_u32(kernel, "t", t)?,
        heads: fits_u32(kernel, "heads", h)?,
        kv_heads: fits_u32(kernel, "kv_heads", kv)?,
        d: fits_u32(kernel, "d", d)?,
        cap: fits_u32(kernel, "cap", cap)?,
        eps: p.eps,
        section: [s(0)?, s(1)?, s(2)?],
        _pad: 0,
    };
    let items = t * (h + 2 * kv);
    if items == 0 {
        return Ok(());
    }
    l.launch(kernel, [grid_dim(kernel, "x", ceil_div(items, qkv_rope_tile::WARPS as usize), MAX_GRID_X)?, 1, 1], qkv_rope_tile::THREADS, &params)
}

impl CudaBackend {
    pub(super) fn rope_op(&self, x: &Tensor, cos: &Tensor, sin: &Tensor) -> Result<Tensor> {
        let (rows, heads, d) = ops::rope_dims(x, cos, sin)?;
        let l = self.enter()?;
        let out = self.output(rows * heads * d)?;
        rope(&l, self.buffer("rope", x)?, self.buffer("rope", cos)?, self.buffer("rope", sin)?, &out, rows, heads, d)?;
        Ok(Self::wrap(x.shape().to_vec(), DType::F32, out))
    }

    pub(super) fn qkv_rope_append_op(&self, qkv: &Tensor, p: &QkvRope<'_>, cursor: &Tensor, k_cache: &mut Tensor, v_cache: &mut Tensor, scales: Option<&mut Tensor>) -> Result<Tensor> {
        const OP: &str = "qkv_rope_append";
        let t = ops::qkv_rope_dims(qkv, p, cursor, k_cache, v_cache)?;
        ops::kv_scale_dims(OP, k_cache, scales.as_deref())?;
        let l = self.enter()?;
        let q_out = self.output(t * p.heads * p.head_dim)?;
        let bufs = QkvBuffers {
            qkv: self.buffer(OP, qkv)?,
            q_norm: self.buffer(OP, p.q_norm)?,
            k_norm: self.buffer(OP, p.k_norm)?,
            inv_freq: self.buffer(OP, p.inv_freq)?,
            cursor: self.buffer(OP, cursor)?,
            q_out: &q_out,
            k_cache: self.buffer(OP, k_cache)?,
            v_cache: self.buffer(OP, v_cache)?,
            kv_scale: scales.as_deref().map(|s| self.buffer(OP, s)).transpose()?,
        };
        qkv_rope_append(&l, k_cache.dtype(), &bufs, p, t, k_cache.shape()[0])?;
        Ok(Self::wrap(vec![t, p.heads, p.head_dim], DType::F32, q_out))
    }
}

/// Row scales a [`rope_cast_f16`] reads or writes: the `[rows, heads, 2]` f32 buffer and the
/// plane (0: keys, 1: values).
pub type ScalePlane<'a> = (&'a DeviceBuffer, usize);

/// `out[row0 ..] = f16(rope(x · s_in) / s)` for `x [rows, heads, d]` f32 (no rotation without
/// `rope`; `s_in` from `scale_in` or 1), each (row, head) vector divided by its
/// `gpu::math::f16_key_scale` (`f16_value_scale` for plane 1), written to `scale_out` at rows
/// `row0 ..` (without `scale_out`, narrowed as is): keys and values narrowed for the
/// tensor-core attention, and f16 KV-cache rows with their scales.
#[allow(clippy::too_many_arguments)]
pub fn rope_cast_f16(l: &Launcher<'_>, x: &DeviceBuffer, rope: Option<(&DeviceBuffer, &DeviceBuffer)>, scale_in: Option<ScalePlane<'_>>, (out, row0): (&DeviceBuffer, usize), scale_out: Option<ScalePlane<'_>>, rows: usize, heads: usize, d: usize) -> Result<()> {
    let kernel = Kernel::RopeCastF16;
    if d % 2 != 0 || d > 64 * qkv_rope_tile::CAST_PAIRS {
        return Err(Error::Limit { op: kernel.name(), msg: format!("head_dim {} must be even and at most {}", d, 64 * qkv_rope_tile::CAST_PAIRS) });
    }
    need(kernel, "x", x, rows * heads * d * 4)?;
    need(kernel, "out", out, (row0 + rows) * heads * d * 2)?;
    if let Some((cos, sin)) = rope {
        need(kernel, "cos", cos, rows * d / 2 * 4)?;
        need(kernel, "sin", sin, rows * d / 2 * 4)?;
    }
    // the address of plane `which` at row `from`, after checking rows up to `from + rows`
    let plane = |name, sc: Option<ScalePlane<'_>>, from: usize| -> Result<u64> {
        match sc {
            None => Ok(0),
            Some((_, which)) if which >= KV_SCALES => Err(Error::Limit { op: kernel.name(), msg: format!("scale plane {} of {}", which, KV_SCALES) }),
            Some((b, which)) => {
                need(kernel, name, b, (from + rows) * heads * KV_SCALES * 4)?;
                Ok(b.addr() + ((from * heads * KV_SCALES + which) * 4) as u64)
            }
        }
    };
    let p = RopeCastParams {
        x: x.addr(),
        cos: rope.map_or(0, |r| r.0.addr()),
        sin: rope.map_or(0, |r| r.1.addr()),
        out: out.addr() + (row0 * heads * d * 2) as u64,
        scale_out: plane("scale_out", scale_out, row0)?,
        scale_in: plane("scale_in", scale_in, 0)?,
        kv_flag: l.kv_flag,
        rows: fits_u32(kernel, "rows", rows)?,
        heads: fits_u32(kernel, "heads", heads)?,
        d: fits_u32(kernel, "d", d)?,
        values: scale_out.map_or(0, |s| (s.1 == 1) as u32),
    };
    if rows == 0 || heads == 0 || d == 0 {
        return Ok(());
    }
    // four pairs a lane where the head dim and the alignments allow (16-byte loads)
    let aligned = (p.x | p.cos | p.sin) % 16 == 0 && p.out % 8 == 0;
    if d % 8 == 0 && 32 % (d / 8) == 0 && aligned {
        let per_block = qkv_rope_tile::WARPS as usize * (32 / (d / 8));
        return l.launch(Kernel::RopeCastX4F16, [grid_dim(Kernel::RopeCastX4F16, "x", ceil_div(rows * heads, per_block), MAX_GRID_X)?, 1, 1], qkv_rope_tile::THREADS, &p);
    }
    l.launch(kernel, [grid_dim(kernel, "x", ceil_div(rows * heads, qkv_rope_tile::WARPS as usize), MAX_GRID_X)?, 1, 1], qkv_rope_tile::THREADS, &p)
}
