//! The per-layer key/value cache of the text decoder, on the backend's device.

use crate::model::config::TextConfig;
use crate::{Backend, Error, Result, Tensor};

pub struct KvCache {
    /// Per layer: `[capacity, kv_heads, head_dim]` f32.
    k: Vec<Tensor>,
    /// Per layer: `[capacity, kv_heads, head_dim]` f32.
    v: Vec<Tensor>,
    len: usize,
    capacity: usize,
}

impl KvCache {
    /// An empty cache for `capacity` tokens (at most the model's `max_position_embeddings`).
    pub fn new(backend: &dyn Backend, cfg: &TextConfig, capacity: usize) -> Result<KvCache> {
        if capacity > cfg.max_position_embeddings {
            return Err(Error::Context { tokens: capacity, limit: cfg.max_position_embeddings, msg: "KV cache capacity above max_position_embeddings".into() });
        }
        let shape = [capacity, cfg.num_key_value_heads, cfg.head_dim];
        let mut k = Vec::with_capacity(cfg.num_hidden_layers);
        let mut v = Vec::with_capacity(cfg.num_hidden_layers);
        for _ in 0..cfg.num_hidden_layers {
            k.push(backend.zeros(&shape)?);
            v.push(backend.zeros(&shape)?);
        }
        Ok(KvCache { k, v, len: 0, capacity })
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

    /// Checks that `n` more tokens fit.
    pub fn reserve(&self, n: usize) -> Result<()> {
        if self.len + n > self.capacity {
            return Err(Error::Context { tokens: self.len + n, limit: self.capacity, msg: "the KV cache is full".into() });
        }
        Ok(())
    }

    /// Writes layer `layer`'s keys and values `[t, kv_heads, head_dim]` at the current end.
    pub fn write(&mut self, backend: &dyn Backend, layer: usize, k: &Tensor, v: &Tensor) -> Result<()> {
        backend.write_rows(&mut self.k[layer], self.len, k)?;
        backend.write_rows(&mut self.v[layer], self.len, v)
    }

    /// The key and value tensors of `layer` (valid rows: `len()` plus those written this step).
    pub fn layer(&self, layer: usize) -> (&Tensor, &Tensor) {
        (&self.k[layer], &self.v[layer])
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
