//! Row gathers, scatters and copies (`gpu/src/embedding.rs`, plus driver copies): the embedding
//! lookup, f16 rows gathered as stored (a paged cache's), the row blend, image rows into the
//! prompt, and the KV-cache and row/column copies.

use super::elementwise::cast_f16;
use super::launch::{fits_u32, grid_dim, need, Launcher, OkOrCuda, MAX_GRID_X};
use super::rope::rope_cast_f16;
use super::{CudaBackend, DeviceBuffer};
use crate::kernels::Kernel;
use crate::{ops, DType, Error, Result, Tensor};
use gpu::params::{BlendRowsParams, EmbeddingParams, ScatterRowsParams, ROW_THREADS};

/// The parameters of a row gather of `rows` rows of `hidden` from `table` (`vocab` rows, `elem`
/// bytes an element) by the u32 `ids` into `out` (`out_elem` bytes an element), sizes checked.
#[allow(clippy::too_many_arguments)]
fn gather_params(kernel: Kernel, (table, elem): (&DeviceBuffer, usize), vocab: usize, ids: &DeviceBuffer, (out, out_elem): (&DeviceBuffer, usize), rows: usize, hidden: usize) -> Result<EmbeddingParams> {
    need(kernel, "table", table, vocab * hidden * elem)?;
    need(kernel, "ids", ids, rows * 4)?;
    need(kernel, "out", out, rows * hidden * out_elem)?;
    Ok(EmbeddingParams {
        table: table.addr(),
        ids: ids.addr(),
        out: out.addr(),
        rows: fits_u32(kernel, "rows", rows)?,
        hidden: fits_u32(kernel, "hidden", hidden)?,
        vocab: fits_u32(kernel, "vocab", vocab)?,
        _pad: 0,
    })
}

/// Gathers `rows` rows of `hidden` from `table` (of `dtype`, `vocab` rows) by the u32 `ids`.
#[allow(clippy::too_many_arguments)]
pub fn embedding(l: &Launcher<'_>, dtype: DType, table: &DeviceBuffer, vocab: usize, ids: &DeviceBuffer, out: &DeviceBuffer, rows: usize, hidden: usize) -> Result<()> {
    let kernel = Kernel::embedding(dtype)?;
    let p = gather_params(kernel, (table, dtype.size_of()), vocab, ids, (out, 4), rows, hidden)?;
    if rows == 0 || hidden == 0 {
        return Ok(());
    }
    l.launch(kernel, [grid_dim(kernel, "x", rows, MAX_GRID_X)?, 1, 1], ROW_THREADS, &p)
}

/// Gathers `rows` f16 rows of `hidden` (a multiple of 8) from `table` (`vocab` rows) by the u32
/// `ids` into `out`, kept f16 (`gather_rows_f16`, `gpu/src/embedding.rs`): a paged cache's keys
/// and values in a sequence's order, for the flash kernels.
pub fn gather_rows_f16(l: &Launcher<'_>, table: &DeviceBuffer, vocab: usize, ids: &DeviceBuffer, out: &DeviceBuffer, rows: usize, hidden: usize) -> Result<()> {
    let kernel = Kernel::GatherRowsF16;
    if hidden % 8 != 0 {
        return Err(Error::Limit { op: kernel.name(), msg: format!("rows of {} elements (a multiple of 8: 16-byte vectors)", hidden) });
    }
    let p = gather_params(kernel, (table, 2), vocab, ids, (out, 2), rows, hidden)?;
    let vectors = rows * hidden / 8;
    if vectors == 0 {
        return Ok(());
    }
    l.launch(kernel, [grid_dim(kernel, "x", vectors.div_ceil(ROW_THREADS as usize).min(65_535 * 8), MAX_GRID_X)?, 1, 1], ROW_THREADS, &p)
}

/// `out [rows, width]` = rows of the f32 `table [vocab, width]` blended by `ids` and `weights`
/// (`[rows · per_row]` each, in one buffer: the u32 ids, then the f32 weights).
#[allow(clippy::too_many_arguments)]
pub fn blend_rows(l: &Launcher<'_>, table: &DeviceBuffer, vocab: usize, ids_weights: &DeviceBuffer, out: &DeviceBuffer, rows: usize, width: usize, per_row: usize) -> Result<()> {
    let kernel = Kernel::BlendRowsF32;
    need(kernel, "table", table, vocab * width * 4)?;
    need(kernel, "ids and weights", ids_weights, 2 * rows * per_row * 4)?;
    need(kernel, "out", out, rows * width * 4)?;
    let p = BlendRowsParams {
        table: table.addr(),
        ids: ids_weights.addr(),
        weights: ids_weights.addr() + (rows * per_row * 4) as u64,
        out: out.addr(),
        rows: fits_u32(kernel, "rows", rows)?,
        width: fits_u32(kernel, "width", width)?,
        vocab: fits_u32(kernel, "vocab", vocab)?,
        per_row: fits_u32(kernel, "per_row", per_row)?,
    };
    if rows == 0 || width == 0 {
        return Ok(());
    }
    l.launch(kernel, [grid_dim(kernel, "x", rows, MAX_GRID_X)?, 1, 1], ROW_THREADS, &p)
}

/// `out[rows[i]] (+)= src[i]` for `count` rows of `width`; `out` has `n` rows.
#[allow(clippy::too_many_arguments)]
pub fn scatter_rows(l: &Launcher<'_>, out: &DeviceBuffer, n: usize, rows: &DeviceBuffer, src: &DeviceBuffer, count: usize, width: usize, add: bool) -> Result<()> {
    let kernel = Kernel::ScatterRowsF32;
    need(kernel, "out", out, n * width * 4)?;
    need(kernel, "rows", rows, count * 4)?;
    need(kernel, "src", src, count * width * 4)?;
    let p = ScatterRowsParams { out: out.addr(), rows: rows.addr(), src: src.addr(), count: fits_u32(kernel, "count", count)?, width: fits_u32(kernel, "width", width)?, add: add as u32, _pad: 0 };
    if count == 0 || width == 0 {
        return Ok(());
    }
    l.launch(kernel, [grid_dim(kernel, "x", count, MAX_GRID_X)?, 1, 1], ROW_THREADS, &p)
}

impl CudaBackend {
    pub(super) fn embedding_gather_op(&self, table: &Tensor, ids: &Tensor) -> Result<Tensor> {
        const OP: &str = "embedding_gather";
        ops::expect_weight(OP, table)?;
        ops::expect_dtype(OP, ids, DType::U32)?;
        if table.shape().len() != 2 || ids.shape().len() != 1 {
            return Err(Error::shape(OP, &[table.shape(), ids.shape()], "table must be [vocab, hidden] and ids [rows]"));
        }
        if table.dtype().is_quantized() {
            return self.qembedding_gather_op(table, ids);
        }
        let (vocab, hidden, rows) = (table.shape()[0], table.shape()[1], ids.shape()[0]);
        let l = self.enter()?;
        let out = self.output(rows * hidden)?;
        embedding(&l, table.dtype(), self.buffer(OP, table)?, vocab, self.buffer(OP, ids)?, &out, rows, hidden)?;
        Ok(Self::wrap(vec![rows, hidden], DType::F32, out))
    }

    pub(super) fn blend_rows_op(&self, table: &Tensor, ids: &[u32], weights: &[f32], per_row: usize) -> Result<Tensor> {
        const OP: &str = "blend_rows";
        let (rows, width) = ops::blend_rows_dims(table, ids, weights, per_row)?;
        // one upload for both: the ids, then the weights' bits
        let packed: Vec<u32> = ids.iter().copied().chain(weights.iter().map(|w| w.to_bits())).collect();
        let iw = self.upload_raw(packed.as_ptr() as *const u8, packed.len() * 4)?;
        let l = self.enter()?;
        let out = self.output(rows * width)?;
        blend_rows(&l, self.buffer(OP, table)?, table.shape()[0], &iw, &out, rows, width, per_row)?;
        Ok(Self::wrap(vec![rows, width], DType::F32, out))
    }

    pub(super) fn write_rows_op(&self, dst: &mut Tensor, row0: usize, src: &Tensor) -> Result<()> {
        let (rows, row_len) = ops::write_rows_dims(dst, row0, src)?;
        let elem = dst.dtype().size_of();
        let (d, s) = (self.buffer("write_rows", dst)?, self.buffer("write_rows", src)?);
        let at = d.addr() + (row0 * row_len * elem) as u64;
        let l = self.enter()?;
        if dst.dtype() == DType::F16 {
            return cast_f16(&l, s, at, rows * row_len);
        }
        if rows * row_len > 0 {
            unsafe { cust::sys::cuMemcpyDtoDAsync_v2(at, s.addr(), rows * row_len * 4, l.stream) }.ok_or_cuda("cuMemcpyDtoDAsync (write_rows)")?;
        }
        Ok(())
    }

    pub(super) fn write_kv_rows_op(&self, dst: &mut Tensor, scales: Option<(&mut Tensor, usize)>, row0: usize, src: &Tensor) -> Result<()> {
        const OP: &str = "write_kv_rows";
        let (sc, which) = match scales {
            Some(s) => s,
            None => return self.write_rows_op(dst, row0, src),
        };
        let (rows, _) = ops::write_rows_dims(dst, row0, src)?;
        ops::expect_dtype(OP, dst, DType::F16)?;
        ops::kv_scale_dims(OP, dst, Some(sc))?;
        let (kv_heads, d) = (dst.shape()[1], dst.shape()[2]);
        let l = self.enter()?;
        rope_cast_f16(&l, self.buffer(OP, src)?, None, None, (self.buffer(OP, dst)?, row0), Some((self.buffer(OP, sc)?, which)), rows, kv_heads, d)
    }

    pub(super) fn narrow_cols_op(&self, x: &Tensor, col0: usize, width: usize) -> Result<Tensor> {
        let (rows, cols) = ops::narrow_cols_dims(x, col0, width)?;
        let src = self.buffer("narrow_cols", x)?;
        let l = self.enter()?;
        let out = self.pool.alloc(rows * width * 4)?;
        if rows * width > 0 {
            let copy = cust::sys::CUDA_MEMCPY2D {
                srcXInBytes: col0 * 4,
                srcY: 0,
                srcMemoryType: cust::sys::CUmemorytype::CU_MEMORYTYPE_DEVICE,
                srcHost: std::ptr::null(),
                srcDevice: src.addr(),
                srcArray: std::ptr::null_mut(),
                srcPitch: cols * 4,
                dstXInBytes: 0,
                dstY: 0,
                dstMemoryType: cust::sys::CUmemorytype::CU_MEMORYTYPE_DEVICE,
                dstHost: std::ptr::null_mut(),
                dstDevice: out.addr(),
                dstArray: std::ptr::null_mut(),
                dstPitch: width * 4,
                WidthInBytes: width * 4,
                Height: rows,
            };
            unsafe { cust::sys::cuMemcpy2DAsync_v2(&copy, l.stream) }.ok_or_cuda("cuMemcpy2DAsync (narrow_cols)")?;
        }
        Ok(Self::wrap(vec![rows, width], DType::F32, out))
    }

    pub(super) fn scatter_rows_op(&self, x: &Tensor, rows: &[usize], src: &Tensor, add: bool) -> Result<Tensor> {
        let (n, width) = ops::scatter_rows_dims(x, rows, src)?;
        let mut seen = std::collections::HashSet::new();
        if !rows.iter().all(|r| seen.insert(*r)) {
            return Err(Error::Limit { op: "scatter_rows", msg: "row indices must be distinct".into() });
        }
        let out = self.take_rows_op(x, 0, n)?.reshape(x.shape())?;
        let idx: Vec<u32> = rows.iter().map(|&r| r as u32).collect();
        let idx = self.upload_raw(idx.as_ptr() as *const u8, idx.len() * 4)?;
        let l = self.enter()?;
        scatter_rows(&l, self.buffer("scatter_rows", &out)?, n, &idx, self.buffer("scatter_rows", src)?, rows.len(), width, add)?;
        Ok(out)
    }

    pub(super) fn take_rows_op(&self, x: &Tensor, row0: usize, count: usize) -> Result<Tensor> {
        let (row_len, shape) = ops::take_rows_dims(x, row0, count)?;
        let elem = x.dtype().size_of();
        let src = self.buffer("take_rows", x)?;
        let l = self.enter()?;
        let out = self.pool.alloc(count * row_len * elem)?;
        if count * row_len > 0 {
            let offset = (row0 * row_len * elem) as u64;
            unsafe { cust::sys::cuMemcpyDtoDAsync_v2(out.addr(), src.addr() + offset, count * row_len * elem, l.stream) }.ok_or_cuda("cuMemcpyDtoDAsync (take_rows)")?;
        }
        Ok(Self::wrap(shape, x.dtype(), out))
    }
}
