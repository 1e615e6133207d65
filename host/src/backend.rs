//! The backend interface: every op the model uses, once, implemented by the CPU backend
//! (pure Rust, multithreaded) and the CUDA backend (Rust kernels from `gpu/`). Code above
//! this trait is written once and runs on either. Shape and dtype rules live in [`crate::ops`]
//! and both backends check them before doing any work.

use crate::{DType, DeviceKind, MappedBytes, Result, Tensor};

/// Device memory accounting (all zero on the CPU backend).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct MemoryStats {
    /// Bytes held by live tensors.
    pub in_use: usize,
    /// Bytes of freed blocks kept for reuse.
    pub cached: usize,
    /// High-water mark of `in_use`.
    pub peak: usize,
    /// Number of real device allocations made so far (cache misses).
    pub device_allocs: u64,
}

/// The two GELU forms Qwen3-VL uses: tanh in the vision MLP, erf in the patch mergers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Gelu {
    Tanh,
    Erf,
}

/// How queries see keys in [`Backend::attention`].
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct AttnParams {
    /// Valid key/value rows (a prefix of the cache).
    pub kv_len: usize,
    /// Key index of the first query row: query `i` sits at key position `q_pos0 + i`.
    pub q_pos0: usize,
    /// Causal: query `i` attends to keys `0 ..= q_pos0 + i` only. Otherwise to all `kv_len`.
    pub causal: bool,
    /// Multiplier of the scores, usually `1 / sqrt(head_dim)`.
    pub scale: f32,
}

pub trait Backend: Send + Sync {
    /// Which device this backend runs on.
    fn kind(&self) -> DeviceKind;

    /// A human-readable description (device name, threads).
    fn describe(&self) -> String;

    /// Copies f32 host data into a new tensor on this backend.
    fn upload_f32(&self, shape: &[usize], data: &[f32]) -> Result<Tensor>;

    /// Copies raw f16/bf16 bits into a new tensor of `dtype` on this backend.
    fn upload_half(&self, shape: &[usize], dtype: DType, bits: &[u16]) -> Result<Tensor>;

    /// A tensor of `dtype` from mapped checkpoint bytes: zero-copy on the CPU when aligned,
    /// uploaded on a device.
    fn upload_mapped(&self, shape: &[usize], dtype: DType, bytes: MappedBytes) -> Result<Tensor>;

    /// Copies an f32 tensor of this backend back to host memory.
    fn download_f32(&self, t: &Tensor) -> Result<Vec<f32>>;

    /// Linear layer: `a [m, k]` f32 times `w [n, k]` (f32/f16/bf16) transposed, plus an optional
    /// `bias [n]` f32; returns `[m, n]` f32.
    fn linear(&self, a: &Tensor, w: &Tensor, bias: Option<&Tensor>) -> Result<Tensor>;

    /// RMSNorm over the last axis of `x` with f32 weight `w [cols]`.
    fn rms_norm(&self, x: &Tensor, w: &Tensor, eps: f32) -> Result<Tensor>;

    /// LayerNorm over the last axis of `x` with f32 weight and bias `[cols]`.
    fn layer_norm(&self, x: &Tensor, w: &Tensor, b: &Tensor, eps: f32) -> Result<Tensor>;

    /// GELU, elementwise (tanh approximation or exact erf form).
    fn gelu(&self, x: &Tensor, kind: Gelu) -> Result<Tensor>;

    /// Softmax over the last axis of `x`.
    fn softmax(&self, x: &Tensor) -> Result<Tensor>;

    /// `silu(gate) * up`, elementwise, same shapes.
    fn silu_mul(&self, gate: &Tensor, up: &Tensor) -> Result<Tensor>;

    /// A new f32 tensor of zeros.
    fn zeros(&self, shape: &[usize]) -> Result<Tensor>;

    /// Embedding lookup: rows `ids` of `table [vocab, hidden]` (any dtype) as `[ids.len(), hidden]`
    /// f32. Ids out of range are an error.
    fn embedding(&self, table: &Tensor, ids: &[u32]) -> Result<Tensor>;

    /// `a + b`, elementwise, same shapes, f32.
    fn add(&self, a: &Tensor, b: &Tensor) -> Result<Tensor>;

    /// Rotary embedding in the rotate-half layout: `x [rows, heads, head_dim]` with per-row
    /// `cos`, `sin` of `[rows, head_dim / 2]` (the same angle applies to element `i` and
    /// `i + head_dim / 2`).
    fn rope(&self, x: &Tensor, cos: &Tensor, sin: &Tensor) -> Result<Tensor>;

    /// Scaled dot-product attention with grouped KV heads (see [`AttnParams`]):
    /// `q [t, heads, d]` against the first `p.kv_len` rows of `k`, `v` `[cap, kv_heads, d]`;
    /// returns `[t, heads, d]`.
    fn attention(&self, q: &Tensor, k: &Tensor, v: &Tensor, p: AttnParams) -> Result<Tensor>;

    /// Copies `src [r, ..]` into rows `row0 .. row0 + r` of `dst [cap, ..]` (trailing axes equal),
    /// in place: the KV-cache append.
    fn write_rows(&self, dst: &mut Tensor, row0: usize, src: &Tensor) -> Result<()>;

    /// `x [n, width]` with row `rows[i]` replaced by (`add`: increased by) row `i` of
    /// `src [rows.len(), width]`: image embeddings into the prompt, DeepStack features.
    fn scatter_rows(&self, x: &Tensor, rows: &[usize], src: &Tensor, add: bool) -> Result<Tensor>;

    /// Rows `row0 .. row0 + count` of `x [rows, ..]` as a new tensor.
    fn take_rows(&self, x: &Tensor, row0: usize, count: usize) -> Result<Tensor>;

    /// Waits for all queued work.
    fn synchronize(&self) -> Result<()>;

    /// Device memory accounting.
    fn memory_stats(&self) -> MemoryStats {
        MemoryStats::default()
    }

    /// Test aid: when on, every new output buffer is filled with NaN before the op writes it,
    /// so an element an op fails to write shows up as NaN.
    fn set_poison_outputs(&self, on: bool);
}
