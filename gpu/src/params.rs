//! Launch parameters, one `#[repr(C)]` struct per kernel family, passed by value as the
//! kernel's single argument. The host fills them with device addresses (`u64`) and sizes
//! after validating them; the layout is shared by both sides because both compile this file.
//!
//! All tensors are row-major and contiguous along their last axis; `ld*` fields give the
//! distance in elements between consecutive rows.

/// `c[m, n] = sum_k a[m, k] * w[n, k] (+ bias[n])`: a linear layer, `w` in PyTorch's
/// `[out_features, in_features]` layout. Used by the `matmul_*` and `gemv_*` kernels.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct LinearParams {
    /// `[m, k]` f32 activations, row stride `lda`.
    pub a: u64,
    /// `[n, k]` weights of the kernel's dtype, row stride `k`.
    pub w: u64,
    /// `[n]` f32 bias, or 0 for none.
    pub bias: u64,
    /// `[m, n]` f32 output, row stride `ldc`.
    pub c: u64,
    pub m: u32,
    pub n: u32,
    pub k: u32,
    pub lda: u32,
    pub ldc: u32,
    pub _pad: u32,
}

/// `y[r, :] = x[r, :] * rsqrt(mean(x[r, :]^2) + eps) * w` for each of `rows` rows.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct RmsNormParams {
    /// `[rows, n]` f32 input.
    pub x: u64,
    /// `[n]` f32 weight.
    pub w: u64,
    /// `[rows, n]` f32 output (may alias `x`).
    pub y: u64,
    pub rows: u32,
    pub n: u32,
    pub eps: f32,
    pub _pad: u32,
}

/// `y[r, :] = (x[r, :] - mean) · rsqrt(var + eps) · w + b` for each of `rows` rows.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct LayerNormParams {
    /// `[rows, n]` f32 input.
    pub x: u64,
    /// `[n]` f32 weight.
    pub w: u64,
    /// `[n]` f32 bias.
    pub b: u64,
    /// `[rows, n]` f32 output (may alias `x`).
    pub y: u64,
    pub rows: u32,
    pub n: u32,
    pub eps: f32,
    pub _pad: u32,
}

/// `out[i] = f(x[i])` for `i < len`.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct UnaryParams {
    pub x: u64,
    pub out: u64,
    pub len: u64,
}

/// `y[r, :] = softmax(x[r, :])` for each of `rows` rows.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct SoftmaxParams {
    /// `[rows, n]` f32 input.
    pub x: u64,
    /// `[rows, n]` f32 output (may alias `x`).
    pub y: u64,
    pub rows: u32,
    pub n: u32,
}

/// `out[i] = f(a[i], b[i])` for `i < len`: `silu_mul_f32` (a = gate, b = up) and `add_f32`.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct BinaryParams {
    pub a: u64,
    pub b: u64,
    pub out: u64,
    pub len: u64,
}

/// `out[r, :] = f32(table[ids[r], :])` for `r < rows`.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct EmbeddingParams {
    /// `[vocab, hidden]` of the kernel's dtype.
    pub table: u64,
    /// `[rows]` u32 token ids, each `< vocab` (checked by the host).
    pub ids: u64,
    /// `[rows, hidden]` f32.
    pub out: u64,
    pub rows: u32,
    pub hidden: u32,
}

/// `out[rows[i], :] (+)= src[i, :]` for `i < count`; `out` already holds a copy of `x`.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct ScatterRowsParams {
    /// `[n, width]` f32, updated in place.
    pub out: u64,
    /// `[count]` u32 row indices, each `< n` (checked by the host).
    pub rows: u64,
    /// `[count, width]` f32.
    pub src: u64,
    pub count: u32,
    pub width: u32,
    /// 1: add, 0: replace.
    pub add: u32,
    pub _pad: u32,
}

/// Rotate-half rotary embedding of `x [rows, heads, d]` with `cos`, `sin` `[rows, d / 2]`.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct RopeParams {
    pub x: u64,
    pub cos: u64,
    pub sin: u64,
    /// `[rows, heads, d]` f32 (may alias `x`).
    pub out: u64,
    pub rows: u32,
    pub heads: u32,
    pub d: u32,
    pub _pad: u32,
}

/// Attention of `q [t, heads, d]` over the first `kv_len` rows of `k`, `v` `[cap, kv_heads, d]`.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct AttentionParams {
    pub q: u64,
    pub k: u64,
    pub v: u64,
    /// `[t, heads, d]` f32.
    pub out: u64,
    pub t: u32,
    pub heads: u32,
    pub kv_heads: u32,
    pub d: u32,
    pub kv_len: u32,
    /// Key position of query row 0.
    pub q_pos0: u32,
    /// 1: query `i` sees keys `0 ..= q_pos0 + i`; 0: all `kv_len` keys.
    pub causal: u32,
    pub scale: f32,
}

/// Launch shape of `attention_f32`: one warp per (query row, head).
pub mod attention_tile {
    pub const WARPS: u32 = 4;
    pub const THREADS: u32 = WARPS * 32;
    /// Head-dim elements a lane keeps in registers; `d <= 32 * MAX_PER_LANE`.
    pub const MAX_PER_LANE: usize = 8;
}

/// Tile sizes of `matmul_*`, shared with the host launcher.
pub mod matmul_tile {
    /// Rows of `c` per block.
    pub const BM: u32 = 64;
    /// Columns of `c` per block.
    pub const BN: u32 = 64;
    /// Depth of one shared-memory stage.
    pub const BK: u32 = 16;
    /// Threads per block (16 x 16; each computes a 4 x 4 register block).
    pub const THREADS: u32 = 256;
}

/// Launch shape of `gemv_*`: one warp per output element.
pub mod gemv_tile {
    /// Warps (= output rows) per block.
    pub const WARPS: u32 = 8;
    pub const THREADS: u32 = WARPS * 32;
}

/// Threads per block of the row-wise kernels (`rms_norm_*`, `softmax_*`): one block per row.
pub const ROW_THREADS: u32 = 256;
/// Threads per block of the elementwise kernels.
pub const ELEMENTWISE_THREADS: u32 = 256;
