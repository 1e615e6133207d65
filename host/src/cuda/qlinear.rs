//! Linear layers and embeddings with block-quantized weights (`Q8_0`, `Q4_K`, `Q6_K`) on the GPU
//! (`gpu/src/mmvq.rs`, `gpu/src/dequant.rs`): the checked launchers, the upload into the device
//! layout, and the backend ops the text decoder, the LM head and the vision tower call.
//!
//! Kernel choice: up to [`MMVQ_MAX_M`] activation rows (decode) quantize the activations once
//! (`quantize_act_f32`, with the layer's RMSNorm fused in) into a pool scratch buffer and take
//! the integer-dot GEMVs (`mmvq_*`, `mmvq_gate_up_*`) — the CPU's int8 arithmetic, so the two
//! agree to float reassociation. More rows (prefill, the vision tower) dequantize chunks of at
//! most [`CHUNK_BYTES`] of weight rows to f16 in a pool scratch buffer (`dequant_rows_*`) and run
//! the f16 GEMM the module has for that chunk of output columns (tensor cores on compute_80, the
//! SIMT tiles on compute_61), so a small memory budget still holds the scratch.
//!
//! CPU twin: `cpu/qlinear.rs` (and `cpu/gather.rs` for the embedding).

use super::launch::{ceil_div, fits_u32, grid_dim, need, Launcher, MAX_GRID_X, MAX_GRID_Y};
use super::linear::{self, FusedNorm, LinearAlgo};
use super::{CudaBackend, DeviceBuffer};
use crate::kernels::Kernel;
use crate::quant::act::Q8Acts;
use crate::{ops, DType, Error, Result, Tensor};
use gpu::params::qtile::{self, CHUNK_BYTES, MMVQ_MAX_M, ROWS, ROW_THREADS, THREADS, WARPS};
use gpu::params::{DequantParams, LinearParams, QLinearParams, QuantActParams, ACT_GELU_ERF, ACT_GELU_TANH, ACT_NONE};
use gpu::qmath::{act_layout, q6_k_planes, q8_0_d_at, QK_K};

/// `[n, k]` = (rows, row length) of a quantized tensor's shape (leading axes are rows).
fn rows_cols(shape: &[usize]) -> (usize, usize) {
    match shape.split_last() {
        Some((&k, lead)) => (lead.iter().product(), k),
        None => (1, 1),
    }
}

/// GGUF blocks of `n` rows of `k` values of `dtype` regrouped into the device layout
/// (`gpu::qmath`): `Q8_0` and `Q6_K` as aligned planes, `Q4_K` unchanged. Same size.
pub fn device_layout(dtype: DType, n: usize, k: usize, raw: &[u8]) -> std::borrow::Cow<'_, [u8]> {
    use crate::quant::{q6_k, q8_0};
    match dtype {
        DType::Q8_0 => {
            let mut out = vec![0u8; raw.len()];
            let (qs, ds) = out.split_at_mut(q8_0_d_at(n, k));
            for (b, blk) in raw.chunks_exact(q8_0::BLOCK_BYTES).enumerate() {
                ds[2 * b..2 * b + 2].copy_from_slice(&blk[..2]);
                qs[32 * b..32 * b + 32].copy_from_slice(&blk[2..]);
            }
            out.into()
        }
        DType::Q6K => {
            let blocks = raw.len() / q6_k::BLOCK_BYTES;
            let (qh_at, sc_at, d_at) = q6_k_planes(blocks);
            let mut out = vec![0u8; raw.len()];
            for (i, blk) in raw.chunks_exact(q6_k::BLOCK_BYTES).enumerate() {
                out[128 * i..128 * i + 128].copy_from_slice(&blk[..128]);
                out[qh_at + 64 * i..qh_at + 64 * i + 64].copy_from_slice(&blk[128..192]);
                out[sc_at + 16 * i..sc_at + 16 * i + 16].copy_from_slice(&blk[192..208]);
                out[d_at + 2 * i..d_at + 2 * i + 2].copy_from_slice(&blk[208..210]);
            }
            out.into()
        }
        _ => raw.into(),
    }
}

/// The activation block size (values per scale) that weights of `dtype` take.
fn act_block(kernel: Kernel, dtype: DType) -> Result<usize> {
    Q8Acts::block_for(dtype).ok_or(Error::DType { op: kernel.name(), expected: "q8_0, q4_k or q6_k weights", got: dtype })
}

/// Checks that rows of `k` values are whole blocks of `dtype` (and a multiple of 8 values, the
/// dequantizer's group; true of every block type).
fn check_k(kernel: Kernel, dtype: DType, k: usize) -> Result<usize> {
    match dtype.row_bytes(k) {
        Some(rb) if k % 8 == 0 => Ok(rb),
        _ => Err(Error::Limit { op: kernel.name(), msg: format!("rows of {} values are not whole {} blocks of {}", k, dtype, dtype.block_size()) }),
    }
}

/// Quantizes `x [m, k]` (RMS-normed first with `norm`) into `acts` in blocks of `block`.
pub fn quantize_act(l: &Launcher<'_>, x: &DeviceBuffer, norm: Option<FusedNorm<'_>>, acts: &DeviceBuffer, m: usize, k: usize, block: usize) -> Result<()> {
    let kernel = Kernel::QuantizeActF32;
    if block != 32 && block != QK_K || k % block != 0 {
        return Err(Error::Limit { op: kernel.name(), msg: format!("k = {} must be a multiple of the activation block {} (32 or 256)", k, block) });
    }
    need(kernel, "x", x, m * k * 4)?;
    need(kernel, "acts", acts, act_layout(m, k, block).2)?;
    if let Some(f) = norm {
        need(kernel, "norm", f.weight, k * 4)?;
    }
    let p = QuantActParams {
        x: x.addr(),
        norm: norm.map_or(0, |f| f.weight.addr()),
        acts: acts.addr(),
        m: fits_u32(kernel, "m", m)?,
        k: fits_u32(kernel, "k", k)?,
        block: block as u32,
        eps: norm.map_or(0.0, |f| f.eps),
    };
    if m == 0 || k == 0 {
        return Ok(());
    }
    let chunks = ceil_div(k, 8 * ROW_THREADS as usize);
    l.launch(kernel, [grid_dim(kernel, "x", chunks, MAX_GRID_X)?, grid_dim(kernel, "y", m, MAX_GRID_Y)?, 1], ROW_THREADS, &p)
}

/// `c = acts · wᵀ (+ bias) (+ residual)`, or with `up` `c = silu(acts · wᵀ) ⊙ (acts · upᵀ)`
/// (no bias or residual then): the quantized GEMVs, `acts` from [`quantize_act`] for `m` rows.
#[allow(clippy::too_many_arguments)]
pub fn mmvq(
    l: &Launcher<'_>,
    dtype: DType,
    acts: &DeviceBuffer,
    w: &DeviceBuffer,
    up: Option<&DeviceBuffer>,
    bias: Option<&DeviceBuffer>,
    residual: Option<&DeviceBuffer>,
    c: &DeviceBuffer,
    (m, n, k): (usize, usize, usize),
) -> Result<()> {
    let kernel = if up.is_some() { Kernel::mmvq_gate_up(dtype)? } else { Kernel::mmvq(dtype)? };
    let rb = check_k(kernel, dtype, k)?;
    if m > MMVQ_MAX_M {
        return Err(Error::Limit { op: kernel.name(), msg: format!("takes at most {} rows, got {}", MMVQ_MAX_M, m) });
    }
    if up.is_some() && (bias.is_some() || residual.is_some()) {
        return Err(Error::Limit { op: kernel.name(), msg: "the gate/up GEMV has no bias or residual".into() });
    }
    need(kernel, "acts", acts, act_layout(m, k, act_block(kernel, dtype)?).2)?;
    need(kernel, "w", w, n * rb)?;
    if let Some(u) = up {
        need(kernel, "up", u, n * rb)?;
    }
    need(kernel, "c", c, m * n * 4)?;
    if let Some(b) = bias {
        need(kernel, "bias", b, n * 4)?;
    }
    if let Some(r) = residual {
        need(kernel, "residual", r, m * n * 4)?;
    }
    let p = QLinearParams {
        acts: acts.addr(),
        w: w.addr(),
        up: up.map_or(0, |u| u.addr()),
        bias: bias.map_or(0, |b| b.addr()),
        residual: residual.map_or(0, |r| r.addr()),
        c: c.addr(),
        m: m as u32,
        n: fits_u32(kernel, "n", n)?,
        k: fits_u32(kernel, "k", k)?,
        ldc: fits_u32(kernel, "n", n)?,
    };
    if m == 0 || n == 0 {
        return Ok(());
    }
    let grid = [grid_dim(kernel, "x", ceil_div(n, WARPS as usize), MAX_GRID_X)?, grid_dim(kernel, "y", ceil_div(m, ROWS), MAX_GRID_Y)?, 1];
    l.launch(kernel, grid, THREADS, &p)
}

/// Which rows [`dequant_rows`] decodes: the ids in a u32 buffer, or `count` rows from `row0`.
#[derive(Clone, Copy)]
pub enum RowSel<'a> {
    Ids(&'a DeviceBuffer),
    Range(usize),
}

/// `out[r] = dequantize(w[row(r)])` for `count` rows of `k` values of `w [n, k]`, as f32, or as
/// f16 bits with `half`.
#[allow(clippy::too_many_arguments)]
pub fn dequant_rows(l: &Launcher<'_>, dtype: DType, w: &DeviceBuffer, (n, k): (usize, usize), rows: RowSel<'_>, count: usize, out: &DeviceBuffer, half: bool) -> Result<()> {
    let kernel = Kernel::dequant_rows(dtype)?;
    let rb = check_k(kernel, dtype, k)?;
    need(kernel, "w", w, n * rb)?;
    need(kernel, "out", out, count * k * if half { 2 } else { 4 })?;
    let (ids, row0) = match rows {
        RowSel::Ids(ids) => {
            need(kernel, "ids", ids, count * 4)?;
            (ids.addr(), 0)
        }
        RowSel::Range(row0) => {
            if row0 + count > n {
                return Err(Error::Limit { op: kernel.name(), msg: format!("rows {}..{} of {}", row0, row0 + count, n) });
            }
            (0, row0)
        }
    };
    let p = DequantParams {
        w: w.addr(),
        ids,
        out: out.addr(),
        rows: fits_u32(kernel, "rows", count)?,
        row0: fits_u32(kernel, "row0", row0)?,
        n: fits_u32(kernel, "n", n)?,
        k: fits_u32(kernel, "k", k)?,
        half: half as u32,
        _pad: 0,
    };
    if count == 0 || k == 0 {
        return Ok(());
    }
    l.launch(kernel, [grid_dim(kernel, "x", count, MAX_GRID_X)?, 1, 1], qtile::ROW_THREADS, &p)
}

/// Output features per dequantized chunk for rows of `k` values: what [`CHUNK_BYTES`] of f16
/// holds, a multiple of 128 (the GEMM tiles) when that is at least one tile.
pub fn chunk_rows(n: usize, k: usize) -> usize {
    let rows = (CHUNK_BYTES / (2 * k.max(1))).max(1);
    let rows = if rows >= 128 { rows / 128 * 128 } else { rows };
    rows.min(n.max(1))
}

impl CudaBackend {
    /// [`crate::Backend::upload_blocks`]: the blocks regrouped into the device layout.
    pub(super) fn upload_blocks_op(&self, shape: &[usize], dtype: DType, blocks: crate::Blocks) -> Result<Tensor> {
        let bytes = crate::tensor::quantized_bytes("upload_blocks", shape, dtype)?;
        let raw = blocks.bytes();
        if raw.len() != bytes {
            return Err(Error::shape("upload_blocks", &[shape], format!("{} of shape {:?} is {} bytes, {} were given", dtype, shape, bytes, raw.len())));
        }
        let (n, k) = rows_cols(shape);
        let dev = device_layout(dtype, n, k, raw);
        Ok(Self::wrap(shape.to_vec(), dtype, self.upload_raw(dev.as_ptr(), dev.len())?))
    }

    /// `act(rms_norm?(x) · wᵀ + bias) + residual` with block-quantized `w` (see the module docs).
    pub(super) fn qlinear_op(&self, x: &Tensor, norm: Option<(&Tensor, f32)>, w: &Tensor, bias: Option<&Tensor>, act: u32, residual: Option<&Tensor>) -> Result<Tensor> {
        const OP: &str = "linear";
        let (m, n, k) = ops::linear_dims(x, w, bias)?;
        let out_shape = ops::linear_out_shape(x, n);
        if let Some(r) = residual {
            ops::expect_f32(OP, r)?;
            if r.shape() != out_shape.as_slice() {
                return Err(Error::shape(OP, &[r.shape(), &out_shape], "the residual must have the output's shape"));
            }
        }
        if let Some((nw, _)) = norm {
            ops::rms_norm_dims(x, nw)?;
        }
        if m > MMVQ_MAX_M {
            let x = &self.rms_normed(x, norm)?;
            return self.dequant_gemm(x, w, bias, act, residual, &out_shape);
        }
        if act != ACT_NONE {
            // decode-sized inputs: the product, then the activation
            let kind = if act == ACT_GELU_TANH { crate::backend::Gelu::Tanh } else { crate::backend::Gelu::Erf };
            debug_assert!(act == ACT_GELU_TANH || act == ACT_GELU_ERF);
            return self.gelu_op(&self.qlinear_op(x, norm, w, bias, ACT_NONE, residual)?, kind);
        }
        let l = self.enter()?;
        let kernel = Kernel::mmvq(w.dtype())?;
        let block = act_block(kernel, w.dtype())?;
        let acts = self.pool.alloc(act_layout(m, k, block).2)?;
        let nb = match norm {
            Some((nw, eps)) => Some(FusedNorm { weight: self.buffer(OP, nw)?, eps }),
            None => None,
        };
        quantize_act(&l, self.buffer(OP, x)?, nb, &acts, m, k, block)?;
        let out = self.output(m * n)?;
        let bb = bias.map(|b| self.buffer(OP, b)).transpose()?;
        let rb = residual.map(|r| self.buffer(OP, r)).transpose()?;
        mmvq(&l, w.dtype(), &acts, self.buffer(OP, w)?, None, bb, rb, &out, (m, n, k))?;
        Ok(Self::wrap(out_shape, DType::F32, out))
    }

    /// The prefill path: chunks of `w`'s rows dequantized to f16, each through the f16 GEMM
    /// this module picks for `m` rows, writing its columns of the output.
    fn dequant_gemm(&self, x: &Tensor, w: &Tensor, bias: Option<&Tensor>, act: u32, residual: Option<&Tensor>, out_shape: &[usize]) -> Result<Tensor> {
        const OP: &str = "linear";
        let (m, n, k) = ops::linear_dims(x, w, bias)?;
        let l = self.enter()?;
        let (xb, wb) = (self.buffer(OP, x)?, self.buffer(OP, w)?);
        let bb = bias.map(|b| self.buffer(OP, b)).transpose()?;
        let rb = residual.map(|r| self.buffer(OP, r)).transpose()?;
        let out = self.output(m * n)?;
        let chunk = chunk_rows(n, k);
        let scratch = self.pool.alloc(chunk * k * 2)?;
        let algo = self.pick_linear(m, chunk, k, DType::F16);
        let kernel = algo.kernel(DType::F16, l.a16)?;
        // split-K workspace for one chunk's partial sums (when the pick splits)
        let ws = match algo {
            LinearAlgo::Big(s) | LinearAlgo::Mma(_, _, s) | LinearAlgo::Skinny(_, s) if s > 1 => Some(self.pool.alloc(s as usize * m * chunk * 4)?),
            _ => None,
        };
        need(kernel, "a", xb, m * k * 4)?;
        if let Some(r) = rb {
            need(kernel, "residual", r, m * n * 4)?;
        }
        // the activations' row scales, once for every chunk (f16 tensor cores)
        let scales = self.row_scales_for(&l, algo, DType::F16, xb, (m, k))?;
        // 16-bit activations (`Precision::Bf16`): rounded once for every chunk
        let a16 = self.a16_operand(&l, algo, DType::F16, xb, scales.as_ref(), (m, k))?;
        let xb = a16.as_ref().unwrap_or(xb);
        let mut c0 = 0;
        while c0 < n {
            let cn = chunk.min(n - c0);
            dequant_rows(&l, w.dtype(), wb, (n, k), RowSel::Range(c0), cn, &scratch, true)?;
            let p = LinearParams {
                a: xb.addr(),
                w: scratch.addr(),
                bias: bb.map_or(0, |b| b.addr() + 4 * c0 as u64),
                residual: rb.map_or(0, |r| r.addr() + 4 * c0 as u64),
                c: out.addr() + 4 * c0 as u64,
                norm: 0,
                m: fits_u32(kernel, "m", m)?,
                n: cn as u32,
                k: fits_u32(kernel, "k", k)?,
                lda: k as u32,
                ldc: fits_u32(kernel, "n", n)?,
                eps: 0.0,
                act,
                k_split: 0,
                row_scale: scales.as_ref().map_or(0, |s| s.addr()),
            };
            if matches!(algo, LinearAlgo::GemvVec) {
                return Err(Error::Limit { op: kernel.name(), msg: format!("the dequantized path needs a GEMM for m = {}", m) });
            }
            linear::launch(&l, algo, kernel, &p, 0, ws.as_ref())?;
            c0 += cn;
        }
        Ok(Self::wrap(out_shape.to_vec(), DType::F32, out))
    }

    /// `silu(x' · gateᵀ) ⊙ (x' · upᵀ)` with block-quantized weights, `x' = rms_norm(x)` with
    /// `norm`.
    pub(super) fn qgate_up_op(&self, x: &Tensor, norm: Option<(&Tensor, f32)>, gate: &Tensor, up: &Tensor) -> Result<Tensor> {
        const OP: &str = "gate_up_silu";
        let (m, n, k) = ops::linear_dims(x, gate, None)?;
        if m > MMVQ_MAX_M {
            let x = &self.rms_normed(x, norm)?;
            let shape = ops::linear_out_shape(x, n);
            let g = self.dequant_gemm(x, gate, None, ACT_NONE, None, &shape)?;
            return self.silu_mul_op(&g, &self.dequant_gemm(x, up, None, ACT_NONE, None, &shape)?);
        }
        let nb = match norm {
            Some((nw, eps)) => {
                ops::rms_norm_dims(x, nw)?;
                Some(FusedNorm { weight: self.buffer(OP, nw)?, eps })
            }
            None => None,
        };
        let l = self.enter()?;
        let kernel = Kernel::mmvq_gate_up(gate.dtype())?;
        let block = act_block(kernel, gate.dtype())?;
        let acts = self.pool.alloc(act_layout(m, k, block).2)?;
        quantize_act(&l, self.buffer(OP, x)?, nb, &acts, m, k, block)?;
        let out = self.output(m * n)?;
        mmvq(&l, gate.dtype(), &acts, self.buffer(OP, gate)?, Some(self.buffer(OP, up)?), None, None, &out, (m, n, k))?;
        Ok(Self::wrap(ops::linear_out_shape(x, n), DType::F32, out))
    }

    /// Embedding rows of a block-quantized table for the u32 `ids` (dequantized to f32).
    pub(super) fn qembedding_gather_op(&self, table: &Tensor, ids: &Tensor) -> Result<Tensor> {
        const OP: &str = "embedding_gather";
        let (vocab, hidden, rows) = (table.shape()[0], table.shape()[1], ids.shape()[0]);
        let l = self.enter()?;
        let out = self.output(rows * hidden)?;
        dequant_rows(&l, table.dtype(), self.buffer(OP, table)?, (vocab, hidden), RowSel::Ids(self.buffer(OP, ids)?), rows, &out, false)?;
        Ok(Self::wrap(vec![rows, hidden], DType::F32, out))
    }
}
