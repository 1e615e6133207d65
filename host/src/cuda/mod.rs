//! The CUDA backend: the kernels of `gpu/` (one PTX module chosen for the device and
//! JIT-compiled by the driver) launched through the driver API, with device memory from a
//! caching pool. Each op is the third layer over a kernel: shape rules (`crate::ops`), then the
//! checked launcher, then the kernel. One file per kernel family holds its launchers and the
//! bodies of its backend ops; the `Backend` impl below only dispatches to them.

mod attention;
pub mod driver;
mod elementwise;
mod error;
mod embedding;
mod graph;
mod launch;
mod linear;
mod module;
mod norm;
pub(crate) mod pool;
mod qlinear;
mod rope;
mod sample;
mod staging;

pub use linear::{LinearAlgo, PIPE_TILES};
pub use qlinear::{chunk_rows, device_layout};
pub use pool::{bucket, DeviceBuffer, Pool};

use crate::backend::{AttnParams, Backend, BlockMask, DeviceSampling, Gelu, Mark, MemoryStats, Precision, QkvRope, Recording};
use crate::kernels::{Arch, KernelsRequest, Ptx};
use crate::tensor::Storage;
use crate::{ops, DType, DeviceKind, Error, MappedBytes, Result, Tensor};
use cust::context::{Context, CurrentContext};
use cust::device::DeviceAttribute;
use cust::stream::{Stream, StreamFlags};
use launch::{cuda_err, Launcher, OkOrCuda};
use module::Kernels;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

pub struct CudaBackend {
    // Field order is drop order: stream and kernels go before the context.
    stream: Stream,
    kernels: Kernels,
    /// Arrival counters of split-KV attention and split-K few-row linears: zero between launches
    /// (each launch resets the ones it uses), so recorded steps can replay them. Dropped before
    /// the pool.
    counters: DeviceBuffer,
    /// One u32, zero until a kernel writes an f16 K/V row scale other than 1 (sticky): the
    /// tensor-core flash kernels take their scaled path only after that (see
    /// `gpu/src/flash_mma.rs`).
    kv_flag: DeviceBuffer,
    /// Page-locked memory small uploads go through without synchronizing (`None` when it could
    /// not be allocated: every upload then waits for its copy).
    staging: Option<staging::Staging>,
    pool: Arc<Pool>,
    ctx: Context,
    ordinal: usize,
    name: String,
    /// Compute capability, multiprocessor count and SM clock (kHz) of the device.
    cc: (u32, u32),
    sms: u32,
    clock_khz: u32,
    /// Why this kernel module was loaded.
    kernels_reason: String,
    poison: AtomicBool,
    /// `Precision::Bf16` asked for (and the compute_80 module, whose tensor-core GEMMs have
    /// the 16-bit-activation variants, loaded).
    a16: AtomicBool,
}

/// Page-locked bytes of the upload staging ring (uploads up to a quarter of it are staged).
const STAGING_BYTES: usize = 4 << 20;

/// Arrival counters kept for split-KV attention (one per KV head and query block) and split-K
/// few-row linears (one per column block).
pub(crate) const ARRIVAL_COUNTERS: usize = 1 << 16;

// SAFETY: the driver API is thread-safe; every entry point makes this backend's (primary)
// context current on the calling thread before using the module, stream or pool, so backends
// of different devices may be used from different threads, or one after the other from one.
unsafe impl Send for CudaBackend {}
unsafe impl Sync for CudaBackend {}

impl CudaBackend {
    /// Initializes CUDA on the device of `ordinal` (its primary context, made current on the
    /// calling thread), loads the module of `ptx` that `kernels` asks for (the newest the
    /// device supports by default) and looks up every kernel it must carry. Errors say which
    /// step failed. Backends of different ordinals may live in one process: each driver call
    /// below makes this backend's context current first (see [`CudaBackend::enter`]).
    pub fn new(ptx: &[Ptx], kernels: KernelsRequest, ordinal: usize) -> Result<CudaBackend> {
        let count = Self::device_count()?;
        if count == 0 {
            return Err(Error::Unavailable("no usable CUDA device (the driver reports none)".into()));
        }
        if ordinal >= count {
            return Err(Error::Unavailable(format!("no CUDA device {}: this process sees {} (ordinals 0 to {}; CUDA_VISIBLE_DEVICES renumbers them)", ordinal, count, count - 1)));
        }
        let device = cust::device::Device::get_device(ordinal as u32).map_err(|e| Error::Unavailable(format!("no CUDA device {} ({})", ordinal, e)))?;
        let ctx = Context::new(device).map_err(|e| Error::Unavailable(format!("cannot open CUDA device {} ({})", ordinal, e)))?;
        // (Context::new makes it current but ignores a failure; the module load and the stream
        // below need it current on this thread)
        CurrentContext::set_current(&ctx).map_err(|e| cuda_err("cuCtxSetCurrent", e))?;
        if let Err(e) = ctx.set_flags(cust::context::ContextFlags::SCHED_AUTO) {
            log::debug!("CUDA device {}: keeping the context's scheduling flags ({})", ordinal, e);
        }
        let name = device.name().unwrap_or_else(|_| "unknown CUDA device".into());
        let name = if ordinal == 0 { name } else { format!("{} #{}", name, ordinal) };
        let attr = |a| device.get_attribute(a).map(|v| v as u32).map_err(|e| Error::Unavailable(format!("cannot query {}: {}", name, e)));
        let cc = (attr(DeviceAttribute::ComputeCapabilityMajor)?, attr(DeviceAttribute::ComputeCapabilityMinor)?);
        let sms = attr(DeviceAttribute::MultiprocessorCount)?;
        let clock_khz = attr(DeviceAttribute::ClockRate)?;
        let mut shared_limit = 0;
        // SAFETY: an out-parameter for one attribute of a live device handle
        unsafe { cust::sys::cuDeviceGetAttribute(&mut shared_limit, cust::sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN, device.as_raw()) }
            .ok_or_cuda("cuDeviceGetAttribute (shared memory a block may opt in to)")?;
        let (kernels, kernels_reason) = Kernels::load(ptx, kernels, cc, shared_limit.max(0) as u32, &name)?;
        let stream = Stream::new(StreamFlags::NON_BLOCKING, None).map_err(|e| Error::Unavailable(format!("cannot create a stream: {}", e)))?;
        let pool = Pool::new(ctx.clone());
        // zeroed on the backend's own stream: a synchronous memset runs on the legacy stream,
        // which another backend's stream capture in this process (a recorded decode step on
        // another thread) refuses (CUDA_ERROR_STREAM_CAPTURE_IMPLICIT)
        let counters = pool.alloc(ARRIVAL_COUNTERS * 4)?;
        unsafe { cust::sys::cuMemsetD32Async(counters.addr(), 0, ARRIVAL_COUNTERS, stream.as_inner()) }.ok_or_cuda("cuMemsetD32Async (arrival counters)")?;
        let kv_flag = pool.alloc(4)?;
        unsafe { cust::sys::cuMemsetD32Async(kv_flag.addr(), 0, 1, stream.as_inner()) }.ok_or_cuda("cuMemsetD32Async (KV scale flag)")?;
        stream.synchronize().map_err(|e| cuda_err("cuStreamSynchronize (zeroing the arrival counters)", e))?;
        let staging = match staging::Staging::new(STAGING_BYTES) {
            Ok(s) => Some(s),
            Err(e) => {
                log::warn!("CUDA device {}: no page-locked upload staging ({}); small uploads wait for their copies", ordinal, e);
                None
            }
        };
        Ok(CudaBackend { stream, kernels, staging, pool, ctx, ordinal, name, cc, sms, clock_khz, kernels_reason, counters, kv_flag, poison: AtomicBool::new(false), a16: AtomicBool::new(false) })
    }

    /// How many CUDA devices this process sees (opening the driver and initializing it first).
    pub fn device_count() -> Result<usize> {
        let lib = driver::load().map_err(Error::Unavailable)?;
        log::debug!("CUDA driver opened from {}", lib);
        cust::init(cust::CudaFlags::empty()).map_err(|e| Error::Unavailable(format!("no usable CUDA device ({})", e)))?;
        cust::device::Device::num_devices().map(|n| n as usize).map_err(|e| Error::Unavailable(format!("cannot count the CUDA devices ({})", e)))
    }

    /// The device's ordinal (as `--device cuda:N` names it).
    pub fn ordinal(&self) -> usize {
        self.ordinal
    }

    /// The loaded module's architecture and why it was chosen.
    pub fn kernels_module(&self) -> (Arch, &str) {
        (self.kernels.arch(), &self.kernels_reason)
    }

    /// Whether the warpgroup GEMMs (`gpu/src/wgmma.rs`) and flash attention
    /// (`flash_attention_wgmma_*`) run here: the compute_80 module was loaded as sm_90a.
    pub fn warpgroup_kernels(&self) -> bool {
        self.kernels.sm90a()
    }

    /// How many times `kernel` was launched (or recorded) by this backend.
    pub fn kernel_launches(&self, kernel: crate::kernels::Kernel) -> u64 {
        self.kernels.launches(kernel)
    }

    /// Compute capability and multiprocessor count.
    pub fn device_shape(&self) -> ((u32, u32), u32) {
        (self.cc, self.sms)
    }

    /// The device's FP32 peak in TFLOP/s (FMA lanes per multiprocessor by compute capability,
    /// times multiprocessors, times the boost clock the driver reports).
    pub fn fp32_peak_tflops(&self) -> f64 {
        let lanes = match self.cc {
            (7, _) | (8, 0) => 64.0,
            _ => 128.0,
        };
        2.0 * lanes * self.sms as f64 * self.clock_khz as f64 * 1e3 / 1e12
    }

    /// Makes this backend's context current on the calling thread (another backend of another
    /// device may have been current there) and hands out the launcher.
    fn enter(&self) -> Result<Launcher<'_>> {
        CurrentContext::set_current(&self.ctx).map_err(|e| cuda_err("cuCtxSetCurrent", e))?;
        Ok(Launcher { kernels: &self.kernels, stream: self.stream.as_inner(), kv_flag: self.kv_flag.addr(), counters: self.counters.addr(), a16: self.a16.load(Ordering::Relaxed) })
    }

    fn buffer<'t>(&self, op: &'static str, t: &'t Tensor) -> Result<&'t DeviceBuffer> {
        match t.storage() {
            Storage::Cuda(b) => Ok(b),
            Storage::Cpu(_) => Err(Error::Device { op, msg: "operand is a CPU tensor; upload it to the CUDA backend first".into() }),
        }
    }

    /// A new output buffer of `len` 4-byte elements, NaN-filled when poisoning is on.
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

    /// The staging ring for an upload of `bytes` bytes, when one goes through it: the ring is
    /// there, the upload small enough, and no graph is being recorded (see `staging`).
    fn stager(&self, bytes: usize) -> Option<&staging::Staging> {
        self.staging.as_ref().filter(|st| bytes <= st.max_bytes() && !self.pool.recording())
    }

    /// Copies `bytes` bytes from host memory at `src` to `dst` on the stream. Small copies go
    /// through the page-locked staging ring and return at once (`src` is copied there first);
    /// larger ones, and any while a graph is being recorded, wait until `src` is read.
    fn copy_in(&self, dst: u64, src: *const u8, bytes: usize) -> Result<()> {
        self.enter()?;
        if bytes == 0 {
            return Ok(());
        }
        // SAFETY: the caller gives `bytes` readable bytes at `src`
        let data = unsafe { std::slice::from_raw_parts(src, bytes) };
        let stream = self.stream.as_inner();
        self.upload_with(data, |from| unsafe { cust::sys::cuMemcpyHtoDAsync_v2(dst, from as *const _, bytes, stream) }.ok_or_cuda("cuMemcpyHtoDAsync"))
    }

    /// Queues `copy(from)`, a host-to-device copy on the stream reading `data.len()` bytes at
    /// `from`: `from` in the staging ring when [`CudaBackend::stager`] takes the upload (the
    /// call returns at once), else `data` itself (pageable memory the caller owns: the call
    /// waits until it is read).
    fn upload_with(&self, data: &[u8], copy: impl FnOnce(*const u8) -> Result<()>) -> Result<()> {
        match self.stager(data.len()) {
            Some(st) => st.stage(data, self.stream.as_inner(), copy),
            None => {
                copy(data.as_ptr())?;
                self.synchronize()
            }
        }
    }

    /// Copies `bytes` bytes from host memory at `src` into a new pool buffer.
    fn upload_raw(&self, src: *const u8, bytes: usize) -> Result<DeviceBuffer> {
        self.enter()?;
        let buf = self.pool.alloc(bytes)?;
        self.copy_in(buf.addr(), src, bytes)?;
        Ok(buf)
    }

    /// Copies a device buffer's first `bytes` bytes to `dst`, waiting for the queued work.
    fn copy_out(&self, dst: *mut u8, src: &DeviceBuffer, bytes: usize) -> Result<()> {
        self.enter()?;
        if bytes > 0 {
            unsafe { cust::sys::cuMemcpyDtoHAsync_v2(dst as *mut _, src.addr(), bytes, self.stream.as_inner()) }.ok_or_cuda("cuMemcpyDtoHAsync")?;
        }
        self.synchronize()
    }

    fn upload_bytes(&self, shape: &[usize], dtype: DType, src: *const u8, bytes: usize) -> Result<Tensor> {
        Ok(Self::wrap(shape.to_vec(), dtype, self.upload_raw(src, bytes)?))
    }

    /// Frees every cached block of the memory pool.
    pub fn empty_cache(&self) {
        self.pool.empty_cache()
    }

    /// Records an event on the stream (for timing with [`cust::event::Event::elapsed_time_f32`]).
    pub fn record_event(&self, ev: &cust::event::Event) -> Result<()> {
        self.enter()?;
        ev.record(&self.stream).map_err(|e| cuda_err("cuEventRecord", e))
    }

    /// A device-to-device copy of `bytes` bytes (for the copy-bandwidth benchmark).
    pub fn copy_device(&self, dst: &Tensor, src: &Tensor, bytes: usize) -> Result<()> {
        let (d, s) = (self.buffer("copy_device", dst)?, self.buffer("copy_device", src)?);
        if bytes > d.len() || bytes > s.len() {
            return Err(Error::Limit { op: "copy_device", msg: format!("{} bytes exceed the buffers ({} / {})", bytes, d.len(), s.len()) });
        }
        self.enter()?;
        unsafe { cust::sys::cuMemcpyDtoDAsync_v2(d.addr(), s.addr(), bytes, self.stream.as_inner()) }.ok_or_cuda("cuMemcpyDtoDAsync")
    }
}

impl Drop for CudaBackend {
    /// The fields go after this: the module unloads from, and the stream is destroyed in, this
    /// backend's context, which need not be the thread's current one.
    fn drop(&mut self) {
        let _ = CurrentContext::set_current(&self.ctx);
    }
}

impl Backend for CudaBackend {
    fn kind(&self) -> DeviceKind {
        DeviceKind::Cuda
    }

    fn describe(&self) -> String {
        format!("CUDA ({}, {} kernels)", self.name, self.kernels.arch())
    }

    fn as_any(&self) -> &dyn std::any::Any {
        self
    }

    fn upload_f32(&self, shape: &[usize], data: &[f32]) -> Result<Tensor> {
        if shape.iter().product::<usize>() != data.len() {
            return Err(Error::shape("upload_f32", &[shape], format!("{} elements given", data.len())));
        }
        self.upload_bytes(shape, DType::F32, data.as_ptr() as *const u8, data.len() * 4)
    }

    fn upload_half(&self, shape: &[usize], dtype: DType, bits: &[u16]) -> Result<Tensor> {
        if dtype != DType::F16 && dtype != DType::BF16 {
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

    fn upload_blocks(&self, shape: &[usize], dtype: DType, blocks: crate::Blocks) -> Result<Tensor> {
        self.upload_blocks_op(shape, dtype, blocks)
    }

    fn download_f32(&self, t: &Tensor) -> Result<Vec<f32>> {
        ops::expect_f32("download_f32", t)?;
        let mut out = vec![0.0f32; t.elem_count()];
        self.copy_out(out.as_mut_ptr() as *mut u8, self.buffer("download_f32", t)?, out.len() * 4)?;
        Ok(out)
    }

    fn download_half(&self, t: &Tensor) -> Result<Vec<u16>> {
        if t.dtype() != DType::F16 && t.dtype() != DType::BF16 {
            return Err(Error::DType { op: "download_half", expected: "f16 or bf16", got: t.dtype() });
        }
        let mut out = vec![0u16; t.elem_count()];
        self.copy_out(out.as_mut_ptr() as *mut u8, self.buffer("download_half", t)?, out.len() * 2)?;
        Ok(out)
    }

    fn upload_u32(&self, shape: &[usize], data: &[u32]) -> Result<Tensor> {
        if shape.iter().product::<usize>() != data.len() {
            return Err(Error::shape("upload_u32", &[shape], format!("{} elements given", data.len())));
        }
        self.upload_bytes(shape, DType::U32, data.as_ptr() as *const u8, data.len() * 4)
    }

    fn download_u32(&self, t: &Tensor) -> Result<Vec<u32>> {
        ops::expect_dtype("download_u32", t, DType::U32)?;
        let mut out = vec![0u32; t.elem_count()];
        self.copy_out(out.as_mut_ptr() as *mut u8, self.buffer("download_u32", t)?, out.len() * 4)?;
        Ok(out)
    }

    fn write_u32(&self, dst: &mut Tensor, data: &[u32]) -> Result<()> {
        ops::expect_dtype("write_u32", dst, DType::U32)?;
        if dst.elem_count() != data.len() {
            return Err(Error::shape("write_u32", &[dst.shape()], format!("{} elements given", data.len())));
        }
        self.copy_in(self.buffer("write_u32", dst)?.addr(), data.as_ptr() as *const u8, data.len() * 4)
    }

    fn write_u32_cols(&self, dst: &mut Tensor, data: &[u32], width: usize) -> Result<()> {
        let (rows, cols) = ops::u32_cols_dims("write_u32_cols", dst, data, width)?;
        let l = self.enter()?;
        let to = self.buffer("write_u32_cols", dst)?.addr();
        let copy = |src: *const u8| {
            let c = cust::sys::CUDA_MEMCPY2D {
                srcXInBytes: 0,
                srcY: 0,
                srcMemoryType: cust::sys::CUmemorytype::CU_MEMORYTYPE_HOST,
                srcHost: src as *const _,
                srcDevice: 0,
                srcArray: std::ptr::null_mut(),
                srcPitch: width * 4,
                dstXInBytes: 0,
                dstY: 0,
                dstMemoryType: cust::sys::CUmemorytype::CU_MEMORYTYPE_DEVICE,
                dstHost: std::ptr::null_mut(),
                dstDevice: to,
                dstArray: std::ptr::null_mut(),
                dstPitch: cols * 4,
                WidthInBytes: width * 4,
                Height: rows,
            };
            // SAFETY: `rows` rows of `width` u32 at `src`, into `dst`'s `[rows, cols]`
            unsafe { cust::sys::cuMemcpy2DAsync_v2(&c, l.stream) }.ok_or_cuda("cuMemcpy2DAsync (write_u32_cols)")
        };
        if rows * width == 0 {
            return Ok(());
        }
        // SAFETY: `data` is `rows · width` u32
        let bytes = unsafe { std::slice::from_raw_parts(data.as_ptr() as *const u8, data.len() * 4) };
        self.upload_with(bytes, copy)
    }

    fn linear(&self, a: &Tensor, w: &Tensor, bias: Option<&Tensor>) -> Result<Tensor> {
        self.linear_op(a, w, bias, None)
    }

    fn rms_norm(&self, x: &Tensor, w: &Tensor, eps: f32) -> Result<Tensor> {
        self.rms_norm_op(x, w, eps)
    }

    fn layer_norm(&self, x: &Tensor, w: &Tensor, b: &Tensor, eps: f32) -> Result<Tensor> {
        self.layer_norm_op(x, w, b, eps)
    }

    fn gelu(&self, x: &Tensor, kind: Gelu) -> Result<Tensor> {
        self.gelu_op(x, kind)
    }

    fn softmax(&self, x: &Tensor) -> Result<Tensor> {
        self.softmax_op(x)
    }

    fn silu_mul(&self, gate: &Tensor, up: &Tensor) -> Result<Tensor> {
        self.silu_mul_op(gate, up)
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
        ops::embedding_dims(table, ids)?;
        let ids = self.upload_u32(&[ids.len()], ids)?;
        self.embedding_gather_op(table, &ids)
    }

    fn add(&self, a: &Tensor, b: &Tensor) -> Result<Tensor> {
        self.add_op(a, b)
    }

    fn rope(&self, x: &Tensor, cos: &Tensor, sin: &Tensor) -> Result<Tensor> {
        self.rope_op(x, cos, sin)
    }

    fn attention_scaled(&self, q: &Tensor, k: &Tensor, v: &Tensor, scales: Option<&Tensor>, p: AttnParams) -> Result<Tensor> {
        self.attention_op(q, k, v, scales, p, None)
    }

    fn write_rows(&self, dst: &mut Tensor, row0: usize, src: &Tensor) -> Result<()> {
        self.write_rows_op(dst, row0, src)
    }

    fn write_kv_rows(&self, dst: &mut Tensor, scales: Option<(&mut Tensor, usize)>, row0: usize, src: &Tensor) -> Result<()> {
        self.write_kv_rows_op(dst, scales, row0, src)
    }

    fn narrow_cols(&self, x: &Tensor, col0: usize, width: usize) -> Result<Tensor> {
        self.narrow_cols_op(x, col0, width)
    }

    fn rms_norm_swiglu_residual(&self, x: &Tensor, norm: &Tensor, eps: f32, gate: &Tensor, up: &Tensor, down: &Tensor) -> Result<Tensor> {
        self.rms_norm_swiglu_residual_op(x, norm, eps, gate, up, down)
    }

    fn layer_norm_gelu_mlp(&self, x: &Tensor, norm: (&Tensor, &Tensor, f32), fc1: (&Tensor, Option<&Tensor>), kind: Gelu, fc2: (&Tensor, Option<&Tensor>)) -> Result<Tensor> {
        self.layer_norm_gelu_mlp_op(x, norm, fc1, kind, fc2)
    }

    fn layer_norm_linears(&self, x: &Tensor, norm: (&Tensor, &Tensor, f32), linears: &[(&Tensor, Option<&Tensor>, Option<Gelu>)]) -> Result<Vec<Tensor>> {
        self.layer_norm_linears_op(x, norm, linears)
    }

    fn blend_rows(&self, table: &Tensor, ids: &[u32], weights: &[f32], per_row: usize) -> Result<Tensor> {
        self.blend_rows_op(table, ids, weights, per_row)
    }

    fn scatter_rows(&self, x: &Tensor, rows: &[usize], src: &Tensor, add: bool) -> Result<Tensor> {
        self.scatter_rows_op(x, rows, src, add)
    }

    fn take_rows(&self, x: &Tensor, row0: usize, count: usize) -> Result<Tensor> {
        self.take_rows_op(x, row0, count)
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

    fn set_memory_cap(&self, cap: Option<usize>) -> Result<()> {
        self.pool.set_cap(cap)
    }

    fn memory_cap(&self) -> Option<usize> {
        self.pool.cap()
    }

    fn device_memory(&self) -> Option<(usize, usize)> {
        let (mut free, mut total) = (0usize, 0usize);
        self.enter().ok()?;
        // SAFETY: two plain out-parameters; the context is current.
        unsafe { cust::sys::cuMemGetInfo_v2(&mut free, &mut total) }.ok_or_cuda("cuMemGetInfo").ok()?;
        Some((free, total))
    }

    fn alloc_size(&self, bytes: usize) -> usize {
        pool::bucket(bytes)
    }

    fn weight_alloc_size(&self, bytes: usize) -> usize {
        pool::exact(bytes)
    }

    fn set_weight_loading(&self, on: bool) {
        self.pool.set_exact(on)
    }

    fn precision(&self) -> Precision {
        if self.a16.load(Ordering::Relaxed) {
            Precision::Bf16
        } else {
            Precision::F32
        }
    }

    /// Bf16 takes effect with the compute_80 module (the compute_61 SIMT kernels multiply f32
    /// activations by widened weights, which costs nothing extra: that module stays f32).
    fn set_precision(&self, precision: Precision) {
        self.a16.store(precision == Precision::Bf16 && self.kernels.arch() >= Arch::Compute80, Ordering::Relaxed);
    }

    fn default_kv_dtype(&self) -> DType {
        DType::F16
    }

    fn embedding_gather(&self, table: &Tensor, ids: &Tensor) -> Result<Tensor> {
        self.embedding_gather_op(table, ids)
    }

    fn linear_residual(&self, a: &Tensor, w: &Tensor, bias: Option<&Tensor>, residual: &Tensor) -> Result<Tensor> {
        self.linear_op(a, w, bias, Some(residual))
    }

    fn linear_gelu(&self, a: &Tensor, w: &Tensor, bias: Option<&Tensor>, kind: Gelu) -> Result<Tensor> {
        self.linear_gelu_op(a, w, bias, kind)
    }

    fn gate_up_silu(&self, x: &Tensor, gate: &Tensor, up: &Tensor) -> Result<Tensor> {
        self.gate_up_silu_op(x, None, gate, up)
    }

    fn rms_norm_linear(&self, x: &Tensor, norm: &Tensor, eps: f32, w: &Tensor, bias: Option<&Tensor>) -> Result<Tensor> {
        self.rms_norm_linear_op(x, norm, eps, w, bias)
    }

    fn rms_norm_gate_up_silu(&self, x: &Tensor, norm: &Tensor, eps: f32, gate: &Tensor, up: &Tensor) -> Result<Tensor> {
        self.gate_up_silu_op(x, Some((norm, eps)), gate, up)
    }

    fn qkv_rope_append(&self, qkv: &Tensor, p: &QkvRope<'_>, cursor: &Tensor, k_cache: &mut Tensor, v_cache: &mut Tensor, scales: Option<&mut Tensor>) -> Result<Tensor> {
        self.qkv_rope_append_op(qkv, p, cursor, k_cache, v_cache, scales)
    }

    fn attention_cached(&self, q: &Tensor, k_cache: &Tensor, v_cache: &Tensor, scales: Option<&Tensor>, cursor: &Tensor, scale: f32) -> Result<Tensor> {
        self.attention_cached_op(q, k_cache, v_cache, scales, cursor, scale)
    }

    fn attention_paged(&self, q: &Tensor, k_pool: &Tensor, v_pool: &Tensor, scales: Option<&Tensor>, pages: &crate::Pages, scale: f32) -> Result<Tensor> {
        self.attention_paged_op(q, k_pool, v_pool, scales, pages, scale)
    }

    fn attention_slots(&self, q: &Tensor, k_pool: &Tensor, v_pool: &Tensor, scales: Option<&Tensor>, slots: &Tensor, p: AttnParams) -> Result<Tensor> {
        self.attention_slots_op(q, k_pool, v_pool, scales, slots, p)
    }

    fn attention_chunks(&self, q: &Tensor, k_pool: &Tensor, v_pool: &Tensor, scales: Option<&Tensor>, chunks: &crate::chunks::Chunks, scale: f32) -> Result<Tensor> {
        self.attention_chunks_op(q, k_pool, v_pool, scales, chunks, scale)
    }

    fn attention_block_sparse(&self, q: &Tensor, k: &Tensor, v: &Tensor, mask: &BlockMask, scale: f32, rope: Option<(&Tensor, &Tensor)>) -> Result<Tensor> {
        self.attention_block_sparse_op(q, k, v, mask, scale, rope)
    }

    fn sample_step(&self, logits: &Tensor, s: &DeviceSampling, n: usize, mask: Option<&Tensor>, ids: &mut Tensor, cursor: &mut Tensor) -> Result<()> {
        self.sample_step_op(logits, s, n, mask, ids, cursor)
    }

    fn sample_step_rows(&self, logits: &Tensor, settings: &Tensor, max_k: usize, n: usize, mask: Option<&Tensor>, ids: &mut Tensor, cursor: &mut Tensor) -> Result<()> {
        self.sample_step_rows_op(logits, settings, max_k, n, mask, ids, cursor)
    }

    fn records(&self) -> bool {
        true
    }

    fn record(&self, f: &mut dyn FnMut() -> Result<()>) -> Result<Option<Recording>> {
        self.record_op(f)
    }

    fn replay(&self, r: &Recording) -> Result<()> {
        self.replay_op(r)
    }

    fn profiler(&self, on: bool) -> Result<()> {
        self.synchronize()?;
        // SAFETY: argument-less driver calls on the current context (entered by synchronize)
        let r = unsafe { if on { driver::cuProfilerStart() } else { driver::cuProfilerStop() } };
        r.ok_or_cuda(if on { "cuProfilerStart" } else { "cuProfilerStop" })
    }

    fn mark(&self) -> Result<Mark> {
        self.mark_op()
    }

    fn seconds_between(&self, a: &Mark, b: &Mark) -> Result<f64> {
        self.seconds_between_op(a, b)
    }
}
