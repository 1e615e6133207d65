//! Checked launchers: one function per kernel family. Each validates that the buffers hold
//! the sizes it is given and that the launch shape is within the device's limits, returns
//! `Err` (naming the kernel) before launching otherwise, and then launches on the stream.

use super::pool::DeviceBuffer;
use crate::kernels::Kernel;
use crate::{DType, Error, Result};
use cust::function::{BlockSize, GridSize};
use cust::module::Module;
use cust::stream::Stream;
use gpu::params::{
    attention_tile, gemv_tile, matmul_tile, AttentionParams, BinaryParams, EmbeddingParams, LayerNormParams, ScatterRowsParams, UnaryParams, LinearParams, RmsNormParams, RopeParams, SoftmaxParams, ELEMENTWISE_THREADS, ROW_THREADS,
};
use std::ffi::c_void;

const MAX_GRID_X: usize = (1 << 31) - 1;
const MAX_GRID_Y: usize = 65_535;

/// The module and stream kernels are launched with.
pub struct Launcher<'a> {
    pub module: &'a Module,
    pub stream: &'a Stream,
}

impl Launcher<'_> {
    /// Launches `kernel` with its single parameter struct `params`.
    fn launch<P: Copy>(&self, kernel: Kernel, grid: GridSize, block: BlockSize, params: &P) -> Result<()> {
        let f = self.module.get_function(kernel.name()).map_err(|e| cuda_err(kernel.name(), e))?;
        let args = [params as *const P as *mut c_void];
        unsafe { self.stream.launch(&f, grid, block, 0, &args) }.map_err(|e| cuda_err(kernel.name(), e))
    }
}

pub fn cuda_err(op: &str, e: cust::error::CudaError) -> Error {
    Error::Cuda { op: op.to_string(), msg: e.to_string() }
}

/// Turns a raw driver status into a `Result` naming the call.
pub trait OkOrCuda {
    fn ok_or_cuda(self, op: &str) -> Result<()>;
}

impl OkOrCuda for cust::sys::CUresult {
    fn ok_or_cuda(self, op: &str) -> Result<()> {
        if self == cust::sys::CUresult::CUDA_SUCCESS {
            Ok(())
        } else {
            Err(Error::Cuda { op: op.to_string(), msg: format!("{:?}", self) })
        }
    }
}

fn need(kernel: Kernel, what: &str, buf: &DeviceBuffer, bytes: usize) -> Result<()> {
    if buf.len() < bytes {
        return Err(Error::Limit {
            op: kernel.name(),
            msg: format!("{} buffer holds {} bytes, the launch reads or writes {}", what, buf.len(), bytes),
        });
    }
    Ok(())
}

fn fits_u32(kernel: Kernel, what: &str, v: usize) -> Result<u32> {
    if v > u32::MAX as usize {
        return Err(Error::Limit { op: kernel.name(), msg: format!("{} = {} exceeds u32", what, v) });
    }
    Ok(v as u32)
}

fn grid_dim(kernel: Kernel, axis: &str, v: usize, max: usize) -> Result<u32> {
    if v > max {
        return Err(Error::Limit { op: kernel.name(), msg: format!("grid {} = {} exceeds the limit {}", axis, v, max) });
    }
    Ok(v as u32)
}

/// Which kernel computes a linear layer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LinearAlgo {
    /// `matmul_*`: shared-memory tiles, for prefill-sized `m`.
    Tiled,
    /// `gemv_*`: one warp per output, for decode-sized `m`.
    Gemv,
}

/// `c[m, n] = a[m, k] · w[n, k]ᵀ (+ bias)`, all contiguous. Empty sizes launch nothing.
#[allow(clippy::too_many_arguments)]
pub fn linear(
    l: &Launcher<'_>,
    algo: LinearAlgo,
    wdtype: DType,
    a: &DeviceBuffer,
    w: &DeviceBuffer,
    bias: Option<&DeviceBuffer>,
    c: &DeviceBuffer,
    (m, n, k): (usize, usize, usize),
) -> Result<()> {
    let kernel = match algo {
        LinearAlgo::Tiled => Kernel::matmul(wdtype),
        LinearAlgo::Gemv => Kernel::gemv(wdtype),
    };
    need(kernel, "a", a, m * k * 4)?;
    need(kernel, "w", w, n * k * wdtype.size_of())?;
    need(kernel, "c", c, m * n * 4)?;
    if let Some(b) = bias {
        need(kernel, "bias", b, n * 4)?;
    }
    let p = LinearParams {
        a: a.addr(),
        w: w.addr(),
        bias: bias.map_or(0, |b| b.addr()),
        c: c.addr(),
        m: fits_u32(kernel, "m", m)?,
        n: fits_u32(kernel, "n", n)?,
        k: fits_u32(kernel, "k", k)?,
        lda: fits_u32(kernel, "k", k)?,
        ldc: fits_u32(kernel, "n", n)?,
        _pad: 0,
    };
    if m == 0 || n == 0 {
        return Ok(());
    }
    let (grid, block) = match algo {
        LinearAlgo::Tiled => (
            GridSize::xy(
                grid_dim(kernel, "x", ceil_div(n, matmul_tile::BN as usize), MAX_GRID_X)?,
                grid_dim(kernel, "y", ceil_div(m, matmul_tile::BM as usize), MAX_GRID_Y)?,
            ),
            BlockSize::x(matmul_tile::THREADS),
        ),
        LinearAlgo::Gemv => (
            GridSize::xy(
                grid_dim(kernel, "x", ceil_div(n, gemv_tile::WARPS as usize), MAX_GRID_X)?,
                grid_dim(kernel, "y", m, MAX_GRID_Y)?,
            ),
            BlockSize::x(gemv_tile::THREADS),
        ),
    };
    l.launch(kernel, grid, block, &p)
}

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
    l.launch(kernel, GridSize::x(grid_dim(kernel, "x", rows, MAX_GRID_X)?), BlockSize::x(ROW_THREADS), &p)
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
    l.launch(kernel, GridSize::x(grid_dim(kernel, "x", rows, MAX_GRID_X)?), BlockSize::x(ROW_THREADS), &p)
}

/// An elementwise unary kernel (`gelu_tanh_f32`, `gelu_erf_f32`) over `len` f32.
pub fn unary(l: &Launcher<'_>, kernel: Kernel, x: &DeviceBuffer, out: &DeviceBuffer, len: usize) -> Result<()> {
    need(kernel, "x", x, len * 4)?;
    need(kernel, "out", out, len * 4)?;
    if len == 0 {
        return Ok(());
    }
    let p = UnaryParams { x: x.addr(), out: out.addr(), len: len as u64 };
    let blocks = ceil_div(len, ELEMENTWISE_THREADS as usize).min(65_535 * 8);
    l.launch(kernel, GridSize::x(blocks as u32), BlockSize::x(ELEMENTWISE_THREADS), &p)
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
    l.launch(kernel, GridSize::x(grid_dim(kernel, "x", rows, MAX_GRID_X)?), BlockSize::x(ROW_THREADS), &p)
}

/// An elementwise binary kernel (`silu_mul_f32`: a = gate, b = up; `add_f32`) over `len` f32.
pub fn binary(l: &Launcher<'_>, kernel: Kernel, a: &DeviceBuffer, b: &DeviceBuffer, out: &DeviceBuffer, len: usize) -> Result<()> {
    for (what, buf) in [("a", a), ("b", b), ("out", out)] {
        need(kernel, what, buf, len * 4)?;
    }
    if len == 0 {
        return Ok(());
    }
    let p = BinaryParams { a: a.addr(), b: b.addr(), out: out.addr(), len: len as u64 };
    let blocks = ceil_div(len, ELEMENTWISE_THREADS as usize).min(65_535 * 8);
    l.launch(kernel, GridSize::x(blocks as u32), BlockSize::x(ELEMENTWISE_THREADS), &p)
}

/// Gathers `rows` rows of `hidden` from `table` (of `dtype`, `vocab` rows) by the u32 `ids`.
#[allow(clippy::too_many_arguments)]
pub fn embedding(l: &Launcher<'_>, dtype: DType, table: &DeviceBuffer, vocab: usize, ids: &DeviceBuffer, out: &DeviceBuffer, rows: usize, hidden: usize) -> Result<()> {
    let kernel = Kernel::embedding(dtype);
    need(kernel, "table", table, vocab * hidden * dtype.size_of())?;
    need(kernel, "ids", ids, rows * 4)?;
    need(kernel, "out", out, rows * hidden * 4)?;
    let p = EmbeddingParams { table: table.addr(), ids: ids.addr(), out: out.addr(), rows: fits_u32(kernel, "rows", rows)?, hidden: fits_u32(kernel, "hidden", hidden)? };
    if rows == 0 || hidden == 0 {
        return Ok(());
    }
    l.launch(kernel, GridSize::x(grid_dim(kernel, "x", rows, MAX_GRID_X)?), BlockSize::x(ROW_THREADS), &p)
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
    l.launch(kernel, GridSize::x(grid_dim(kernel, "x", count, MAX_GRID_X)?), BlockSize::x(ROW_THREADS), &p)
}

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
    l.launch(kernel, GridSize::x(grid_dim(kernel, "x", rows, MAX_GRID_X)?), BlockSize::x(ROW_THREADS), &p)
}

/// Sizes of an attention launch (validated against each other by `crate::ops`).
pub struct AttnShape {
    pub t: usize,
    pub heads: usize,
    pub kv_heads: usize,
    pub d: usize,
    pub cap: usize,
}

/// Flash-style attention; see `gpu/src/attention.rs`.
#[allow(clippy::too_many_arguments)]
pub fn attention(l: &Launcher<'_>, q: &DeviceBuffer, k: &DeviceBuffer, v: &DeviceBuffer, out: &DeviceBuffer, s: &AttnShape, p: &crate::backend::AttnParams) -> Result<()> {
    let kernel = Kernel::AttentionF32;
    let max_d = 32 * attention_tile::MAX_PER_LANE;
    if s.d > max_d || s.kv_heads == 0 || s.heads % s.kv_heads != 0 {
        return Err(Error::Limit { op: kernel.name(), msg: format!("head_dim {} (max {}) / heads {} over kv_heads {}", s.d, max_d, s.heads, s.kv_heads) });
    }
    need(kernel, "q", q, s.t * s.heads * s.d * 4)?;
    need(kernel, "k", k, s.cap * s.kv_heads * s.d * 4)?;
    need(kernel, "v", v, s.cap * s.kv_heads * s.d * 4)?;
    need(kernel, "out", out, s.t * s.heads * s.d * 4)?;
    let params = AttentionParams {
        q: q.addr(),
        k: k.addr(),
        v: v.addr(),
        out: out.addr(),
        t: fits_u32(kernel, "t", s.t)?,
        heads: fits_u32(kernel, "heads", s.heads)?,
        kv_heads: fits_u32(kernel, "kv_heads", s.kv_heads)?,
        d: fits_u32(kernel, "d", s.d)?,
        kv_len: fits_u32(kernel, "kv_len", p.kv_len)?,
        q_pos0: fits_u32(kernel, "q_pos0", p.q_pos0)?,
        causal: p.causal as u32,
        scale: p.scale,
    };
    let items = s.t * s.heads;
    if items == 0 {
        return Ok(());
    }
    let blocks = grid_dim(kernel, "x", ceil_div(items, attention_tile::WARPS as usize), MAX_GRID_X)?;
    l.launch(kernel, GridSize::x(blocks), BlockSize::x(attention_tile::THREADS), &params)
}

fn ceil_div(a: usize, b: usize) -> usize {
    (a + b - 1) / b
}
