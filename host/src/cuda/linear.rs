//! Linear layers on the GPU (`gpu/src/matmul.rs`, `gpu/src/gemv.rs`): the checked launchers and
//! the backend ops `linear`, `linear_residual` and `gate_up_silu`.
//!
//! Kernel choice, by shape: up to [`GEMV_MAX_ROWS`] activation rows take a GEMV (decode) —
//! the 16-byte-vector `gemv_vec_*` when a weight row is a whole number of 16-byte vectors,
//! else the scalar `gemv_*`; more rows take the tiled `matmul_*` (prefill, vision).

use super::launch::{ceil_div, fits_u32, grid_dim, need, Launcher, MAX_GRID_X, MAX_GRID_Y};
use super::{CudaBackend, DeviceBuffer};
use crate::kernels::Kernel;
use crate::{ops, DType, Error, Result, Tensor};
use gpu::params::{gemv_tile, gemv_vec_tile, matmul_tile, GateUpParams, LinearParams};

/// Decode-sized inputs (at most this many rows) use the GEMV kernels.
pub const GEMV_MAX_ROWS: usize = gemv_tile::MAX_ROWS;

/// Which kernel computes a linear layer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LinearAlgo {
    /// `matmul_*`: shared-memory tiles, for prefill-sized `m`.
    Tiled,
    /// `gemv_*`: one warp per (row, output), scalar loads, any `k`.
    Gemv,
    /// `gemv_vec_*`: one warp per output, 16-byte weight vectors, one row (decode).
    GemvVec,
}

impl LinearAlgo {
    /// Whether weight rows of `k` elements of `dtype` are whole 16-byte vectors (the condition
    /// of the vector kernels).
    pub fn vector_rows(k: usize, dtype: DType) -> bool {
        (k * dtype.size_of()) % 16 == 0
    }

    /// The kernel the backend uses for `m` rows of `k` inputs with weights of `dtype`.
    pub fn pick(m: usize, k: usize, dtype: DType) -> LinearAlgo {
        if m > GEMV_MAX_ROWS {
            LinearAlgo::Tiled
        } else if m == 1 && Self::vector_rows(k, dtype) {
            LinearAlgo::GemvVec
        } else {
            LinearAlgo::Gemv
        }
    }
}

/// An RMSNorm applied to the activations inside a GEMV: its `[k]` f32 weight and epsilon.
#[derive(Clone, Copy)]
pub struct FusedNorm<'a> {
    pub weight: &'a DeviceBuffer,
    pub eps: f32,
}

/// Whether a GEMV can norm `m` rows of `k` activations in its shared-memory stage.
pub fn norm_fits(m: usize, k: usize) -> bool {
    m == 1 && k <= gemv_vec_tile::MAX_STAGED
}

/// Warps per block of the vector GEMVs for `n` outputs: 8 when that still gives every
/// multiprocessor of a large GPU several blocks, else 4.
fn vec_warps(n: usize) -> u32 {
    if n >= 8 * 4 * 132 {
        gemv_vec_tile::WARPS_LARGE
    } else {
        gemv_vec_tile::WARPS_SMALL
    }
}

/// Checks and launch fields of an optional fused norm: `(address, eps, shared bytes)`.
fn norm_fields(kernel: Kernel, norm: Option<FusedNorm<'_>>, m: usize, k: usize) -> Result<(u64, f32, u32)> {
    match norm {
        None => Ok((0, 0.0, 0)),
        Some(f) => {
            need(kernel, "norm", f.weight, k * 4)?;
            if !norm_fits(m, k) {
                return Err(Error::Limit { op: kernel.name(), msg: format!("a fused RMSNorm stages m·k = {} floats, at most {}", m * k, gemv_vec_tile::MAX_STAGED) });
            }
            Ok((f.weight.addr(), f.eps, (m * k * 4) as u32))
        }
    }
}

/// `c[m, n] = a[m, k] · w[n, k]ᵀ (+ bias) (+ residual)`, all contiguous; with `norm` (vector
/// GEMV only) the rows of `a` are RMS-normed first. Empty sizes launch nothing.
#[allow(clippy::too_many_arguments)]
pub fn linear(
    l: &Launcher<'_>,
    algo: LinearAlgo,
    wdtype: DType,
    a: &DeviceBuffer,
    w: &DeviceBuffer,
    bias: Option<&DeviceBuffer>,
    residual: Option<&DeviceBuffer>,
    norm: Option<FusedNorm<'_>>,
    c: &DeviceBuffer,
    (m, n, k): (usize, usize, usize),
) -> Result<()> {
    let kernel = match algo {
        LinearAlgo::Tiled => Kernel::matmul(wdtype)?,
        LinearAlgo::Gemv => Kernel::gemv(wdtype)?,
        LinearAlgo::GemvVec => Kernel::gemv_vec(wdtype)?,
    };
    need(kernel, "a", a, m * k * 4)?;
    need(kernel, "w", w, n * k * wdtype.size_of())?;
    need(kernel, "c", c, m * n * 4)?;
    if let Some(b) = bias {
        need(kernel, "bias", b, n * 4)?;
    }
    if let Some(r) = residual {
        need(kernel, "residual", r, m * n * 4)?;
    }
    if algo == LinearAlgo::GemvVec && (m > 1 || !LinearAlgo::vector_rows(k, wdtype)) {
        return Err(Error::Limit { op: kernel.name(), msg: format!("needs one row and 16-byte weight rows (m = {}, k = {} of {})", m, k, wdtype) });
    }
    if norm.is_some() && algo != LinearAlgo::GemvVec {
        return Err(Error::Limit { op: kernel.name(), msg: "only the vector GEMV fuses an RMSNorm".into() });
    }
    let (norm_addr, eps, shared) = norm_fields(kernel, norm, m, k)?;
    let p = LinearParams {
        a: a.addr(),
        w: w.addr(),
        bias: bias.map_or(0, |b| b.addr()),
        residual: residual.map_or(0, |r| r.addr()),
        c: c.addr(),
        norm: norm_addr,
        m: fits_u32(kernel, "m", m)?,
        n: fits_u32(kernel, "n", n)?,
        k: fits_u32(kernel, "k", k)?,
        lda: fits_u32(kernel, "k", k)?,
        ldc: fits_u32(kernel, "n", n)?,
        eps,
    };
    if m == 0 || n == 0 {
        return Ok(());
    }
    let (grid, block) = match algo {
        LinearAlgo::Tiled => (
            [grid_dim(kernel, "x", ceil_div(n, matmul_tile::BN as usize), MAX_GRID_X)?, grid_dim(kernel, "y", ceil_div(m, matmul_tile::BM as usize), MAX_GRID_Y)?, 1],
            matmul_tile::THREADS,
        ),
        LinearAlgo::Gemv => (
            [grid_dim(kernel, "x", ceil_div(n, gemv_tile::WARPS as usize), MAX_GRID_X)?, grid_dim(kernel, "y", m, MAX_GRID_Y)?, 1],
            gemv_tile::THREADS,
        ),
        LinearAlgo::GemvVec => {
            let warps = vec_warps(n);
            ([grid_dim(kernel, "x", ceil_div(n, warps as usize), MAX_GRID_X)?, 1, 1], warps * 32)
        }
    };
    l.launch_shared(kernel, grid, block, shared, &p)
}

/// `c[1, n] = silu(a · gateᵀ) ⊙ (a · upᵀ)` for one row with 16-byte weight rows,
/// the rows of `a` RMS-normed first with `norm`.
#[allow(clippy::too_many_arguments)]
pub fn gate_up(
    l: &Launcher<'_>,
    wdtype: DType,
    a: &DeviceBuffer,
    gate: &DeviceBuffer,
    up: &DeviceBuffer,
    norm: Option<FusedNorm<'_>>,
    c: &DeviceBuffer,
    (m, n, k): (usize, usize, usize),
) -> Result<()> {
    let kernel = Kernel::gemv_gate_up(wdtype)?;
    need(kernel, "a", a, m * k * 4)?;
    need(kernel, "gate", gate, n * k * wdtype.size_of())?;
    need(kernel, "up", up, n * k * wdtype.size_of())?;
    need(kernel, "c", c, m * n * 4)?;
    if m > 1 || !LinearAlgo::vector_rows(k, wdtype) {
        return Err(Error::Limit { op: kernel.name(), msg: format!("needs one row and 16-byte weight rows (m = {}, k = {} of {})", m, k, wdtype) });
    }
    let (norm_addr, eps, shared) = norm_fields(kernel, norm, m, k)?;
    let p = GateUpParams { a: a.addr(), gate: gate.addr(), up: up.addr(), c: c.addr(), norm: norm_addr, m: m as u32, n: fits_u32(kernel, "n", n)?, k: fits_u32(kernel, "k", k)?, lda: k as u32, eps, _pad: 0 };
    if m == 0 || n == 0 {
        return Ok(());
    }
    let warps = vec_warps(n);
    l.launch_shared(kernel, [grid_dim(kernel, "x", ceil_div(n, warps as usize), MAX_GRID_X)?, 1, 1], warps * 32, shared, &p)
}

impl CudaBackend {
    /// A linear layer with an explicit kernel choice (tests and benchmarks use this to cover
    /// every kernel; [`crate::Backend::linear`] picks with [`LinearAlgo::pick`]).
    pub fn linear_with(&self, algo: LinearAlgo, a: &Tensor, w: &Tensor, bias: Option<&Tensor>, residual: Option<&Tensor>) -> Result<Tensor> {
        self.linear_normed(algo, a, None, w, bias, residual)
    }

    /// [`CudaBackend::linear_with`] with an optional RMSNorm `(weight [k] f32, eps)` of the
    /// input rows fused in (vector GEMV only).
    pub fn linear_normed(&self, algo: LinearAlgo, a: &Tensor, norm: Option<(&Tensor, f32)>, w: &Tensor, bias: Option<&Tensor>, residual: Option<&Tensor>) -> Result<Tensor> {
        const OP: &str = "linear";
        let (m, n, k) = ops::linear_dims(a, w, bias)?;
        let out_shape = ops::linear_out_shape(a, n);
        if let Some(r) = residual {
            ops::expect_f32(OP, r)?;
            if r.shape() != out_shape.as_slice() {
                return Err(Error::shape(OP, &[r.shape(), &out_shape], "the residual must have the output's shape"));
            }
        }
        let l = self.enter()?;
        let (ab, wb) = (self.buffer(OP, a)?, self.buffer(OP, w)?);
        let bb = bias.map(|b| self.buffer(OP, b)).transpose()?;
        let rb = residual.map(|r| self.buffer(OP, r)).transpose()?;
        let nb = match norm {
            Some((nw, eps)) => {
                ops::rms_norm_dims(a, nw)?;
                Some(FusedNorm { weight: self.buffer(OP, nw)?, eps })
            }
            None => None,
        };
        let out = self.output(m * n)?;
        linear(&l, algo, w.dtype(), ab, wb, bb, rb, nb, &out, (m, n, k))?;
        Ok(Self::wrap(out_shape, DType::F32, out))
    }

    pub(super) fn rms_norm_linear_op(&self, x: &Tensor, norm: &Tensor, eps: f32, w: &Tensor, bias: Option<&Tensor>) -> Result<Tensor> {
        let (m, _, k) = ops::linear_dims(x, w, bias)?;
        match LinearAlgo::pick(m, k, w.dtype()) {
            LinearAlgo::GemvVec if norm_fits(m, k) => self.linear_normed(LinearAlgo::GemvVec, x, Some((norm, eps)), w, bias, None),
            // prefill-sized inputs (or rows the stage cannot hold): the norm, then the product
            _ => self.linear_op(&self.rms_norm_op(x, norm, eps)?, w, bias, None),
        }
    }

    pub(super) fn linear_op(&self, a: &Tensor, w: &Tensor, bias: Option<&Tensor>, residual: Option<&Tensor>) -> Result<Tensor> {
        let (m, _, k) = ops::linear_dims(a, w, bias)?;
        self.linear_with(LinearAlgo::pick(m, k, w.dtype()), a, w, bias, residual)
    }

    /// `silu(x' · gateᵀ) ⊙ (x' · upᵀ)` with `x' = rms_norm(x)` when `norm` is given, else `x`.
    pub(super) fn gate_up_silu_op(&self, x: &Tensor, norm: Option<(&Tensor, f32)>, gate: &Tensor, up: &Tensor) -> Result<Tensor> {
        const OP: &str = "gate_up_silu";
        let (m, n, k) = ops::linear_dims(x, gate, None)?;
        if up.shape() != gate.shape() || up.dtype() != gate.dtype() {
            return Err(Error::shape(OP, &[gate.shape(), up.shape()], "gate and up weights must have one shape and dtype"));
        }
        let fused = LinearAlgo::pick(m, k, gate.dtype()) == LinearAlgo::GemvVec && norm.map_or(true, |_| norm_fits(m, k));
        if !fused {
            // prefill-sized (or odd-k) inputs: the norm, two products and the elementwise gate
            let normed;
            let x = match norm {
                Some((w, eps)) => {
                    normed = self.rms_norm_op(x, w, eps)?;
                    &normed
                }
                None => x,
            };
            return self.silu_mul_op(&self.linear_op(x, gate, None, None)?, &self.linear_op(x, up, None, None)?);
        }
        let nb = match norm {
            Some((nw, eps)) => {
                ops::rms_norm_dims(x, nw)?;
                Some(FusedNorm { weight: self.buffer(OP, nw)?, eps })
            }
            None => None,
        };
        let l = self.enter()?;
        let out = self.output(m * n)?;
        gate_up(&l, gate.dtype(), self.buffer(OP, x)?, self.buffer(OP, gate)?, self.buffer(OP, up)?, nb, &out, (m, n, k))?;
        Ok(Self::wrap(ops::linear_out_shape(x, n), DType::F32, out))
    }
}
