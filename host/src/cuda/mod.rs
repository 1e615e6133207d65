//! The CUDA backend: the kernels of `gpu/` (PTX, JIT-compiled by the driver for the device at
//! hand) launched through `cust`, with device memory from a caching pool. Each op here is the
//! third layer over a kernel: shape rules (`crate::ops`), then the checked launcher
//! (`launch`), then the kernel.

mod launch;
mod pool;

pub use launch::LinearAlgo;
pub use pool::{bucket, DeviceBuffer, Pool};

use crate::backend::{AttnParams, Backend, Gelu, MemoryStats};
use crate::kernels::Kernel;
use crate::tensor::Storage;
use crate::{ops, DType, DeviceKind, Error, MappedBytes, Result, Tensor};
use cust::context::{Context, CurrentContext};
use cust::module::Module;
use cust::stream::{Stream, StreamFlags};
use launch::{cuda_err, Launcher, OkOrCuda};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

/// Decode-sized inputs (at most this many rows) use the GEMV kernels.
pub const GEMV_MAX_ROWS: usize = 4;

pub struct CudaBackend {
    // Field order is drop order: stream and module go before the context.
    stream: Stream,
    module: Module,
    pool: Arc<Pool>,
    ctx: Context,
    name: String,
    poison: AtomicBool,
}

// SAFETY: the driver API is thread-safe; every entry point makes the (primary) context current
// on the calling thread before using the module or stream.
unsafe impl Send for CudaBackend {}
unsafe impl Sync for CudaBackend {}

impl CudaBackend {
    /// Initializes CUDA on device 0, loads `ptx` and checks that every kernel of
    /// [`Kernel::ALL`] is in it. Errors say which step failed.
    pub fn new(ptx: &str) -> Result<CudaBackend> {
        let ctx = cust::quick_init().map_err(|e| Error::Unavailable(format!("no usable CUDA device ({})", e)))?;
        let device = cust::device::Device::get_device(0).map_err(|e| Error::Unavailable(format!("no CUDA device 0 ({})", e)))?;
        let name = device.name().unwrap_or_else(|_| "unknown CUDA device".into());
        let module = Module::from_ptx(ptx, &[]).map_err(|e| Error::Unavailable(format!("loading the PTX on {} failed: {}", name, e)))?;
        for k in Kernel::ALL {
            module
                .get_function(k.name())
                .map_err(|e| Error::Unavailable(format!("kernel {} is missing from the PTX ({})", k.name(), e)))?;
        }
        let stream = Stream::new(StreamFlags::NON_BLOCKING, None).map_err(|e| Error::Unavailable(format!("cannot create a stream: {}", e)))?;
        let pool = Pool::new(ctx.clone());
        Ok(CudaBackend { stream, module, pool, ctx, name, poison: AtomicBool::new(false) })
    }

    fn enter(&self) -> Result<Launcher<'_>> {
        CurrentContext::set_current(&self.ctx).map_err(|e| cuda_err("cuCtxSetCurrent", e))?;
        Ok(Launcher { module: &self.module, stream: &self.stream })
    }

    fn buffer<'t>(&self, op: &'static str, t: &'t Tensor) -> Result<&'t DeviceBuffer> {
        match t.storage() {
            Storage::Cuda(b) => Ok(b),
            Storage::Cpu(_) => Err(Error::Device { op, msg: "operand is a CPU tensor; upload it to the CUDA backend first".into() }),
        }
    }

    /// A new output buffer of `len` f32, NaN-filled when poisoning is on.
    fn output(&self, len: usize) -> Result<DeviceBuffer> {
        let buf = self.pool.alloc(len * 4)?;
        if self.poison.load(Ordering::Relaxed) && len > 0 {
            unsafe { cust::sys::cuMemsetD32Async(buf.addr(), f32::NAN.to_bits(), len, self.stream.as_inner()) }
                .ok_or_cuda("cuMemsetD32Async")?;
        }
        Ok(buf)
    }

    fn wrap(shape: Vec<usize>, dtype: DType, buf: DeviceBuffer) -> Tensor {
        Tensor::from_storage(shape, dtype, Storage::Cuda(Arc::new(buf)))
    }

    /// Copies `bytes` bytes from host memory at `src` into a new pool buffer.
    fn upload_raw(&self, src: *const u8, bytes: usize) -> Result<DeviceBuffer> {
        self.enter()?;
        let buf = self.pool.alloc(bytes)?;
        if bytes > 0 {
            unsafe { cust::sys::cuMemcpyHtoDAsync_v2(buf.addr(), src as *const _, bytes, self.stream.as_inner()) }
                .ok_or_cuda("cuMemcpyHtoDAsync")?;
            // the source is pageable host memory owned by the caller: wait until it is read
            self.synchronize()?;
        }
        Ok(buf)
    }

    /// Index lists (token ids, row numbers) as a u32 device buffer.
    fn upload_u32(&self, v: &[u32]) -> Result<DeviceBuffer> {
        self.upload_raw(v.as_ptr() as *const u8, v.len() * 4)
    }

    fn upload_bytes(&self, shape: &[usize], dtype: DType, src: *const u8, bytes: usize) -> Result<Tensor> {
        Ok(Self::wrap(shape.to_vec(), dtype, self.upload_raw(src, bytes)?))
    }

    /// A linear layer with an explicit kernel choice (tests and benchmarks use this to cover
    /// both kernels; [`Backend::linear`] picks by the number of rows).
    pub fn linear_with(&self, algo: LinearAlgo, a: &Tensor, w: &Tensor, bias: Option<&Tensor>) -> Result<Tensor> {
        const OP: &str = "linear";
        let (m, n, k) = ops::linear_dims(a, w, bias)?;
        let l = self.enter()?;
        let (ab, wb) = (self.buffer(OP, a)?, self.buffer(OP, w)?);
        let bb = match bias {
            Some(b) => Some(self.buffer(OP, b)?),
            None => None,
        };
        let out = self.output(m * n)?;
        launch::linear(&l, algo, w.dtype(), ab, wb, bb, &out, (m, n, k))?;
        Ok(Self::wrap(ops::linear_out_shape(a, n), DType::F32, out))
    }

    /// Frees every cached block of the memory pool.
    pub fn empty_cache(&self) {
        self.pool.empty_cache()
    }

    /// Records an event on the stream (for timing with [`cust::event::Event::elapsed_time_f32`]).
    pub fn record(&self, ev: &cust::event::Event) -> Result<()> {
        self.enter()?;
        ev.record(&self.stream).map_err(|e| cuda_err("cuEventRecord", e))
    }
}

impl Backend for CudaBackend {
    fn kind(&self) -> DeviceKind {
        DeviceKind::Cuda
    }

    fn describe(&self) -> String {
        format!("CUDA ({})", self.name)
    }

    fn upload_f32(&self, shape: &[usize], data: &[f32]) -> Result<Tensor> {
        if shape.iter().product::<usize>() != data.len() {
            return Err(Error::shape("upload_f32", &[shape], format!("{} elements given", data.len())));
        }
        self.upload_bytes(shape, DType::F32, data.as_ptr() as *const u8, data.len() * 4)
    }

    fn upload_half(&self, shape: &[usize], dtype: DType, bits: &[u16]) -> Result<Tensor> {
        if dtype == DType::F32 {
            return Err(Error::DType { op: "upload_half", expected: "f16 or bf16", got: dtype });
        }
        if shape.iter().product::<usize>() != bits.len() {
            return Err(Error::shape("upload_half", &[shape], format!("{} elements given", bits.len())));
        }
        self.upload_bytes(shape, dtype, bits.as_ptr() as *const u8, bits.len() * 2)
    }

    fn upload_mapped(&self, shape: &[usize], dtype: DType, bytes: MappedBytes) -> Result<Tensor> {
        let raw = bytes.bytes();
        if shape.iter().product::<usize>() * dtype.size_of() != raw.len() {
            return Err(Error::shape("upload_mapped", &[shape], format!("{} bytes of {} given", raw.len(), dtype)));
        }
        self.upload_bytes(shape, dtype, raw.as_ptr(), raw.len())
    }

    fn download_f32(&self, t: &Tensor) -> Result<Vec<f32>> {
        ops::expect_f32("download_f32", t)?;
        let buf = self.buffer("download_f32", t)?;
        self.enter()?;
        let mut out = vec![0.0f32; t.elem_count()];
        if !out.is_empty() {
            unsafe {
                cust::sys::cuMemcpyDtoHAsync_v2(out.as_mut_ptr() as *mut _, buf.addr(), out.len() * 4, self.stream.as_inner())
            }
            .ok_or_cuda("cuMemcpyDtoHAsync")?;
        }
        self.synchronize()?;
        Ok(out)
    }

    fn linear(&self, a: &Tensor, w: &Tensor, bias: Option<&Tensor>) -> Result<Tensor> {
        let algo = if a.rows_cols().0 <= GEMV_MAX_ROWS { LinearAlgo::Gemv } else { LinearAlgo::Tiled };
        self.linear_with(algo, a, w, bias)
    }

    fn rms_norm(&self, x: &Tensor, w: &Tensor, eps: f32) -> Result<Tensor> {
        let (rows, cols) = ops::rms_norm_dims(x, w)?;
        let l = self.enter()?;
        let out = self.output(rows * cols)?;
        launch::rms_norm(&l, self.buffer("rms_norm", x)?, self.buffer("rms_norm", w)?, &out, rows, cols, eps)?;
        Ok(Self::wrap(x.shape().to_vec(), DType::F32, out))
    }

    fn layer_norm(&self, x: &Tensor, w: &Tensor, b: &Tensor, eps: f32) -> Result<Tensor> {
        let (rows, cols) = ops::layer_norm_dims(x, w, b)?;
        let l = self.enter()?;
        let out = self.output(rows * cols)?;
        launch::layer_norm(&l, self.buffer("layer_norm", x)?, self.buffer("layer_norm", w)?, self.buffer("layer_norm", b)?, &out, rows, cols, eps)?;
        Ok(Self::wrap(x.shape().to_vec(), DType::F32, out))
    }

    fn gelu(&self, x: &Tensor, kind: Gelu) -> Result<Tensor> {
        ops::expect_f32("gelu", x)?;
        let kernel = match kind {
            Gelu::Tanh => Kernel::GeluTanhF32,
            Gelu::Erf => Kernel::GeluErfF32,
        };
        let l = self.enter()?;
        let out = self.output(x.elem_count())?;
        launch::unary(&l, kernel, self.buffer("gelu", x)?, &out, x.elem_count())?;
        Ok(Self::wrap(x.shape().to_vec(), DType::F32, out))
    }

    fn softmax(&self, x: &Tensor) -> Result<Tensor> {
        let (rows, cols) = ops::softmax_dims(x)?;
        let l = self.enter()?;
        let out = self.output(rows * cols)?;
        launch::softmax(&l, self.buffer("softmax", x)?, &out, rows, cols)?;
        Ok(Self::wrap(x.shape().to_vec(), DType::F32, out))
    }

    fn silu_mul(&self, gate: &Tensor, up: &Tensor) -> Result<Tensor> {
        let len = ops::silu_mul_len(gate, up)?;
        let l = self.enter()?;
        let out = self.output(len)?;
        launch::binary(&l, Kernel::SiluMulF32, self.buffer("silu_mul", gate)?, self.buffer("silu_mul", up)?, &out, len)?;
        Ok(Self::wrap(gate.shape().to_vec(), DType::F32, out))
    }

    fn zeros(&self, shape: &[usize]) -> Result<Tensor> {
        let len: usize = shape.iter().product();
        self.enter()?;
        let buf = self.pool.alloc(len * 4)?;
        if len > 0 {
            unsafe { cust::sys::cuMemsetD32Async(buf.addr(), 0, len, self.stream.as_inner()) }.ok_or_cuda("cuMemsetD32Async")?;
        }
        Ok(Self::wrap(shape.to_vec(), DType::F32, buf))
    }

    fn embedding(&self, table: &Tensor, ids: &[u32]) -> Result<Tensor> {
        let (rows, hidden) = ops::embedding_dims(table, ids)?;
        let tb = self.buffer("embedding", table)?;
        let id_buf = self.upload_u32(ids)?;
        let l = self.enter()?;
        let out = self.output(rows * hidden)?;
        launch::embedding(&l, table.dtype(), tb, table.shape()[0], &id_buf, &out, rows, hidden)?;
        Ok(Self::wrap(vec![rows, hidden], DType::F32, out))
    }

    fn add(&self, a: &Tensor, b: &Tensor) -> Result<Tensor> {
        let len = ops::add_len(a, b)?;
        let l = self.enter()?;
        let out = self.output(len)?;
        launch::binary(&l, Kernel::AddF32, self.buffer("add", a)?, self.buffer("add", b)?, &out, len)?;
        Ok(Self::wrap(a.shape().to_vec(), DType::F32, out))
    }

    fn rope(&self, x: &Tensor, cos: &Tensor, sin: &Tensor) -> Result<Tensor> {
        let (rows, heads, d) = ops::rope_dims(x, cos, sin)?;
        let l = self.enter()?;
        let out = self.output(rows * heads * d)?;
        launch::rope(&l, self.buffer("rope", x)?, self.buffer("rope", cos)?, self.buffer("rope", sin)?, &out, rows, heads, d)?;
        Ok(Self::wrap(x.shape().to_vec(), DType::F32, out))
    }

    fn attention(&self, q: &Tensor, k: &Tensor, v: &Tensor, p: AttnParams) -> Result<Tensor> {
        const OP: &str = "attention";
        let (t, heads, kv_heads, d) = ops::attention_dims(q, k, v, &p)?;
        let l = self.enter()?;
        let out = self.output(t * heads * d)?;
        let shape = launch::AttnShape { t, heads, kv_heads, d, cap: k.shape()[0] };
        launch::attention(&l, self.buffer(OP, q)?, self.buffer(OP, k)?, self.buffer(OP, v)?, &out, &shape, &p)?;
        Ok(Self::wrap(vec![t, heads, d], DType::F32, out))
    }

    fn write_rows(&self, dst: &mut Tensor, row0: usize, src: &Tensor) -> Result<()> {
        let (rows, row_len) = ops::write_rows_dims(dst, row0, src)?;
        let bytes = rows * row_len * src.dtype().size_of();
        let offset = (row0 * row_len * dst.dtype().size_of()) as u64;
        let (d, s) = (self.buffer("write_rows", dst)?, self.buffer("write_rows", src)?);
        self.enter()?;
        if bytes > 0 {
            unsafe { cust::sys::cuMemcpyDtoDAsync_v2(d.addr() + offset, s.addr(), bytes, self.stream.as_inner()) }.ok_or_cuda("cuMemcpyDtoDAsync (write_rows)")?;
        }
        Ok(())
    }

    fn scatter_rows(&self, x: &Tensor, rows: &[usize], src: &Tensor, add: bool) -> Result<Tensor> {
        let (n, width) = ops::scatter_rows_dims(x, rows, src)?;
        let mut seen = std::collections::HashSet::new();
        if !rows.iter().all(|r| seen.insert(*r)) {
            return Err(Error::Limit { op: "scatter_rows", msg: "row indices must be distinct".into() });
        }
        let out = self.take_rows(x, 0, n)?.reshape(x.shape())?;
        let idx: Vec<u32> = rows.iter().map(|&r| r as u32).collect();
        let idx_buf = self.upload_u32(&idx)?;
        let l = self.enter()?;
        launch::scatter_rows(&l, self.buffer("scatter_rows", &out)?, n, &idx_buf, self.buffer("scatter_rows", src)?, rows.len(), width, add)?;
        Ok(out)
    }

    fn take_rows(&self, x: &Tensor, row0: usize, count: usize) -> Result<Tensor> {
        let (row_len, shape) = ops::take_rows_dims(x, row0, count)?;
        let src = self.buffer("take_rows", x)?;
        self.enter()?;
        let out = self.pool.alloc(count * row_len * 4)?;
        if count * row_len > 0 {
            let offset = (row0 * row_len * 4) as u64;
            unsafe { cust::sys::cuMemcpyDtoDAsync_v2(out.addr(), src.addr() + offset, count * row_len * 4, self.stream.as_inner()) }.ok_or_cuda("cuMemcpyDtoDAsync (take_rows)")?;
        }
        Ok(Self::wrap(shape, DType::F32, out))
    }

    fn synchronize(&self) -> Result<()> {
        self.enter()?;
        self.stream.synchronize().map_err(|e| cuda_err("cuStreamSynchronize (a kernel before it failed)", e))
    }

    fn memory_stats(&self) -> MemoryStats {
        self.pool.stats()
    }

    fn set_poison_outputs(&self, on: bool) {
        self.poison.store(on, Ordering::Relaxed);
    }
}
