//! Checked launchers: one function per kernel family. Each validates that the buffers hold
//! the sizes it is given and that the launch shape is within the device's limits, returns
//! `Err` (naming the kernel) before launching otherwise, and then launches on the stream.

use super::pool::DeviceBuffer;
use crate::kernels::Kernel;
use crate::{DType, Error, Result};
use cust::function::{BlockSize, GridSize};
use cust::module::Module;
use cust::stream::Stream;
use gpu::params::{gemv_tile, matmul_tile, LinearParams, RmsNormParams, SiluMulParams, SoftmaxParams, ELEMENTWISE_THREADS, ROW_THREADS};
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

/// `out = silu(gate) * up` over `len` f32.
pub fn silu_mul(l: &Launcher<'_>, gate: &DeviceBuffer, up: &DeviceBuffer, out: &DeviceBuffer, len: usize) -> Result<()> {
    let kernel = Kernel::SiluMulF32;
    for (what, b) in [("gate", gate), ("up", up), ("out", out)] {
        need(kernel, what, b, len * 4)?;
    }
    if len == 0 {
        return Ok(());
    }
    let p = SiluMulParams { gate: gate.addr(), up: up.addr(), out: out.addr(), len: len as u64 };
    let blocks = ceil_div(len, ELEMENTWISE_THREADS as usize).min(65_535 * 8);
    l.launch(kernel, GridSize::x(blocks as u32), BlockSize::x(ELEMENTWISE_THREADS), &p)
}

fn ceil_div(a: usize, b: usize) -> usize {
    (a + b - 1) / b
}
