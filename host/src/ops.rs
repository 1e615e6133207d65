//! Shape and dtype rules of every op, checked once here and by both backends before any work.

use crate::{DType, Error, Result, Tensor};
use crate::pick::DeviceSampling;
use gpu::params::{CURSOR_FIELDS, CURSOR_ROW};

/// How queries see keys in [`crate::Backend::attention`].
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

/// The shape of a decoder layer's fused QKV step ([`crate::Backend::qkv_rope_append`]).
#[derive(Clone, Copy)]
pub struct QkvRope<'a> {
    pub heads: usize,
    pub kv_heads: usize,
    pub head_dim: usize,
    /// `[head_dim]` f32 RMSNorm weights of the q and k heads.
    pub q_norm: &'a Tensor,
    pub k_norm: &'a Tensor,
    pub eps: f32,
    /// `[head_dim / 2]` f32 rotary inverse frequencies, on the backend.
    pub inv_freq: &'a Tensor,
    /// Interleaved MRoPE sections (t, h, w).
    pub section: [usize; 3],
}

/// `(m, n, k)` of a linear layer, after checking `a [.., k]` f32, `w [n, k]`, `bias [n]` f32.
pub fn linear_dims(a: &Tensor, w: &Tensor, bias: Option<&Tensor>) -> Result<(usize, usize, usize)> {
    const OP: &str = "linear";
    expect_f32(OP, a)?;
    expect_weight(OP, w)?;
    if w.shape().len() != 2 {
        return Err(Error::shape(OP, &[a.shape(), w.shape()], "weight must be 2-D [out, in]"));
    }
    let (m, k) = a.rows_cols();
    let (n, wk) = (w.shape()[0], w.shape()[1]);
    if a.shape().is_empty() || wk != k {
        return Err(Error::shape(OP, &[a.shape(), w.shape()], format!("input has {} features, weight expects {}", k, wk)));
    }
    if let Some(b) = bias {
        expect_f32(OP, b)?;
        if b.shape() != [n] {
            return Err(Error::shape(OP, &[w.shape(), b.shape()], format!("bias must be [{}]", n)));
        }
    }
    Ok((m, n, k))
}

/// The output shape of a linear layer: `a`'s leading axes then `n`.
pub fn linear_out_shape(a: &Tensor, n: usize) -> Vec<usize> {
    let mut s = a.shape().to_vec();
    if let Some(last) = s.last_mut() {
        *last = n;
    }
    s
}

/// `(rows, cols)` of an RMSNorm, after checking `x [.., cols]` f32 and `w [cols]` f32.
pub fn rms_norm_dims(x: &Tensor, w: &Tensor) -> Result<(usize, usize)> {
    const OP: &str = "rms_norm";
    expect_f32(OP, x)?;
    expect_f32(OP, w)?;
    let (rows, cols) = x.rows_cols();
    if w.shape() != [cols] {
        return Err(Error::shape(OP, &[x.shape(), w.shape()], format!("weight must be [{}]", cols)));
    }
    Ok((rows, cols))
}

/// `(rows, cols)` of a LayerNorm, after checking `x [.., cols]`, `w`, `b` `[cols]`, all f32.
pub fn layer_norm_dims(x: &Tensor, w: &Tensor, b: &Tensor) -> Result<(usize, usize)> {
    const OP: &str = "layer_norm";
    for t in [x, w, b] {
        expect_f32(OP, t)?;
    }
    let (rows, cols) = x.rows_cols();
    if w.shape() != [cols] || b.shape() != [cols] {
        return Err(Error::shape(OP, &[x.shape(), w.shape(), b.shape()], format!("weight and bias must be [{}]", cols)));
    }
    Ok((rows, cols))
}

/// `(rows, cols)` of a row softmax of f32 `x`.
pub fn softmax_dims(x: &Tensor) -> Result<(usize, usize)> {
    expect_f32("softmax", x)?;
    Ok(x.rows_cols())
}

/// Element count of `silu(gate) * up`, after checking both are f32 of one shape.
pub fn silu_mul_len(gate: &Tensor, up: &Tensor) -> Result<usize> {
    const OP: &str = "silu_mul";
    expect_f32(OP, gate)?;
    expect_f32(OP, up)?;
    if gate.shape() != up.shape() {
        return Err(Error::shape(OP, &[gate.shape(), up.shape()], "gate and up must have one shape"));
    }
    Ok(gate.elem_count())
}

/// Checks that `t` has dtype `want`.
pub fn expect_dtype(op: &'static str, t: &Tensor, want: DType) -> Result<()> {
    if t.dtype() != want {
        return Err(Error::DType { op, expected: want.name(), got: t.dtype() });
    }
    Ok(())
}

/// `(rows, cols)` of [`crate::Backend::write_u32_cols`]'s `dst`, after checking it is 2-D u32,
/// `width ≤ cols` and `data` holds `rows · width` elements.
pub fn u32_cols_dims(op: &'static str, dst: &Tensor, data: &[u32], width: usize) -> Result<(usize, usize)> {
    expect_dtype(op, dst, DType::U32)?;
    let s = dst.shape();
    if s.len() != 2 || width > s[1] || data.len() != s[0] * width {
        return Err(Error::shape(op, &[s], format!("{} elements for the first {} columns", data.len(), width)));
    }
    Ok((s[0], s[1]))
}

/// Copies `data` (`[rows, width]`) over the first `width` columns of `dst` (`[rows, cols]`),
/// the other columns kept: [`crate::Backend::write_u32_cols`] on host memory.
pub fn write_cols(dst: &mut [u32], cols: usize, data: &[u32], width: usize) {
    for (r, row) in data.chunks_exact(width.max(1)).enumerate() {
        dst[r * cols..r * cols + width].copy_from_slice(row);
    }
}

/// Checks a KV pair: f32 or f16 elements, the same for both.
pub fn expect_kv(op: &'static str, k: &Tensor, v: &Tensor) -> Result<()> {
    if k.dtype() != DType::F32 && k.dtype() != DType::F16 {
        return Err(Error::DType { op, expected: "f32 or f16 keys and values", got: k.dtype() });
    }
    expect_dtype(op, v, k.dtype())
}

/// Checks that `w` is a weight matrix type (f32, f16 or bf16).
pub fn expect_weight(op: &'static str, w: &Tensor) -> Result<()> {
    if !w.dtype().is_float() {
        return Err(Error::DType { op, expected: "f32, f16 or bf16 weights", got: w.dtype() });
    }
    Ok(())
}

/// Checks a decode cursor: `[rows, CURSOR_FIELDS]` u32.
pub fn cursor_dims(op: &'static str, cursor: &Tensor, rows: usize) -> Result<()> {
    expect_dtype(op, cursor, DType::U32)?;
    if cursor.shape() != [rows, CURSOR_FIELDS] {
        return Err(Error::shape(op, &[cursor.shape()], format!("the cursor must be [{}, {}] (t, h, w, cache row per row)", rows, CURSOR_FIELDS)));
    }
    Ok(())
}

/// Checks that a downloaded cursor's cache rows are consecutive (what the composite paths,
/// which write and attend by row ranges, assume).
pub fn cursor_rows_consecutive(op: &'static str, cur: &[u32]) -> Result<()> {
    let rows: Vec<u32> = cur.chunks(CURSOR_FIELDS).map(|r| r[CURSOR_ROW]).collect();
    if rows.windows(2).any(|w| w[1] != w[0] + 1) {
        return Err(Error::Limit { op, msg: format!("cursor cache rows {:?} are not consecutive", rows) });
    }
    Ok(())
}

/// `t` of [`crate::Backend::qkv_rope_append`], after checking
/// `qkv [t, (heads + 2 kv_heads) · d]` f32, the norms `[d]` and frequencies `[d / 2]` f32, the
/// cursor `[t, 4]` u32 and the caches `[cap, kv_heads, d]`.
pub fn qkv_rope_dims(qkv: &Tensor, p: &QkvRope<'_>, cursor: &Tensor, k: &Tensor, v: &Tensor) -> Result<usize> {
    const OP: &str = "qkv_rope_append";
    expect_f32(OP, qkv)?;
    let (t, width) = qkv.rows_cols();
    let d = p.head_dim;
    if d == 0 || d % 2 != 0 || p.kv_heads == 0 || p.heads % p.kv_heads != 0 || width != (p.heads + 2 * p.kv_heads) * d {
        return Err(Error::shape(OP, &[qkv.shape()], format!("qkv must be [t, ({} + 2·{}) · {}] with an even head_dim", p.heads, p.kv_heads, d)));
    }
    for w in [p.q_norm, p.k_norm] {
        expect_f32(OP, w)?;
        if w.shape() != [d] {
            return Err(Error::shape(OP, &[w.shape()], format!("q/k norm weights must be [{}]", d)));
        }
    }
    expect_f32(OP, p.inv_freq)?;
    if p.inv_freq.shape() != [d / 2] {
        return Err(Error::shape(OP, &[p.inv_freq.shape()], format!("inv_freq must be [{}]", d / 2)));
    }
    cursor_dims(OP, cursor, t)?;
    expect_kv(OP, k, v)?;
    if k.shape() != v.shape() || k.shape().len() != 3 || k.shape()[1..] != [p.kv_heads, d] {
        return Err(Error::shape(OP, &[k.shape(), v.shape()], format!("caches must be [cap, {}, {}]", p.kv_heads, d)));
    }
    Ok(t)
}

/// `(rows, vocab, n)` of [`crate::Backend::sample_step`], after checking `logits [rows, vocab]`
/// f32, the candidate count `n` (`1..=vocab`), `ids [rows]` and `cursor [rows, 4]` u32, and
/// the settings.
pub fn sample_dims(logits: &Tensor, s: &DeviceSampling, n: usize, ids: &Tensor, cursor: &Tensor, max_k: usize) -> Result<(usize, usize, usize)> {
    const OP: &str = "sample_step";
    expect_f32(OP, logits)?;
    let (rows, vocab) = logits.rows_cols();
    expect_dtype(OP, ids, DType::U32)?;
    if ids.shape() != [rows] || vocab == 0 {
        return Err(Error::shape(OP, &[logits.shape(), ids.shape()], format!("ids must be [{}] and the vocabulary non-empty", rows)));
    }
    if n == 0 || n > vocab {
        return Err(Error::Limit { op: OP, msg: format!("{} candidate ids in rows of {} logits (1..={})", n, vocab, vocab) });
    }
    cursor_dims(OP, cursor, rows)?;
    sampling_fits(OP, s, n, max_k)?;
    Ok((rows, vocab, n))
}

/// Checks a sampling mask of [`crate::Backend::sample_step`]: u32 `[rows, ceil(n / 32)]`, one
/// bit per candidate id.
pub fn sample_mask_dims(op: &'static str, mask: &Tensor, rows: usize, n: usize) -> Result<()> {
    expect_dtype(op, mask, DType::U32)?;
    let words = crate::pick::mask_words(n);
    if mask.shape() != [rows, words] {
        return Err(Error::shape(op, &[mask.shape()], format!("the mask must be [{}, {}]: {} rows of one bit per id of {}", rows, words, rows, n)));
    }
    Ok(())
}

/// Whether the device samples with `s` among `n` candidates, keeping at most `max_k`.
pub fn sampling_fits(op: &'static str, s: &DeviceSampling, n: usize, max_k: usize) -> Result<()> {
    if !s.is_greedy() && (s.top_k == 0 || s.top_k > max_k.min(n) || !(s.top_p > 0.0 && s.top_p <= 1.0)) {
        return Err(Error::Limit { op, msg: format!("top_k {} (1..={}) / top_p {} (0, 1] cannot be sampled on the device", s.top_k, max_k.min(n), s.top_p) });
    }
    Ok(())
}

/// The rows of [`crate::Backend::sample_step_rows`], after checking its settings' shape and
/// `max_k` (each row's own settings are checked as it is picked).
pub fn sample_rows_dims(logits: &Tensor, settings: &Tensor, max_k: usize, n: usize, ids: &Tensor, cursor: &Tensor, device_max_k: usize) -> Result<(usize, usize, usize)> {
    const OP: &str = "sample_step_rows";
    let (rows, vocab, n) = sample_dims(logits, &DeviceSampling::greedy(), n, ids, cursor, device_max_k)?;
    expect_dtype(OP, settings, DType::U32)?;
    if settings.shape() != [rows, gpu::params::sample_row::WORDS] {
        return Err(Error::shape(OP, &[logits.shape(), settings.shape()], format!("settings must be [{}, {}]", rows, gpu::params::sample_row::WORDS)));
    }
    if max_k == 0 || max_k > device_max_k.min(n) {
        return Err(Error::Limit { op: OP, msg: format!("max top_k {} (1..={})", max_k, device_max_k.min(n)) });
    }
    Ok((rows, vocab, n))
}

/// `(rows, cols)` of [`crate::Backend::narrow_cols`], after checking the f32 matrix and range.
pub fn narrow_cols_dims(x: &Tensor, col0: usize, width: usize) -> Result<(usize, usize)> {
    expect_f32("narrow_cols", x)?;
    let (rows, cols) = x.rows_cols();
    if x.shape().is_empty() || col0 + width > cols {
        return Err(Error::shape("narrow_cols", &[x.shape()], format!("columns {}..{} out of range", col0, col0 + width)));
    }
    Ok((rows, cols))
}

pub fn expect_f32(op: &'static str, t: &Tensor) -> Result<()> {
    if t.dtype() != DType::F32 {
        return Err(Error::DType { op, expected: "f32", got: t.dtype() });
    }
    Ok(())
}

/// `(rows, width)` of [`crate::Backend::blend_rows`], after checking the f32 `table [vocab,
/// width]`, `ids` and `weights` of one length, a whole number of rows of `per_row` (at least 1)
/// entries, and every id `< vocab`.
pub fn blend_rows_dims(table: &Tensor, ids: &[u32], weights: &[f32], per_row: usize) -> Result<(usize, usize)> {
    const OP: &str = "blend_rows";
    expect_f32(OP, table)?;
    if table.shape().len() != 2 {
        return Err(Error::shape(OP, &[table.shape()], "table must be [vocab, width]"));
    }
    let (vocab, width) = (table.shape()[0], table.shape()[1]);
    if per_row == 0 || ids.len() != weights.len() || ids.len() % per_row != 0 {
        return Err(Error::Limit { op: OP, msg: format!("{} ids and {} weights are not rows of {} entries", ids.len(), weights.len(), per_row) });
    }
    if let Some(&bad) = ids.iter().find(|&&i| i as usize >= vocab) {
        return Err(Error::Limit { op: OP, msg: format!("id {} is outside the {} rows of the table", bad, vocab) });
    }
    Ok((ids.len() / per_row, width))
}

/// `(rows, hidden)` of an embedding lookup, after checking `table [vocab, hidden]` and the ids.
pub fn embedding_dims(table: &Tensor, ids: &[u32]) -> Result<(usize, usize)> {
    const OP: &str = "embedding";
    expect_weight(OP, table)?;
    if table.shape().len() != 2 {
        return Err(Error::shape(OP, &[table.shape()], "table must be [vocab, hidden]"));
    }
    let (vocab, hidden) = (table.shape()[0], table.shape()[1]);
    if let Some(&bad) = ids.iter().find(|&&i| i as usize >= vocab) {
        return Err(Error::Limit { op: OP, msg: format!("token id {} is outside the vocabulary of {}", bad, vocab) });
    }
    Ok((ids.len(), hidden))
}

/// Element count of `a + b`, after checking both are f32 of one shape.
pub fn add_len(a: &Tensor, b: &Tensor) -> Result<usize> {
    expect_f32("add", a)?;
    expect_f32("add", b)?;
    if a.shape() != b.shape() {
        return Err(Error::shape("add", &[a.shape(), b.shape()], "operands must have one shape"));
    }
    Ok(a.elem_count())
}

/// `(rows, heads, head_dim)` of a rotary embedding, after checking `x [rows, heads, head_dim]`
/// with an even head_dim and `cos`, `sin` of `[rows, head_dim / 2]`, all f32.
pub fn rope_dims(x: &Tensor, cos: &Tensor, sin: &Tensor) -> Result<(usize, usize, usize)> {
    const OP: &str = "rope";
    for t in [x, cos, sin] {
        expect_f32(OP, t)?;
    }
    if x.shape().len() != 3 || x.shape()[2] % 2 != 0 {
        return Err(Error::shape(OP, &[x.shape()], "x must be [rows, heads, even head_dim]"));
    }
    let (rows, heads, d) = (x.shape()[0], x.shape()[1], x.shape()[2]);
    if cos.shape() != [rows, d / 2] || sin.shape() != [rows, d / 2] {
        return Err(Error::shape(OP, &[x.shape(), cos.shape(), sin.shape()], format!("cos and sin must be [{}, {}]", rows, d / 2)));
    }
    Ok((rows, heads, d))
}

/// Shapes of an attention call: `(t, heads, kv_heads, head_dim)`, after checking
/// `q [t, heads, d]`, `k`, `v` `[cap, kv_heads, d]` with `kv_heads` dividing `heads`,
/// `kv_len <= cap`, and (when causal) the last query's position inside the keys.
pub fn attention_dims(q: &Tensor, k: &Tensor, v: &Tensor, p: &AttnParams) -> Result<(usize, usize, usize, usize)> {
    const OP: &str = "attention";
    expect_f32(OP, q)?;
    expect_kv(OP, k, v)?;
    for t in [q, k, v] {
        if t.shape().len() != 3 {
            return Err(Error::shape(OP, &[q.shape(), k.shape(), v.shape()], "q, k, v must be 3-D [rows, heads, head_dim]"));
        }
    }
    let (t, heads, d) = (q.shape()[0], q.shape()[1], q.shape()[2]);
    let (cap, kvh) = (k.shape()[0], k.shape()[1]);
    if k.shape() != v.shape() || k.shape()[2] != d || kvh == 0 || heads % kvh != 0 {
        return Err(Error::shape(OP, &[q.shape(), k.shape(), v.shape()], "k and v must be [cap, kv_heads, head_dim] with kv_heads dividing heads"));
    }
    if p.kv_len > cap {
        return Err(Error::Limit { op: OP, msg: format!("kv_len {} exceeds the cache capacity {}", p.kv_len, cap) });
    }
    if p.causal && t > 0 && p.q_pos0 + t > p.kv_len {
        return Err(Error::Limit { op: OP, msg: format!("queries reach position {} but only {} keys are valid", p.q_pos0 + t, p.kv_len) });
    }
    Ok((t, heads, kvh, d))
}

/// Checks [`crate::Backend::attention_slots`]: [`attention_dims`] of `q` against the caches
/// `k`, `v`, and `slots` a u32 `[kv_len]`.
pub fn attention_slots_dims(q: &Tensor, k: &Tensor, v: &Tensor, slots: &Tensor, p: &AttnParams) -> Result<(usize, usize, usize, usize)> {
    const OP: &str = "attention_slots";
    expect_dtype(OP, slots, DType::U32)?;
    if slots.shape() != [p.kv_len] {
        return Err(Error::shape(OP, &[slots.shape()], format!("slots must be [kv_len] = [{}]", p.kv_len)));
    }
    attention_dims(q, k, v, p)
}

/// Checks the row scales of f32 or f16 keys and values `k [cap, kv_heads, d]`: `[cap, kv_heads,
/// 2]` f32 (see [`crate::backend::KV_SCALES`]).
pub fn kv_scale_dims(op: &'static str, k: &Tensor, scales: Option<&Tensor>) -> Result<()> {
    let sc = match scales {
        Some(sc) => sc,
        None => return Ok(()),
    };
    expect_f32(op, sc)?;
    let ks = k.shape();
    if ks.len() != 3 || sc.shape() != [ks[0], ks[1], 2] {
        return Err(Error::shape(op, &[ks, sc.shape()], "row scales must be [rows, kv_heads, 2] for keys [rows, kv_heads, d]"));
    }
    Ok(())
}

/// `(t, heads, kv_heads, d)` of [`crate::Backend::attention_block_sparse`], after checking q
/// (f32 `[t, heads, d]`), k and v (`[kv_len, kv_heads, d]`, f32 or f16, kv_heads dividing heads),
/// the block mask's extent (`t` rows, `kv_len` keys) and the rotary tables (`[t, d / 2]` f32, d even,
/// f32 keys and `t == kv_len`).
pub fn block_sparse_dims(q: &Tensor, k: &Tensor, v: &Tensor, (mask_rows, mask_keys): (usize, usize), rope: Option<(&Tensor, &Tensor)>) -> Result<(usize, usize, usize, usize)> {
    const OP: &str = "attention_block_sparse";
    let kv_len = k.shape().first().copied().unwrap_or(0);
    let p = AttnParams { kv_len, q_pos0: 0, causal: false, scale: 1.0 };
    let (t, heads, kvh, d) = attention_dims(q, k, v, &p).map_err(|e| match e {
        Error::Shape { msg, shapes, .. } => Error::Shape { op: OP, msg, shapes },
        other => other,
    })?;
    if mask_rows != t || mask_keys != kv_len {
        return Err(Error::shape(OP, &[q.shape(), k.shape()], format!("the mask covers {} rows and {} keys", mask_rows, mask_keys)));
    }
    if let Some((cos, sin)) = rope {
        expect_f32(OP, cos)?;
        expect_f32(OP, sin)?;
        expect_f32(OP, k)?;
        if d % 2 != 0 || t != kv_len || cos.shape() != [t, d / 2] || sin.shape() != [t, d / 2] {
            return Err(Error::shape(OP, &[q.shape(), k.shape(), cos.shape(), sin.shape()], "rotary tables must be [t, d / 2] with as many keys as queries"));
        }
    }
    Ok((t, heads, kvh, d))
}

/// `(rows, row_len)` of `src` for [`crate::Backend::write_rows`], after checking it fits `dst`
/// from `row0` on with equal trailing axes and one dtype.
pub fn write_rows_dims(dst: &Tensor, row0: usize, src: &Tensor) -> Result<(usize, usize)> {
    const OP: &str = "write_rows";
    expect_f32(OP, src)?;
    if dst.dtype() != DType::F32 && dst.dtype() != DType::F16 {
        return Err(Error::DType { op: OP, expected: "an f32 or f16 destination", got: dst.dtype() });
    }
    if dst.shape().is_empty() || src.shape().len() != dst.shape().len() || src.shape()[1..] != dst.shape()[1..] {
        return Err(Error::shape(OP, &[dst.shape(), src.shape()], "trailing axes must agree"));
    }
    let rows = src.shape()[0];
    if row0 + rows > dst.shape()[0] {
        return Err(Error::Limit { op: OP, msg: format!("rows {}..{} exceed the destination's {}", row0, row0 + rows, dst.shape()[0]) });
    }
    Ok((rows, src.elem_count() / rows.max(1)))
}

/// `(row_len, out_shape)` of [`crate::Backend::take_rows`], after checking the range.
pub fn take_rows_dims(x: &Tensor, row0: usize, count: usize) -> Result<(usize, Vec<usize>)> {
    if x.dtype() != DType::F32 && x.dtype() != DType::F16 {
        return Err(Error::DType { op: "take_rows", expected: "f32 or f16", got: x.dtype() });
    }
    if x.shape().is_empty() || row0 + count > x.shape()[0] {
        return Err(Error::shape("take_rows", &[x.shape()], format!("rows {}..{} out of range", row0, row0 + count)));
    }
    let mut shape = x.shape().to_vec();
    shape[0] = count;
    let row_len = x.shape()[1..].iter().product();
    Ok((row_len, shape))
}

/// `(n, width)` of a row scatter, after checking `x [n, width]`, `src [rows.len(), width]` (f32)
/// and that every row index is below `n`.
pub fn scatter_rows_dims(x: &Tensor, rows: &[usize], src: &Tensor) -> Result<(usize, usize)> {
    const OP: &str = "scatter_rows";
    expect_f32(OP, x)?;
    expect_f32(OP, src)?;
    let (n, width) = x.rows_cols();
    if src.rows_cols() != (rows.len(), width) {
        return Err(Error::shape(OP, &[x.shape(), src.shape()], format!("src must be [{}, {}]", rows.len(), width)));
    }
    if let Some(&bad) = rows.iter().find(|&&r| r >= n) {
        return Err(Error::Limit { op: OP, msg: format!("row {} is outside the {} rows of x", bad, n) });
    }
    Ok((n, width))
}

/// `(t, heads, kv_heads, d)` of [`crate::Backend::attention_paged`], after checking `q [t, heads,
/// d]` f32, the caches `[slots, kv_heads, d]` of one dtype (f32 or f16) with at least the rows
/// `pages` was made for, and one table row per query row.
pub fn paged_dims(q: &Tensor, k: &Tensor, v: &Tensor, pages: &crate::Pages) -> Result<(usize, usize, usize, usize)> {
    const OP: &str = "attention_paged";
    expect_f32(OP, q)?;
    if k.dtype() != v.dtype() || !matches!(k.dtype(), DType::F32 | DType::F16) {
        return Err(Error::DType { op: OP, expected: "f32 or f16 caches of one type", got: if k.dtype() == v.dtype() { k.dtype() } else { v.dtype() } });
    }
    let (qs, ks) = (q.shape(), k.shape());
    if qs.len() != 3 || ks.len() != 3 || v.shape() != ks || qs[2] != ks[2] || ks[1] == 0 || qs[1] % ks[1] != 0 || qs[0] != pages.rows() || ks[0] < pages.cache_rows() {
        return Err(Error::shape(OP, &[qs, ks, v.shape()], format!("q must be [t, heads, d] with t = {} table rows, k and v [slots >= {}, kv_heads, d] with heads a multiple of kv_heads", pages.rows(), pages.cache_rows())));
    }
    Ok((qs[0], qs[1], ks[1], qs[2]))
}
