//! The backend interface: every op the model uses, once, implemented by the CPU backend
//! (pure Rust, multithreaded) and the CUDA backend (Rust kernels from `gpu/`). Code above
//! this trait is written once and runs on either. Shape and dtype rules live in [`crate::ops`]
//! and both backends check them before doing any work.

use crate::model::rope::{mrope_tables, Pos3};
use crate::pages::{gather_cache_rows, gather_cache_rows_at, Pages};
use crate::{ops, Blocks, DType, DeviceKind, Error, MappedBytes, Result, Tensor};
use gpu::params::{block_mask, sample_row, CURSOR_FIELDS, CURSOR_ROW};
pub use crate::memory::MemoryStats;
pub use crate::ops::{AttnParams, QkvRope};
pub use crate::pick::DeviceSampling;

/// The two GELU forms Qwen3-VL uses: tanh in the vision MLP, erf in the patch mergers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Gelu {
    Tanh,
    Erf,
}

/// How f16 keys and values keep f32's range: each row (one KV head's `d` values of one token) is
/// stored divided by a power of two, `gpu::math::f16_key_scale` / `f16_value_scale` of its
/// largest magnitude (1 for every row in `[2^-4, 2^15)`, so ordinary rows are stored as plain
/// f16; values are only ever scaled down), and a `[rows, kv_heads, 2]`
/// f32 tensor beside the cache holds each row's key scale (`[.., 0]`) and value scale (`[.., 1]`).
/// Readers multiply them back in f32. The KV caches in f16 carry one ([`crate::model::KvCache`],
/// the engine's paged pool); `None` in the ops below means every row is stored as is. Scales
/// come from the backend's own writers ([`Backend::write_kv_rows`],
/// [`Backend::qkv_rope_append`]): a device backend notes when one is not 1 and until then its
/// tensor-core flash kernels do not apply them, so scales uploaded any other way must all be 1.
pub const KV_SCALES: usize = 2;

/// A block mask for [`Backend::attention_block_sparse`]: query rows cut into blocks at
/// `q_bounds` (cu_seqlens style: `0 = b_0 <= b_1 <= ... <= b_n = rows`), keys at `k_bounds`, and
/// for each (query block, key block) whether the one sees the other. Kernels skip the key tiles
/// a query tile's blocks may not see instead of masking them after the fact. The mask lives on
/// the host (for the composite path) and, packed as `gpu::params::block_mask` describes, on the
/// backend it was made for, so a model builds it once and every layer reuses it.
#[derive(Clone, Debug)]
pub struct BlockMask {
    q_bounds: Vec<usize>,
    k_bounds: Vec<usize>,
    allowed: Vec<bool>,
    packed: Tensor,
}

impl BlockMask {
    /// Checks the bounds (start at 0, never decrease, at least one block each, every value a
    /// u32) and `allowed` (`nqb · nkb` entries, row-major by query block), and uploads the packed
    /// form to `b`.
    pub fn new(b: &dyn Backend, q_bounds: &[usize], k_bounds: &[usize], allowed: &[bool]) -> Result<BlockMask> {
        const OP: &str = "block mask";
        let bad = |msg: String| Error::Limit { op: OP, msg };
        for (what, bounds) in [("query", q_bounds), ("key", k_bounds)] {
            if bounds.len() < 2 || bounds[0] != 0 || bounds.windows(2).any(|w| w[1] < w[0]) || *bounds.last().unwrap_or(&0) > u32::MAX as usize {
                return Err(bad(format!("{} bounds {:?} must start at 0, never decrease and make at least one block", what, bounds)));
            }
        }
        let (nqb, nkb) = (q_bounds.len() - 1, k_bounds.len() - 1);
        if allowed.len() != nqb * nkb {
            return Err(bad(format!("{} allowed flags for {} x {} blocks", allowed.len(), nqb, nkb)));
        }
        let mut packed = vec![0u32; block_mask::words(nqb, nkb)];
        packed[0] = nqb as u32;
        packed[1] = nkb as u32;
        for (i, &x) in q_bounds.iter().enumerate() {
            packed[block_mask::HEADER + i] = x as u32;
        }
        for (i, &x) in k_bounds.iter().enumerate() {
            packed[block_mask::k_bounds_at(nqb) + i] = x as u32;
        }
        let bits = block_mask::bits_at(nqb, nkb);
        for (n, _) in allowed.iter().enumerate().filter(|(_, &a)| a) {
            packed[bits + n / 32] |= 1 << (n % 32);
        }
        let packed = b.upload_u32(&[packed.len()], &packed)?;
        Ok(BlockMask { q_bounds: q_bounds.to_vec(), k_bounds: k_bounds.to_vec(), allowed: allowed.to_vec(), packed })
    }

    /// One diagonal block per segment of `lens` rows (images, or frames): rows see the keys of
    /// their own segment only. Segments may not be empty.
    pub fn block_diagonal(b: &dyn Backend, lens: &[usize]) -> Result<BlockMask> {
        if lens.is_empty() || lens.contains(&0) {
            return Err(Error::Limit { op: "block mask", msg: format!("segments {:?} must be non-empty", lens) });
        }
        let bounds: Vec<usize> = std::iter::once(0).chain(lens.iter().scan(0, |s, &l| {
            *s += l;
            Some(*s)
        })).collect();
        let n = lens.len();
        let allowed: Vec<bool> = (0..n * n).map(|i| i / n == i % n).collect();
        BlockMask::new(b, &bounds, &bounds, &allowed)
    }

    /// Query rows the mask covers.
    pub fn rows(&self) -> usize {
        *self.q_bounds.last().unwrap_or(&0)
    }

    /// Keys the mask covers.
    pub fn keys(&self) -> usize {
        *self.k_bounds.last().unwrap_or(&0)
    }

    pub fn q_bounds(&self) -> &[usize] {
        &self.q_bounds
    }

    pub fn k_bounds(&self) -> &[usize] {
        &self.k_bounds
    }

    /// Whether query block `qb` sees key block `kb`.
    pub fn allowed(&self, qb: usize, kb: usize) -> bool {
        self.allowed[qb * (self.k_bounds.len() - 1) + kb]
    }

    /// Whether query row `row` sees key `key`.
    pub fn sees(&self, row: usize, key: usize) -> bool {
        let block = |bounds: &[usize], x: usize| bounds[1..].iter().position(|&b| x < b);
        match (block(&self.q_bounds, row), block(&self.k_bounds, key)) {
            (Some(qb), Some(kb)) => self.allowed(qb, kb),
            _ => false,
        }
    }

    /// The packed mask on the backend it was made for (`[words]` u32).
    pub fn packed(&self) -> &Tensor {
        &self.packed
    }
}

/// The composite body of [`Backend::attention_block_sparse`] (the CPU path and the test oracle),
/// for overrides that fall back to it: per query block, the allowed key blocks' rows (gathered
/// when they are not one run) and one dense [`Backend::attention`]; rows that see no key stay
/// zero. Rotates q and k first when `rope` is given.
pub fn attention_block_sparse_composite<B: Backend + ?Sized>(b: &B, q: &Tensor, k: &Tensor, v: &Tensor, mask: &BlockMask, scale: f32, rope: Option<(&Tensor, &Tensor)>) -> Result<Tensor> {
    let (t, heads, kv_heads, d) = ops::block_sparse_dims(q, k, v, (mask.rows(), mask.keys()), rope)?;
    let (q, k) = match rope {
        Some((cos, sin)) => (b.rope(q, cos, sin)?, b.rope(k, cos, sin)?),
        None => (q.clone(), k.clone()),
    };
    let full = |kv_len| AttnParams { kv_len, q_pos0: 0, causal: false, scale };
    let (nqb, nkb) = (mask.q_bounds.len() - 1, mask.k_bounds.len() - 1);
    if nqb == 1 && nkb == 1 && mask.allowed[0] {
        return b.attention(&q, &k, v, full(mask.keys()));
    }
    // keys and values as f32 rows that can be gathered
    let widen = |x: &Tensor| -> Result<Tensor> {
        match x.dtype() {
            DType::F16 => b.upload_f32(x.shape(), &b.download_half(x)?.iter().map(|&h| gpu::math::f16_to_f32(h)).collect::<Vec<_>>()),
            _ => Ok(x.clone()),
        }
    };
    let (k, v) = (widen(&k)?, widen(v)?);
    let mut out = b.zeros(&[t, heads, d])?;
    for qb in 0..nqb {
        let (r0, r1) = (mask.q_bounds[qb], mask.q_bounds[qb + 1]);
        // the allowed key blocks as runs of consecutive keys
        let mut runs: Vec<(usize, usize)> = Vec::new();
        for kb in (0..nkb).filter(|&kb| mask.allowed(qb, kb)) {
            let (k0, k1) = (mask.k_bounds[kb], mask.k_bounds[kb + 1]);
            match runs.last_mut() {
                Some(last) if last.1 == k0 => last.1 = k1,
                _ if k1 > k0 => runs.push((k0, k1)),
                _ => {}
            }
        }
        let n: usize = runs.iter().map(|r| r.1 - r.0).sum();
        if r1 == r0 || n == 0 {
            continue;
        }
        let (ks, vs) = if runs.len() == 1 {
            (b.take_rows(&k, runs[0].0, n)?, b.take_rows(&v, runs[0].0, n)?)
        } else {
            let (mut ks, mut vs) = (b.zeros(&[n, kv_heads, d])?, b.zeros(&[n, kv_heads, d])?);
            let mut at = 0;
            for &(k0, k1) in &runs {
                b.write_rows(&mut ks, at, &b.take_rows(&k, k0, k1 - k0)?)?;
                b.write_rows(&mut vs, at, &b.take_rows(&v, k0, k1 - k0)?)?;
                at += k1 - k0;
            }
            (ks, vs)
        };
        let o = b.attention(&b.take_rows(&q, r0, r1 - r0)?, &ks, &vs, full(n))?;
        b.write_rows(&mut out, r0, &o)?;
    }
    Ok(out)
}

/// The composite body of [`Backend::attention_paged`] (the CPU path and the test oracle): per
/// row, its keys, values and their scales gathered out of the caches, then one dense
/// [`Backend::attention_scaled`].
/// The default body of [`Backend::layer_norm_linears`]: the norm, then each product.
pub fn layer_norm_linears_composite<B: Backend + ?Sized>(b: &B, x: &Tensor, norm: (&Tensor, &Tensor, f32), linears: &[(&Tensor, Option<&Tensor>, Option<Gelu>)]) -> Result<Vec<Tensor>> {
    let h = b.layer_norm(x, norm.0, norm.1, norm.2)?;
    linears
        .iter()
        .map(|&(w, bias, gelu)| match gelu {
            Some(kind) => b.linear_gelu(&h, w, bias, kind),
            None => b.linear(&h, w, bias),
        })
        .collect()
}

/// The default body of [`Backend::rms_norm_swiglu_residual`].
pub fn rms_norm_swiglu_residual_composite<B: Backend + ?Sized>(b: &B, x: &Tensor, norm: &Tensor, eps: f32, gate: &Tensor, up: &Tensor, down: &Tensor) -> Result<Tensor> {
    b.linear_residual(&b.rms_norm_gate_up_silu(x, norm, eps, gate, up)?, down, None, x)
}

/// The default body of [`Backend::layer_norm_gelu_mlp`].
pub fn layer_norm_gelu_mlp_composite<B: Backend + ?Sized>(b: &B, x: &Tensor, norm: (&Tensor, &Tensor, f32), fc1: (&Tensor, Option<&Tensor>), kind: Gelu, fc2: (&Tensor, Option<&Tensor>)) -> Result<Tensor> {
    let h = b.layer_norm_linears(x, norm, &[(fc1.0, fc1.1, Some(kind))])?.remove(0);
    b.linear_residual(&h, fc2.0, fc2.1, x)
}

/// The default body of [`Backend::attention_slots`]: the keys, values (and row scales) gathered
/// by `slots` into contiguous rows, then [`Backend::attention_scaled`].
pub fn attention_slots_composite<B: Backend + ?Sized>(b: &B, q: &Tensor, k_pool: &Tensor, v_pool: &Tensor, scales: Option<&Tensor>, slots: &Tensor, p: AttnParams) -> Result<Tensor> {
    ops::attention_slots_dims(q, k_pool, v_pool, slots, &p)?;
    ops::kv_scale_dims("attention_slots", k_pool, scales)?;
    let sc = scales.map(|s| gather_cache_rows_at(b, s, slots)).transpose()?;
    b.attention_scaled(q, &gather_cache_rows_at(b, k_pool, slots)?, &gather_cache_rows_at(b, v_pool, slots)?, sc.as_ref(), p)
}

pub fn attention_paged_composite<B: Backend + ?Sized>(b: &B, q: &Tensor, k_pool: &Tensor, v_pool: &Tensor, scales: Option<&Tensor>, pages: &Pages, scale: f32) -> Result<Tensor> {
    let (t, heads, _, d) = ops::paged_dims(q, k_pool, v_pool, pages)?;
    ops::kv_scale_dims("attention_paged", k_pool, scales)?;
    let mut out = b.zeros(&[t, heads, d])?;
    for i in 0..t {
        let (n, slots) = (pages.len(i), pages.slots(i, pages.len(i)));
        let (k, v) = (gather_cache_rows(b, k_pool, &slots)?, gather_cache_rows(b, v_pool, &slots)?);
        let sc = scales.map(|s| gather_cache_rows(b, s, &slots)).transpose()?;
        let o = b.attention_scaled(&b.take_rows(q, i, 1)?, &k, &v, sc.as_ref(), AttnParams { kv_len: n, q_pos0: n - 1, causal: false, scale })?;
        b.write_rows(&mut out, i, &o)?;
    }
    Ok(out)
}

/// The default bodies of [`Backend::sample_step`] and [`Backend::sample_step_rows`]: each row
/// of `logits [rows, vocab]` picked on the host among its first `n` with `settings(row)` (with
/// `mask`, `[rows, ceil(n / 32)]` u32 already checked, among the ids it allows: the others
/// lowered to negative infinity first, as the device stages them), the draw numbered by the
/// cursor's row field; the ids written and every cursor field advanced.
#[allow(clippy::too_many_arguments)]
fn pick_rows_on_host<B: Backend + ?Sized>(b: &B, logits: &Tensor, (vocab, n): (usize, usize), mask: Option<&Tensor>, ids: &mut Tensor, cursor: &mut Tensor, settings: &dyn Fn(usize) -> Result<DeviceSampling>) -> Result<()> {
    let all = b.download_f32(logits)?;
    let mut cur = b.download_u32(cursor)?;
    let masks = mask.map(|m| b.download_u32(m)).transpose()?;
    let words = crate::pick::mask_words(n);
    let rows = all.len() / vocab.max(1);
    let mut picks = Vec::with_capacity(rows);
    for r in 0..rows {
        let s = settings(r)?;
        let c = &mut cur[r * CURSOR_FIELDS..(r + 1) * CURSOR_FIELDS];
        let row = &all[r * vocab..r * vocab + n];
        picks.push(match &masks {
            None => crate::pick::pick(row, &s, c[CURSOR_ROW] as u64),
            Some(m) => {
                let mut row = row.to_vec();
                crate::pick::apply_mask(&mut row, &m[r * words..(r + 1) * words]);
                crate::pick::pick(&row, &s, c[CURSOR_ROW] as u64)
            }
        });
        c.iter_mut().for_each(|f| *f += 1);
    }
    b.write_u32(ids, &picks)?;
    b.write_u32(cursor, &cur)
}

/// Whether `a` and `b` are the same backend object.
pub fn same_backend(a: &dyn Backend, b: &dyn Backend) -> bool {
    std::ptr::eq(a as *const dyn Backend as *const u8, b as *const dyn Backend as *const u8)
}

/// `t` (f32, f16/bf16 or u32, on `from`) as a tensor on `to`: a copy through host memory, or `t`
/// itself when both are one backend. How the hidden state crosses between the parts of a model
/// split over a device and the host.
pub fn transfer(from: &dyn Backend, to: &dyn Backend, t: &Tensor) -> Result<Tensor> {
    if same_backend(from, to) {
        return Ok(t.clone());
    }
    match t.dtype() {
        DType::F32 => to.upload_f32(t.shape(), &from.download_f32(t)?),
        DType::U32 => to.upload_u32(t.shape(), &from.download_u32(t)?),
        d @ (DType::F16 | DType::BF16) => to.upload_half(t.shape(), d, &from.download_half(t)?),
        d => Err(Error::DType { op: "transfer", expected: "f32, f16, bf16 or u32", got: d }),
    }
}

/// How the tensor-core GEMMs treat their f32 activations (`--precision`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Precision {
    /// Each activation split into a 16-bit high part and its remainder, two products per tile:
    /// as precise as f32 activations to about 2^-16 relative (the default of the library).
    F32,
    /// Each activation rounded once to the weights' 16-bit type (bf16; f16 after the row
    /// scales), one product per tile: what a bf16 GEMM in transformers, vLLM or cuBLAS does.
    Bf16,
}

impl Precision {
    /// `f32` / `bf16`.
    pub fn name(self) -> &'static str {
        match self {
            Precision::F32 => "f32",
            Precision::Bf16 => "bf16",
        }
    }
}

impl std::str::FromStr for Precision {
    type Err = String;
    fn from_str(s: &str) -> std::result::Result<Self, String> {
        match s.to_ascii_lowercase().as_str() {
            "f32" | "fp32" => Ok(Precision::F32),
            "bf16" => Ok(Precision::Bf16),
            other => Err(format!("unknown precision '{}': expected f32 or bf16", other)),
        }
    }
}

impl std::fmt::Display for Precision {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// A recorded sequence of device work ([`Backend::record`]) that [`Backend::replay`] runs again.
pub struct Recording(pub Box<dyn std::any::Any + Send>);

/// Runs `body` on `b` through the recording `held` when it is of `kind`: replayed; else, when
/// `record` and `kind` never failed to record, recorded first (a failure is kept in `failed` and
/// not retried); else as plain launches ([`Backend::within`]). The decode steps of a session and
/// of the engine run this way, so a step is the same body recorded or not.
pub fn run_recorded<K: Copy + PartialEq>(b: &dyn Backend, record: bool, held: &mut Option<(K, Recording)>, failed: &mut Vec<K>, kind: K, body: &mut dyn FnMut() -> Result<()>) -> Result<()> {
    let replayable = matches!(held, Some((k, _)) if *k == kind);
    if !replayable && record && !failed.contains(&kind) {
        *held = None;
        match b.record(body)? {
            Some(r) => *held = Some((kind, r)),
            None => failed.push(kind),
        }
    }
    match held {
        Some((k, r)) if *k == kind && record => b.replay(r),
        _ => b.within(body),
    }
}

/// A point in a backend's timeline ([`Backend::mark`]): a host instant, and on a device a
/// recorded event, so that device time is measured on the device.
pub struct Mark {
    pub host: std::time::Instant,
    pub device: Option<Box<dyn std::any::Any + Send>>,
}

pub trait Backend: Send + Sync {
    /// Which device this backend runs on.
    fn kind(&self) -> DeviceKind;

    /// A human-readable description (device name, threads).
    fn describe(&self) -> String;

    /// The concrete backend, for backend-specific tools (benchmarks, `info`).
    fn as_any(&self) -> &dyn std::any::Any;

    /// Copies f32 host data into a new tensor on this backend.
    fn upload_f32(&self, shape: &[usize], data: &[f32]) -> Result<Tensor>;

    /// Copies raw f16/bf16 bits into a new tensor of `dtype` on this backend.
    fn upload_half(&self, shape: &[usize], dtype: DType, bits: &[u16]) -> Result<Tensor>;

    /// A tensor of `dtype` from mapped checkpoint bytes: zero-copy on the CPU when aligned,
    /// uploaded on a device.
    fn upload_mapped(&self, shape: &[usize], dtype: DType, bytes: MappedBytes) -> Result<Tensor>;

    /// A tensor of the block-quantized `dtype` (`shape` in elements, rows whole blocks) from its
    /// blocks: zero-copy on the CPU. The default stores the raw bytes on the device (as 16-bit
    /// words; every block size is even), so that ops without kernels for the type fail on it
    /// with a dtype error naming it rather than at load.
    fn upload_blocks(&self, shape: &[usize], dtype: DType, blocks: Blocks) -> Result<Tensor> {
        let bytes = crate::tensor::quantized_bytes("upload_blocks", shape, dtype)?;
        let raw = blocks.bytes();
        if raw.len() != bytes || raw.len() % 2 != 0 {
            return Err(Error::shape("upload_blocks", &[shape], format!("{} of shape {:?} is {} bytes, {} were given", dtype, shape, bytes, raw.len())));
        }
        let words: Vec<u16> = raw.chunks_exact(2).map(|c| u16::from_le_bytes([c[0], c[1]])).collect();
        let t = self.upload_half(&[words.len()], DType::F16, &words)?;
        Ok(Tensor::from_storage(shape.to_vec(), dtype, t.storage().clone()))
    }

    /// Copies an f32 tensor of this backend back to host memory.
    fn download_f32(&self, t: &Tensor) -> Result<Vec<f32>>;

    /// Copies the raw bits of an f16/bf16 tensor of this backend back to host memory.
    fn download_half(&self, t: &Tensor) -> Result<Vec<u16>>;

    /// Copies u32 host data (token ids, cursors) into a new tensor on this backend.
    fn upload_u32(&self, shape: &[usize], data: &[u32]) -> Result<Tensor>;

    /// Copies a u32 tensor of this backend back to host memory.
    fn download_u32(&self, t: &Tensor) -> Result<Vec<u32>>;

    /// Overwrites the elements of the u32 tensor `dst` (same count) in place, keeping its
    /// storage (recorded work that reads it sees the new values).
    fn write_u32(&self, dst: &mut Tensor, data: &[u32]) -> Result<()>;

    /// Overwrites the first `width` columns of the 2-D u32 tensor `dst` (`[rows, cols]`) in
    /// place with `data` (`[rows, width]`), keeping the other columns (a block table's unused
    /// tail). The default reads `dst` back, patches it and writes it whole.
    fn write_u32_cols(&self, dst: &mut Tensor, data: &[u32], width: usize) -> Result<()> {
        let (_, cols) = ops::u32_cols_dims("write_u32_cols", dst, data, width)?;
        let mut all = self.download_u32(dst)?;
        ops::write_cols(&mut all, cols, data, width);
        self.write_u32(dst, &all)
    }

    /// Linear layer: `a [m, k]` f32 times `w [n, k]` (f32/f16/bf16, or a block-quantized type
    /// where the backend has kernels for it) transposed, plus an optional `bias [n]` f32;
    /// returns `[m, n]` f32.
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
    /// `q [t, heads, d]` against the first `p.kv_len` rows of `k`, `v` `[cap, kv_heads, d]`
    /// (f32 or f16, rows times their `scales` when given, see [`KV_SCALES`]); returns
    /// `[t, heads, d]`.
    fn attention_scaled(&self, q: &Tensor, k: &Tensor, v: &Tensor, scales: Option<&Tensor>, p: AttnParams) -> Result<Tensor>;

    /// [`Backend::attention_scaled`] of rows stored as they are.
    fn attention(&self, q: &Tensor, k: &Tensor, v: &Tensor, p: AttnParams) -> Result<Tensor> {
        self.attention_scaled(q, k, v, None, p)
    }

    /// Copies `src [r, ..]` (f32) into rows `row0 .. row0 + r` of `dst [cap, ..]` (trailing axes
    /// equal; f32, or f16 rounded to nearest even), in place: the KV-cache append.
    fn write_rows(&self, dst: &mut Tensor, row0: usize, src: &Tensor) -> Result<()>;

    /// [`Backend::write_rows`] of keys or values `src [r, kv_heads, d]` into a cache row range
    /// with row scales: with `scales = Some((s, which))` (`s [cap, kv_heads, 2]`, `which` 0 for
    /// keys, 1 for values) each (row, head) vector is stored divided by its
    /// `gpu::math::f16_key_scale` (values: `f16_value_scale`) and the scale goes to
    /// `s[row, head, which]`; without, as `write_rows`.
    fn write_kv_rows(&self, dst: &mut Tensor, scales: Option<(&mut Tensor, usize)>, row0: usize, src: &Tensor) -> Result<()>;

    /// Columns `col0 .. col0 + width` of the f32 matrix `x [rows, cols]` as `[rows, width]`.
    fn narrow_cols(&self, x: &Tensor, col0: usize, width: usize) -> Result<Tensor>;

    /// `x [n, width]` with row `rows[i]` replaced by (`add`: increased by) row `i` of
    /// `src [rows.len(), width]`: image embeddings into the prompt, DeepStack features.
    fn scatter_rows(&self, x: &Tensor, rows: &[usize], src: &Tensor, add: bool) -> Result<Tensor>;

    /// Rows `row0 .. row0 + count` of `x [rows, ..]` (f32 or f16) as a new tensor of its type.
    fn take_rows(&self, x: &Tensor, row0: usize, count: usize) -> Result<Tensor>;

    /// Waits for all queued work.
    fn synchronize(&self) -> Result<()>;

    /// Device memory accounting.
    fn memory_stats(&self) -> MemoryStats {
        MemoryStats::default()
    }

    /// Bounds the device memory this backend's pool may hold (`None`: the device's size); an
    /// allocation past it fails with [`Error::OutOfMemory`]. The CPU backend holds no device
    /// memory and ignores it.
    fn set_memory_cap(&self, _cap: Option<usize>) -> Result<()> {
        Ok(())
    }

    /// The bound [`Backend::set_memory_cap`] set.
    fn memory_cap(&self) -> Option<usize> {
        None
    }

    /// `(free, total)` bytes of the device's memory as the driver reports them; `None` on the CPU.
    fn device_memory(&self) -> Option<(usize, usize)> {
        None
    }

    /// The bytes an allocation of `bytes` takes (a pool rounds requests up to its blocks).
    fn alloc_size(&self, bytes: usize) -> usize {
        bytes
    }

    /// The bytes a weight of `bytes` takes: allocated while [`Backend::set_weight_loading`] is
    /// on, which may round less than [`Backend::alloc_size`] (weights live as long as the model).
    fn weight_alloc_size(&self, bytes: usize) -> usize {
        self.alloc_size(bytes)
    }

    /// On while a model's weights load: allocations are sized exactly, not rounded to the
    /// pool's reuse buckets (a 2B model's weights take ~150 MB less on the GPU).
    fn set_weight_loading(&self, _on: bool) {}

    /// Test aid: when on, every new output buffer is filled with NaN before the op writes it,
    /// so an element an op fails to write shows up as NaN.
    fn set_poison_outputs(&self, on: bool);

    /// How the GEMMs round activations ([`Precision`]): f32 unless [`Backend::set_precision`]
    /// chose otherwise on a backend that has a 16-bit path (the CPU always computes in f32).
    fn precision(&self) -> Precision {
        Precision::F32
    }

    /// Asks for `precision` in later GEMMs; a backend without a 16-bit-activation path keeps
    /// f32 (see [`Backend::precision`]). Recordings made before keep the kernels they hold.
    fn set_precision(&self, _precision: Precision) {}

    /// The KV-cache element type when the user does not choose one: f32 on the CPU; a device
    /// may prefer f16 (half the attention bytes).
    fn default_kv_dtype(&self) -> DType {
        DType::F32
    }

    // ---- fused ops: each default body composes the primitives above (the CPU path and the
    // ---- test oracle); a device backend overrides it with fewer, larger kernels.

    /// Embedding rows for the token ids in the u32 tensor `ids [rows]` (ids produced on the
    /// device, e.g. by [`Backend::sample_step`]).
    fn embedding_gather(&self, table: &Tensor, ids: &Tensor) -> Result<Tensor> {
        ops::expect_dtype("embedding_gather", ids, DType::U32)?;
        self.embedding(table, &self.download_u32(ids)?)
    }

    /// `out[r] = Σ_j weights[r · per_row + j] · table[ids[r · per_row + j]]`, `j` in order, for
    /// the f32 `table [vocab, width]`: `[ids.len() / per_row, width]` rows blended from the table
    /// (the vision tower's bilinearly interpolated position embeddings: four corners a row).
    fn blend_rows(&self, table: &Tensor, ids: &[u32], weights: &[f32], per_row: usize) -> Result<Tensor> {
        let (rows, width) = ops::blend_rows_dims(table, ids, weights, per_row)?;
        let picked = self.download_f32(&self.embedding(table, ids)?)?; // [rows · per_row, width]
        let mut out = vec![0.0f32; rows * width];
        for (o, (p, w)) in out.chunks_mut(width.max(1)).zip(picked.chunks(per_row * width.max(1)).zip(weights.chunks(per_row))) {
            for (src, &wt) in p.chunks(width.max(1)).zip(w) {
                for (x, &v) in o.iter_mut().zip(src) {
                    *x += v * wt;
                }
            }
        }
        self.upload_f32(&[rows, width], &out)
    }

    /// `residual + a · wᵀ (+ bias)`: a linear layer with the residual add in its epilogue.
    fn linear_residual(&self, a: &Tensor, w: &Tensor, bias: Option<&Tensor>, residual: &Tensor) -> Result<Tensor> {
        self.add(residual, &self.linear(a, w, bias)?)
    }

    /// `gelu(a · wᵀ + bias)`: a linear layer with the GELU in its epilogue (the vision MLP).
    fn linear_gelu(&self, a: &Tensor, w: &Tensor, bias: Option<&Tensor>, kind: Gelu) -> Result<Tensor> {
        self.gelu(&self.linear(a, w, bias)?, kind)
    }

    /// `silu(x · gateᵀ) ⊙ (x · upᵀ)`: the SwiGLU MLP's first half.
    fn gate_up_silu(&self, x: &Tensor, gate: &Tensor, up: &Tensor) -> Result<Tensor> {
        self.silu_mul(&self.linear(x, gate, None)?, &self.linear(x, up, None)?)
    }

    /// `rms_norm(x, norm, eps) · wᵀ (+ bias)`: a linear layer of RMS-normed inputs.
    fn rms_norm_linear(&self, x: &Tensor, norm: &Tensor, eps: f32, w: &Tensor, bias: Option<&Tensor>) -> Result<Tensor> {
        self.linear(&self.rms_norm(x, norm, eps)?, w, bias)
    }

    /// [`Backend::gate_up_silu`] of `rms_norm(x, norm, eps)`.
    fn rms_norm_gate_up_silu(&self, x: &Tensor, norm: &Tensor, eps: f32, gate: &Tensor, up: &Tensor) -> Result<Tensor> {
        self.gate_up_silu(&self.rms_norm(x, norm, eps)?, gate, up)
    }

    /// `layer_norm(x, w, b, eps)` through each of `linears` (weight, bias, and a GELU for
    /// [`Backend::linear_gelu`]): the vision tower's q, k and v of one normed input, and its
    /// MLP's first layer.
    fn layer_norm_linears(&self, x: &Tensor, norm: (&Tensor, &Tensor, f32), linears: &[(&Tensor, Option<&Tensor>, Option<Gelu>)]) -> Result<Vec<Tensor>> {
        layer_norm_linears_composite(self, x, norm, linears)
    }

    /// `x + down(silu(x' · gateᵀ) ⊙ (x' · upᵀ))` with `x' = rms_norm(x, norm, eps)`: the
    /// decoder's whole SwiGLU MLP with its residual.
    fn rms_norm_swiglu_residual(&self, x: &Tensor, norm: &Tensor, eps: f32, gate: &Tensor, up: &Tensor, down: &Tensor) -> Result<Tensor> {
        rms_norm_swiglu_residual_composite(self, x, norm, eps, gate, up, down)
    }

    /// `x + fc2(gelu(fc1(layer_norm(x))))`, each layer `(weight, bias)`: the vision tower's MLP
    /// with its residual.
    fn layer_norm_gelu_mlp(&self, x: &Tensor, norm: (&Tensor, &Tensor, f32), fc1: (&Tensor, Option<&Tensor>), kind: Gelu, fc2: (&Tensor, Option<&Tensor>)) -> Result<Tensor> {
        layer_norm_gelu_mlp_composite(self, x, norm, fc1, kind, fc2)
    }

    /// The decoder's step between the fused QKV projection and attention: splits
    /// `qkv [t, (heads + 2 kv_heads) · d]`, RMS-norms the q and k heads, rotates them with
    /// interleaved MRoPE at the positions of `cursor [t, 4]` (u32: t, h, w, cache row), writes
    /// keys and values into `k_cache`, `v_cache` `[cap, kv_heads, d]` at the cursor's cache rows
    /// (any rows: a paged cache's jump at block bounds), and returns the queries `[t, heads, d]`.
    /// With `scales` (`[cap, kv_heads, 2]`, see [`KV_SCALES`]) the rows are written scaled and
    /// their scales beside them.
    fn qkv_rope_append(&self, qkv: &Tensor, p: &QkvRope<'_>, cursor: &Tensor, k_cache: &mut Tensor, v_cache: &mut Tensor, mut scales: Option<&mut Tensor>) -> Result<Tensor> {
        let t = ops::qkv_rope_dims(qkv, p, cursor, k_cache, v_cache)?;
        ops::kv_scale_dims("qkv_rope_append", k_cache, scales.as_deref())?;
        let cur = self.download_u32(cursor)?;
        let (qd, kvd) = (p.heads * p.head_dim, p.kv_heads * p.head_dim);
        // 1. rotary tables for the cursor's positions: cos, sin [t, d / 2]
        let pos: Vec<Pos3> = cur.chunks(CURSOR_FIELDS).map(|r| [r[0], r[1], r[2]]).collect();
        let (cos, sin) = mrope_tables(&self.download_f32(p.inv_freq)?, &p.section, &pos);
        let half = p.head_dim / 2;
        let (cos, sin) = (self.upload_f32(&[t, half], &cos)?, self.upload_f32(&[t, half], &sin)?);
        // 2. q, k: per-head RMSNorm then rotation; v as is
        let q = self.narrow_cols(qkv, 0, qd)?.reshape(&[t, p.heads, p.head_dim])?;
        let k = self.narrow_cols(qkv, qd, kvd)?.reshape(&[t, p.kv_heads, p.head_dim])?;
        let v = self.narrow_cols(qkv, qd + kvd, kvd)?.reshape(&[t, p.kv_heads, p.head_dim])?;
        let q = self.rope(&self.rms_norm(&q, p.q_norm, p.eps)?, &cos, &sin)?;
        let k = self.rope(&self.rms_norm(&k, p.k_norm, p.eps)?, &cos, &sin)?;
        // 3. append to the cache, one write per run of consecutive cache rows (a paged cache's
        //    rows jump at block bounds)
        let rows: Vec<usize> = cur.chunks(CURSOR_FIELDS).map(|r| r[CURSOR_ROW] as usize).collect();
        let mut i0 = 0;
        while i0 < t {
            let mut i1 = i0 + 1;
            while i1 < t && rows[i1] == rows[i1 - 1] + 1 {
                i1 += 1;
            }
            let (kr, vr) = if i0 == 0 && i1 == t { (k.clone(), v.clone()) } else { (self.take_rows(&k, i0, i1 - i0)?, self.take_rows(&v, i0, i1 - i0)?) };
            self.write_kv_rows(k_cache, scales.as_deref_mut().map(|s| (s, 0)), rows[i0], &kr)?;
            self.write_kv_rows(v_cache, scales.as_deref_mut().map(|s| (s, 1)), rows[i0], &vr)?;
            i0 = i1;
        }
        Ok(q)
    }

    /// Causal attention of `q [t, heads, d]` against the KV cache: query row `i` sees the keys
    /// `0 ..= cursor[i].row` (rows of `cursor [t, 4]` consecutive).
    /// `scales`: the cache's row scales ([`KV_SCALES`]) or `None`.
    fn attention_cached(&self, q: &Tensor, k_cache: &Tensor, v_cache: &Tensor, scales: Option<&Tensor>, cursor: &Tensor, scale: f32) -> Result<Tensor> {
        ops::cursor_dims("attention_cached", cursor, q.shape().first().copied().unwrap_or(0))?;
        let cur = self.download_u32(cursor)?;
        ops::cursor_rows_consecutive("attention_cached", &cur)?;
        let t = cur.len() / CURSOR_FIELDS;
        let row0 = if t == 0 { 0 } else { cur[CURSOR_ROW] as usize };
        self.attention_scaled(q, k_cache, v_cache, scales, AttnParams { kv_len: row0 + t, q_pos0: row0, causal: true, scale })
    }

    /// Attention for a batched decode step: `q [t, heads, d]`, each row a sequence of its own,
    /// row `i` seeing keys `0 .. pages.len(i)` of the paged caches `k_pool`, `v_pool`
    /// `[slots, kv_heads, d]` (f32 or f16) through its block table (`pages` made for this
    /// backend), rows times their `scales` ([`KV_SCALES`]) when given. Returns `[t, heads, d]`.
    fn attention_paged(&self, q: &Tensor, k_pool: &Tensor, v_pool: &Tensor, scales: Option<&Tensor>, pages: &Pages, scale: f32) -> Result<Tensor> {
        attention_paged_composite(self, q, k_pool, v_pool, scales, pages, scale)
    }

    /// [`Backend::attention_scaled`] over keys where a paged cache holds them: key `j` is row
    /// `slots[j]` of `k_pool`, `v_pool` `[cap, kv_heads, d]` (and of `scales`), `slots` a u32
    /// `[p.kv_len]` on this backend (a prefill chunk's sequence: its earlier keys, then its own).
    /// The default gathers them with [`Backend::embedding_gather`] (a slot past the pool is
    /// refused on the host, a NaN row on a device), which widens f16 rows to f32; a device
    /// gathers an f16 cache's rows as stored.
    fn attention_slots(&self, q: &Tensor, k_pool: &Tensor, v_pool: &Tensor, scales: Option<&Tensor>, slots: &Tensor, p: AttnParams) -> Result<Tensor> {
        attention_slots_composite(self, q, k_pool, v_pool, scales, slots, p)
    }

    /// A step's prefill chunks in one op (`chunks` made for this backend): `q [chunks.rows(),
    /// heads, d]`, the rows of chunk `c` (from `chunks.part(c).0`) attending causally to their
    /// sequence's keys at its slots as [`Backend::attention_slots`] does (`q_pos0` = keys − rows).
    /// Returns `[chunks.rows(), heads, d]`. The default runs one `attention_slots` per chunk.
    fn attention_chunks(&self, q: &Tensor, k_pool: &Tensor, v_pool: &Tensor, scales: Option<&Tensor>, chunks: &crate::chunks::Chunks, scale: f32) -> Result<Tensor> {
        crate::chunks::attention_chunks_composite(self, q, k_pool, v_pool, scales, chunks, scale)
    }

    /// Block-sparse attention (non-causal): `q [t, heads, d]` against `k`, `v`
    /// `[kv_len, kv_heads, d]` (f32 or f16), query row `i` seeing key `j` when `mask` lets the
    /// block of `i` see the block of `j` (`mask` made for this backend, `mask.rows() == t`,
    /// `mask.keys() == kv_len`); a row that sees no key gets zeros. With `rope = Some((cos,
    /// sin))`, `[t, d / 2]` f32 tables, q and k (f32, `t == kv_len`) are rotated first
    /// (rotate-half, as [`Backend::rope`]): the vision tower's 2-D rotary embedding, which a
    /// device applies as it loads them. Returns `[t, heads, d]`.
    fn attention_block_sparse(&self, q: &Tensor, k: &Tensor, v: &Tensor, mask: &BlockMask, scale: f32, rope: Option<(&Tensor, &Tensor)>) -> Result<Tensor> {
        attention_block_sparse_composite(self, q, k, v, mask, scale, rope)
    }

    /// Picks the next token of each row of `logits [rows, vocab]` as `s` says, among the ids
    /// `0..n` (`n <= vocab`: the columns past `n`, such as the padding rows of an LM head
    /// larger than the tokenizer, are never picked), writes the ids to `ids [rows]` (u32) and
    /// advances every field of `cursor [rows, 4]` by one: the end of a decode step, so the next
    /// step's inputs are already in place.
    ///
    /// `mask`: `None`, or `[rows, ceil(n / 32)]` u32, bit `t % 32` of word `t / 32` of a row set
    /// when that row may pick id `t` (a grammar's allowed next tokens; a row free of constraints
    /// all ones). The ids it clears rank as negative infinity: never picked, greedy the first
    /// maximum among the allowed, sampling over the allowed among the top-k (a row with fewer
    /// allowed than `top_k` samples among those alone).
    fn sample_step(&self, logits: &Tensor, s: &DeviceSampling, n: usize, mask: Option<&Tensor>, ids: &mut Tensor, cursor: &mut Tensor) -> Result<()> {
        let (rows, vocab, n) = ops::sample_dims(logits, s, n, ids, cursor, self.max_device_top_k())?;
        if let Some(m) = mask {
            ops::sample_mask_dims("sample_step", m, rows, n)?;
        }
        pick_rows_on_host(self, logits, (vocab, n), mask, ids, cursor, &|_| Ok(*s))
    }

    /// [`Backend::sample_step`] with each row's own settings: `settings [rows, WORDS]` u32
    /// ([`DeviceSampling::row_words`]; `gpu::params::sample_row`), every row's candidates at
    /// most `max_k` (the rows of a batch that sample differently, in one step).
    #[allow(clippy::too_many_arguments)]
    fn sample_step_rows(&self, logits: &Tensor, settings: &Tensor, max_k: usize, n: usize, mask: Option<&Tensor>, ids: &mut Tensor, cursor: &mut Tensor) -> Result<()> {
        let (rows, vocab, n) = ops::sample_rows_dims(logits, settings, max_k, n, ids, cursor, self.max_device_top_k())?;
        if let Some(m) = mask {
            ops::sample_mask_dims("sample_step_rows", m, rows, n)?;
        }
        let words = self.download_u32(settings)?;
        pick_rows_on_host(self, logits, (vocab, n), mask, ids, cursor, &|r| {
            let s = DeviceSampling::from_row_words(&words[r * sample_row::WORDS..(r + 1) * sample_row::WORDS]);
            ops::sampling_fits("sample_step_rows", &s, n, max_k).map(|_| s)
        })
    }

    /// The largest `top_k` [`Backend::sample_step`] takes.
    fn max_device_top_k(&self) -> usize {
        gpu::params::sample_tile::MAX_K
    }

    // ---- recorded work and timing

    /// Runs `f`, a whole step of ops on this backend, where the backend's ops run best. Every
    /// backend now runs it on the calling thread (the CPU with its pool installed for the whole
    /// step: the calling thread takes part in each op's parallel work, and the pool's workers
    /// keep polling between ops instead of sleeping); the hook stays for backends that need a
    /// thread or context of their own.
    fn within(&self, f: &mut dyn FnMut() -> Result<()>) -> Result<()> {
        f()
    }

    /// Records the device work `f` launches, without running it, so [`Backend::replay`] can run
    /// it again with no host work: `f` must only launch work whose inputs live in tensors that
    /// outlive the recording (what it reads changes between replays through those tensors, as
    /// the decode cursor does). `Ok(None)`: this backend does not record (the CPU), or recording
    /// failed (the backend logs why); the caller then runs `f` itself each time.
    fn record(&self, _f: &mut dyn FnMut() -> Result<()>) -> Result<Option<Recording>> {
        Ok(None)
    }

    /// Whether [`Backend::record`] makes recordings here (it may still fail and say why).
    fn records(&self) -> bool {
        false
    }

    /// Runs a [`Recording`] made by this backend.
    fn replay(&self, _r: &Recording) -> Result<()> {
        Err(Error::Device { op: "replay", msg: "this backend records nothing to replay".into() })
    }

    /// Starts (`true`) or stops a profiler's capture after the work queued so far (CUDA:
    /// `cuProfilerStart` / `cuProfilerStop`, for `ncu --profile-from-start off`); a no-op on
    /// backends without one.
    fn profiler(&self, _on: bool) -> Result<()> {
        Ok(())
    }

    /// A point in this backend's timeline (after the work queued so far).
    fn mark(&self) -> Result<Mark> {
        Ok(Mark { host: std::time::Instant::now(), device: None })
    }

    /// Seconds from `a` to `b` (waits for `b`): device time where the marks carry events.
    fn seconds_between(&self, a: &Mark, b: &Mark) -> Result<f64> {
        self.synchronize()?;
        Ok(b.host.duration_since(a.host).as_secs_f64())
    }
}
