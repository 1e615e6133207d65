//! The Qwen3-VL text decoder: embeddings, `num_hidden_layers` pre-norm blocks (GQA attention
//! with per-head q/k RMSNorm and interleaved MRoPE, SwiGLU MLP), final norm and LM head.

use super::checkpoint::Loader;
use super::config::TextConfig;
use super::kv_cache::KvCache;
use super::placement::Placement;
use super::rope::{inv_freq, Pos3};
use crate::backend::{same_backend, transfer, QkvRope};
use crate::{Backend, DType, Error, Result, Storage, Tensor};
use gpu::params::CURSOR_FIELDS;
use std::sync::Arc;

/// Checkpoint names of the text decoder.
pub const PREFIX: &str = super::names::TEXT_PREFIX;

/// Visual features to add to the hidden states of the image-token rows after the first
/// decoder layers (DeepStack): `features[k]` is added after layer `k`.
pub struct Deepstack<'a> {
    /// Row indices (within this forward's tokens) of the image tokens.
    pub rows: &'a [usize],
    /// Per layer `k`: `[rows.len(), hidden]` f32.
    pub features: &'a [Tensor],
}

struct Attention {
    qkv_proj: Tensor,         // [(heads + 2 kv_heads) * head_dim, hidden]: q_proj, k_proj, v_proj stacked at load
    o_proj: Tensor,           // [hidden, heads * head_dim]
    qkv_bias: Option<Tensor>, // [(heads + 2 kv_heads) * head_dim] when attention_bias
    o_bias: Option<Tensor>,   // [hidden]
    q_norm: Tensor,           // [head_dim] f32
    k_norm: Tensor,           // [head_dim] f32
}

struct Mlp {
    gate_proj: Tensor, // [intermediate, hidden]
    up_proj: Tensor,   // [intermediate, hidden]
    down_proj: Tensor, // [hidden, intermediate]
}

struct DecoderLayer {
    input_layernorm: Tensor,          // [hidden] f32
    attn: Attention,
    post_attention_layernorm: Tensor, // [hidden] f32
    mlp: Mlp,
}

impl DecoderLayer {
    /// This layer's weights (host tensors) uploaded to `to` in their own types: the streamed
    /// copy a large forward runs on the device (see [`Placement::stream_rows`]).
    fn upload_to(&self, to: &dyn Backend) -> Result<DecoderLayer> {
        let up = |t: &Tensor| -> Result<Tensor> {
            match t.dtype() {
                DType::F32 => to.upload_f32(t.shape(), t.as_cpu_f32("stream a layer")?),
                d @ (DType::F16 | DType::BF16) => to.upload_half(t.shape(), d, t.as_cpu_half("stream a layer")?),
                d => to.upload_blocks(t.shape(), d, t.to_blocks("stream a layer")?),
            }
        };
        let opt = |t: &Option<Tensor>| t.as_ref().map(&up).transpose();
        let a = &self.attn;
        Ok(DecoderLayer {
            input_layernorm: up(&self.input_layernorm)?,
            attn: Attention { qkv_proj: up(&a.qkv_proj)?, o_proj: up(&a.o_proj)?, qkv_bias: opt(&a.qkv_bias)?, o_bias: opt(&a.o_bias)?, q_norm: up(&a.q_norm)?, k_norm: up(&a.k_norm)? },
            post_attention_layernorm: up(&self.post_attention_layernorm)?,
            mlp: Mlp { gate_proj: up(&self.mlp.gate_proj)?, up_proj: up(&self.mlp.up_proj)?, down_proj: up(&self.mlp.down_proj)? },
        })
    }
}

pub struct TextModel {
    pub cfg: TextConfig,
    embed_tokens: Tensor, // [vocab, hidden]
    layers: Vec<DecoderLayer>,
    norm: Tensor,         // [hidden] f32
    lm_head: Tensor,      // [vocab, hidden]; the embedding itself when tied (and on its side)
    inv_freq: Tensor,     // [head_dim / 2] f32, on the backend
    /// Which parts live on the host backend (all on the device unless split).
    place: Placement,
    host: Option<HostSide>,
    /// Host layers streamed through the device so far.
    streamed: std::sync::atomic::AtomicUsize,
}

/// The host side of a decoder split over two backends (see [`super::placement`]): the backend
/// the host parts were loaded on, and the rotary frequencies there.
struct HostSide {
    backend: Arc<dyn Backend>,
    inv_freq: Tensor,
}

/// What a decoder layer's attention reads and writes: the keys and values of the tokens before
/// this forward's, and where this forward's go.
pub trait LayerKv {
    /// Layer `layer`'s attention on backend `b`: from `qkv [t, (heads + 2 kv_heads) · d]`, the
    /// normed and rotated queries against the keys before them and their own (causal), the
    /// new keys and values stored at the cursor's cache rows. Returns `[t, heads, d]`.
    fn attend(&mut self, layer: usize, b: &dyn Backend, qkv: &Tensor, shape: &QkvRope<'_>, cursor: &Tensor, scale: f32) -> Result<Tensor>;

    /// [`LayerKv::attend`] for a streamed host layer (see [`Placement::stream_rows`]): `qkv`
    /// and the result on the device `at.0`, with the layer's shape (q/k norms, frequencies) and
    /// the cursor there; the layer's cache on the host `host_at.0`, with the same there. This
    /// default sends `qkv` to the host and attends there; a cache that can lend its rows to the
    /// device for the forward overrides it.
    fn attend_streamed(&mut self, layer: usize, at: (&dyn Backend, &QkvRope<'_>, &Tensor), host_at: (&dyn Backend, &QkvRope<'_>, &Tensor), qkv: &Tensor, scale: f32) -> Result<Tensor> {
        let ((dev, _, _), (host, shape, cursor)) = (at, host_at);
        let o = self.attend(layer, host, &transfer(dev, host, qkv)?, shape, cursor, scale)?;
        transfer(host, dev, &o)
    }
}

impl LayerKv for KvCache {
    fn attend(&mut self, layer: usize, b: &dyn Backend, qkv: &Tensor, shape: &QkvRope<'_>, cursor: &Tensor, scale: f32) -> Result<Tensor> {
        let (kc, vc, sc) = self.layer_mut(layer);
        let q = b.qkv_rope_append(qkv, shape, cursor, kc, vc, sc)?; // [t, heads, head_dim]; k, v cached
        let (kc, vc, sc) = self.layer(layer);
        b.attention_cached(&q, kc, vc, sc, cursor, scale)
    }

    /// The attention on the device: the cached rows before this forward's (`[0, row0)`) are
    /// lent to it in a cache of `row0 + t` rows, where this forward's keys and values are
    /// appended and attended; those `t` rows then come back to the host's cache.
    fn attend_streamed(&mut self, layer: usize, at: (&dyn Backend, &QkvRope<'_>, &Tensor), host_at: (&dyn Backend, &QkvRope<'_>, &Tensor), qkv: &Tensor, scale: f32) -> Result<Tensor> {
        let ((dev, shape, cursor), (host, _, host_cursor)) = (at, host_at);
        let cur = host.download_u32(host_cursor)?;
        let t = cur.len() / CURSOR_FIELDS;
        let row0 = if t == 0 { 0 } else { cur[gpu::params::CURSOR_ROW] as usize };
        if row0 + t > self.capacity() {
            return Err(Error::Context { tokens: row0 + t, limit: self.capacity(), msg: "the KV cache is full".into() });
        }
        // 1. the device's copy of rows [0, row0 + t) (the last t not yet written)
        let (kc, vc, sc) = self.layer(layer);
        let (mut k, mut v) = (lend_rows(host, dev, kc, row0 + t)?, lend_rows(host, dev, vc, row0 + t)?);
        let mut s = sc.map(|s| lend_rows(host, dev, s, row0 + t)).transpose()?;
        // 2. append and attend there (the ops check that the cursor's rows run on from row0)
        let q = dev.qkv_rope_append(qkv, shape, cursor, &mut k, &mut v, s.as_mut())?;
        let o = dev.attention_cached(&q, &k, &v, s.as_ref(), cursor, scale)?;
        // 3. this forward's rows back into the host's cache
        let (kc, vc, sc) = self.layer_mut(layer);
        return_rows(dev, host, &k, kc, row0, t)?;
        return_rows(dev, host, &v, vc, row0, t)?;
        if let (Some(d), Some(c)) = (s.as_ref(), sc) {
            return_rows(dev, host, d, c, row0, t)?;
        }
        Ok(o)
    }
}

/// Rows `[0, rows)` of the host tensor `c [cap, ..]` (f32 or f16) as a tensor on `dev`.
fn lend_rows(host: &dyn Backend, dev: &dyn Backend, c: &Tensor, rows: usize) -> Result<Tensor> {
    transfer(host, dev, &host.take_rows(c, 0, rows)?)
}

/// Rows `[row0, row0 + t)` of `d` (on `dev`) written into the same rows of the host tensor `c`
/// of the same type (f16 values pass through f32 exactly).
fn return_rows(dev: &dyn Backend, host: &dyn Backend, d: &Tensor, c: &mut Tensor, row0: usize, t: usize) -> Result<()> {
    copy_rows_to_host(dev, host, d, row0, c, row0, t)
}

/// Rows `[from, from + t)` of `d` (on `dev`) written into rows `[to, to + t)` of the host
/// tensor `c` of the same type (f16 values pass through f32 exactly).
pub(crate) fn copy_rows_to_host(dev: &dyn Backend, host: &dyn Backend, d: &Tensor, from: usize, c: &mut Tensor, to: usize, t: usize) -> Result<()> {
    let rows = dev.take_rows(d, from, t)?;
    let vals: Vec<f32> = match rows.dtype() {
        DType::F16 => dev.download_half(&rows)?.iter().map(|&h| gpu::math::f16_to_f32(h)).collect(),
        _ => dev.download_f32(&rows)?,
    };
    host.write_rows(c, to, &host.upload_f32(rows.shape(), &vals)?)
}

/// Whether two tensors share their storage (a tied LM head).
fn same_storage(a: &Tensor, b: &Tensor) -> bool {
    match (a.storage(), b.storage()) {
        (Storage::Cpu(x), Storage::Cpu(y)) => Arc::ptr_eq(x, y),
        #[cfg(feature = "cuda")]
        (Storage::Cuda(x), Storage::Cuda(y)) => Arc::ptr_eq(x, y),
        #[allow(unreachable_patterns)]
        _ => false,
    }
}

/// Bytes of a tensor's elements (or blocks).
pub fn tensor_bytes(t: &Tensor) -> usize {
    match t.shape().split_last() {
        Some((&cols, lead)) => lead.iter().product::<usize>() * t.dtype().row_bytes(cols).unwrap_or(cols * t.dtype().size_of()),
        None => t.dtype().size_of(),
    }
}

/// A decoder pass's cursor `[t, 4]` u32 on `b`: per row the (t, h, w) rotary position and the
/// KV-cache row (`row0 + i`). The decode loop keeps one and lets the device advance it.
pub fn cursor(b: &dyn Backend, pos: &[Pos3], row0: usize) -> Result<Tensor> {
    let mut data = Vec::with_capacity(pos.len() * CURSOR_FIELDS);
    for (i, p) in pos.iter().enumerate() {
        data.extend_from_slice(&[p[0], p[1], p[2], (row0 + i) as u32]);
    }
    b.upload_u32(&[pos.len(), CURSOR_FIELDS], &data)
}

impl TextModel {
    /// Loads the decoder's weights through `ld`, checking every shape against `cfg`.
    /// `tied`: the LM head is the embedding.
    pub fn new(cfg: &TextConfig, tied: bool, ld: &mut Loader<'_>) -> Result<TextModel> {
        TextModel::new_placed(cfg, tied, ld, None, &Placement::all_on_device(cfg.num_hidden_layers))
    }

    /// [`TextModel::new`] with the parts `place` puts on the host loaded onto `host` (the
    /// loader's backend is the device).
    pub fn new_placed<'a>(cfg: &TextConfig, tied: bool, ld: &mut Loader<'a>, host: Option<&'a Arc<dyn Backend>>, place: &Placement) -> Result<TextModel> {
        let (h, d, i) = (cfg.hidden_size, cfg.head_dim, cfg.intermediate_size);
        let (qd, kvd) = (cfg.num_attention_heads * d, cfg.num_key_value_heads * d);
        if place.layers != cfg.num_hidden_layers || (place.is_split() && host.is_none()) {
            return Err(Error::Limit { op: "text model", msg: format!("a placement of {} layers (split: {}) for {} layers with{} a host backend", place.layers, place.is_split(), cfg.num_hidden_layers, if host.is_some() { "" } else { "out" }) });
        }
        let device: &'a dyn Backend = ld.backend;
        let side = |on_device: bool| -> &'a dyn Backend {
            match host {
                Some(hb) if !on_device => &**hb,
                _ => device,
            }
        };
        ld.backend = side(place.embed_on_device);
        let embed_tokens = ld.weight(&format!("{}embed_tokens.weight", PREFIX), &[cfg.vocab_size, h])?;
        let mut layers = Vec::with_capacity(cfg.num_hidden_layers);
        for l in 0..cfg.num_hidden_layers {
            ld.backend = side(l < place.device_layers);
            let p = format!("{}layers.{}.", PREFIX, l);
            let name = |proj: &str, what: &str| format!("{}self_attn.{}.{}", p, proj, what);
            let (qn, kn, vn) = (name("q_proj", "weight"), name("k_proj", "weight"), name("v_proj", "weight"));
            let (qb, kb, vb) = (name("q_proj", "bias"), name("k_proj", "bias"), name("v_proj", "bias"));
            let attn = Attention {
                qkv_bias: if cfg.attention_bias { Some(ld.f32_concat(&[(&qb, &[qd]), (&kb, &[kvd]), (&vb, &[kvd])])?) } else { None },
                o_bias: if cfg.attention_bias { Some(ld.f32(&name("o_proj", "bias"), &[h])?) } else { None },
                qkv_proj: ld.weight_concat(&[(&qn, &[qd, h]), (&kn, &[kvd, h]), (&vn, &[kvd, h])])?,
                o_proj: ld.weight(&format!("{}self_attn.o_proj.weight", p), &[h, qd])?,
                q_norm: ld.f32(&format!("{}self_attn.q_norm.weight", p), &[d])?,
                k_norm: ld.f32(&format!("{}self_attn.k_norm.weight", p), &[d])?,
            };
            let mlp = Mlp {
                gate_proj: ld.weight(&format!("{}mlp.gate_proj.weight", p), &[i, h])?,
                up_proj: ld.weight(&format!("{}mlp.up_proj.weight", p), &[i, h])?,
                down_proj: ld.weight(&format!("{}mlp.down_proj.weight", p), &[h, i])?,
            };
            layers.push(DecoderLayer {
                input_layernorm: ld.f32(&format!("{}input_layernorm.weight", p), &[h])?,
                attn,
                post_attention_layernorm: ld.f32(&format!("{}post_attention_layernorm.weight", p), &[h])?,
                mlp,
            });
        }
        ld.backend = side(place.head_on_device);
        let norm = ld.f32(&format!("{}norm.weight", PREFIX), &[h])?;
        let lm_head = if tied && place.head_on_device == place.embed_on_device {
            embed_tokens.clone()
        } else if tied {
            ld.weight(&format!("{}embed_tokens.weight", PREFIX), &[cfg.vocab_size, h])?
        } else if ld.src.contains("lm_head.weight") {
            ld.weight("lm_head.weight", &[cfg.vocab_size, h])?
        } else {
            return Err(Error::Checkpoint {
                file: ld.src.describe(),
                tensor: "lm_head.weight".into(),
                msg: "missing, and tie_word_embeddings is false".into(),
            });
        };
        ld.backend = device;
        let freqs = inv_freq(cfg.rope_theta, d);
        let host = match host {
            Some(hb) if place.is_split() => Some(HostSide { backend: Arc::clone(hb), inv_freq: hb.upload_f32(&[d / 2], &freqs)? }),
            _ => None,
        };
        let inv_freq = device.upload_f32(&[d / 2], &freqs)?;
        Ok(TextModel { cfg: cfg.clone(), embed_tokens, layers, norm, lm_head, inv_freq, place: place.clone(), host, streamed: Default::default() })
    }

    /// The backend of a part: `b` (the device) when it is there, else the host's.
    fn side<'s>(&'s self, b: &'s dyn Backend, on_device: bool) -> &'s dyn Backend {
        match &self.host {
            Some(h) if !on_device => &*h.backend,
            _ => b,
        }
    }

    /// Where the parts are.
    pub fn placement(&self) -> &Placement {
        &self.place
    }

    /// Weight bytes on the device `b` (rounded as its pool allocates) and on the host.
    pub fn placed_bytes(&self, b: &dyn Backend) -> (usize, usize) {
        let (mut dev, mut host) = (0, 0);
        let mut add = |on_device: bool, t: &Tensor| {
            let n = tensor_bytes(t);
            match self.host.is_some() && !on_device {
                true => host += n,
                false => dev += b.weight_alloc_size(n),
            }
        };
        add(self.place.embed_on_device, &self.embed_tokens);
        if !same_storage(&self.lm_head, &self.embed_tokens) {
            add(self.place.head_on_device, &self.lm_head);
        }
        add(self.place.head_on_device, &self.norm);
        for (l, layer) in self.layers.iter().enumerate() {
            let a = &layer.attn;
            let mut all = vec![&layer.input_layernorm, &layer.post_attention_layernorm, &a.qkv_proj, &a.o_proj, &a.q_norm, &a.k_norm, &layer.mlp.gate_proj, &layer.mlp.up_proj, &layer.mlp.down_proj];
            all.extend(a.qkv_bias.iter().chain(a.o_bias.iter()));
            for t in all {
                add(l < self.place.device_layers, t);
            }
        }
        (dev, host)
    }

    /// An empty KV cache for `capacity` tokens, each layer's part on its layer's backend.
    pub fn new_cache(&self, b: &dyn Backend, capacity: usize, dtype: DType) -> Result<KvCache> {
        KvCache::new_on(&self.layer_backends(b), &self.cfg, capacity, dtype)
    }

    /// The backend of each layer when `b` is the device.
    pub fn layer_backends<'s>(&'s self, b: &'s dyn Backend) -> Vec<&'s dyn Backend> {
        (0..self.layers.len()).map(|l| self.side(b, l < self.place.device_layers)).collect()
    }

    /// `[ids.len(), hidden]` token embeddings.
    pub fn embed(&self, b: &dyn Backend, ids: &[u32]) -> Result<Tensor> {
        let eb = self.side(b, self.place.embed_on_device);
        transfer(eb, b, &eb.embedding(&self.embed_tokens, ids)?)
    }

    /// The element types of the weight matrices, most common first, with the share of weight
    /// elements each holds: `"q4_k 78%, q6_k 22%"` (one type: just its name).
    pub fn weights_summary(&self) -> String {
        let mut all: Vec<&Tensor> = vec![&self.embed_tokens];
        if !same_storage(&self.lm_head, &self.embed_tokens) {
            all.push(&self.lm_head);
        }
        for l in &self.layers {
            all.extend([&l.attn.qkv_proj, &l.attn.o_proj, &l.mlp.gate_proj, &l.mlp.up_proj, &l.mlp.down_proj]);
        }
        let mut counts: Vec<(crate::DType, usize)> = Vec::new();
        for t in all {
            match counts.iter_mut().find(|(d, _)| *d == t.dtype()) {
                Some(c) => c.1 += t.elem_count(),
                None => counts.push((t.dtype(), t.elem_count())),
            }
        }
        counts.sort_by(|a, b| b.1.cmp(&a.1));
        let total: usize = counts.iter().map(|c| c.1).sum::<usize>().max(1);
        if counts.len() == 1 {
            return counts[0].0.name().to_string();
        }
        counts.iter().map(|(d, n)| format!("{} {:.0}%", d, *n as f64 * 100.0 / total as f64)).collect::<Vec<_>>().join(", ")
    }

    /// `[ids.len(), hidden]` embeddings of token ids held in a u32 tensor on the backend.
    pub fn embed_ids(&self, b: &dyn Backend, ids: &Tensor) -> Result<Tensor> {
        let eb = self.side(b, self.place.embed_on_device);
        if same_backend(eb, b) {
            return b.embedding_gather(&self.embed_tokens, ids);
        }
        self.embed(b, &b.download_u32(ids)?)
    }

    /// Runs the decoder over `x [t, hidden]`, the embeddings of the tokens that follow those in
    /// `cache`, at the rotary positions and cache rows of `cursor [t, 4]` (see [`cursor`]);
    /// writes their keys and values into `cache` and returns the final-normed hidden states
    /// `[t, hidden]`. The caller advances the cache's length (a recorded decode step runs this
    /// without the host, so nothing here may depend on host-side state that changes per step).
    /// Inputs and output are on `b`; layers placed on the host run there, the hidden state and
    /// the cursor crossing at the boundary.
    pub fn forward(&self, b: &dyn Backend, x: Tensor, cursor: &Tensor, cache: &mut KvCache, deepstack: Option<&Deepstack<'_>>) -> Result<Tensor> {
        self.forward_kv(b, x, cursor, cache, deepstack)
    }

    /// [`TextModel::forward`] over any [`LayerKv`]: a contiguous [`KvCache`], or a batched step
    /// of a paged cache (the engine's), whose cursor rows are the cache rows to write.
    pub fn forward_kv(&self, b: &dyn Backend, x: Tensor, cursor: &Tensor, kv: &mut dyn LayerKv, deepstack: Option<&Deepstack<'_>>) -> Result<Tensor> {
        let c = &self.cfg;
        let t = x.shape()[0];
        if cursor.shape() != [t, CURSOR_FIELDS] {
            return Err(Error::shape("text forward", &[x.shape(), cursor.shape()], format!("the cursor must be [{}, {}]", t, CURSOR_FIELDS)));
        }
        let device = b;
        // host layers stream their weights through the device for large forwards (prefill)
        let stream = match (&self.host, self.place.stream_rows) {
            (Some(h), Some(rows)) => t >= rows && !same_backend(&*h.backend, device),
            _ => false,
        };
        if stream && self.place.device_layers < self.layers.len() {
            log::debug!("forward of {} rows: the {} host layers' weights stream through the device", t, self.layers.len() - self.place.device_layers);
        }
        let mut host_cursor: Option<Tensor> = None;
        let (mut x, mut cursor, mut at) = (x, cursor.clone(), b);
        for (l, layer) in self.layers.iter().enumerate() {
            let on_device = l < self.place.device_layers;
            // 0. the backend that runs the layer's linear parts (`lb`), where the hidden state
            //    [t, hidden] and the cursor move; a streamed host layer runs on the device with
            //    its weights uploaded for this forward, its cache staying on the host
            let lb = if stream { device } else { self.side(b, on_device) };
            if !same_backend(lb, at) {
                x = transfer(at, lb, &x)?;
                cursor = transfer(at, lb, &cursor)?;
                at = lb;
            }
            let hb = self.side(b, on_device);
            x = if same_backend(hb, lb) {
                self.layer_forward(l, lb, layer, None, &cursor, kv, x, deepstack.map(|ds| (device, ds)))?
            } else {
                let w = layer.upload_to(lb)?;
                self.streamed.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                if host_cursor.is_none() {
                    host_cursor = Some(transfer(lb, hb, &cursor)?);
                }
                let host = (hb, layer, host_cursor.as_ref().expect("set above"));
                self.layer_forward(l, lb, &w, Some(host), &cursor, kv, x, deepstack.map(|ds| (device, ds)))?
            };
        }
        // 4. final norm, with the LM head; the result back on `b`
        let hb = self.side(b, self.place.head_on_device);
        let x = transfer(at, hb, &x)?;
        transfer(hb, b, &hb.rms_norm(&x, &self.norm, c.rms_norm_eps)?)
    }

    /// The attention shape of layer weights `w` on `b`: their q/k norms, and the rotary
    /// frequencies there (the device's or the host's copy).
    fn qkv_shape<'s>(&'s self, b: &dyn Backend, w: &'s DecoderLayer) -> QkvRope<'s> {
        let c = &self.cfg;
        QkvRope {
            heads: c.num_attention_heads,
            kv_heads: c.num_key_value_heads,
            head_dim: c.head_dim,
            q_norm: &w.attn.q_norm,
            k_norm: &w.attn.k_norm,
            eps: c.rms_norm_eps,
            inv_freq: match &self.host {
                Some(h) if same_backend(b, &*h.backend) => &h.inv_freq,
                _ => &self.inv_freq,
            },
            section: c.mrope_section,
        }
    }

    /// Decoder layer `l` over `x [t, hidden]` on `lb` with weights `w` and the cursor `cursor`
    /// there; `host`: for a streamed layer, the backend its cache is on, with the layer's own
    /// weights and the cursor there (see [`LayerKv::attend_streamed`]). DeepStack features
    /// live on `ds.0`.
    #[allow(clippy::too_many_arguments)]
    fn layer_forward(&self, l: usize, lb: &dyn Backend, w: &DecoderLayer, host: Option<(&dyn Backend, &DecoderLayer, &Tensor)>, cursor: &Tensor, kv: &mut dyn LayerKv, x: Tensor, deepstack: Option<(&dyn Backend, &Deepstack<'_>)>) -> Result<Tensor> {
        let c = &self.cfg;
        let t = x.shape()[0];
        let scale = 1.0 / (c.head_dim as f32).sqrt();
        // 1. attention block: x [t, hidden] += o_proj(attn(rope(norm(q)), rope(norm(k)), v))
        let a = &w.attn;
        let qkv = lb.rms_norm_linear(&x, &w.input_layernorm, c.rms_norm_eps, &a.qkv_proj, a.qkv_bias.as_ref())?; // [t, (heads + 2 kv_heads) * head_dim]
        let o = match host {
            None => kv.attend(l, lb, &qkv, &self.qkv_shape(lb, w), cursor, scale)?,
            Some((hb, own, hc)) => kv.attend_streamed(l, (lb, &self.qkv_shape(lb, w), cursor), (hb, &self.qkv_shape(hb, own), hc), &qkv, scale)?,
        };
        let o = o.reshape(&[t, c.num_attention_heads * c.head_dim])?; // [t, heads * head_dim]
        let x = lb.linear_residual(&o, &a.o_proj, a.o_bias.as_ref(), &x)?;
        // 2. MLP block: x [t, hidden] += down(silu(gate(norm(x))) * up(norm(x)))
        let m = &w.mlp;
        let mut x = lb.rms_norm_swiglu_residual(&x, &w.post_attention_layernorm, c.rms_norm_eps, &m.gate_proj, &m.up_proj, &m.down_proj)?; // [t, hidden]
        // 3. DeepStack: visual features join the image-token rows after the first layers
        if let Some((fb, ds)) = deepstack {
            if let Some(f) = ds.features.get(l) {
                x = lb.scatter_rows(&x, ds.rows, &transfer(fb, lb, f)?, true)?;
            }
        }
        Ok(x)
    }

    /// Host layers streamed through the device so far (see [`Placement::stream_rows`]): a
    /// count for tests and logs.
    pub fn streamed_layers(&self) -> usize {
        self.streamed.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// `[rows, vocab]` logits of final-normed hidden states `[rows, hidden]` (on `b`, as the
    /// result).
    pub fn logits(&self, b: &dyn Backend, hidden: &Tensor) -> Result<Tensor> {
        let hb = self.side(b, self.place.head_on_device);
        transfer(hb, b, &hb.linear(&transfer(b, hb, hidden)?, &self.lm_head, None)?)
    }
}
