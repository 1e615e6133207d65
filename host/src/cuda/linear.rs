//! Linear layers on the GPU (`gpu/src/matmul.rs`, `gpu/src/gemv.rs`): the checked launchers and
//! the backend ops `linear`, `linear_residual` and `gate_up_silu`.
//!
//! Kernel choice, by shape and module: with the compute_80 module and 16-bit weights in 16-byte
//! rows, 2 to 32 activation rows (a batched decode step) take `matmul_skinny_*` (tensor cores,
//! every weight read once, `gpu/src/mma.rs`; `gate_up_skinny_*` for SwiGLU's two projections
//! and the SiLU product in one launch). Otherwise up to [`GEMV_MAX_ROWS`] rows take a GEMV
//! (decode) — the 16-byte-vector `gemv_vec_*` for one row whose weight rows are whole 16-byte
//! vectors, else the scalar `gemv_*`. More rows (prefill, the vision tower) take, with the
//! compute_80 module and 16-bit weights in 16-byte rows, the tensor-core `matmul_mma_*`; else
//! the SIMT `matmul_big_*` (128 × 128 tiles) from [`BIG_MIN_ROWS`] rows on, and `matmul_*`
//! (64 × 64) below. When the tiles of `matmul_mma_*` / `matmul_big_*` give fewer blocks than
//! multiprocessors (few rows: a 64-token prefill), `k` is split ([`SplitPolicy`]) into
//! slices summed by separate blocks into a workspace, and `linear_split_reduce_f32` adds the
//! slices and applies the epilogue (split-K; deterministic, no atomics); on compute 9.0 the
//! pipelined 64 × 64 tile's slices (at most [`MAX_CLUSTER`]) are instead the blocks of one
//! thread-block cluster and add each other's tiles through distributed shared memory, in the
//! same order, inside the launch (`matmul_mma_pipe_64x64_cluster_*`, [`cluster_kernel`]). The few-row kernel
//! splits `k` too when its column blocks leave multiprocessors idle ([`skinny_slices`]), and
//! merges the slices inside the launch (the last slice of a column block to finish adds them
//! in slice order: deterministic, one arrival counter per column block). The f16 tensor-core
//! kernels scale each activation row by an exact power of two first ([`row_scales`]), so no
//! activation overflows f16 whatever its size. With `Precision::Bf16` the tensor-core kernels
//! take 16-bit activations: the few-row `*_a16_*`, and for tiles `cast_a16_*` (the activations
//! rounded once into a scratch buffer) then the pipelined `matmul_mma_pipe_*`
//! (`gpu/src/mma_pipe.rs`).
//! Block-quantized weights go to `qlinear.rs`.

use super::launch::{ceil_div, fits_u32, grid_dim, need, Launcher, MAX_GRID_X, MAX_GRID_Y};
use super::{CudaBackend, DeviceBuffer};
use crate::kernels::Kernel;
use crate::{ops, DType, Error, Result, Tensor};
use crate::kernels::Arch;
use gpu::params::{cast_a16_tile, gemv_tile, gemv_vec_tile, mma_pipe_tile, CastA16Params, matmul_big_tile, matmul_tile, mma_tile, row_scale_tile, skinny_tile, split_reduce_tile, GateUpParams, LinearParams, RowScaleParams, SkinnyParams, SplitReduceParams, ACT_GELU_ERF, ACT_GELU_TANH, ACT_NONE};

/// Decode-sized inputs (at most this many rows) use the GEMV kernels.
pub const GEMV_MAX_ROWS: usize = gemv_tile::MAX_ROWS;
/// From this many rows the SIMT path takes the 128 × 128-tile matmul (split-K where its tiles
/// leave multiprocessors idle), though up to 104 of a tile's rows are then zeros: on the H100
/// with compute_61 forced, prefill @32 / @64 / @96 went 912 / 1,754 / 2,436 → 2,048 / 3,944 /
/// 5,505 tok/s against the 64 × 64 tiles (BENCHMARKS.md).
pub const BIG_MIN_ROWS: usize = 24;
/// How far split-K cuts `k`: aim at `waves` blocks per multiprocessor, keep at least `min_k`
/// elements per slice (a slice's fixed cost — the pipeline's fill and the workspace write —
/// stays small against its loop).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SplitPolicy {
    pub waves: usize,
    pub min_k: usize,
}

/// The SIMT `matmul_big_*` (one 48 KiB block per SM at a time is what fits its registers).
pub const BIG_SPLIT: SplitPolicy = SplitPolicy { waves: 2, min_k: 512 };
/// The tensor-core 64 × 64 tile. Measured on the H100 (64-token bf16 prefill, tok/s, by
/// `waves,min_k`): 1,512 → 8,845; 2,512 → 9,271; 3,512 → 9,271; 2,1024 → 8,474; 4,256 → 8,449;
/// 4,128 → 8,053; 8,128 → 7,008; 1,2048 → 6,498: deeper cuts lose more to the workspace and
/// the reduce than they gain in parallel blocks.
pub const MMA_SPLIT: SplitPolicy = SplitPolicy { waves: 2, min_k: 512 };

/// [`MMA_SPLIT`], or `QWEN3_VL_MMA_SPLIT=waves,min_k` when set (a tuning aid for benchmarks;
/// read once, a malformed value is reported and ignored).
pub fn mma_split() -> SplitPolicy {
    static CACHED: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let c = CACHED.load(std::sync::atomic::Ordering::Relaxed);
    if c != 0 {
        return SplitPolicy { waves: (c >> 32) as usize, min_k: (c & 0xffff_ffff) as usize };
    }
    let p = match std::env::var("QWEN3_VL_MMA_SPLIT") {
        Ok(v) => {
            let parsed: Vec<usize> = v.split(',').filter_map(|x| x.trim().parse().ok()).collect();
            match parsed.as_slice() {
                &[w, k] if w >= 1 && w <= 64 && k >= 32 && k <= 1 << 20 => SplitPolicy { waves: w, min_k: k },
                _ => {
                    log::warn!("QWEN3_VL_MMA_SPLIT={:?} is not 'waves,min_k' (1..=64, 32..=1048576): using {:?}", v, MMA_SPLIT);
                    MMA_SPLIT
                }
            }
        }
        Err(_) => MMA_SPLIT,
    };
    CACHED.store(((p.waves as u64) << 32) | p.min_k as u64, std::sync::atomic::Ordering::Relaxed);
    p
}

/// Which kernel computes a linear layer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LinearAlgo {
    /// `matmul_*`: shared-memory tiles, for prefill-sized `m`.
    Tiled,
    /// `gemv_*`: one warp per (row, output), scalar loads, any `k`.
    Gemv,
    /// `gemv_vec_*`: one warp per output, 16-byte weight vectors, one row (decode).
    GemvVec,
    /// `matmul_big_*`: 128 × 128 SIMT tiles, 8 × 8 per thread; `k` split into this many
    /// slices (1: no split).
    Big(u32),
    /// `matmul_mma_*`: tensor cores (compute_80 module, f16/bf16 weights, `k % 8 == 0`), with
    /// `(rows, columns)` block tiles (one of `mma_tile::TILES`) and `k` split into this many
    /// slices (1: no split).
    Mma(u32, u32, u32),
    /// `matmul_skinny_*`: tensor cores for at most this many rows (16 or 32; compute_80,
    /// f16/bf16 weights, `k % 8 == 0`), every weight read once (batched decode), and `k` split
    /// into this many slices (1: no split; see [`skinny_slices`]).
    Skinny(u32, u32),
}

impl LinearAlgo {
    /// The kernel of this algorithm for weights of `dtype` (`a16`: the tensor-core kernels'
    /// 16-bit-activation variants, `Precision::Bf16`: the few-row `*_a16_*`, and for tiles
    /// the pipelined `matmul_mma_pipe_*` over `cast_a16_*`'s output; the others have none).
    pub fn kernel(self, dtype: DType, a16: bool) -> Result<Kernel> {
        match self {
            LinearAlgo::Tiled => Kernel::matmul(dtype),
            LinearAlgo::Gemv => Kernel::gemv(dtype),
            LinearAlgo::GemvVec => Kernel::gemv_vec(dtype),
            LinearAlgo::Big(s) => Kernel::matmul_big(dtype, s > 1),
            LinearAlgo::Mma(tm, tn, s) if a16 => Kernel::matmul_mma_pipe(dtype, (tm, tn), s > 1),
            LinearAlgo::Mma(tm, tn, s) => Kernel::matmul_mma(dtype, (tm, tn), s > 1),
            LinearAlgo::Skinny(rows, _) => Kernel::matmul_skinny(dtype, rows, a16),
        }
    }

    /// Whether weight rows of `k` elements of `dtype` are whole 16-byte vectors (the condition
    /// of the vector kernels).
    pub fn vector_rows(k: usize, dtype: DType) -> bool {
        (k * dtype.size_of()) % 16 == 0
    }

    /// The kernel the backend uses for `m` rows, `n` outputs and `k` inputs with weights of
    /// `dtype` when the module of `arch` is loaded on a device of `sms` multiprocessors. The
    /// tensor-core tile is the largest that still gives nearly every multiprocessor a block
    /// ([`TILE_FILL`]).
    pub fn pick(m: usize, n: usize, k: usize, dtype: DType, arch: Arch, sms: u32) -> LinearAlgo {
        Self::pick_for(m, n, k, dtype, arch, sms, false, false)
    }

    /// [`LinearAlgo::pick`], where `wide` also offers the 128 × 256 tile ([`PIPE_TILES`]): the
    /// pipelined kernels over 16-bit activations, on a device whose blocks may have its
    /// shared memory (144 KiB: not compute 8.6 / 8.9, whose blocks stop at 99 KiB);
    /// `warpgroup`: that tile is the warpgroup kernel for bf16 weights (sm_90a, [`pipe_tile`]'s
    /// costs).
    #[allow(clippy::too_many_arguments)]
    pub fn pick_for(m: usize, n: usize, k: usize, dtype: DType, arch: Arch, sms: u32, wide: bool, warpgroup: bool) -> LinearAlgo {
        if m > 1 && m <= skinny_tile::MAX_ROWS && arch >= Arch::Compute80 && dtype != DType::F32 && Self::vector_rows(k, dtype) && skinny() {
            let rows = (m.next_power_of_two() as u32).max(16);
            return LinearAlgo::Skinny(rows, skinny_slices(rows, n, k, sms));
        }
        if m > GEMV_MAX_ROWS {
            if arch >= Arch::Compute80 && dtype != DType::F32 && Self::vector_rows(k, dtype) {
                let blocks = |&(tm, tn): &(u32, u32)| ceil_div(m, tm as usize) * ceil_div(n, tn as usize);
                let tiles: &[(u32, u32)] = if wide && wide_tiles() { &PIPE_TILES } else { &mma_tile::TILES };
                let last = tiles[tiles.len() - 1];
                // a tile that leaves a few multiprocessors idle still beats the next smaller one
                let fill = sms as usize * TILE_FILL.0 / TILE_FILL.1;
                // at most 64 rows take no 128-row tile (half its products would be of zero
                // rows: the LM head of a batch-64 step)
                let (tm, tn) = tiles.iter().copied().filter(|&(tm, _)| m > 64 || tm <= 64).find(|t| blocks(t) >= fill).unwrap_or(last);
                // where 128 × 128 was taken with more blocks than multiprocessors (the busiest
                // run two), fewer 128 × 256 blocks (each the work of two, at a better rate: one
                // per multiprocessor here) do better; with at most one 128 × 128 block per
                // multiprocessor they would double the busiest one's work
                let (tm, tn) = if tiles == PIPE_TILES && (tm, tn) == (128, 128) && blocks(&(128, 128)) > sms as usize && blocks(&(128, 256)) <= sms as usize { (128, 256) } else { (tm, tn) };
                // only the smallest tile splits k (a larger one was taken because it nearly fills the device)
                let slices = if (tm, tn) == last { split_slices(blocks(&(tm, tn)), k, mma_tile::BK as usize, sms, mma_split()) } else { 1 };
                // past 64 rows, where no split is wanted, the pipelined tiles by their rounds
                // of blocks on the busiest multiprocessor (`pipe_tile`)
                if tiles == PIPE_TILES && slices == 1 && m > 64 && tile_rounds() {
                    let (tm, tn) = pipe_tile(m, n, sms, 64, warpgroup && dtype == DType::BF16);
                    return LinearAlgo::Mma(tm, tn, 1);
                }
                LinearAlgo::Mma(tm, tn, slices)
            } else if m >= BIG_MIN_ROWS {
                let blocks = ceil_div(m, matmul_big_tile::BM as usize) * ceil_div(n, matmul_big_tile::BN as usize);
                LinearAlgo::Big(split_slices(blocks, k, matmul_big_tile::BK as usize, sms, BIG_SPLIT))
            } else {
                LinearAlgo::Tiled
            }
        } else if m == 1 && Self::vector_rows(k, dtype) {
            LinearAlgo::GemvVec
        } else {
            LinearAlgo::Gemv
        }
    }
}

/// The pipelined kernels' tiles, largest first: `mma_tile::TILES` after 128 × 256 (a block per
/// multiprocessor, 64 × 64 per warp).
pub const PIPE_TILES: [(u32, u32); 4] = [(128, 256), (128, 128), (64, 128), (64, 64)];

/// Blocks of each [`PIPE_TILES`] tile one multiprocessor runs at once (of compute 8.0 and 9.0,
/// whose blocks may take 144 KiB of shared memory): 128 × 256 holds 240 registers a thread,
/// 128 × 128 128 (two blocks' worth of the 64 Ki registers), 64 × 128 92-100 (two), 64 × 64 80
/// and 48 KiB (three).
const PIPE_OCCUPANCY: [usize; 4] = [1, 2, 2, 3];

/// Time of a multiprocessor's full round of blocks of each [`PIPE_TILES`] tile per 128 × 256
/// tile of work, relative to 128 × 256 (one block a round), and a round with fewer blocks than
/// a full one as `PARTIAL_ROUND` of the full round and the rest in proportion to its blocks:
/// fitted to `kernels-bench --only tiles` on the H200 (every pipelined tile of the 2B's text and
/// vision GEMMs and the LM head at 65 to 16,384 rows; the model's picks took 13.28 ms over the
/// sweep where the best tile of each row took 13.25 and the previous rule, the largest tile
/// that nearly filled the device, 13.61).
const PIPE_ROUND_COST: [f64; 4] = [1.0, 1.06, 1.35, 1.7];
/// [`PIPE_ROUND_COST`]'s 128 × 256 where it is the warpgroup kernel (sm_90a), relative to the
/// pipelined one: fitted as above (H200, the same sweep with the warpgroup kernels: the picks
/// took 11.01 ms where the best tile of each row took 11.00, and the pipelined kernel's costs
/// 11.34).
const WARPGROUP_ROUND_COST: f64 = 0.65;
const PARTIAL_ROUND: f64 = 0.6;

/// The [`PIPE_TILES`] tile at least `min_tn` wide (64 rows high where `m` ≤ 64) whose blocks
/// finish first by rounds on the busiest of `sms` multiprocessors: a 17th row tile of 128 (64
/// decode rows beside 2,048 prompt rows) gives 128 × 256 a second round, where 64 × 128 stays
/// within its first two (o_proj 104.5 → 79.5 µs, down_proj 276 → 190 on the H200).
pub fn pipe_tile(m: usize, n: usize, sms: u32, min_tn: u32, warpgroup: bool) -> (u32, u32) {
    let cost = |i: usize| {
        let (tm, tn) = PIPE_TILES[i];
        let per_sm = ceil_div(ceil_div(m, tm as usize) * ceil_div(n, tn as usize), sms.max(1) as usize);
        let occ = PIPE_OCCUPANCY[i];
        let (full, rest) = (per_sm / occ, per_sm % occ);
        let mut blocks = (full * occ) as f64;
        if rest > 0 {
            blocks += PARTIAL_ROUND * occ as f64 + (1.0 - PARTIAL_ROUND) * rest as f64;
        }
        let round = if i == 0 && warpgroup { WARPGROUP_ROUND_COST } else { PIPE_ROUND_COST[i] };
        blocks * (tm * tn) as f64 / (128.0 * 256.0) * round
    };
    let ok = |i: &usize| PIPE_TILES[*i].1 >= min_tn && (m > 64 || PIPE_TILES[*i].0 <= 64);
    // ties go to the larger tile (the first)
    let best = (0..PIPE_TILES.len()).filter(ok).fold(None, |b: Option<(usize, f64)>, i| {
        let c = cost(i);
        match b {
            Some((_, bc)) if bc <= c => b,
            _ => Some((i, c)),
        }
    });
    best.map_or(PIPE_TILES[PIPE_TILES.len() - 1], |(i, _)| PIPE_TILES[i])
}

/// Whether [`pipe_tile`] picks the pipelined kernels' tiles past 64 rows
/// (`QWEN3_VL_TILE_ROUNDS=0`: the largest tile that nearly fills the device, as before; an A/B
/// aid, read once).
pub fn tile_rounds() -> bool {
    static ROUNDS: crate::switch::Switch = crate::switch::Switch::new("QWEN3_VL_TILE_ROUNDS");
    ROUNDS.on()
}

/// Whether the pipelined kernels take 128 × 256 tiles where they fill the device
/// (`QWEN3_VL_PIPE_WIDE=0`: 128 × 128 at most, an A/B aid; read once).
pub fn wide_tiles() -> bool {
    static WIDE: crate::switch::Switch = crate::switch::Switch::new("QWEN3_VL_PIPE_WIDE");
    WIDE.on()
}

/// The share of the multiprocessors (numerator, denominator) a tensor-core tile must give a
/// block for [`LinearAlgo::pick`] to take it over the next smaller one.
pub const TILE_FILL: (usize, usize) = (15, 16);

/// Whether the few-row tensor-core kernels are used (`QWEN3_VL_SKINNY=0` turns them off: an A/B
/// aid for benchmarks; read once).
pub fn skinny() -> bool {
    static SKINNY: crate::switch::Switch = crate::switch::Switch::new("QWEN3_VL_SKINNY");
    SKINNY.on()
}

/// Most blocks of a cluster (the portable limit): a cluster-merged split takes at most this
/// many slices.
pub const MAX_CLUSTER: u32 = 8;

/// The cluster-merged variant of `kernel` when `algo` splits `k` over 64 × 64 pipelined tiles
/// and the loaded module runs clusters (compute 9.0): its slices are the blocks of one cluster,
/// added in the launch, with no workspace and no reduce.
pub fn cluster_kernel(l: &Launcher<'_>, algo: LinearAlgo, kernel: Kernel) -> Option<Kernel> {
    match (algo, kernel) {
        (LinearAlgo::Mma(64, 64, s), Kernel::MatmulMmaPipe64x64SplitF16) if s > 1 && l.kernels.clusters() => Some(Kernel::MatmulMmaPipe64x64ClusterF16),
        (LinearAlgo::Mma(64, 64, s), Kernel::MatmulMmaPipe64x64SplitBf16) if s > 1 && l.kernels.clusters() => Some(Kernel::MatmulMmaPipe64x64ClusterBf16),
        _ => None,
    }
}

/// Split-K slices for a tiled launch of `blocks` blocks over `k` (stage depth `bk`) under
/// `policy`: enough to give every multiprocessor `policy.waves` blocks, each slice at least
/// `policy.min_k` deep, at most `split_reduce_tile::MAX_SLICES`; 1 when the tiles alone fill
/// the device.
pub fn split_slices(blocks: usize, k: usize, bk: usize, sms: u32, policy: SplitPolicy) -> u32 {
    let want = policy.waves * sms as usize;
    if blocks >= sms as usize || blocks == 0 {
        return 1;
    }
    let by_depth = (k / policy.min_k.max(bk)).max(1);
    ceil_div(want, blocks).min(by_depth).min(split_reduce_tile::MAX_SLICES as usize).max(1) as u32
}

/// Split-K slices for `matmul_skinny_*` (the variant for `rows`, 16 or 32) over `n` columns
/// and `k` inputs: none while the column blocks alone give more than half the multiprocessors
/// one (cutting `k` at all adds the slices' merge); else as many as fill the blocks the variant
/// keeps resident per multiprocessor ([`skinny_tile::resident`]), each slice at least
/// [`SKINNY_MIN_K`] deep. On 132 multiprocessors with 16 rows, 2048 columns (64 blocks: o_proj,
/// down_proj of the 2B) take 4 slices; 4096 (qkv, 128 blocks) none. Measured on the H200 (16
/// rows, `kernels-bench`, µs): o 7.9 → 7.3 and down 14.1 → 11.9 against 2 slices (one block per
/// multiprocessor), qkv 8.9 → 9.5 with 2 slices (BENCHMARKS.md).
pub fn skinny_slices(rows: u32, n: usize, k: usize, sms: u32) -> u32 {
    // `QWEN3_VL_SKINNY_SPLIT=0`: never split; `QWEN3_VL_SKINNY_WAVES=N`: aim at N blocks per
    // multiprocessor instead of the resident count (A/B aids for benchmarks; read once)
    static SPLIT: crate::switch::Switch = crate::switch::Switch::new("QWEN3_VL_SKINNY_SPLIT");
    static WAVES: crate::switch::Knob = crate::switch::Knob::new("QWEN3_VL_SKINNY_WAVES", 0, 4);
    if !SPLIT.on() {
        return 1;
    }
    let blocks = ceil_div(n, 8 * skinny_tile::NT).max(1);
    if 2 * blocks > sms as usize {
        return 1;
    }
    let waves = match WAVES.get() {
        0 => skinny_tile::resident(rows),
        w => w,
    };
    let fit = waves * sms as usize / blocks;
    fit.min(k / SKINNY_MIN_K).min(split_reduce_tile::MAX_SLICES as usize).max(1) as u32
}

/// The shallowest `k` slice [`skinny_slices`] cuts: every warp of the block still gets a
/// 32-wide block of each of its `UNROLL` loads.
pub const SKINNY_MIN_K: usize = 32 * skinny_tile::WARPS as usize * skinny_tile::UNROLL;

/// The `k` elements per slice when `k` is cut into `slices` (a multiple of the stage depth
/// `bk`), and the number of non-empty slices that gives.
pub fn slice_depth(k: usize, slices: u32, bk: usize) -> (usize, u32) {
    let depth = ceil_div(ceil_div(k, slices.max(1) as usize), bk) * bk;
    (depth, ceil_div(k, depth.max(1)).max(1) as u32)
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
/// GEMV only) the rows of `a` are RMS-normed first. A split-K algorithm needs `ws`, room for
/// `[slices, m, n]` f32 partial sums; the f16 tensor-core kernels need `row_scale`, `[m]` f32
/// from [`row_scales`] ([`needs_row_scale`]). Empty sizes launch nothing.
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
    act: u32,
    c: &DeviceBuffer,
    ws: Option<&DeviceBuffer>,
    row_scale: Option<&DeviceBuffer>,
    (m, n, k): (usize, usize, usize),
) -> Result<()> {
    let kernel = algo.kernel(wdtype, l.a16)?;
    if let Some(s) = row_scale {
        need(kernel, "row_scale", s, m * 4)?;
    }
    need(kernel, "a", a, m * k * if kernel.reads_a16() { 2 } else { 4 })?;
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
    let tiled = matches!(algo, LinearAlgo::Tiled | LinearAlgo::Big(_) | LinearAlgo::Mma(..) | LinearAlgo::Skinny(..));
    if act != ACT_NONE && !tiled {
        return Err(Error::Limit { op: kernel.name(), msg: "only the tiled kernels fuse an activation".into() });
    }
    if let LinearAlgo::Skinny(rows, _) = algo {
        if m > rows as usize {
            return Err(Error::Limit { op: kernel.name(), msg: format!("{} rows, at most {}", m, rows) });
        }
    }
    if matches!(algo, LinearAlgo::Mma(..) | LinearAlgo::Skinny(..)) && !LinearAlgo::vector_rows(k, wdtype) {
        return Err(Error::Limit { op: kernel.name(), msg: format!("needs 16-byte weight rows (k = {} of {})", k, wdtype) });
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
        act,
        k_split: 0,
        row_scale: row_scale.map_or(0, |s| s.addr()),
    };
    launch(l, algo, kernel, &p, shared, ws)
}

/// Whether `algo` with weights of `dtype` needs per-row activation scales
/// (`LinearParams::row_scale`): the f16 tensor-core kernels, whose operands cannot hold
/// activations past 65504.
fn needs_row_scale(algo: LinearAlgo, dtype: DType) -> bool {
    matches!(algo, LinearAlgo::Mma(..) | LinearAlgo::Skinny(..)) && dtype == DType::F16
}

/// `out[r]` = the exact power of two that brings row `r` of `a` `[m, k]` (row stride `k`) into
/// f16's range for the f16 tensor-core kernels (`gpu::math::f16_row_scale` of its largest
/// magnitude): one block per row.
fn row_scales(l: &Launcher<'_>, a: &DeviceBuffer, out: &DeviceBuffer, (m, k): (usize, usize)) -> Result<()> {
    let kernel = Kernel::RowScaleF32;
    need(kernel, "a", a, m * k * 4)?;
    need(kernel, "out", out, m * 4)?;
    let p = RowScaleParams { a: a.addr(), out: out.addr(), m: fits_u32(kernel, "m", m)?, k: fits_u32(kernel, "k", k)?, lda: fits_u32(kernel, "k", k)?, _pad: 0 };
    if m == 0 {
        return Ok(());
    }
    l.launch(kernel, [grid_dim(kernel, "x", m, MAX_GRID_X)?, 1, 1], row_scale_tile::THREADS, &p)
}

/// Checks that an f16 tensor-core `kernel` (weights or activations of `dtype`) gets the `[m]`
/// row scales of its activations ([`row_scales`]).
fn f16_row_scales(kernel: Kernel, dtype: DType, row_scale: Option<&DeviceBuffer>, m: usize) -> Result<()> {
    match (dtype, row_scale) {
        (DType::F16, Some(s)) => need(kernel, "row_scale", s, m * 4),
        (DType::F16, None) => Err(Error::Limit { op: kernel.name(), msg: "f16 tensor-core kernels need the activations' row scales (row_scales)".into() }),
        _ => Ok(()),
    }
}

/// `out[m, k]` = `a` `[m, k]` f32 (times `row_scale` `[m]` with f16) rounded to `dtype`, the
/// operand of the `matmul_mma_pipe_*` kernels (`k % 8 == 0`).
pub fn cast_a16(l: &Launcher<'_>, dtype: DType, a: &DeviceBuffer, row_scale: Option<&DeviceBuffer>, out: &DeviceBuffer, (m, k): (usize, usize)) -> Result<()> {
    let kernel = match dtype {
        DType::F16 => Kernel::CastA16F16,
        DType::BF16 => Kernel::CastA16Bf16,
        other => return Err(Error::DType { op: "cast_a16", expected: "f16 or bf16", got: other }),
    };
    need(kernel, "a", a, m * k * 4)?;
    need(kernel, "out", out, m * k * 2)?;
    if k % 8 != 0 {
        return Err(Error::Limit { op: kernel.name(), msg: format!("k = {} is not a multiple of 8", k) });
    }
    f16_row_scales(kernel, dtype, row_scale, m)?;
    let p = CastA16Params { a: a.addr(), out: out.addr(), row_scale: row_scale.map_or(0, |s| s.addr()), m: fits_u32(kernel, "m", m)?, k: fits_u32(kernel, "k", k)?, lda: fits_u32(kernel, "k", k)?, _pad: 0 };
    if m == 0 || k == 0 {
        return Ok(());
    }
    let threads = cast_a16_tile::THREADS as usize;
    l.launch(kernel, [grid_dim(kernel, "x", ceil_div(m * k / 8, threads), MAX_GRID_X)?, 1, 1], threads as u32, &p)
}

/// Launches the linear `kernel` (of `algo`) over `p` (checked by the caller; `p.m` × `p.n`
/// outputs at row stride `p.ldc`, `p.k_split` 0): the grid of each algorithm; a split-K
/// algorithm sums its slices into `ws` (room for `[slices, m, n]` f32) and then launches the
/// reduce. Empty sizes launch nothing.
pub fn launch(l: &Launcher<'_>, algo: LinearAlgo, kernel: Kernel, p: &LinearParams, shared: u32, ws: Option<&DeviceBuffer>) -> Result<()> {
    let (m, n, k) = (p.m as usize, p.n as usize, p.k as usize);
    if kernel.needs_row_scale() && p.row_scale == 0 {
        return Err(Error::Limit { op: kernel.name(), msg: "f16 tensor-core kernels need the activations' row scales (row_scales)".into() });
    }
    // split-K: slices of `depth` k elements (whole shared-memory stages)
    let (depth, slices) = match algo {
        LinearAlgo::Big(s) if s > 1 => slice_depth(k, s, matmul_big_tile::BK as usize),
        LinearAlgo::Mma(tm, tn, s) if s > 1 => slice_depth(k, s, if kernel.reads_a16() { mma_pipe_tile::bk(tm, tn) } else { mma_tile::BK } as usize),
        LinearAlgo::Skinny(_, s) if s > 1 => slice_depth(k, s, 32),
        LinearAlgo::Big(0) | LinearAlgo::Mma(_, _, 0) | LinearAlgo::Skinny(_, 0) => return Err(Error::Limit { op: kernel.name(), msg: "split-K needs at least one slice".into() }),
        _ => (0, 1),
    };
    if slices > split_reduce_tile::MAX_SLICES {
        return Err(Error::Limit { op: kernel.name(), msg: format!("split-K into {} slices, at most {}", slices, split_reduce_tile::MAX_SLICES) });
    }
    if let (Some(ck), LinearAlgo::Mma(tm, tn, s)) = (cluster_kernel(l, algo, kernel), algo) {
        // sm_90: the slices (at most a cluster's blocks) merge through the cluster's shared memory
        let (depth, slices) = slice_depth(k, s.min(MAX_CLUSTER), mma_pipe_tile::bk(tm, tn) as usize);
        if m == 0 || n == 0 {
            return Ok(());
        }
        let grid = [grid_dim(ck, "x", ceil_div(n, tn as usize), MAX_GRID_X)?, grid_dim(ck, "y", ceil_div(m, tm as usize), MAX_GRID_Y)?, slices];
        let cp = LinearParams { k_split: fits_u32(ck, "k", depth)?, ..*p };
        let ck = l.wgmma_or(ck);
        return l.launch_cluster(ck, grid, mma_tile::THREADS, ck.large_shared_bytes(), &cp, [1, 1, slices]);
    }
    let part = match (slices > 1, ws) {
        (false, _) => None,
        (true, Some(ws)) => {
            need(kernel, "split-K workspace", ws, slices as usize * m * n * 4)?;
            Some(ws)
        }
        (true, None) => return Err(Error::Limit { op: kernel.name(), msg: "split-K needs a workspace".into() }),
    };
    if m == 0 || n == 0 {
        return Ok(());
    }
    if let LinearAlgo::Skinny(..) = algo {
        // split-K merges inside the launch: the last slice of each column block adds them
        let blocks = ceil_div(n, 8 * skinny_tile::NT);
        if part.is_some() && blocks > super::ARRIVAL_COUNTERS {
            return Err(Error::Limit { op: kernel.name(), msg: format!("{} column blocks split, at most {}", blocks, super::ARRIVAL_COUNTERS) });
        }
        let sp = match part {
            Some(ws) => SkinnyParams { lin: LinearParams { k_split: fits_u32(kernel, "k", depth)?, ..*p }, part: ws.addr(), counters: l.counters },
            None => SkinnyParams { lin: *p, part: 0, counters: 0 },
        };
        let grid = [grid_dim(kernel, "x", blocks, MAX_GRID_X)?, 1, slices];
        return l.launch_shared(kernel, grid, skinny_tile::THREADS, shared, &sp);
    }
    let kernel = if part.is_none() { l.wgmma_or(kernel) } else { kernel };
    // the slices write raw sums into the workspace; the reduce adds them through the epilogue
    let main = match part {
        Some(ws) => LinearParams { c: ws.addr(), ldc: p.n, k_split: fits_u32(kernel, "k", depth)?, ..*p },
        None => *p,
    };
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
        LinearAlgo::Big(_) => (
            [grid_dim(kernel, "x", ceil_div(n, matmul_big_tile::BN as usize), MAX_GRID_X)?, grid_dim(kernel, "y", ceil_div(m, matmul_big_tile::BM as usize), MAX_GRID_Y)?, slices],
            matmul_big_tile::THREADS,
        ),
        LinearAlgo::Mma(tm, tn, _) => (
            [grid_dim(kernel, "x", ceil_div(n, tn as usize), MAX_GRID_X)?, grid_dim(kernel, "y", ceil_div(m, tm as usize), MAX_GRID_Y)?, slices],
            mma_tile::THREADS,
        ),
        LinearAlgo::Skinny(..) => unreachable!("launched above"),
    };
    // the pipelined kernels stage their operands in dynamic shared memory
    let shared = match algo {
        LinearAlgo::Mma(..) if kernel.reads_a16() => kernel.large_shared_bytes(),
        _ => shared,
    };
    l.launch_shared(kernel, grid, block, shared, &main)?;
    if let Some(ws) = part {
        let reduce = Kernel::LinearSplitReduceF32;
        let threads = split_reduce_tile::THREADS;
        let rp = SplitReduceParams { part: ws.addr(), slices, _pad: 0, lin: *p };
        l.launch(reduce, [grid_dim(reduce, "x", ceil_div(m * n, threads as usize), MAX_GRID_X)?, 1, 1], threads, &rp)?;
    }
    Ok(())
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
    let p = GateUpParams { a: a.addr(), gate: gate.addr(), up: up.addr(), c: c.addr(), norm: norm_addr, m: m as u32, n: fits_u32(kernel, "n", n)?, k: fits_u32(kernel, "k", k)?, lda: k as u32, eps, _pad: 0, row_scale: 0 };
    if m == 0 || n == 0 {
        return Ok(());
    }
    let warps = vec_warps(n);
    l.launch_shared(kernel, [grid_dim(kernel, "x", ceil_div(n, warps as usize), MAX_GRID_X)?, 1, 1], warps * 32, shared, &p)
}

/// `c[m, n] = silu(a · gateᵀ) ⊙ (a · upᵀ)` by the few-row tensor-core kernel for at most `rows`
/// rows (compute_80; `row_scale` `[m]` with f16 weights, from [`row_scales`]).
#[allow(clippy::too_many_arguments)]
pub fn gate_up_skinny(l: &Launcher<'_>, wdtype: DType, rows: u32, a: &DeviceBuffer, gate: &DeviceBuffer, up: &DeviceBuffer, c: &DeviceBuffer, row_scale: Option<&DeviceBuffer>, (m, n, k): (usize, usize, usize)) -> Result<()> {
    let kernel = Kernel::gate_up_skinny(wdtype, rows, l.a16)?;
    need(kernel, "a", a, m * k * 4)?;
    need(kernel, "gate", gate, n * k * wdtype.size_of())?;
    need(kernel, "up", up, n * k * wdtype.size_of())?;
    need(kernel, "c", c, m * n * 4)?;
    if m > rows as usize || !LinearAlgo::vector_rows(k, wdtype) {
        return Err(Error::Limit { op: kernel.name(), msg: format!("needs at most {} rows and 16-byte weight rows (m = {}, k = {} of {})", rows, m, k, wdtype) });
    }
    f16_row_scales(kernel, wdtype, row_scale, m)?;
    let p = GateUpParams { a: a.addr(), gate: gate.addr(), up: up.addr(), c: c.addr(), norm: 0, m: m as u32, n: fits_u32(kernel, "n", n)?, k: fits_u32(kernel, "k", k)?, lda: fits_u32(kernel, "k", k)?, eps: 0.0, _pad: 0, row_scale: row_scale.map_or(0, |s| s.addr()) };
    if m == 0 || n == 0 {
        return Ok(());
    }
    l.launch(kernel, [grid_dim(kernel, "x", ceil_div(n, 8 * skinny_tile::NT / 2), MAX_GRID_X)?, 1, 1], skinny_tile::THREADS, &p)
}

/// `c[m, n] = silu(a · gateᵀ) ⊙ (a · upᵀ)` by the pipelined kernel with `tile` over 16-bit
/// activations `a` `[m, k]` (from [`cast_a16`], with the f16 `row_scale` it applied); `c16`:
/// `c` in bf16 (bf16 weights, even `n`: the down projection's operand), else f32.
#[allow(clippy::too_many_arguments)]
pub fn gate_up_pipe(l: &Launcher<'_>, wdtype: DType, tile: (u32, u32), a: &DeviceBuffer, gate: &DeviceBuffer, up: &DeviceBuffer, (c, c16): (&DeviceBuffer, bool), row_scale: Option<&DeviceBuffer>, (m, n, k): (usize, usize, usize)) -> Result<()> {
    let kernel = match c16 {
        true if wdtype == DType::BF16 => Kernel::pipe_c16(true, tile).ok_or_else(|| Error::Limit { op: "gate_up_pipe", msg: format!("no {}x{} tile kernel with a bf16 output", tile.0, tile.1) })?,
        true => return Err(Error::DType { op: "gate_up_pipe (bf16 output)", expected: "bf16 weights", got: wdtype }),
        false => Kernel::gate_up_pipe(wdtype, tile)?,
    };
    need(kernel, "a", a, m * k * 2)?;
    need(kernel, "gate", gate, n * k * wdtype.size_of())?;
    need(kernel, "up", up, n * k * wdtype.size_of())?;
    need(kernel, "c", c, m * n * if c16 { 2 } else { 4 })?;
    if k % 8 != 0 || (c16 && n % 2 != 0) {
        return Err(Error::Limit { op: kernel.name(), msg: format!("needs 16-byte rows (k = {}) and, for a bf16 output, an even n (n = {})", k, n) });
    }
    f16_row_scales(kernel, wdtype, row_scale, m)?;
    let p = GateUpParams { a: a.addr(), gate: gate.addr(), up: up.addr(), c: c.addr(), norm: 0, m: fits_u32(kernel, "m", m)?, n: fits_u32(kernel, "n", n)?, k: fits_u32(kernel, "k", k)?, lda: fits_u32(kernel, "k", k)?, eps: 0.0, _pad: 0, row_scale: row_scale.map_or(0, |s| s.addr()) };
    if m == 0 || n == 0 {
        return Ok(());
    }
    let kernel = l.wgmma_or(kernel);
    let grid = [grid_dim(kernel, "x", ceil_div(n, tile.1 as usize / 2), MAX_GRID_X)?, grid_dim(kernel, "y", ceil_div(m, tile.0 as usize), MAX_GRID_Y)?, 1];
    l.launch_shared(kernel, grid, mma_tile::THREADS, kernel.large_shared_bytes(), &p)
}

/// `c[m, n] = act(a · wᵀ + bias)` in bf16 by the pipelined bf16 kernel with `tile` (128 × 128 or
/// 64 × 128, no split-K) over 16-bit activations `a` `[m, k]`: the next pipelined GEMM's
/// operand (`n` even).
#[allow(clippy::too_many_arguments)]
pub fn linear_c16(l: &Launcher<'_>, tile: (u32, u32), a: &DeviceBuffer, w: &DeviceBuffer, bias: Option<&DeviceBuffer>, act: u32, c: &DeviceBuffer, (m, n, k): (usize, usize, usize)) -> Result<()> {
    let kernel = Kernel::pipe_c16(false, tile).ok_or_else(|| Error::Limit { op: "linear (bf16 output)", msg: format!("no {}x{} tile kernel with a bf16 output", tile.0, tile.1) })?;
    need(kernel, "a", a, m * k * 2)?;
    need(kernel, "w", w, n * k * 2)?;
    need(kernel, "c", c, m * n * 2)?;
    if let Some(b) = bias {
        need(kernel, "bias", b, n * 4)?;
    }
    if k % 8 != 0 || n % 2 != 0 {
        return Err(Error::Limit { op: kernel.name(), msg: format!("needs 16-byte rows (k = {}) and an even n (n = {})", k, n) });
    }
    let p = LinearParams {
        a: a.addr(),
        w: w.addr(),
        bias: bias.map_or(0, |b| b.addr()),
        residual: 0,
        c: c.addr(),
        norm: 0,
        m: fits_u32(kernel, "m", m)?,
        n: fits_u32(kernel, "n", n)?,
        k: fits_u32(kernel, "k", k)?,
        lda: fits_u32(kernel, "k", k)?,
        ldc: fits_u32(kernel, "n", n)?,
        eps: 0.0,
        act,
        k_split: 0,
        row_scale: 0,
    };
    launch(l, LinearAlgo::Mma(tile.0, tile.1, 1), kernel, &p, 0, None)
}

/// The epilogue activation (`ACT_*`) of a GELU.
pub(super) fn gelu_act(kind: crate::backend::Gelu) -> u32 {
    match kind {
        crate::backend::Gelu::Tanh => ACT_GELU_TANH,
        crate::backend::Gelu::Erf => ACT_GELU_ERF,
    }
}

impl CudaBackend {
    /// `x` RMS-normed by `norm` (weight, epsilon), or `x` itself: the unfused paths' first step.
    pub(super) fn rms_normed(&self, x: &Tensor, norm: Option<(&Tensor, f32)>) -> Result<Tensor> {
        match norm {
            Some((w, eps)) => self.rms_norm_op(x, w, eps),
            None => Ok(x.clone()),
        }
    }

    /// The split-K workspace of `algo` for an `[m, n]` output: room for its slices' partial
    /// sums, or `None` when it does not split.
    fn split_workspace(&self, l: &Launcher<'_>, algo: LinearAlgo, dtype: DType, (m, n): (usize, usize)) -> Result<Option<DeviceBuffer>> {
        if cluster_kernel(l, algo, algo.kernel(dtype, l.a16)?).is_some() {
            return Ok(None);
        }
        match algo {
            LinearAlgo::Big(s) | LinearAlgo::Mma(_, _, s) | LinearAlgo::Skinny(_, s) if s > 1 => Ok(Some(self.output(s as usize * m * n)?)),
            _ => Ok(None),
        }
    }

    /// The row scales of `a` `[m, k]` when `algo` with weights of `dtype` needs them
    /// ([`needs_row_scale`]), else `None`.
    pub(super) fn row_scales_for(&self, l: &Launcher<'_>, algo: LinearAlgo, dtype: DType, a: &DeviceBuffer, (m, k): (usize, usize)) -> Result<Option<DeviceBuffer>> {
        if !needs_row_scale(algo, dtype) {
            return Ok(None);
        }
        let s = self.output(m)?;
        row_scales(l, a, &s, (m, k))?;
        Ok(Some(s))
    }

    /// The activations `a` `[m, k]` rounded to 16 bits (times the f16 row `scales`) when the
    /// kernel of `algo` for weights of `dtype` reads them so ([`Kernel::reads_a16`]).
    pub(super) fn a16_operand(&self, l: &Launcher<'_>, algo: LinearAlgo, dtype: DType, a: &DeviceBuffer, scales: Option<&DeviceBuffer>, (m, k): (usize, usize)) -> Result<Option<DeviceBuffer>> {
        if !algo.kernel(dtype, l.a16)?.reads_a16() {
            return Ok(None);
        }
        let out = self.pool.alloc(m * k * 2)?;
        cast_a16(l, dtype, a, scales, &out, (m, k))?;
        Ok(Some(out))
    }

    /// A linear layer with an explicit kernel choice (tests and benchmarks use this to cover
    /// every kernel; [`crate::Backend::linear`] picks with [`LinearAlgo::pick`]).
    pub fn linear_with(&self, algo: LinearAlgo, a: &Tensor, w: &Tensor, bias: Option<&Tensor>, residual: Option<&Tensor>) -> Result<Tensor> {
        self.linear_full(algo, a, None, w, bias, ACT_NONE, residual)
    }

    /// The tile of the pipelined gate/up kernel (`gate_up_pipe_*`, `(rows, columns)`: half the
    /// columns from each matrix) for `m` rows, `n` outputs, `k` inputs, or `None` where the products take other
    /// kernels: the tile picked for one product of `2n` columns when it needs no split-K, and
    /// for 33 to 64 rows (a batched decode step, a short prompt) the 64-row tile even where
    /// its blocks leave multiprocessors idle. There the split alternative is two split-K
    /// GEMMs, their reduces, the SiLU pass and a cast (H100, batch 64: ~78 µs a layer).
    pub fn gate_up_tile(&self, m: usize, n: usize, k: usize, dtype: DType) -> Option<(u32, u32)> {
        match (self.pick_linear(m, n, k, dtype), self.pick_linear(m, 2 * n, k, dtype)) {
            (LinearAlgo::Mma(..), LinearAlgo::Mma(tm, tn, 1)) if tn >= 128 => Some((tm, tn)),
            (LinearAlgo::Mma(64, 64, _), _) if m <= 64 => Some((64, 128)),
            // past 64 rows the rounds may pick 64 × 64, which the pair has no kernel for: its
            // best wider tile
            (LinearAlgo::Mma(..), LinearAlgo::Mma(64, 64, 1)) => self.wider_rounds_tile(m, 2 * n, dtype),
            _ => None,
        }
    }

    /// The kernel [`crate::Backend::linear`] uses for these shapes on this device's module.
    pub fn pick_linear(&self, m: usize, n: usize, k: usize, dtype: DType) -> LinearAlgo {
        self.pick_linear_wide(m, n, k, dtype, true)
    }

    /// [`CudaBackend::pick_linear`], offering the 128 × 256 tile only with `wide` (and where the
    /// mode and the device allow it).
    fn pick_linear_wide(&self, m: usize, n: usize, k: usize, dtype: DType, wide: bool) -> LinearAlgo {
        LinearAlgo::pick_for(m, n, k, dtype, self.kernels.arch(), self.sms, wide && self.wide_fits(), self.warpgroup_tiles())
    }

    /// Where the rounds picked 64 × 64 for `m` rows and `n` columns (past 64 rows, all tiles on
    /// offer), the best of the tiles at least 128 wide: for kernels without a 64 × 64 variant
    /// (the gate/up pair, the bf16-output GEMMs); else `None`.
    fn wider_rounds_tile(&self, m: usize, n: usize, dtype: DType) -> Option<(u32, u32)> {
        (m > 64 && tile_rounds() && wide_tiles() && self.wide_fits()).then(|| pipe_tile(m, n, self.sms, 128, self.warpgroup_tiles() && dtype == DType::BF16))
    }

    /// Whether the 128 × 256 tiles of bf16 weights run as the warpgroup kernels (sm_90a and
    /// their shared memory fits; `Launcher::wgmma_or`).
    fn warpgroup_tiles(&self) -> bool {
        self.kernels.sm90a() && self.kernels.fits_shared(gpu::params::wgmma_tile::shared_bytes(128, 256))
    }

    /// Whether the pipelined 16-bit-activation kernels run and their 128 × 256 tile fits.
    fn wide_fits(&self) -> bool {
        self.a16.load(std::sync::atomic::Ordering::Relaxed) && self.kernels.fits_shared(mma_pipe_tile::shared_bytes(128, 256))
    }

    /// [`CudaBackend::linear_with`] with an optional RMSNorm `(weight [k] f32, eps)` of the
    /// input rows fused in (vector GEMV only).
    pub fn linear_normed(&self, algo: LinearAlgo, a: &Tensor, norm: Option<(&Tensor, f32)>, w: &Tensor, bias: Option<&Tensor>, residual: Option<&Tensor>) -> Result<Tensor> {
        self.linear_full(algo, a, norm, w, bias, ACT_NONE, residual)
    }

    /// Every option of a linear launch: an RMSNorm of the input (vector GEMV), an activation
    /// (`ACT_*`, tiled kernels) and a residual.
    #[allow(clippy::too_many_arguments)]
    fn linear_full(&self, algo: LinearAlgo, a: &Tensor, norm: Option<(&Tensor, f32)>, w: &Tensor, bias: Option<&Tensor>, act: u32, residual: Option<&Tensor>) -> Result<Tensor> {
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
        let ws = self.split_workspace(&l, algo, w.dtype(), (m, n))?;
        let scales = self.row_scales_for(&l, algo, w.dtype(), ab, (m, k))?;
        let a16 = self.a16_operand(&l, algo, w.dtype(), ab, scales.as_ref(), (m, k))?;
        linear(&l, algo, w.dtype(), a16.as_ref().unwrap_or(ab), wb, bb, rb, nb, act, &out, ws.as_ref(), scales.as_ref(), (m, n, k))?;
        Ok(Self::wrap(out_shape, DType::F32, out))
    }

    /// `rms_norm(x)` `[m, k]` rounded to bf16 by one kernel ([`super::norm::rms_norm_a16`]) when
    /// a norm is given, the weights are bf16 and the rows are whole 16-byte vectors; else `None`
    /// (the caller norms and casts in two steps).
    fn normed_a16(&self, l: &Launcher<'_>, x: &Tensor, norm: Option<(&Tensor, f32)>, dtype: DType, (m, k): (usize, usize)) -> Result<Option<DeviceBuffer>> {
        let (nw, eps) = match norm {
            Some(n) if dtype == DType::BF16 && k % 8 == 0 => n,
            _ => return Ok(None),
        };
        ops::rms_norm_dims(x, nw)?;
        let (xb, wb) = (self.buffer("rms_norm", x)?, self.buffer("rms_norm", nw)?);
        if (xb.addr() | wb.addr()) % 16 != 0 {
            return Ok(None);
        }
        let out = self.pool.alloc(m * k * 2)?;
        super::norm::rms_norm_a16(l, xb, wb, &out, m, k, eps)?;
        Ok(Some(out))
    }

    pub(super) fn rms_norm_linear_op(&self, x: &Tensor, norm: &Tensor, eps: f32, w: &Tensor, bias: Option<&Tensor>) -> Result<Tensor> {
        const OP: &str = "linear";
        if w.dtype().is_quantized() {
            return self.qlinear_op(x, Some((norm, eps)), w, bias, ACT_NONE, None);
        }
        let (m, n, k) = ops::linear_dims(x, w, bias)?;
        match self.pick_linear(m, n, k, w.dtype()) {
            LinearAlgo::GemvVec if norm_fits(m, k) => self.linear_normed(LinearAlgo::GemvVec, x, Some((norm, eps)), w, bias, None),
            // 16-bit activations: the norm writes them for the pipelined GEMM
            algo @ LinearAlgo::Mma(..) if self.a16.load(std::sync::atomic::Ordering::Relaxed) => {
                let l = self.enter()?;
                match self.normed_a16(&l, x, Some((norm, eps)), w.dtype(), (m, k))? {
                    Some(a16) => {
                        let bb = bias.map(|b| self.buffer(OP, b)).transpose()?;
                        let out = self.output(m * n)?;
                        let ws = self.split_workspace(&l, algo, w.dtype(), (m, n))?;
                        linear(&l, algo, w.dtype(), &a16, self.buffer(OP, w)?, bb, None, None, ACT_NONE, &out, ws.as_ref(), None, (m, n, k))?;
                        Ok(Self::wrap(ops::linear_out_shape(x, n), DType::F32, out))
                    }
                    None => self.linear_op(&self.rms_norm_op(x, norm, eps)?, w, bias, None),
                }
            }
            // prefill-sized inputs (or rows the stage cannot hold): the norm, then the product
            _ => self.linear_op(&self.rms_norm_op(x, norm, eps)?, w, bias, None),
        }
    }

    /// With 16-bit activations (`Precision::Bf16`), bf16 weights and tiles for every product:
    /// the norm rounds its rows to bf16 once ([`super::norm::layer_norm_a16`]) and each
    /// pipelined GEMM reads them (GELU in its epilogue); else the composite.
    pub(super) fn layer_norm_linears_op(&self, x: &Tensor, norm: (&Tensor, &Tensor, f32), linears: &[(&Tensor, Option<&Tensor>, Option<crate::backend::Gelu>)]) -> Result<Vec<Tensor>> {
        const OP: &str = "layer_norm_linears";
        let (m, k) = ops::layer_norm_dims(x, norm.0, norm.1)?;
        let mut algos = Vec::with_capacity(linears.len());
        for &(w, bias, _) in linears {
            let (_, n, _) = ops::linear_dims(x, w, bias)?;
            algos.push(self.pick_linear(m, n, k, w.dtype()));
        }
        let a16 = self.a16.load(std::sync::atomic::Ordering::Relaxed)
            && k % 8 == 0
            && linears.iter().zip(&algos).all(|((w, ..), algo)| w.dtype() == DType::BF16 && matches!(algo, LinearAlgo::Mma(..)));
        let (xb, wb, bb) = (self.buffer(OP, x)?, self.buffer(OP, norm.0)?, self.buffer(OP, norm.1)?);
        if !a16 || (xb.addr() | wb.addr() | bb.addr()) % 16 != 0 {
            return crate::backend::layer_norm_linears_composite(self, x, norm, linears);
        }
        let l = self.enter()?;
        let h = self.pool.alloc(m * k * 2)?;
        super::norm::layer_norm_a16(&l, xb, wb, bb, &h, m, k, norm.2)?;
        let mut outs = Vec::with_capacity(linears.len());
        for (&(w, bias, gelu), &algo) in linears.iter().zip(&algos) {
            let n = w.shape()[0];
            let act = gelu.map_or(ACT_NONE, gelu_act);
            let out = self.output(m * n)?;
            let ws = self.split_workspace(&l, algo, DType::BF16, (m, n))?;
            let bias = bias.map(|b| self.buffer(OP, b)).transpose()?;
            linear(&l, algo, DType::BF16, &h, self.buffer(OP, w)?, bias, None, None, act, &out, ws.as_ref(), None, (m, n, k))?;
            outs.push(Self::wrap(ops::linear_out_shape(x, n), DType::F32, out));
        }
        Ok(outs)
    }

    /// `x + down(silu(gate · x') ⊙ (up · x'))`, `x' = rms_norm(x)`: with 16-bit activations,
    /// bf16 weights and tiles for both halves, the gate/up kernel writes its product in bf16
    /// for the down projection's pipelined GEMM (no f32 product, no cast); else the composite.
    pub(super) fn rms_norm_swiglu_residual_op(&self, x: &Tensor, norm: &Tensor, eps: f32, gate: &Tensor, up: &Tensor, down: &Tensor) -> Result<Tensor> {
        const OP: &str = "rms_norm_swiglu_residual";
        let (m, n, k) = ops::linear_dims(x, gate, None)?;
        let composite = || crate::backend::rms_norm_swiglu_residual_composite(self, x, norm, eps, gate, up, down);
        // anything else (shapes the composite reports, other types) takes the composite
        let n_out = k;
        if !self.a16.load(std::sync::atomic::Ordering::Relaxed) || [gate, up, down].iter().any(|w| w.dtype() != DType::BF16) || up.shape() != gate.shape() || down.shape() != [k, n] || k % 8 != 0 || n % 8 != 0 || x.shape().len() != 2 {
            return composite();
        }
        let dn = self.pick_linear(m, n_out, n, down.dtype());
        let tile = match (self.gate_up_tile(m, n, k, gate.dtype()), dn) {
            (Some(tile), LinearAlgo::Mma(..)) => tile,
            _ => return composite(),
        };
        let l = self.enter()?;
        let a16 = match self.normed_a16(&l, x, Some((norm, eps)), DType::BF16, (m, k))? {
            Some(a) => a,
            None => return composite(),
        };
        let h = self.pool.alloc(m * n * 2)?;
        gate_up_pipe(&l, DType::BF16, tile, &a16, self.buffer(OP, gate)?, self.buffer(OP, up)?, (&h, true), None, (m, n, k))?;
        let out = self.output(m * n_out)?;
        let ws = self.split_workspace(&l, dn, DType::BF16, (m, n_out))?;
        linear(&l, dn, DType::BF16, &h, self.buffer(OP, down)?, None, Some(self.buffer(OP, x)?), None, ACT_NONE, &out, ws.as_ref(), None, (m, n_out, n))?;
        Ok(Self::wrap(x.shape().to_vec(), DType::F32, out))
    }

    /// `x + fc2(gelu(fc1(layer_norm(x))))` (the vision MLP): with 16-bit activations, bf16
    /// weights and tiles for both layers, the norm writes bf16 once and `fc1` writes its
    /// activated output in bf16 for `fc2`'s pipelined GEMM; else the composite.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn layer_norm_gelu_mlp_op(&self, x: &Tensor, norm: (&Tensor, &Tensor, f32), fc1: (&Tensor, Option<&Tensor>), kind: crate::backend::Gelu, fc2: (&Tensor, Option<&Tensor>)) -> Result<Tensor> {
        const OP: &str = "layer_norm_gelu_mlp";
        let (m, k) = ops::layer_norm_dims(x, norm.0, norm.1)?;
        let (_, n, _) = ops::linear_dims(x, fc1.0, fc1.1)?;
        let composite = || crate::backend::layer_norm_gelu_mlp_composite(self, x, norm, fc1, kind, fc2);
        // anything else (shapes the composite reports, other types) takes the composite
        let n_out = k;
        let bias_ok = fc2.1.map_or(true, |b| b.shape() == [k] && b.dtype() == DType::F32);
        if !self.a16.load(std::sync::atomic::Ordering::Relaxed) || fc1.0.dtype() != DType::BF16 || fc2.0.dtype() != DType::BF16 || fc2.0.shape() != [k, n] || !bias_ok || k % 8 != 0 || n % 8 != 0 || x.shape().len() != 2 {
            return composite();
        }
        // fc1 over k ≤ 1,024 keeps 128 × 128 tiles: with one 128 × 256 block per multiprocessor
        // its GELU epilogue overlaps no other block's products, and the main loop is short
        // (ncu, H200, the 1024² tower's 4,096 × 1,024 → 4,096: 190 against 175 µs; with the
        // cheaper GELU of `math::gelu_tanh` the two tiles measured level on the whole tower);
        // not where 128 × 256 is a warpgroup kernel (sm_90a), which is faster either way
        let wide = k > 1024 || self.kernels.sm90a();
        let (l1, l2) = (self.pick_linear_wide(m, n, k, DType::BF16, wide), self.pick_linear(m, n_out, n, DType::BF16));
        let tile = match (l1, l2) {
            (LinearAlgo::Mma(tm, tn, 1), LinearAlgo::Mma(..)) if Kernel::pipe_c16(false, (tm, tn)).is_some() => (tm, tn),
            // the rounds picked 64 × 64 (fc1 past k = 1,024), which has no bf16-output kernel
            (LinearAlgo::Mma(64, 64, 1), LinearAlgo::Mma(..)) if k > 1024 => match self.wider_rounds_tile(m, n, DType::BF16) {
                Some(tile) => tile,
                None => return composite(),
            },
            _ => return composite(),
        };
        let (xb, wb, bb) = (self.buffer(OP, x)?, self.buffer(OP, norm.0)?, self.buffer(OP, norm.1)?);
        if (xb.addr() | wb.addr() | bb.addr()) % 16 != 0 {
            return composite();
        }
        let l = self.enter()?;
        let a16 = self.pool.alloc(m * k * 2)?;
        super::norm::layer_norm_a16(&l, xb, wb, bb, &a16, m, k, norm.2)?;
        let h = self.pool.alloc(m * n * 2)?;
        let act = gelu_act(kind);
        let b1 = fc1.1.map(|b| self.buffer(OP, b)).transpose()?;
        linear_c16(&l, tile, &a16, self.buffer(OP, fc1.0)?, b1, act, &h, (m, n, k))?;
        let out = self.output(m * n_out)?;
        let ws = self.split_workspace(&l, l2, DType::BF16, (m, n_out))?;
        let b2 = fc2.1.map(|b| self.buffer(OP, b)).transpose()?;
        linear(&l, l2, DType::BF16, &h, self.buffer(OP, fc2.0)?, b2, Some(xb), None, ACT_NONE, &out, ws.as_ref(), None, (m, n_out, n))?;
        Ok(Self::wrap(x.shape().to_vec(), DType::F32, out))
    }

    pub(super) fn linear_op(&self, a: &Tensor, w: &Tensor, bias: Option<&Tensor>, residual: Option<&Tensor>) -> Result<Tensor> {
        if w.dtype().is_quantized() {
            return self.qlinear_op(a, None, w, bias, ACT_NONE, residual);
        }
        let (m, n, k) = ops::linear_dims(a, w, bias)?;
        self.linear_with(self.pick_linear(m, n, k, w.dtype()), a, w, bias, residual)
    }

    pub(super) fn linear_gelu_op(&self, a: &Tensor, w: &Tensor, bias: Option<&Tensor>, kind: crate::backend::Gelu) -> Result<Tensor> {
        if w.dtype().is_quantized() {
            return self.qlinear_op(a, None, w, bias, gelu_act(kind), None);
        }
        let (m, n, k) = ops::linear_dims(a, w, bias)?;
        let algo = self.pick_linear(m, n, k, w.dtype());
        if !matches!(algo, LinearAlgo::Tiled | LinearAlgo::Big(_) | LinearAlgo::Mma(..) | LinearAlgo::Skinny(..)) {
            // decode-sized inputs: the product, then the activation
            return self.gelu_op(&self.linear_op(a, w, bias, None)?, kind);
        }
        self.linear_full(algo, a, None, w, bias, gelu_act(kind), None)
    }

    /// `silu(x' · gateᵀ) ⊙ (x' · upᵀ)` with `x' = rms_norm(x)` when `norm` is given, else `x`.
    pub(super) fn gate_up_silu_op(&self, x: &Tensor, norm: Option<(&Tensor, f32)>, gate: &Tensor, up: &Tensor) -> Result<Tensor> {
        const OP: &str = "gate_up_silu";
        let (m, n, k) = ops::linear_dims(x, gate, None)?;
        if up.shape() != gate.shape() || up.dtype() != gate.dtype() {
            return Err(Error::shape(OP, &[gate.shape(), up.shape()], "gate and up weights must have one shape and dtype"));
        }
        if gate.dtype().is_quantized() {
            return self.qgate_up_op(x, norm, gate, up);
        }
        let algo = self.pick_linear(m, n, k, gate.dtype());
        let fused = algo == LinearAlgo::GemvVec && norm.map_or(true, |_| norm_fits(m, k));
        if !fused {
            // 16-bit activations: both products and the gate in one pipelined kernel, its tile
            // from `gate_up_tile`; the norm writes the bf16 activations itself
            let l = self.enter()?;
            if let (true, Some(tile)) = (l.a16, self.gate_up_tile(m, n, k, gate.dtype())) {
                let (a16, scales) = match self.normed_a16(&l, x, norm, gate.dtype(), (m, k))? {
                    Some(a16) => (a16, None),
                    None => {
                        let x = &self.rms_normed(x, norm)?;
                        let xb = self.buffer(OP, x)?;
                        let scales = self.row_scales_for(&l, algo, gate.dtype(), xb, (m, k))?;
                        let a16 = self.pool.alloc(m * k * 2)?;
                        cast_a16(&l, gate.dtype(), xb, scales.as_ref(), &a16, (m, k))?;
                        (a16, scales)
                    }
                };
                let out = self.output(m * n)?;
                gate_up_pipe(&l, gate.dtype(), tile, &a16, self.buffer(OP, gate)?, self.buffer(OP, up)?, (&out, false), scales.as_ref(), (m, n, k))?;
                return Ok(Self::wrap(ops::linear_out_shape(x, n), DType::F32, out));
            }
            let x = &self.rms_normed(x, norm)?;
            if let LinearAlgo::Skinny(rows, _) = algo {
                // a batched decode step: one few-row kernel for both products
                let xb = self.buffer(OP, x)?;
                let scales = self.row_scales_for(&l, algo, gate.dtype(), xb, (m, k))?;
                let out = self.output(m * n)?;
                gate_up_skinny(&l, gate.dtype(), rows, xb, self.buffer(OP, gate)?, self.buffer(OP, up)?, &out, scales.as_ref(), (m, n, k))?;
                return Ok(Self::wrap(ops::linear_out_shape(x, n), DType::F32, out));
            }
            // prefill-sized (or odd-k) inputs: the norm, two products and the elementwise gate
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn split_k_fills_the_device_and_keeps_slices_deep() {
        // a full wave of tiles: no split
        let p = BIG_SPLIT;
        assert_eq!(split_slices(132, 2048, 32, 132, p), 1);
        // 64-token prefill, o_proj (32 tiles of 64 × 64): 2048 / 512 = 4 slices at most
        assert_eq!(split_slices(32, 2048, 32, 132, p), 4);
        // down_proj (k 6144): ceil(264 / 32) = 9 slices
        assert_eq!(split_slices(32, 6144, 32, 132, p), 9);
        // a deeper policy: four blocks per SM, slices of ≥ 256 (o_proj: 8 slices)
        assert_eq!(split_slices(32, 2048, 32, 132, SplitPolicy { waves: 4, min_k: 256 }), 8);
        // shallow k: no split; never more than MAX_SLICES
        assert_eq!(split_slices(1, 300, 8, 132, p), 1);
        assert_eq!(split_slices(1, 1 << 20, 8, 132, p), split_reduce_tile::MAX_SLICES);
        // slices are whole stages and cover k exactly once
        for &(k, s, bk) in &[(2048, 4, 32), (6144, 9, 32), (1000, 3, 32), (40, 3, 32), (8, 3, 8), (0, 3, 32)] {
            let (depth, n) = slice_depth(k, s, bk);
            assert!(n >= 1 && n <= s.max(1), "k {} s {}: {} slices", k, s, n);
            if k > 0 {
                assert_eq!(depth % bk, 0);
                assert!(depth * n as usize >= k && depth * (n as usize - 1) < k, "k {} s {}: depth {} × {}", k, s, depth, n);
            }
        }
    }

    #[test]
    fn at_most_64_rows_take_no_128_row_tile() {
        // the LM head of a batch-64 decode step: 64 × 128 tiles; one row more, 128 × 128
        assert_eq!(LinearAlgo::pick(64, 151_936, 2048, DType::BF16, Arch::Compute80, 132), LinearAlgo::Mma(64, 128, 1));
        assert_eq!(LinearAlgo::pick(33, 151_936, 2048, DType::BF16, Arch::Compute80, 132), LinearAlgo::Mma(64, 128, 1));
        assert_eq!(LinearAlgo::pick(65, 151_936, 2048, DType::BF16, Arch::Compute80, 132), LinearAlgo::Mma(128, 128, 1));
    }

    #[test]
    fn pipelined_kernels_take_128x256_tiles_where_they_fill_the_device() {
        let pick = |m, n, a16| LinearAlgo::pick_for(m, n, 2048, DType::BF16, Arch::Compute80, 132, a16, false);
        // 4,096 rows of the vision tower's fc2 (1,024 outputs): 32 × 4 = 128 tiles of 128 × 256
        assert_eq!(pick(4096, 1024, true), LinearAlgo::Mma(128, 256, 1));
        // the f32-precision kernels have no such tile
        assert_eq!(pick(4096, 1024, false), LinearAlgo::Mma(128, 128, 1));
        // 1,024 rows: 8 × 4 = 32 tiles of 128 × 256 and 8 × 8 of 128 × 128 would idle most
        // multiprocessors; 16 × 8 of 64 × 128 fill them
        assert_eq!(pick(1024, 1024, true), LinearAlgo::Mma(64, 128, 1));
        // at most 64 rows: no 128-row tile
        assert_eq!(pick(64, 151_936, true), LinearAlgo::Mma(64, 128, 1));
        // 1,041 rows (a server step's prompts), 2,048 outputs: 9 × 8 = 72 blocks of 128 × 256
        // finish in one round
        assert_eq!(pick(1041, 2048, true), LinearAlgo::Mma(128, 256, 1));
        assert_eq!(pick(1041, 2048, false), LinearAlgo::Mma(128, 128, 1));
        // 2,048 rows, 1,024 outputs: 256 blocks of 64 × 128, one full round of two per SM (64
        // of 128 × 256 would double the busiest multiprocessor's work)
        assert_eq!(pick(2048, 1024, true), LinearAlgo::Mma(64, 128, 1));
    }

    #[test]
    fn pipelined_tiles_go_by_rounds_of_blocks() {
        // 2,048 prompt rows: 16 row tiles, one or two full rounds of 128 × 256 on 132 SMs
        for n in [2048, 4096, 12_288] {
            assert_eq!(pipe_tile(2048, n, 132, 64, false), (128, 256), "n {}", n);
        }
        // 64 decode rows more: a 17th row tile would be a second round of 128 × 256 for 136
        // blocks; 33 × 16 = 528 blocks of 64 × 128 are two full rounds of two
        assert_eq!(pipe_tile(2112, 2048, 132, 64, false), (64, 128));
        assert_eq!(pipe_tile(2112, 4096, 132, 64, false), (64, 128));
        // an image prompt (1,038 rows) and 16 decode rows, qkv: 9 × 16 = 144 blocks of
        // 128 × 256 are two rounds on 12 SMs; 17 × 32 of 64 × 128 two and a half
        assert_eq!(pipe_tile(1054, 4096, 132, 64, false), (64, 128));
        // the LM head of 65-128 rows keeps 128 × 256; a pair without a 64 × 64 kernel never
        // gets it
        assert_eq!(pipe_tile(65, 151_936, 132, 64, false), (128, 256));
        assert_eq!(pipe_tile(300, 1024, 132, 128, false).1, 128);
        // at most 64 rows: 64-row tiles only; a device of no multiprocessors does not divide by 0
        assert_eq!(pipe_tile(64, 151_936, 132, 64, false).0, 64);
        assert!(PIPE_TILES.contains(&pipe_tile(4096, 4096, 0, 64, false)));
        // the warpgroup kernel's 128 × 256 (sm_90a) takes the 17th row tile's second round
        // (2,112 rows: down_proj 178 against 190 µs on the H200) and an image prompt's qkv
        // (1,054 rows: 70.5 against 90.4)
        assert_eq!(pipe_tile(2112, 2048, 132, 64, true), (128, 256));
        assert_eq!(pipe_tile(1054, 4096, 132, 64, true), (128, 256));
    }

    #[test]
    fn the_few_row_kernel_splits_narrow_layers_only() {
        // o_proj and down_proj of the 2B (2048 columns: 64 blocks) on an H100 / H200: four
        // slices of the 16-row kernel (two blocks a multiprocessor), two of the 32-row one
        assert_eq!(skinny_slices(16, 2048, 2048, 132), 4);
        assert_eq!(skinny_slices(16, 2048, 6144, 132), 4);
        assert_eq!(skinny_slices(32, 2048, 2048, 132), 2);
        assert_eq!(skinny_slices(32, 2048, 6144, 132), 2);
        // qkv (4096 columns) and wider give half the device a block: no split
        assert_eq!(skinny_slices(16, 4096, 2048, 132), 1);
        assert_eq!(skinny_slices(16, 151_936, 2048, 132), 1);
        // slices stay at least SKINNY_MIN_K deep; a small device splits less
        assert_eq!(skinny_slices(16, 130, 256, 132), 1);
        assert_eq!(skinny_slices(16, 130, 1024, 132), 1024 / SKINNY_MIN_K as u32);
        assert_eq!(skinny_slices(32, 2048, 2048, 28), 1);
        assert_eq!(skinny_slices(16, 2048, 2048, 28), 1);
    }
}
