//! The pure-Rust CPU backend: multithreaded (its own rayon pool), f32 activations, weights read
//! in their stored dtype. It is also the reference the CUDA backend is tested against.

mod elementwise;
mod linear;
mod rowwise;

pub use linear::{dot, Weights};

use crate::backend::Backend;
use crate::ops;
use crate::{DType, DeviceKind, Error, Result, Tensor};
use std::sync::atomic::{AtomicBool, Ordering};

pub struct CpuBackend {
    pool: rayon::ThreadPool,
    poison: AtomicBool,
}

impl CpuBackend {
    /// A CPU backend with `threads` worker threads (all cores when `None`).
    pub fn new(threads: Option<usize>) -> Result<CpuBackend> {
        let mut b = rayon::ThreadPoolBuilder::new();
        if let Some(t) = threads {
            b = b.num_threads(t.max(1));
        }
        let pool = b.build().map_err(|e| Error::Limit { op: "cpu backend", msg: format!("cannot start worker threads: {}", e) })?;
        Ok(CpuBackend { pool, poison: AtomicBool::new(false) })
    }

    pub fn threads(&self) -> usize {
        self.pool.current_num_threads()
    }

    fn output(&self, len: usize) -> Vec<f32> {
        let fill = if self.poison.load(Ordering::Relaxed) { f32::NAN } else { 0.0 };
        vec![fill; len]
    }

    fn weights<'a>(w: &'a Tensor) -> Result<Weights<'a>> {
        Ok(match w.dtype() {
            DType::F32 => Weights::F32(w.as_cpu_f32("linear")?),
            DType::F16 => Weights::F16(w.as_cpu_half("linear")?),
            DType::BF16 => Weights::Bf16(w.as_cpu_half("linear")?),
        })
    }
}

impl Backend for CpuBackend {
    fn kind(&self) -> DeviceKind {
        DeviceKind::Cpu
    }

    fn describe(&self) -> String {
        format!("CPU ({} threads)", self.threads())
    }

    fn upload_f32(&self, shape: &[usize], data: &[f32]) -> Result<Tensor> {
        Tensor::cpu_f32(shape, data.to_vec())
    }

    fn upload_half(&self, shape: &[usize], dtype: DType, bits: &[u16]) -> Result<Tensor> {
        Tensor::cpu_half(shape, dtype, bits.to_vec())
    }

    fn download_f32(&self, t: &Tensor) -> Result<Vec<f32>> {
        Ok(t.as_cpu_f32("download_f32")?.to_vec())
    }

    fn linear(&self, a: &Tensor, w: &Tensor, bias: Option<&Tensor>) -> Result<Tensor> {
        let (m, n, k) = ops::linear_dims(a, w, bias)?;
        let av = a.as_cpu_f32("linear")?;
        let wv = Self::weights(w)?;
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

    fn synchronize(&self) -> Result<()> {
        Ok(())
    }

    fn set_poison_outputs(&self, on: bool) {
        self.poison.store(on, Ordering::Relaxed);
    }
}
