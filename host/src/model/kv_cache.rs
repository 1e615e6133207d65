//! The per-layer key/value cache of the text decoder, on the backend's device: f32, or f16
//! (half the bytes attention reads per token; the kernels widen to f32 and accumulate in f32)
//! with row scales beside it, so that values beyond f16's range are kept
//! ([`crate::backend::KV_SCALES`]).

use crate::model::config::TextConfig;
use crate::{Backend, DType, Error, Result, Tensor};

pub struct KvCache {
    /// Per layer: `[capacity, kv_heads, head_dim]` of `dtype`.
    k: Vec<Tensor>,
    /// Per layer: `[capacity, kv_heads, head_dim]` of `dtype`.
    v: Vec<Tensor>,
    /// Per layer, f16 caches: `[capacity, kv_heads, 2]` f32 row scales.
    s: Vec<Option<Tensor>>,
    len: usize,
    capacity: usize,
    dtype: DType,
}

impl KvCache {
    /// An empty cache for `capacity` tokens (at most the model's `max_position_embeddings`) with
    /// elements of `dtype` (f32 or f16).
    pub fn new(backend: &dyn Backend, cfg: &TextConfig, capacity: usize, dtype: DType) -> Result<KvCache> {
        KvCache::new_on(&vec![backend; cfg.num_hidden_layers], cfg, capacity, dtype)
    }

    /// [`KvCache::new`] with layer `l`'s keys and values on `per_layer[l]` (a model split over a
    /// device and the host keeps each layer's cache with the layer).
    pub fn new_on(per_layer: &[&dyn Backend], cfg: &TextConfig, capacity: usize, dtype: DType) -> Result<KvCache> {
        if per_layer.len() != cfg.num_hidden_layers {
            return Err(Error::Limit { op: "KvCache::new", msg: format!("{} backends for {} layers", per_layer.len(), cfg.num_hidden_layers) });
        }
        if capacity > cfg.max_position_embeddings {
            return Err(Error::Context { tokens: capacity, limit: cfg.max_position_embeddings, msg: "KV cache capacity above max_position_embeddings".into() });
        }
        let shape = [capacity, cfg.num_key_value_heads, cfg.head_dim];
        let zeros = |backend: &dyn Backend| cache_zeros(backend, &shape, dtype, "KvCache::new");
        let mut k = Vec::with_capacity(cfg.num_hidden_layers);
        let mut v = Vec::with_capacity(cfg.num_hidden_layers);
        let mut s = Vec::with_capacity(cfg.num_hidden_layers);
        for &backend in per_layer {
            k.push(zeros(backend)?);
            v.push(zeros(backend)?);
            s.push(cache_scales(backend, &shape, dtype)?);
        }
        Ok(KvCache { k, v, s, len: 0, capacity, dtype })
    }

    /// Tokens cached so far.
    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    pub fn capacity(&self) -> usize {
        self.capacity
    }

    /// The element type.
    pub fn dtype(&self) -> DType {
        self.dtype
    }

    /// Checks that `n` more tokens fit.
    pub fn reserve(&self, n: usize) -> Result<()> {
        if self.len + n > self.capacity {
            return Err(Error::Context { tokens: self.len + n, limit: self.capacity, msg: "the KV cache is full".into() });
        }
        Ok(())
    }

    /// The key and value tensors of `layer` and their row scales (valid rows: `len()` plus
    /// those written this step).
    pub fn layer(&self, layer: usize) -> (&Tensor, &Tensor, Option<&Tensor>) {
        (&self.k[layer], &self.v[layer], self.s[layer].as_ref())
    }

    /// [`KvCache::layer`], for the ops that append to them.
    pub fn layer_mut(&mut self, layer: usize) -> (&mut Tensor, &mut Tensor, Option<&mut Tensor>) {
        (&mut self.k[layer], &mut self.v[layer], self.s[layer].as_mut())
    }

    /// Marks `n` written tokens as cached (after every layer wrote them).
    pub fn advance(&mut self, n: usize) {
        self.len += n;
    }

    /// Forgets everything (the tensors are reused).
    pub fn clear(&mut self) {
        self.len = 0;
    }
}

/// The row scales of an f16 cache of `shape` (`[rows, kv_heads, d]`) on `b`: `[rows, kv_heads,
/// 2]` f32 ones (rows not yet written are never read); none for f32.
pub fn cache_scales(b: &dyn Backend, shape: &[usize], dtype: DType) -> Result<Option<Tensor>> {
    if dtype != DType::F16 {
        return Ok(None);
    }
    let s = [shape[0], shape[1], crate::backend::KV_SCALES];
    Ok(Some(b.upload_f32(&s, &vec![1.0; s.iter().product()])?))
}

/// A zeroed cache tensor of `shape` and `dtype` (f32 or f16) on `b`; `op` names the caller in
/// the error for another type.
pub fn cache_zeros(b: &dyn Backend, shape: &[usize], dtype: DType, op: &'static str) -> Result<Tensor> {
    match dtype {
        DType::F32 => b.zeros(shape),
        DType::F16 => b.upload_half(shape, DType::F16, &vec![0u16; shape.iter().product()]),
        other => Err(Error::DType { op, expected: "f32 or f16", got: other }),
    }
}
