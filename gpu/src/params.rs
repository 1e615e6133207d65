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
    /// `[m, n]` f32 added to the result (row stride `ldc`), or 0 for none; may be `c` itself.
    pub residual: u64,
    /// `[m, n]` f32 output, row stride `ldc`.
    pub c: u64,
    /// `[k]` f32 RMSNorm weight applied to each row of `a` first (`gemv_vec_*` only), or 0.
    pub norm: u64,
    pub m: u32,
    pub n: u32,
    pub k: u32,
    pub lda: u32,
    pub ldc: u32,
    /// The RMSNorm epsilon (with `norm`).
    pub eps: f32,
    /// Activation applied before the residual by the tiled kernels: 0 none, 1 tanh GELU,
    /// 2 erf GELU (see `ACT_*`).
    pub act: u32,
    pub _pad: u32,
}

/// [`LinearParams::act`]: no activation.
pub const ACT_NONE: u32 = 0;
/// [`LinearParams::act`]: GELU, tanh approximation.
pub const ACT_GELU_TANH: u32 = 1;
/// [`LinearParams::act`]: GELU, erf form.
pub const ACT_GELU_ERF: u32 = 2;

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
    /// `[rows]` u32 token ids; an id `>= vocab` (only possible for ids made on the device) gives
    /// a row of NaN rather than a read out of bounds.
    pub ids: u64,
    /// `[rows, hidden]` f32.
    pub out: u64,
    pub rows: u32,
    pub hidden: u32,
    pub vocab: u32,
    pub _pad: u32,
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
    /// `[t, 4]` u32 decode cursor (see [`QkvRopeParams::cursor`]) or 0. When set, causal query
    /// `i` sees keys `0 ..= cursor[i].row` (at most `cap`) instead of the host's `q_pos0 + i`.
    pub cursor: u64,
    /// Rows the K/V buffers hold.
    pub cap: u32,
    pub _pad: u32,
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

/// Tile sizes of `matmul_big_*` (compute_61 SIMT GEMM for prefill-sized `m`).
pub mod matmul_big_tile {
    /// Rows of `c` per block.
    pub const BM: u32 = 128;
    /// Columns of `c` per block.
    pub const BN: u32 = 128;
    /// Depth of one shared-memory stage.
    pub const BK: u32 = 8;
    /// 16 × 16 threads, each an 8 × 8 register block.
    pub const THREADS: u32 = 256;
}

/// Tile sizes of `matmul_mma_*` (compute_80 tensor-core GEMM).
pub mod mma_tile {
    /// Rows of `c` per block of the largest tile (`matmul_mma_*`); the variants are named by
    /// their tile (`matmul_mma_64x128_*`, `matmul_mma_64x64_*`).
    pub const BM: u32 = 128;
    /// Columns of `c` per block of the largest tile.
    pub const BN: u32 = 128;
    /// The tiles the kernels come in: (rows, columns), largest first.
    pub const TILES: [(u32, u32); 3] = [(128, 128), (64, 128), (64, 64)];
    /// Depth of one shared-memory stage (two mma k-steps).
    pub const BK: u32 = 32;
    /// Warps along n (2 along m): a warp owns a 64 × 32 tile.
    pub const WARPS_N: u32 = 4;
    pub const THREADS: u32 = 256;
}

/// Launch shape of `gemv_*`: one warp per output element.
pub mod gemv_tile {
    /// Activation rows the backend sends to GEMV kernels (more take the tiled matmul); the
    /// vector kernels take one.
    pub const MAX_ROWS: usize = 4;
    /// Warps (= output rows) per block.
    pub const WARPS: u32 = 8;
    pub const THREADS: u32 = WARPS * 32;
}

/// Threads per block of the row-wise kernels (`rms_norm_*`, `softmax_*`): one block per row.
pub const ROW_THREADS: u32 = 256;
/// Threads per block of the elementwise kernels.
pub const ELEMENTWISE_THREADS: u32 = 256;

/// Launch shape of `gemv_vec_*` and `gemv_gate_up_*`: one warp per output feature, weights
/// streamed as 16-byte vectors. The launcher picks the warps per block (the kernels read it).
pub mod gemv_vec_tile {
    /// Warps (= output features) per block for small `n` (more blocks to fill the device).
    pub const WARPS_SMALL: u32 = 4;
    /// Warps per block for large `n` (fewer blocks repeat the RMSNorm prologue).
    pub const WARPS_LARGE: u32 = 8;
    /// 16-byte weight vectors per lane, row and round (two rounds in flight).
    pub const UNROLL: usize = 4;
    /// Floats of normed activations a block may stage in dynamic shared memory (`k`): 44 KiB,
    /// leaving room under the 48 KiB limit for the kernel's static scratch.
    pub const MAX_STAGED: usize = 11 * 1024;
}

/// `c[m, n] = silu(a · gateᵀ) ⊙ (a · upᵀ)`: the SwiGLU MLP's first half in one pass.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct GateUpParams {
    /// `[m, k]` f32 activations, row stride `lda`.
    pub a: u64,
    /// `[n, k]` gate weights of the kernel's dtype.
    pub gate: u64,
    /// `[n, k]` up weights of the kernel's dtype.
    pub up: u64,
    /// `[m, n]` f32 output.
    pub c: u64,
    /// `[k]` f32 RMSNorm weight applied to each row of `a` first, or 0.
    pub norm: u64,
    pub m: u32,
    pub n: u32,
    pub k: u32,
    pub lda: u32,
    pub eps: f32,
    pub _pad: u32,
}

/// A decoder pass's cursor: `[t, CURSOR_FIELDS]` u32, per row its (t, h, w) rotary position and
/// the KV-cache row it is written to.
pub const CURSOR_FIELDS: usize = 4;
/// Index of the KV-cache row within a cursor row.
pub const CURSOR_ROW: usize = 3;

/// Per-head q/k RMSNorm, interleaved MRoPE and the KV-cache append of a fused `[t, (heads +
/// 2 kv_heads) · d]` QKV projection.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct QkvRopeParams {
    /// `[t, heads + 2 · kv_heads, d]` f32: q heads, then k heads, then v heads.
    pub qkv: u64,
    /// `[d]` f32 RMSNorm weights of q and k heads.
    pub q_norm: u64,
    pub k_norm: u64,
    /// `[d / 2]` f32 rotary inverse frequencies.
    pub inv_freq: u64,
    /// `[t, CURSOR_FIELDS]` u32 (see [`CURSOR_FIELDS`]).
    pub cursor: u64,
    /// `[t, heads, d]` f32: normed, rotated queries.
    pub q_out: u64,
    /// `[cap, kv_heads, d]` of the kernel's dtype (f32 or f16): normed, rotated keys and the
    /// values are written at each row's cache row.
    pub k_cache: u64,
    pub v_cache: u64,
    pub t: u32,
    pub heads: u32,
    pub kv_heads: u32,
    pub d: u32,
    pub cap: u32,
    pub eps: f32,
    /// Interleaved MRoPE sections (t, h, w), in frequency pairs.
    pub section: [u32; 3],
    pub _pad: u32,
}

/// Launch shape of `qkv_rope_append_*`: one warp per (row, head vector).
pub mod qkv_rope_tile {
    pub const WARPS: u32 = 4;
    pub const THREADS: u32 = WARPS * 32;
    /// Largest head dim (a warp stages its vector in shared memory).
    pub const MAX_D: usize = 256;
}

/// Split-KV attention for a few query rows against the KV cache: partial softmax states per
/// KV chunk, merged by the last block of each KV group to finish.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct SplitAttnParams {
    /// `[t, heads, d]` f32 queries.
    pub q: u64,
    /// `[cap, kv_heads, d]` of the kernel's dtype.
    pub k: u64,
    pub v: u64,
    /// `[t, CURSOR_FIELDS]` u32: query `i` sees keys `0 ..= cursor[i].row`.
    pub cursor: u64,
    /// `[t, heads, splits, d + 2]` f32 partial states: unnormalized output, then max and sum.
    pub partial: u64,
    /// `[t, heads, d]` f32 output (written by the last block of each group to finish).
    pub out: u64,
    /// `[kv_heads · blocks per group]` u32 arrival counters, zero before the launch; the
    /// kernel leaves them zero.
    pub counters: u64,
    pub t: u32,
    pub heads: u32,
    pub kv_heads: u32,
    pub d: u32,
    pub cap: u32,
    pub splits: u32,
    pub scale: f32,
    pub _pad: u32,
}

/// Launch shape of `attention_split_*`.
pub mod attn_split_tile {
    pub const WARPS: u32 = 4;
    pub const THREADS: u32 = WARPS * 32;
    /// Query vectors (of the rows × heads of one KV group) a block serves; a group with more
    /// takes several blocks (grid z).
    pub const MAX_QV: usize = 2;
    /// Query vectors per KV group the split path takes in all.
    pub const MAX_GROUP_QV: usize = 16;
    /// Largest head dim (a power of two from 32 up to this).
    pub const MAX_D: usize = 256;
    /// At most this many KV chunks.
    pub const MAX_SPLITS: usize = 64;
    /// Keys a chunk gets at least (shorter contexts use fewer chunks): a block of 32 keys per
    /// warp. More keys per chunk shorten the merge but leave warps idle at short contexts;
    /// fewer lengthen the merge (both measured on the H100, BENCHMARKS.md).
    pub const MIN_KEYS: usize = 128;
    /// Query rows the split path takes (more go to the tiled kernel).
    pub const MAX_ROWS: usize = 4;
}

/// Token choice on the device: top-k candidates per block, then one pick per row.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct SampleParams {
    /// `[rows, n]` f32 logits.
    pub logits: u64,
    /// `[rows, blocks, k]` candidates: f32 logits then u32 ids (two arrays of `rows·blocks·k`).
    pub cand: u64,
    /// `[rows]` u32: the picked token ids.
    pub ids: u64,
    /// `[rows, CURSOR_FIELDS]` u32, advanced by one on every field after the pick.
    pub cursor: u64,
    pub rows: u32,
    pub n: u32,
    /// Candidates kept (1: greedy).
    pub k: u32,
    /// Blocks per row of the first stage.
    pub blocks: u32,
    /// <= 0: greedy (the best candidate).
    pub temperature: f32,
    pub top_p: f32,
    pub seed: u64,
}

/// Launch shape of the sampling kernels.
pub mod sample_tile {
    pub const THREADS: u32 = 256;
    /// First-stage blocks per row.
    pub const BLOCKS: u32 = 64;
    /// Largest top-k done on the device.
    pub const MAX_K: usize = 64;
    /// Logits a first-stage block stages in shared memory.
    pub const MAX_SLICE: usize = 4096;
    /// Candidates the second stage merges (`blocks · k`) in shared memory.
    pub const MAX_CAND: usize = 4096;
}

/// `out[i] = f16(x[i])` for `i < len` (round to nearest even), `out` as raw bits.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct CastParams {
    pub x: u64,
    pub out: u64,
    pub len: u64,
}
