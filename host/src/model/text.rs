//! The Qwen3-VL text decoder: embeddings, `num_hidden_layers` pre-norm blocks (GQA attention
//! with per-head q/k RMSNorm and interleaved MRoPE, SwiGLU MLP), final norm and LM head.

use super::checkpoint::Loader;
use super::config::TextConfig;
use super::kv_cache::KvCache;
use super::rope::{inv_freq, mrope_tables, Pos3};
use crate::{AttnParams, Backend, Error, Result, Tensor};

/// Checkpoint names of the text decoder.
pub const PREFIX: &str = "model.language_model.";

/// Visual features to add to the hidden states of the image-token rows after the first
/// decoder layers (DeepStack): `features[k]` is added after layer `k`.
pub struct Deepstack<'a> {
    /// Row indices (within this forward's tokens) of the image tokens.
    pub rows: &'a [usize],
    /// Per layer `k`: `[rows.len(), hidden]` f32.
    pub features: &'a [Tensor],
}

struct Attention {
    q_proj: Tensor,          // [heads * head_dim, hidden]
    k_proj: Tensor,          // [kv_heads * head_dim, hidden]
    v_proj: Tensor,          // [kv_heads * head_dim, hidden]
    o_proj: Tensor,          // [hidden, heads * head_dim]
    q_bias: Option<Tensor>,  // [heads * head_dim] when attention_bias
    k_bias: Option<Tensor>,  // [kv_heads * head_dim]
    v_bias: Option<Tensor>,  // [kv_heads * head_dim]
    o_bias: Option<Tensor>,  // [hidden]
    q_norm: Tensor,          // [head_dim] f32
    k_norm: Tensor,          // [head_dim] f32
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

pub struct TextModel {
    pub cfg: TextConfig,
    embed_tokens: Tensor, // [vocab, hidden]
    layers: Vec<DecoderLayer>,
    norm: Tensor,         // [hidden] f32
    lm_head: Tensor,      // [vocab, hidden]; the embedding itself when tied
    inv_freq: Vec<f32>,   // [head_dim / 2]
}

impl TextModel {
    /// Loads the decoder's weights through `ld`, checking every shape against `cfg`.
    /// `tied`: the LM head is the embedding.
    pub fn new(cfg: &TextConfig, tied: bool, ld: &mut Loader<'_>) -> Result<TextModel> {
        let (h, d, i) = (cfg.hidden_size, cfg.head_dim, cfg.intermediate_size);
        let (qd, kvd) = (cfg.num_attention_heads * d, cfg.num_key_value_heads * d);
        let embed_tokens = ld.weight(&format!("{}embed_tokens.weight", PREFIX), &[cfg.vocab_size, h])?;
        let mut layers = Vec::with_capacity(cfg.num_hidden_layers);
        for l in 0..cfg.num_hidden_layers {
            let p = format!("{}layers.{}.", PREFIX, l);
            let bias = |ld: &mut Loader<'_>, name: &str, n: usize| -> Result<Option<Tensor>> {
                if cfg.attention_bias {
                    ld.f32(&format!("{}self_attn.{}.bias", p, name), &[n]).map(Some)
                } else {
                    Ok(None)
                }
            };
            let attn = Attention {
                q_bias: bias(ld, "q_proj", qd)?,
                k_bias: bias(ld, "k_proj", kvd)?,
                v_bias: bias(ld, "v_proj", kvd)?,
                o_bias: bias(ld, "o_proj", h)?,
                q_proj: ld.weight(&format!("{}self_attn.q_proj.weight", p), &[qd, h])?,
                k_proj: ld.weight(&format!("{}self_attn.k_proj.weight", p), &[kvd, h])?,
                v_proj: ld.weight(&format!("{}self_attn.v_proj.weight", p), &[kvd, h])?,
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
        let norm = ld.f32(&format!("{}norm.weight", PREFIX), &[h])?;
        let lm_head = if tied {
            embed_tokens.clone()
        } else if ld.ckpt.contains("lm_head.weight") {
            ld.weight("lm_head.weight", &[cfg.vocab_size, h])?
        } else {
            return Err(Error::Checkpoint {
                file: "checkpoint".into(),
                tensor: "lm_head.weight".into(),
                msg: "missing, and tie_word_embeddings is false".into(),
            });
        };
        Ok(TextModel { cfg: cfg.clone(), embed_tokens, layers, norm, lm_head, inv_freq: inv_freq(cfg.rope_theta, d) })
    }

    /// `[ids.len(), hidden]` token embeddings.
    pub fn embed(&self, b: &dyn Backend, ids: &[u32]) -> Result<Tensor> {
        b.embedding(&self.embed_tokens, ids)
    }

    /// Runs the decoder over `x [t, hidden]` (embeddings of the tokens after those in `cache`)
    /// at rotary positions `pos` (one per row), appends their keys and values to `cache`, and
    /// returns the final-normed hidden states `[t, hidden]`.
    pub fn forward(&self, b: &dyn Backend, x: Tensor, pos: &[Pos3], cache: &mut KvCache, deepstack: Option<&Deepstack<'_>>) -> Result<Tensor> {
        let c = &self.cfg;
        let t = x.shape()[0];
        if pos.len() != t {
            return Err(Error::shape("text forward", &[x.shape()], format!("{} positions for {} tokens", pos.len(), t)));
        }
        cache.reserve(t)?;
        // 1. rotary tables for these positions: cos, sin [t, head_dim / 2]
        let (cos, sin) = mrope_tables(&self.inv_freq, &c.mrope_section, pos);
        let half = c.head_dim / 2;
        let (cos, sin) = (b.upload_f32(&[t, half], &cos)?, b.upload_f32(&[t, half], &sin)?);
        let attn = AttnParams { kv_len: cache.len() + t, q_pos0: cache.len(), causal: true, scale: 1.0 / (c.head_dim as f32).sqrt() };
        let mut x = x;
        for (l, layer) in self.layers.iter().enumerate() {
            // 2. attention block: x [t, hidden] += o_proj(attn(rope(norm(q)), rope(norm(k)), v))
            let h = b.rms_norm(&x, &layer.input_layernorm, c.rms_norm_eps)?;
            let a = &layer.attn;
            let q = b.linear(&h, &a.q_proj, a.q_bias.as_ref())?.reshape(&[t, c.num_attention_heads, c.head_dim])?;
            let k = b.linear(&h, &a.k_proj, a.k_bias.as_ref())?.reshape(&[t, c.num_key_value_heads, c.head_dim])?;
            let v = b.linear(&h, &a.v_proj, a.v_bias.as_ref())?.reshape(&[t, c.num_key_value_heads, c.head_dim])?;
            let q = b.rope(&b.rms_norm(&q, &a.q_norm, c.rms_norm_eps)?, &cos, &sin)?; // [t, heads, head_dim]
            let k = b.rope(&b.rms_norm(&k, &a.k_norm, c.rms_norm_eps)?, &cos, &sin)?; // [t, kv_heads, head_dim]
            cache.write(b, l, &k, &v)?;
            let (kc, vc) = cache.layer(l);
            let o = b.attention(&q, kc, vc, attn)?.reshape(&[t, c.num_attention_heads * c.head_dim])?;
            x = b.add(&x, &b.linear(&o, &a.o_proj, a.o_bias.as_ref())?)?;
            // 3. MLP block: x [t, hidden] += down(silu(gate(norm(x))) * up(norm(x)))
            let h = b.rms_norm(&x, &layer.post_attention_layernorm, c.rms_norm_eps)?;
            let m = &layer.mlp;
            let act = b.silu_mul(&b.linear(&h, &m.gate_proj, None)?, &b.linear(&h, &m.up_proj, None)?)?; // [t, intermediate]
            x = b.add(&x, &b.linear(&act, &m.down_proj, None)?)?;
            // 4. DeepStack: visual features join the image-token rows after the first layers
            if let Some(ds) = deepstack {
                if let Some(f) = ds.features.get(l) {
                    x = b.scatter_rows(&x, ds.rows, f, true)?;
                }
            }
        }
        cache.advance(t);
        // 5. final norm
        b.rms_norm(&x, &self.norm, c.rms_norm_eps)
    }

    /// `[rows, vocab]` logits of final-normed hidden states `[rows, hidden]`.
    pub fn logits(&self, b: &dyn Backend, hidden: &Tensor) -> Result<Tensor> {
        b.linear(hidden, &self.lm_head, None)
    }
}
