//! The pure-Rust CPU backend: multithreaded (its own fork-join [`Pool`]), f32 activations,
//! weights read in their stored dtype. It is also the reference the CUDA backend is tested against.

mod attention;
mod elementwise;
mod gather;
pub mod huge_pages;
mod linear;
pub mod pool;
mod qisa;
pub mod qlinear;
mod rope;
mod rowwise;
mod weights;
#[cfg(target_arch = "x86_64")]
mod simd;

pub use linear::{dot, linear_on, Isa, Weights};
pub use pool::Pool;

use crate::backend::{AttnParams, Backend, Gelu};
use crate::ops;
use crate::{Blocks, DType, DeviceKind, Error, MappedBytes, Result, Tensor};
use std::sync::atomic::{AtomicBool, Ordering};

pub struct CpuBackend {
    pool: Pool,
    poison: AtomicBool,
}

impl CpuBackend {
    /// A CPU backend of `threads` threads: the one calling its ops and `threads - 1` workers
    /// (when `None`, as many as rayon's global pool has: `RAYON_NUM_THREADS`, else every
    /// logical core).
    pub fn new(threads: Option<usize>) -> Result<CpuBackend> {
        let t = threads.unwrap_or_else(rayon::current_num_threads).max(1);
        let pool = Pool::new(t).map_err(|e| Error::Limit { op: "cpu backend", msg: format!("cannot start worker threads: {}", e) })?;
        Ok(CpuBackend { pool, poison: AtomicBool::new(false) })
    }

    pub fn threads(&self) -> usize {
        self.pool.threads()
    }

    fn output(&self, len: usize) -> Vec<f32> {
        let fill = if self.poison.load(Ordering::Relaxed) { f32::NAN } else { 0.0 };
        vec![fill; len]
    }

    fn weights<'a>(op: &'static str, w: &'a Tensor) -> Result<Weights<'a>> {
        Ok(match w.dtype() {
            DType::F32 => Weights::F32(w.as_cpu_f32(op)?),
            DType::F16 => Weights::F16(w.as_cpu_half(op)?),
            DType::BF16 => Weights::Bf16(w.as_cpu_half(op)?),
            other => return Err(Error::DType { op, expected: "f32, f16 or bf16", got: other }),
        })
    }

    /// [`Backend::linear`] with block-quantized weights (shapes checked by the caller).
    fn qlinear(&self, a: &Tensor, w: &Tensor, bias: Option<&Tensor>, m: usize, n: usize, k: usize) -> Result<Tensor> {
        let (wt, wb) = (w.dtype(), w.as_cpu_blocks("linear")?);
        if wt.row_bytes(k).map(|r| r * n) != Some(wb.len()) {
            return Err(Error::shape("linear", &[a.shape(), w.shape()], format!("{} weight rows of {} values are not whole blocks", wt, k)));
        }
        let av = a.as_cpu_f32("linear")?;
        let bv = match bias {
            Some(b) => Some(b.as_cpu_f32("linear")?),
            None => None,
        };
        let mut out = self.output(m * n);
        self.pool.install(|| qlinear::linear(av, wt, wb, bv, m, n, k, &mut out));
        Tensor::cpu_f32(&ops::linear_out_shape(a, n), out)
    }

    /// The first `rows` rows of an f32 or f16 KV tensor as f32 (f16 widened exactly).
    /// The first `rows` rows of keys or values `t [cap, kv_heads, d]` as f32, each (row, head)
    /// vector times its scale from `scales` (`which` 0: keys, 1: values) when given.
    fn kv_f32<'a>(op: &'static str, t: &'a Tensor, rows: usize, scales: Option<(&Tensor, usize)>) -> Result<std::borrow::Cow<'a, [f32]>> {
        let row_len: usize = t.shape()[1..].iter().product();
        let mut x = match t.dtype() {
            DType::F32 => std::borrow::Cow::Borrowed(&t.as_cpu_f32(op)?[..rows * row_len]),
            _ => std::borrow::Cow::Owned(t.as_cpu_half(op)?[..rows * row_len].iter().map(|&h| gpu::math::f16_to_f32(h)).collect()),
        };
        if let Some((sc, which)) = scales {
            let (sv, d) = (sc.as_cpu_f32(op)?, t.shape()[2]);
            for (i, vec) in x.to_mut().chunks_mut(d.max(1)).enumerate() {
                let f = sv[crate::backend::KV_SCALES * i + which];
                vec.iter_mut().for_each(|v| *v *= f);
            }
        }
        Ok(x)
    }
}

impl Backend for CpuBackend {
    fn kind(&self) -> DeviceKind {
        DeviceKind::Cpu
    }

    fn describe(&self) -> String {
        format!("CPU ({} threads)", self.threads())
    }

    fn within(&self, f: &mut dyn FnMut() -> Result<()>) -> Result<()> {
        // the ops inside find the pool installed already; this thread submits their jobs
        self.pool.install(f)
    }

    fn as_any(&self) -> &dyn std::any::Any {
        self
    }

    fn upload_f32(&self, shape: &[usize], data: &[f32]) -> Result<Tensor> {
        Tensor::cpu_f32(shape, data.to_vec())
    }

    fn upload_half(&self, shape: &[usize], dtype: DType, bits: &[u16]) -> Result<Tensor> {
        Tensor::cpu_half(shape, dtype, bits.to_vec())
    }

    fn upload_mapped(&self, shape: &[usize], dtype: DType, bytes: MappedBytes) -> Result<Tensor> {
        // Large weights are read from huge pages (see `huge_pages`); the copy reads the file.
        if let Some(m) = huge_pages::moved("a mapped tensor", bytes.bytes()) {
            return Tensor::cpu_mapped(shape, dtype, m);
        }
        // Fault the pages in now, so loading (and its progress) is real and the first tokens
        // do not pay for disk reads.
        for b in bytes.bytes().iter().step_by(4096) {
            // SAFETY: `b` is a valid reference into the live mapping; a volatile read keeps the
            // access from being optimised away.
            unsafe { std::ptr::read_volatile(b) };
        }
        Tensor::cpu_mapped(shape, dtype, bytes)
    }

    fn upload_blocks(&self, shape: &[usize], dtype: DType, blocks: Blocks) -> Result<Tensor> {
        // Large weights are read from huge pages (see `huge_pages`), once their size is checked.
        if crate::tensor::quantized_bytes("upload_blocks", shape, dtype)? == blocks.bytes().len() {
            if let Some(m) = huge_pages::moved("a quantized tensor", blocks.bytes()) {
                return Tensor::cpu_blocks(shape, dtype, Blocks::Mapped(m));
            }
        }
        Tensor::cpu_blocks(shape, dtype, blocks)
    }

    fn download_f32(&self, t: &Tensor) -> Result<Vec<f32>> {
        Ok(t.as_cpu_f32("download_f32")?.to_vec())
    }

    fn download_half(&self, t: &Tensor) -> Result<Vec<u16>> {
        Ok(t.as_cpu_half("download_half")?.to_vec())
    }

    fn upload_u32(&self, shape: &[usize], data: &[u32]) -> Result<Tensor> {
        Tensor::cpu_u32(shape, data.to_vec())
    }

    fn download_u32(&self, t: &Tensor) -> Result<Vec<u32>> {
        Ok(t.as_cpu_u32("download_u32")?.to_vec())
    }

    fn write_u32(&self, dst: &mut Tensor, data: &[u32]) -> Result<()> {
        let d = dst.as_cpu_u32_mut("write_u32")?;
        if d.len() != data.len() {
            return Err(Error::shape("write_u32", &[dst.shape()], format!("{} elements given", data.len())));
        }
        d.copy_from_slice(data);
        Ok(())
    }

    fn write_u32_cols(&self, dst: &mut Tensor, data: &[u32], width: usize) -> Result<()> {
        let (_, cols) = ops::u32_cols_dims("write_u32_cols", dst, data, width)?;
        ops::write_cols(dst.as_cpu_u32_mut("write_u32_cols")?, cols, data, width);
        Ok(())
    }

    fn linear(&self, a: &Tensor, w: &Tensor, bias: Option<&Tensor>) -> Result<Tensor> {
        let (m, n, k) = ops::linear_dims(a, w, bias)?;
        if w.dtype().is_quantized() {
            return self.qlinear(a, w, bias, m, n, k);
        }
        let av = a.as_cpu_f32("linear")?;
        let wv = Self::weights("linear", w)?;
        let bv = match bias {
            Some(b) => Some(b.as_cpu_f32("linear")?),
            None => None,
        };
        let mut out = self.output(m * n);
        self.pool.install(|| linear::linear(av, wv, bv, m, n, k, &mut out));
        Tensor::cpu_f32(&ops::linear_out_shape(a, n), out)
    }

    fn rms_norm(&self, x: &Tensor, w: &Tensor, eps: f32) -> Result<Tensor> {
        let (rows, cols) = ops::rms_norm_dims(x, w)?;
        let (xv, wv) = (x.as_cpu_f32("rms_norm")?, w.as_cpu_f32("rms_norm")?);
        let mut out = self.output(rows * cols);
        self.pool.install(|| rowwise::rms_norm(xv, wv, eps, cols, &mut out));
        Tensor::cpu_f32(x.shape(), out)
    }

    fn layer_norm(&self, x: &Tensor, w: &Tensor, b: &Tensor, eps: f32) -> Result<Tensor> {
        let (rows, cols) = ops::layer_norm_dims(x, w, b)?;
        let (xv, wv, bv) = (x.as_cpu_f32("layer_norm")?, w.as_cpu_f32("layer_norm")?, b.as_cpu_f32("layer_norm")?);
        let mut out = self.output(rows * cols);
        self.pool.install(|| rowwise::layer_norm(xv, wv, bv, eps, cols, &mut out));
        Tensor::cpu_f32(x.shape(), out)
    }

    fn gelu(&self, x: &Tensor, kind: Gelu) -> Result<Tensor> {
        ops::expect_f32("gelu", x)?;
        let xv = x.as_cpu_f32("gelu")?;
        let mut out = self.output(xv.len());
        self.pool.install(|| elementwise::gelu(xv, kind, &mut out));
        Tensor::cpu_f32(x.shape(), out)
    }

    fn softmax(&self, x: &Tensor) -> Result<Tensor> {
        let (rows, cols) = ops::softmax_dims(x)?;
        let xv = x.as_cpu_f32("softmax")?;
        let mut out = self.output(rows * cols);
        self.pool.install(|| rowwise::softmax(xv, cols, &mut out));
        Tensor::cpu_f32(x.shape(), out)
    }

    fn silu_mul(&self, gate: &Tensor, up: &Tensor) -> Result<Tensor> {
        let len = ops::silu_mul_len(gate, up)?;
        let (g, u) = (gate.as_cpu_f32("silu_mul")?, up.as_cpu_f32("silu_mul")?);
        let mut out = self.output(len);
        self.pool.install(|| elementwise::silu_mul(g, u, &mut out));
        Tensor::cpu_f32(gate.shape(), out)
    }

    fn zeros(&self, shape: &[usize]) -> Result<Tensor> {
        Tensor::cpu_f32(shape, vec![0.0; shape.iter().product()])
    }

    fn embedding(&self, table: &Tensor, ids: &[u32]) -> Result<Tensor> {
        let (rows, hidden) = ops::embedding_dims(table, ids)?;
        if table.dtype().is_quantized() {
            let (dt, tb) = (table.dtype(), table.as_cpu_blocks("embedding")?);
            let rb = dt.row_bytes(hidden).ok_or_else(|| Error::shape("embedding", &[table.shape()], format!("rows are not whole {} blocks", dt)))?;
            let mut out = self.output(rows * hidden);
            self.pool.install(|| gather::embedding_blocks(dt, tb, rb, hidden, ids, &mut out));
            return Tensor::cpu_f32(&[rows, hidden], out);
        }
        let tv = Self::weights("embedding", table)?;
        let mut out = self.output(rows * hidden);
        self.pool.install(|| gather::embedding(tv, hidden, ids, &mut out));
        Tensor::cpu_f32(&[rows, hidden], out)
    }

    fn add(&self, a: &Tensor, b: &Tensor) -> Result<Tensor> {
        let len = ops::add_len(a, b)?;
        let (av, bv) = (a.as_cpu_f32("add")?, b.as_cpu_f32("add")?);
        let mut out = self.output(len);
        self.pool.install(|| elementwise::add(av, bv, &mut out));
        Tensor::cpu_f32(a.shape(), out)
    }

    fn rope(&self, x: &Tensor, cos: &Tensor, sin: &Tensor) -> Result<Tensor> {
        let (rows, heads, d) = ops::rope_dims(x, cos, sin)?;
        let (xv, c, s) = (x.as_cpu_f32("rope")?, cos.as_cpu_f32("rope")?, sin.as_cpu_f32("rope")?);
        let mut out = self.output(rows * heads * d);
        self.pool.install(|| rope::rope(xv, c, s, heads, d, &mut out));
        Tensor::cpu_f32(x.shape(), out)
    }

    fn attention_scaled(&self, q: &Tensor, k: &Tensor, v: &Tensor, scales: Option<&Tensor>, p: AttnParams) -> Result<Tensor> {
        let (t, heads, kv_heads, d) = ops::attention_dims(q, k, v, &p)?;
        ops::kv_scale_dims("attention", k, scales)?;
        let qv = q.as_cpu_f32("attention")?;
        let (kv, vv) = (Self::kv_f32("attention", k, p.kv_len, scales.map(|s| (s, 0)))?, Self::kv_f32("attention", v, p.kv_len, scales.map(|s| (s, 1)))?);
        let mut out = self.output(t * heads * d);
        let dims = attention::Dims { t, heads, kv_heads, d };
        self.pool.install(|| attention::attention(qv, &kv, &vv, dims, p, &mut out));
        Tensor::cpu_f32(&[t, heads, d], out)
    }

    fn write_rows(&self, dst: &mut Tensor, row0: usize, src: &Tensor) -> Result<()> {
        let (rows, row_len) = ops::write_rows_dims(dst, row0, src)?;
        let sv = src.as_cpu_f32("write_rows")?;
        let range = row0 * row_len..(row0 + rows) * row_len;
        if dst.dtype() == DType::F16 {
            let dv = dst.as_cpu_half_mut("write_rows")?;
            dv[range].iter_mut().zip(sv).for_each(|(d, &x)| *d = gpu::math::f32_to_f16_bits(x));
        } else {
            dst.as_cpu_f32_mut("write_rows")?[range].copy_from_slice(sv);
        }
        Ok(())
    }

    fn write_kv_rows(&self, dst: &mut Tensor, scales: Option<(&mut Tensor, usize)>, row0: usize, src: &Tensor) -> Result<()> {
        let (sc, which) = match scales {
            Some(s) => s,
            None => return self.write_rows(dst, row0, src),
        };
        let (rows, row_len) = ops::write_rows_dims(dst, row0, src)?;
        ops::expect_dtype("write_kv_rows", dst, DType::F16)?;
        ops::kv_scale_dims("write_kv_rows", dst, Some(sc))?;
        let d = dst.shape()[2].max(1);
        let (sv, scv) = (src.as_cpu_f32("write_kv_rows")?, sc.as_cpu_f32_mut("write_kv_rows")?);
        let mut scaled = Vec::with_capacity(rows * row_len);
        for (i, vec) in sv.chunks(d).enumerate() {
            let m = vec.iter().fold(0.0f32, |m, x| m.max(x.abs()));
            let s = if which == 1 { gpu::math::f16_value_scale(m) } else { gpu::math::f16_key_scale(m) };
            scv[crate::backend::KV_SCALES * (row0 * row_len / d + i) + which] = s;
            scaled.extend(vec.iter().map(|x| x / s));
        }
        self.write_rows(dst, row0, &Tensor::cpu_f32(src.shape(), scaled)?)
    }

    fn narrow_cols(&self, x: &Tensor, col0: usize, width: usize) -> Result<Tensor> {
        let (rows, cols) = ops::narrow_cols_dims(x, col0, width)?;
        let xv = x.as_cpu_f32("narrow_cols")?;
        let out: Vec<f32> = (0..rows).flat_map(|r| xv[r * cols + col0..r * cols + col0 + width].iter().copied()).collect();
        Tensor::cpu_f32(&[rows, width], out)
    }

    fn scatter_rows(&self, x: &Tensor, rows: &[usize], src: &Tensor, add: bool) -> Result<Tensor> {
        let (_, width) = ops::scatter_rows_dims(x, rows, src)?;
        let mut out = x.as_cpu_f32("scatter_rows")?.to_vec();
        let sv = src.as_cpu_f32("scatter_rows")?;
        for (i, &r) in rows.iter().enumerate() {
            let (dst, s) = (&mut out[r * width..(r + 1) * width], &sv[i * width..(i + 1) * width]);
            if add {
                dst.iter_mut().zip(s).for_each(|(d, v)| *d += v);
            } else {
                dst.copy_from_slice(s);
            }
        }
        Tensor::cpu_f32(x.shape(), out)
    }

    fn take_rows(&self, x: &Tensor, row0: usize, count: usize) -> Result<Tensor> {
        let (row_len, shape) = ops::take_rows_dims(x, row0, count)?;
        let range = row0 * row_len..(row0 + count) * row_len;
        match x.dtype() {
            DType::F16 => Tensor::cpu_half(&shape, DType::F16, x.as_cpu_half("take_rows")?[range].to_vec()),
            _ => Tensor::cpu_f32(&shape, x.as_cpu_f32("take_rows")?[range].to_vec()),
        }
    }

    fn synchronize(&self) -> Result<()> {
        Ok(())
    }

    fn set_poison_outputs(&self, on: bool) {
        self.poison.store(on, Ordering::Relaxed);
    }
}
