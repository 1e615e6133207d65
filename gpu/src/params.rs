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
    /// Split-K (`matmul_big_*`, `matmul_mma_*`): 0, or the `k` elements each z-slice of the
    /// grid sums (a multiple of the kernel's shared-memory stage depth). With slices, `c` is the
    /// `[slices, m, n]` f32 workspace of partial sums (row stride `ldc` = `n`) and no epilogue is
    /// applied: `linear_split_reduce_f32` adds the slices and applies it.
    pub k_split: u32,
    /// `[m]` f32 exact powers of two (`row_scale_f32`, see `math::f16_row_scale`): the f16
    /// tensor-core kernels (`matmul_mma_*_f16`) multiply each row of `a` by its factor as they
    /// stage it and divide the row's sums by it before the epilogue, so activations beyond
    /// f16's range split into finite parts. Required by those kernels (the launcher makes it);
    /// 0 elsewhere.
    pub row_scale: u64,
}

/// `row_scale_f32`: `out[r] = f16_row_scale(max_j |a[r, j]|)` for the rows of `a` `[m, k]`
/// (row stride `lda`).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct RowScaleParams {
    pub a: u64,
    pub out: u64,
    pub m: u32,
    pub k: u32,
    pub lda: u32,
    pub _pad: u32,
}

/// `cast_a16_*`: `out[r, j] = to16(a[r, j] · row_scale[r])` for the rows of `a` `[m, k]` (row
/// stride `lda`); `out` is `[m, k]` 16-bit, `row_scale` `[m]` f32 or 0 (factor 1).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct CastA16Params {
    pub a: u64,
    pub out: u64,
    pub row_scale: u64,
    pub m: u32,
    pub k: u32,
    pub lda: u32,
    pub _pad: u32,
}

/// Launch shape of `cast_a16_*`: one thread per 8 activations.
pub mod cast_a16_tile {
    pub const THREADS: u32 = 256;
}

/// Launch shape of `row_scale_f32`: one block per row.
pub mod row_scale_tile {
    pub const THREADS: u32 = 256;
}

/// `linear_split_reduce_f32`: `lin.c[r, col] = epilogue(Σ_z part[z, r, col])` with the bias,
/// activation and residual of `lin` (see [`LinearParams`]).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct SplitReduceParams {
    /// `[slices, lin.m, lin.n]` f32 partial sums.
    pub part: u64,
    pub slices: u32,
    pub _pad: u32,
    pub lin: LinearParams,
}

/// `matmul_skinny_*`: the linear layer `lin` (output `c` at row stride `ldc`, epilogue) and,
/// under split-K (`lin.k_split` > 0, the slices over grid z), the `[slices, m, n]` f32
/// workspace `part` for the slices' raw sums and the arrival `counters` (one u32 per column
/// block, zero between launches): the last slice of a column block to finish adds the slices
/// through the epilogue into `c` and puts its counter back to zero.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct SkinnyParams {
    pub lin: LinearParams,
    pub part: u64,
    pub counters: u64,
}

/// Launch shape of `linear_split_reduce_f32`: one thread per output element.
pub mod split_reduce_tile {
    pub const THREADS: u32 = 256;
    /// At most this many slices (the launcher checks).
    pub const MAX_SLICES: u32 = 16;
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

/// `out[r, :] = Σ_{j < per_row} weights[r · per_row + j] · table[ids[r · per_row + j], :]` for
/// `r < rows`, `j` in order.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct BlendRowsParams {
    /// `[vocab, width]` f32.
    pub table: u64,
    /// `[rows · per_row]` u32 row ids (checked `< vocab` by the host; one out of range gives a
    /// NaN row, never a read past the table).
    pub ids: u64,
    /// `[rows · per_row]` f32.
    pub weights: u64,
    /// `[rows, width]` f32.
    pub out: u64,
    pub rows: u32,
    pub width: u32,
    pub vocab: u32,
    pub per_row: u32,
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
    /// `[cap, kv_heads, 2]` f32 or 0: per cache row and KV head the power of two its f16 key
    /// (`[.., 0]`) and value (`[.., 1]`) row is stored divided by (`crate::math::f16_key_scale`,
    /// `f16_value_scale`;
    /// the kernels multiply it back). 0: every row as stored.
    pub kv_scale: u64,
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

/// Tiled (flash) attention of `q [t, heads, d]` over `k`, `v` `[cap, kv_heads, d]`: the
/// `flash_attention_*` kernels (SIMT, compute_61) and `flash_attention_mma_*` (tensor cores,
/// compute_80). A block owns a tile of query vectors of one KV head — the vectors of a row are its
/// `heads / kv_heads` query heads of that group, so every K/V tile staged in shared memory serves
/// the whole group — and streams the visible key tiles through shared memory.
///
/// Which keys a query row sees: keys below `kv_len` (or, with `cursor`, up to `cap`); when
/// `causal`, up to its own position (`q_pos0 + row`, or `cursor[row].row`); with `mask`, only the
/// key blocks its query block may see ([`block_mask`]). A row that sees no key gets zeros.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct FlashParams {
    /// `[t, heads, d]` f32 queries.
    pub q: u64,
    /// `[cap, kv_heads, d]` of the kernel's dtype.
    pub k: u64,
    pub v: u64,
    /// `[t, heads, d]` f32.
    pub out: u64,
    /// `[t, CURSOR_FIELDS]` u32 decode cursor, or 0: when set, causal row `i` sees keys
    /// `0 ..= min(cursor[i].row, cap - 1)`, and `kv_len`, `q_pos0` are not read.
    pub cursor: u64,
    /// A packed block mask ([`block_mask`]) on the device, or 0 for none.
    pub mask: u64,
    /// `[t, d / 2]` f32 rotary tables applied to the queries as they are loaded (rotate-half,
    /// `crate::math::rope_pair`), or 0 for none.
    pub cos: u64,
    pub sin: u64,
    /// `[cap, kv_heads, 2]` f32 or 0: per cache row and KV head the power of two its f16 key
    /// (`[.., 0]`) and value (`[.., 1]`) row is stored divided by (`crate::math::f16_key_scale`,
    /// `f16_value_scale`;
    /// the kernels multiply it back). 0: every row as stored.
    pub kv_scale: u64,
    /// The writers' KV scale flag (see [`QkvRopeParams::kv_flag`]), or 0: when it reads 0 and no
    /// query row needs a scale, the tensor-core kernels skip every row-scale step.
    pub kv_flag: u64,
    pub t: u32,
    pub heads: u32,
    pub kv_heads: u32,
    pub d: u32,
    pub kv_len: u32,
    /// Key position of query row 0 (causal, without a cursor).
    pub q_pos0: u32,
    /// 1: causal.
    pub causal: u32,
    /// Rows the K/V buffers hold.
    pub cap: u32,
    /// Multiplier of the scores (the kernels fold it, times log2(e), into the queries).
    pub scale: f32,
    pub _pad: u32,
}

/// The packed block mask of block-sparse attention, one u32 array: `[nqb, nkb, q_bounds
/// (nqb + 1), k_bounds (nkb + 1), allowed bits]`. Query rows `q_bounds[i] .. q_bounds[i + 1]`
/// form query block `i` (cu_seqlens style: `q_bounds` starts at 0, never decreases and ends at
/// `t`), keys likewise with `k_bounds` (ending at `kv_len`); bit `qb · nkb + kb` of the bit words
/// (bit `n % 32` of word `n / 32`) says whether query block `qb` sees key block `kb`.
pub mod block_mask {
    /// Words before `q_bounds`.
    pub const HEADER: usize = 2;

    /// Index of the first `k_bounds` word.
    pub const fn k_bounds_at(nqb: usize) -> usize {
        HEADER + nqb + 1
    }

    /// Index of the first word of allowed bits.
    pub const fn bits_at(nqb: usize, nkb: usize) -> usize {
        HEADER + nqb + 1 + nkb + 1
    }

    /// The whole array's length in words.
    pub const fn words(nqb: usize, nkb: usize) -> usize {
        bits_at(nqb, nkb) + (nqb * nkb + 31) / 32
    }

    /// (query block, key block) pairs a kernel checks to classify one tile; a tile that touches
    /// more is taken as partly visible (checked per element) without looking further.
    pub const MAX_TILE_PAIRS: usize = 64;

    /// Key tiles a block classifies up front (into `CLASS_WORDS` words of shared memory) when a
    /// mask is given; later tiles are classified one by one.
    pub const CLASSIFIED_TILES: usize = 1024;
    pub const CLASS_WORDS: usize = 2 * CLASSIFIED_TILES / 32;
}

/// Tile shape of the SIMT `flash_attention_d{64,128}_*` kernels. A row group of `TX = D / 8`
/// lanes holds `ROWS` (4) query vectors; lane `x` of a group holds dims `4x .. 4x + 4` and
/// `4x + 4 TX .. 4x + 4 TX + 4` of each (8 dims: the queries and the output accumulators stay in
/// registers). Warps per block: `WARPS`; vectors per block: `WARPS · (32 / TX) · ROWS`.
pub mod flash_tile {
    pub const WARPS: u32 = 4;
    pub const THREADS: u32 = WARPS * 32;
    /// Query vectors of one row group.
    pub const ROWS: usize = 4;
    /// Keys per tile staged in shared memory (K and V, f32).
    pub const BN: usize = 32;
    /// Keys per QK step (scored together, then reduced across the group's lanes).
    pub const CHUNK: usize = 8;
    /// Query vectors per block for head-dim class `dc` (64 or 128).
    pub const fn vectors(dc: usize) -> usize {
        WARPS as usize * (32 / (dc / 8)) * ROWS
    }
    /// Floats of one row group's probability tile: `BN` keys × `ROWS`, padded by 4 so that the
    /// row groups of a warp read different banks.
    pub const P_STRIDE: usize = BN * ROWS + 4;
    /// Dynamic shared memory of a block for head-dim class `dc`: the K and V tiles (`BN × dc`
    /// f32 each), the probability tiles of its row groups and the mask's tile classes. (The
    /// kernels declare no static shared memory: `cuda_std` declares the dynamic array with a
    /// size, so ptxas lays it out among the static ones and writes past it would reach them.)
    pub const fn smem_bytes(dc: usize) -> usize {
        4 * (2 * BN * dc + vectors(dc) / ROWS * P_STRIDE + super::block_mask::CLASS_WORDS)
    }
}

/// Tile shape of the tensor-core `flash_attention_mma_d{64,128}_*` kernels and their warpgroup
/// twins `flash_attention_wgmma_*` (`wg`): each warp owns `m_tiles` tiles of 16 query vectors,
/// `warps` warps per block, key tiles of `BN` keys staged in shared memory as f16 (`cp.async`
/// straight from an f16 cache).
pub mod flash_mma_tile {
    /// Keys per tile.
    pub const BN: usize = 64;
    /// m16 row tiles per warp for head-dim class `dc`: with `mma.sync`, two for 64 (each K/V
    /// fragment read from shared memory then feeds two products), one for 128 (its wider
    /// accumulators fill the register file); by warpgroups one (the 64-row tile of a warpgroup
    /// instruction is four warps' m-tiles).
    pub const fn m_tiles(dc: usize, wg: bool) -> usize {
        if dc <= 64 && !wg {
            2
        } else {
            1
        }
    }
    /// Warps per block: four (one warpgroup), or by warpgroups for head-dim class 64 eight (two
    /// warpgroups of half the registers a thread: twice the warps a multiprocessor holds).
    pub const fn warps(dc: usize, wg: bool) -> u32 {
        if dc <= 64 && wg {
            8
        } else {
            4
        }
    }
    /// Threads per block.
    pub const fn threads(dc: usize, wg: bool) -> u32 {
        32 * warps(dc, wg)
    }
    /// Query vectors per block (128 for head-dim class 64, 64 for 128, either family).
    pub const fn vectors(dc: usize, wg: bool) -> usize {
        16 * m_tiles(dc, wg) * warps(dc, wg) as usize
    }
    /// Dynamic shared memory of a block of the warpgroup kernel for head-dim class 64, whose
    /// K/V tiles are double-buffered (the next visible tile loads while one is multiplied): two
    /// K and two V tiles (`BN × 64` f16 each), the queries (`vectors × 64` f16), two tiles' row
    /// scales (`BN × 2` f32), the mask's tile classes, and 1 KiB to align the tiles; 0 for 128,
    /// which uses static shared memory as the `mma.sync` kernels do (one K and one V tile).
    pub const fn wg_shared_bytes(dc: usize) -> usize {
        if dc <= 64 {
            1024 + 2 * (2 * BN * dc * 2 + BN * 8) + vectors(dc, true) * dc * 2 + 4 * super::block_mask::CLASS_WORDS
        } else {
            0
        }
    }
}

/// The flash kernels take head dims up to this (in two classes: up to 64, up to 128); larger
/// ones use the one-warp-per-row `attention_*` kernels.
pub const FLASH_MAX_D: usize = 128;

/// `out[r, h, :] = f16(rope(x[r, h, :]))` (or without rotation when `cos` is 0): keys rotated and
/// keys and values narrowed for the tensor-core attention.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct RopeCastParams {
    /// `[rows, heads, d]` f32.
    pub x: u64,
    /// `[rows, d / 2]` f32 rotary tables, or 0 for none.
    pub cos: u64,
    pub sin: u64,
    /// `[rows, heads, d]` f16 bits.
    pub out: u64,
    /// `[rows, heads]` f32 at a stride of 2 floats (one plane of a `[rows, heads, 2]` scale
    /// tensor, see [`AttentionParams::kv_scale`]), or 0: when set, each (row, head) vector is
    /// stored divided by its `crate::math::f16_key_scale` (`f16_value_scale` with `values`),
    /// written here; else narrowed as is.
    pub scale_out: u64,
    /// Like `scale_out`, or 0: the scales `x`'s vectors are multiplied by first (K/V gathered
    /// out of a scaled cache).
    pub scale_in: u64,
    /// See [`QkvRopeParams::kv_flag`].
    pub kv_flag: u64,
    pub rows: u32,
    pub heads: u32,
    pub d: u32,
    /// 1: the vectors are values (`f16_value_scale`), 0: keys (`f16_key_scale`).
    pub values: u32,
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

/// Launch shape of `matmul_skinny_*` (compute_80): a block per `8 · NT` output columns, its warps
/// splitting `k`; variants for at most 16 and 32 rows.
/// Launch shape of `matmul_mma_pipe_*` (`gpu/src/mma_pipe.rs`): the tiles of `mma_tile` with
/// `STAGES` shared-memory stages of `BK` elements of both operands, in dynamic shared memory.
pub mod mma_pipe_tile {
    pub use super::mma_tile::{BM, BN, THREADS, TILES, WARPS_N};
    /// Stages in flight.
    pub const STAGES: u32 = 3;

    /// Depth of one stage of a `tm × tn` tile: 64 (four mma k-steps per barrier, 128-byte rows)
    /// for the others; 32 for 128 × 128, whose 64-deep stages (96 KiB) measured slower
    /// on the H100 (prefill @4096 54.9k against 57.6k tok/s), while 64 × 128 went from 54 to
    /// 43 µs on a 512-row qkv projection.
    pub const fn bk(tm: u32, tn: u32) -> u32 {
        if tm == 128 && tn == 128 {
            32
        } else {
            64
        }
    }

    /// Dynamic shared memory of a `tm × tn` tile: its stages (72 KiB for 64 × 128, 144 KiB for
    /// 128 × 256, which also holds its staged `[128][264]` f32 epilogue tile), or 0 for
    /// 128 × 128, whose 48 KiB are static (the same stages in dynamic memory measured 84 µs
    /// against 74 on a 512 × 6144 × 2048 projection).
    pub const fn shared_bytes(tm: u32, tn: u32) -> u32 {
        if bk(tm, tn) == 32 {
            0
        } else {
            STAGES * (tm + tn) * bk(tm, tn) * 2
        }
    }
}

/// Launch shape of the warpgroup GEMMs (`gpu/src/wgmma.rs`): `tm × tn` tiles (128 × 256,
/// 64 × 128, 64 × 64), 256 threads (two warpgroups), stages of 64 elements.
pub mod wgmma_tile {
    /// Stages of both operands of a `tm × tn` tile in shared memory: `stages - 2` copied ahead
    /// of the one multiplied, one whose multiplies are still in flight. 4 (48 KiB each for
    /// 128 × 256, 16 for 64 × 64: three blocks a multiprocessor, so a batched decode step's
    /// cluster-split products run in one wave); 8 for 64 × 128 (24 KiB each), whose few-row
    /// products are bound by the bytes in flight (H200, the SwiGLU pair of 64 rows over 2,048:
    /// 23.4 µs with 4, 18.5 with 8; 64 × 64 with 6 instead of 4 went from 12.0 to 15.0 µs on
    /// qkv, split in clusters of 4).
    pub const fn stages(tm: u32, tn: u32) -> u32 {
        if tm == 64 && tn == 128 {
            8
        } else {
            4
        }
    }

    /// Dynamic shared memory of a `tm × tn` tile: the stages and 1 KiB to align them by.
    pub const fn shared_bytes(tm: u32, tn: u32) -> u32 {
        stages(tm, tn) * (tm + tn) * 64 * 2 + 1024
    }
}

pub mod skinny_tile {
    pub const WARPS: u32 = 8;
    pub const THREADS: u32 = WARPS * 32;
    /// n tiles of 8 columns per block.
    pub const NT: usize = 4;
    /// 32-wide k blocks a warp loads before it does their math.
    pub const UNROLL: usize = 2;
    /// Most rows (the largest variant).
    pub const MAX_ROWS: usize = 32;
    /// Blocks of the variant for `rows` (16 or 32) a multiprocessor holds at once: the 16-row
    /// kernels are capped at 128 registers (`Kernel::max_registers`), so two blocks of 256
    /// threads fit in 64 K registers; the 32-row ones take ~160, one block.
    pub const fn resident(rows: u32) -> usize {
        if rows <= 16 {
            2
        } else {
            1
        }
    }
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
/// Rows per block of `layer_norm_a16_bf16`: a warp each, `ROW_THREADS / 32`.
pub const WARP_ROWS: usize = ROW_THREADS as usize / 32;

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
    /// `[m]` f32 row scales of the f16 few-row kernel (`gate_up_skinny_*_f16`, see
    /// `LinearParams::row_scale`), else 0.
    pub row_scale: u64,
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
    /// f16 caches: `[cap, kv_heads, 2]` f32, where each written row's key and value scale go
    /// (see [`AttentionParams::kv_scale`]); 0 to store rows unscaled (f32 caches).
    pub kv_scale: u64,
    /// A u32 on the device that every writer of row scales sets to 1 when it writes a scale other
    /// than 1 (and nothing resets), or 0 for none.
    pub kv_flag: u64,
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
    /// Rotary pairs a lane of `rope_cast_f16` holds (its head dim at most `64 · CAST_PAIRS`,
    /// which is `MAX_D`).
    pub const CAST_PAIRS: usize = MAX_D / 64;
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
    /// Paged mode when non-zero: `[t, table_stride]` u32 block ids, row `i`'s keys in the KV
    /// blocks `table[i][0], table[i][1], ...` (`1 << block_shift` rows each; logical key `j` at
    /// cache row `table[i][j >> block_shift] << block_shift | (j & (block - 1))`). Each query row
    /// is its own sequence: grid z = `t · ceil(group / MAX_QV)`, and the cursor is not read.
    pub table: u64,
    /// Paged mode: `[t]` u32, the keys query row `i` sees (`0 .. lens[i]`).
    pub lens: u64,
    /// `[cap, kv_heads, 2]` f32 or 0: per cache row and KV head the power of two its f16 key
    /// (`[.., 0]`) and value (`[.., 1]`) row is stored divided by (`crate::math::f16_key_scale`,
    /// `f16_value_scale`;
    /// the kernels multiply it back). 0: every row as stored.
    pub kv_scale: u64,
    pub t: u32,
    pub heads: u32,
    pub kv_heads: u32,
    pub d: u32,
    pub cap: u32,
    pub splits: u32,
    pub scale: f32,
    pub table_stride: u32,
    pub block_shift: u32,
    pub _pad: u32,
}

/// Launch shape of `attention_paged_f16` (compute_80): the paged decode kernel that stages
/// key and value tiles in shared memory with `cp.async` (`gpu/src/attention_paged.rs`). Grid and
/// partial states as the paged mode of `attention_split_*` (`attn_split_tile::MAX_QV` query
/// vectors per block, at most `attn_split_tile::MAX_SPLITS` chunks).
pub mod attn_paged_tile {
    pub const WARPS: u32 = 4;
    pub const THREADS: u32 = WARPS * 32;
    /// Bytes of one staged key tile (and of its value tile): `TILE_BYTES / (2 d)` keys, 32 for
    /// a head dim of 128.
    pub const TILE_BYTES: u32 = 8192;
    /// Tiles in flight.
    pub const STAGES: u32 = 3;
    /// Keys each key slot (`d / 8` lanes) scores per tile: every tile is `KEYS_PER_SLOT` keys
    /// for each of the block's `THREADS / (d / 8)` slots, whatever the head dim.
    pub const KEYS_PER_SLOT: usize = 4;
    /// Keys a chunk gets at least (shorter contexts use fewer chunks): two tiles at d 128.
    pub const MIN_KEYS: usize = 64;
    /// Bytes of one stage: the key tile, the value tile, and the (key, value) row scales of its
    /// keys (at most 128 keys: d 32).
    pub const STAGE: u32 = 2 * TILE_BYTES + 128 * 8;
    /// Leading block-table entries of its row a block copies to shared memory at its start
    /// (alongside its other first loads, before it knows its chunk); later lookups past them
    /// read the table in global memory. 1024 entries: 16k keys in blocks of 16.
    pub const TABLE_ENTRIES: u32 = 1024;
    /// Dynamic shared memory: the stages (the merge reuses them), then the table entries.
    pub const SHARED_BYTES: u32 = STAGES * STAGE + 4 * TABLE_ENTRIES;
}

/// Launch shape of `attention_paged_mma_f16` (compute_80): decode attention on tensor cores
/// (`gpu/src/attention_paged_mma.rs`), a block per query row, KV head and chunk of keys.
pub mod attn_paged_mma_tile {
    pub const WARPS: usize = 4;
    pub const THREADS: u32 = WARPS as u32 * 32;
    /// The head dim it takes.
    pub const D: usize = 128;
    /// Query heads per KV head it takes at most (the m16 rows of its A operand).
    pub const MAX_GROUP: usize = 16;
    /// Keys per step (two n8 tiles of scores; the k16 of `P V`).
    pub const KEYS: usize = 16;
    /// Keys a chunk gets at least when a row is split (shorter rows use fewer chunks): a step
    /// for each warp.
    pub const MIN_KEYS: usize = WARPS * KEYS;
    /// Slots in each warp's ring (steps in flight per warp).
    pub const STAGES: u32 = 3;
    /// One slot: the step's key rows, value rows (f16 `[KEYS][D]` each), row scales `[KEYS][2]`.
    pub const SLOT_BYTES: u32 = (2 * KEYS * D * 2 + KEYS * 8) as u32;
    /// The staged block-table entries at the start of shared memory.
    pub const TABLE_BYTES: u32 = 4 * super::attn_paged_tile::TABLE_ENTRIES;
    /// Dynamic shared memory: the table, then every warp's ring (the merge at the end reuses
    /// the rings: `WARPS · MAX_GROUP · D` outputs and two floats of state per warp and head).
    pub const SHARED_BYTES: u32 = TABLE_BYTES + WARPS as u32 * STAGES * SLOT_BYTES;
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
    /// `[rows, ld]` f32 logits; the first `n` of each row are the candidates.
    pub logits: u64,
    /// `[rows, blocks, k]` candidates: f32 logits then u32 ids (two arrays of `rows·blocks·k`).
    pub cand: u64,
    /// `[rows]` u32: the picked token ids.
    pub ids: u64,
    /// `[rows, CURSOR_FIELDS]` u32, advanced by one on every field after the pick.
    pub cursor: u64,
    pub rows: u32,
    /// Candidate ids per row: `0..n` (columns past `n`, such as a vocabulary's padding rows,
    /// are never picked).
    pub n: u32,
    /// Row stride of `logits` in elements (`>= n`).
    pub ld: u32,
    /// Candidates kept (1: greedy).
    pub k: u32,
    /// Blocks per row of the first stage.
    pub blocks: u32,
    /// <= 0: greedy (the best candidate).
    pub temperature: f32,
    pub top_p: f32,
    pub seed: u64,
    /// 0, or `[rows, sample_row::WORDS]` u32: each row's own settings (temperature, top-p,
    /// top-k at most `k`, seed), which then replace the three above.
    pub row_settings: u64,
    /// 0, or `[rows, mask_words]` u32: the ids each row may pick (bit `t % 32` of word
    /// `t / 32` set when id `t` is allowed; a grammar's mask of allowed next tokens). The others
    /// rank as negative infinity.
    pub mask: u64,
    /// Words per row of `mask` (`ceil(n / 32)`).
    pub mask_words: u32,
}

/// The layout of a row's sampling settings (`SampleParams::row_settings`): u32 words.
pub mod sample_row {
    pub const WORDS: usize = 8;
    /// f32 bits; <= 0: greedy.
    pub const TEMPERATURE: usize = 0;
    /// f32 bits.
    pub const TOP_P: usize = 1;
    /// Candidates this row samples among (1: greedy), at most the launch's `k`.
    pub const TOP_K: usize = 2;
    /// The seed's low and high halves.
    pub const SEED_LO: usize = 3;
    pub const SEED_HI: usize = 4;
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

/// `acts = q8(rms_norm?(x))`: the 8-bit activation blocks the `mmvq_*` kernels read (layout:
/// `crate::qmath::act_layout`).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct QuantActParams {
    /// `[m, k]` f32 activations, row stride `k`.
    pub x: u64,
    /// `[k]` f32 RMSNorm weight applied to each row first, or 0.
    pub norm: u64,
    /// The activation buffer (`act_layout(m, k, block)` bytes).
    pub acts: u64,
    pub m: u32,
    pub k: u32,
    /// Values per scale: 32 (against `Q8_0`) or 256 (against K-quants).
    pub block: u32,
    pub eps: f32,
}

/// `c[m, n] = acts · wᵀ (+ bias) (+ residual)`, or with `up` set `c = silu(acts · wᵀ) ⊙
/// (acts · upᵀ)`: the quantized GEMVs (`mmvq_*`, `mmvq_gate_up_*`).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct QLinearParams {
    /// 8-bit activations of `m` rows (`crate::qmath::act_layout`, blocks of 32 for `Q8_0`
    /// weights, 256 for K-quants).
    pub acts: u64,
    /// `[n, k]` weights in the device layout of the kernel's type (`crate::qmath`).
    pub w: u64,
    /// `[n, k]` up weights (`mmvq_gate_up_*`), else 0.
    pub up: u64,
    /// `[n]` f32 bias, or 0.
    pub bias: u64,
    /// `[m, n]` f32 added to the result (row stride `ldc`), or 0; may be `c`.
    pub residual: u64,
    /// `[m, n]` f32 output, row stride `ldc`.
    pub c: u64,
    pub m: u32,
    pub n: u32,
    pub k: u32,
    pub ldc: u32,
}

/// `out[r, :] = dequantize(w[row(r), :])` for `r < rows`, `row(r) = ids[r]` (or `row0 + r`
/// without ids): the embedding lookup and the weight chunks of the prefill path.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct DequantParams {
    /// `[n, k]` weights in the device layout of the kernel's type.
    pub w: u64,
    /// `[rows]` u32 row ids (an id `>= n` gives a NaN row), or 0: rows `row0 ..`.
    pub ids: u64,
    /// `[rows, k]` f32, or f16 bits when `half` is 1.
    pub out: u64,
    pub rows: u32,
    pub row0: u32,
    pub n: u32,
    pub k: u32,
    pub half: u32,
    pub _pad: u32,
}

/// Launch shapes of the quantized-weight kernels.
pub mod qtile {
    /// Activation rows one `mmvq_*` warp serves (its weights read once for them); more rows
    /// take further row groups (grid y).
    pub const ROWS: usize = 4;
    /// Rows the backend sends to the quantized GEMVs; more take dequantized tiles and the GEMMs.
    pub const MMVQ_MAX_M: usize = 8;
    /// Warps (= output features) per block of `mmvq_*`.
    pub const WARPS: u32 = 4;
    pub const THREADS: u32 = WARPS * 32;
    /// Lanes sharing one K-quant super-block (each takes 16 bytes of its values).
    pub const SUPER_LANES: usize = 8;
    /// Threads per block of `quantize_act_f32` (one block per row) and `dequant_rows_*` (one
    /// block per output row, 8 values per thread and step).
    pub const ROW_THREADS: u32 = 256;
    /// Values a `dequant_rows_*` thread decodes per step.
    pub const DEQUANT_GROUP: usize = 8;
    /// Bytes of f16 weights the prefill path dequantizes at a time (a chunk of output features).
    pub const CHUNK_BYTES: usize = 32 << 20;
}
