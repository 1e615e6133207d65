//! Row-wise kernels (`gpu/src/norm.rs`, `gpu/src/softmax.rs`): RMSNorm, LayerNorm and softmax,
//! one block per row.

use super::launch::{fits_u32, grid_dim, need, Launcher, MAX_GRID_X};
use super::{CudaBackend, DeviceBuffer};
use crate::kernels::Kernel;
use crate::{ops, DType, Result, Tensor};
use gpu::params::{LayerNormParams, RmsNormParams, SoftmaxParams, ROW_THREADS, WARP_ROWS};

/// RMSNorm of `rows` rows of `cols` f32.
pub fn rms_norm(l: &Launcher<'_>, x: &DeviceBuffer, w: &DeviceBuffer, y: &DeviceBuffer, rows: usize, cols: usize, eps: f32) -> Result<()> {
    let kernel = Kernel::RmsNormF32;
    need(kernel, "x", x, rows * cols * 4)?;
    need(kernel, "w", w, cols * 4)?;
    need(kernel, "y", y, rows * cols * 4)?;
    let p = RmsNormParams { x: x.addr(), w: w.addr(), y: y.addr(), rows: fits_u32(kernel, "rows", rows)?, n: fits_u32(kernel, "cols", cols)?, eps, _pad: 0 };
    if rows == 0 || cols == 0 {
        return Ok(());
    }
    l.launch(kernel, [grid_dim(kernel, "x", rows, MAX_GRID_X)?, 1, 1], ROW_THREADS, &p)
}

/// RMSNorm of `rows` rows of `cols` f32 rounded to bf16 into `y` (`[rows, cols]` 16-bit: the
/// 16-bit activations of `Precision::Bf16`'s pipelined GEMMs); `cols % 8 == 0`.
pub fn rms_norm_a16(l: &Launcher<'_>, x: &DeviceBuffer, w: &DeviceBuffer, y: &DeviceBuffer, rows: usize, cols: usize, eps: f32) -> Result<()> {
    let kernel = Kernel::RmsNormA16Bf16;
    need(kernel, "x", x, rows * cols * 4)?;
    need(kernel, "w", w, cols * 4)?;
    need(kernel, "y", y, rows * cols * 2)?;
    if cols % 8 != 0 || (x.addr() | w.addr()) % 16 != 0 {
        return Err(crate::Error::Limit { op: kernel.name(), msg: format!("needs rows of whole 16-byte vectors (cols = {}) and 16-byte aligned x and w", cols) });
    }
    let p = RmsNormParams { x: x.addr(), w: w.addr(), y: y.addr(), rows: fits_u32(kernel, "rows", rows)?, n: fits_u32(kernel, "cols", cols)?, eps, _pad: 0 };
    if rows == 0 || cols == 0 {
        return Ok(());
    }
    l.launch(kernel, [grid_dim(kernel, "x", rows, MAX_GRID_X)?, 1, 1], ROW_THREADS, &p)
}

/// LayerNorm of `rows` rows of `cols` f32.
#[allow(clippy::too_many_arguments)]
pub fn layer_norm(l: &Launcher<'_>, x: &DeviceBuffer, w: &DeviceBuffer, b: &DeviceBuffer, y: &DeviceBuffer, rows: usize, cols: usize, eps: f32) -> Result<()> {
    let kernel = Kernel::LayerNormF32;
    need(kernel, "x", x, rows * cols * 4)?;
    need(kernel, "w", w, cols * 4)?;
    need(kernel, "b", b, cols * 4)?;
    need(kernel, "y", y, rows * cols * 4)?;
    let p = LayerNormParams { x: x.addr(), w: w.addr(), b: b.addr(), y: y.addr(), rows: fits_u32(kernel, "rows", rows)?, n: fits_u32(kernel, "cols", cols)?, eps, _pad: 0 };
    if rows == 0 || cols == 0 {
        return Ok(());
    }
    l.launch(kernel, [grid_dim(kernel, "x", rows, MAX_GRID_X)?, 1, 1], ROW_THREADS, &p)
}

/// LayerNorm of `rows` rows of `cols` f32 rounded to bf16 into `y` (`[rows, cols]` 16-bit, as
/// [`rms_norm_a16`]); `cols % 8 == 0`.
#[allow(clippy::too_many_arguments)]
pub fn layer_norm_a16(l: &Launcher<'_>, x: &DeviceBuffer, w: &DeviceBuffer, b: &DeviceBuffer, y: &DeviceBuffer, rows: usize, cols: usize, eps: f32) -> Result<()> {
    let kernel = Kernel::LayerNormA16Bf16;
    need(kernel, "x", x, rows * cols * 4)?;
    need(kernel, "w", w, cols * 4)?;
    need(kernel, "b", b, cols * 4)?;
    need(kernel, "y", y, rows * cols * 2)?;
    if cols % 8 != 0 || (x.addr() | w.addr() | b.addr()) % 16 != 0 {
        return Err(crate::Error::Limit { op: kernel.name(), msg: format!("needs rows of whole 16-byte vectors (cols = {}) and 16-byte aligned x, w and b", cols) });
    }
    let p = LayerNormParams { x: x.addr(), w: w.addr(), b: b.addr(), y: y.addr(), rows: fits_u32(kernel, "rows", rows)?, n: fits_u32(kernel, "cols", cols)?, eps, _pad: 0 };
    if rows == 0 || cols == 0 {
        return Ok(());
    }
    // a warp per row
    l.launch(kernel, [grid_dim(kernel, "x", rows.div_ceil(WARP_ROWS), MAX_GRID_X)?, 1, 1], ROW_THREADS, &p)
}

/// Softmax of `rows` rows of `cols` f32.
pub fn softmax(l: &Launcher<'_>, x: &DeviceBuffer, y: &DeviceBuffer, rows: usize, cols: usize) -> Result<()> {
    let kernel = Kernel::SoftmaxF32;
    need(kernel, "x", x, rows * cols * 4)?;
    need(kernel, "y", y, rows * cols * 4)?;
    let p = SoftmaxParams { x: x.addr(), y: y.addr(), rows: fits_u32(kernel, "rows", rows)?, n: fits_u32(kernel, "cols", cols)? };
    if rows == 0 || cols == 0 {
        return Ok(());
    }
    l.launch(kernel, [grid_dim(kernel, "x", rows, MAX_GRID_X)?, 1, 1], ROW_THREADS, &p)
}

impl CudaBackend {
    pub(super) fn rms_norm_op(&self, x: &Tensor, w: &Tensor, eps: f32) -> Result<Tensor> {
        let (rows, cols) = ops::rms_norm_dims(x, w)?;
        let l = self.enter()?;
        let out = self.output(rows * cols)?;
        rms_norm(&l, self.buffer("rms_norm", x)?, self.buffer("rms_norm", w)?, &out, rows, cols, eps)?;
        Ok(Self::wrap(x.shape().to_vec(), DType::F32, out))
    }

    pub(super) fn layer_norm_op(&self, x: &Tensor, w: &Tensor, b: &Tensor, eps: f32) -> Result<Tensor> {
        let (rows, cols) = ops::layer_norm_dims(x, w, b)?;
        let l = self.enter()?;
        let out = self.output(rows * cols)?;
        layer_norm(&l, self.buffer("layer_norm", x)?, self.buffer("layer_norm", w)?, self.buffer("layer_norm", b)?, &out, rows, cols, eps)?;
        Ok(Self::wrap(x.shape().to_vec(), DType::F32, out))
    }

    pub(super) fn softmax_op(&self, x: &Tensor) -> Result<Tensor> {
        let (rows, cols) = ops::softmax_dims(x)?;
        let l = self.enter()?;
        let out = self.output(rows * cols)?;
        softmax(&l, self.buffer("softmax", x)?, &out, rows, cols)?;
        Ok(Self::wrap(x.shape().to_vec(), DType::F32, out))
    }
}
