//! The model configuration in GGUF metadata, with llama.cpp's keys for Qwen3-VL.
//!
//! Text model (`general.architecture = qwen3vl`): `qwen3vl.{context_length, embedding_length,
//! feed_forward_length, block_count, attention.head_count, attention.head_count_kv,
//! attention.key_length, attention.value_length, attention.layer_norm_rms_epsilon,
//! rope.freq_base, rope.dimension_sections (t, h, w, 0), n_deepstack_layers}`; the vocabulary
//! size is the token embedding's row count, the head is tied when `output.weight` is absent, the
//! attention has biases when `blk.0.attn_q.bias` exists, and the image / vision token ids are
//! looked up in the tokenizer.
//!
//! Vision tower (`general.architecture = clip`, `clip.projector_type = qwen3vl_merger`):
//! `clip.vision.{block_count, embedding_length, feed_forward_length, attention.head_count,
//! patch_size, image_size, spatial_merge_size, projection_dim, is_deepstack_layers,
//! image_mean, image_std}`; input channels and the temporal patch size come from the patch
//! embedding's shape and slices.
//!
//! The values are validated by the same code as `config.json` ([`Config::from_json`]), so both
//! sources accept exactly the same models.

use super::{Array, Gguf, Value, Writer};
use crate::image::PreprocessConfig;
use crate::model::config::Config;
use crate::{Error, Result, Tokenizer};
use serde_json::json;

pub const TEXT_ARCH: &str = "qwen3vl";
pub const CLIP_ARCH: &str = "clip";
pub const PROJECTOR: &str = "qwen3vl_merger";

/// llama.cpp's `general.file_type` numbers for the mixes written here.
pub mod file_type {
    pub const ALL_F32: u32 = 0;
    pub const MOSTLY_F16: u32 = 1;
    pub const MOSTLY_Q8_0: u32 = 7;
    pub const MOSTLY_Q4_K_M: u32 = 15;
    pub const MOSTLY_BF16: u32 = 32;
}

fn key(k: &str) -> String {
    format!("{}.{}", TEXT_ARCH, k)
}

/// Checks `general.architecture` is `want`.
pub fn expect_arch(g: &Gguf, want: &str) -> Result<()> {
    match g.get_str("general.architecture")? {
        Some(a) if a == want => Ok(()),
        Some(a) => Err(g.error("", format!("general.architecture is '{}', expected '{}'", a, want))),
        None => Err(g.error("", "metadata key 'general.architecture' is missing")),
    }
}

/// The configuration of a text GGUF and its mmproj, with the special token ids from `tok`.
pub fn config(text: &Gguf, mmproj: &Gguf, tok: &Tokenizer) -> Result<Config> {
    expect_arch(text, TEXT_ARCH)?;
    expect_arch(mmproj, CLIP_ARCH)?;
    match mmproj.get_str("clip.projector_type")? {
        Some(PROJECTOR) => {}
        Some(p) => return Err(mmproj.error("", format!("clip.projector_type is '{}', expected '{}' (a Qwen3-VL mmproj)", p, PROJECTOR))),
        None => return Err(mmproj.error("", "metadata key 'clip.projector_type' is missing")),
    }
    if mmproj.get_bool("clip.has_vision_encoder")? == Some(false) {
        return Err(mmproj.error("", "clip.has_vision_encoder is false: the file has no vision tower"));
    }
    let embd = text.tensor("token_embd.weight").ok_or_else(|| text.error("token_embd.weight", "missing"))?;
    if embd.shape.len() != 2 {
        return Err(text.error("token_embd.weight", format!("shape {:?} is not 2-D", embd.shape)));
    }
    let (vocab, hidden) = (embd.shape[0], text.need_usize(&key("embedding_length"))?);
    let heads = text.need_usize(&key("attention.head_count"))?;
    let kv_heads = text.get_u64(&key("attention.head_count_kv"))?.unwrap_or(heads as u64);
    let head_dim = match text.get_u64(&key("attention.key_length"))? {
        Some(k) => k,
        None => (hidden / heads.max(1)) as u64,
    };
    if let Some(v) = text.get_u64(&key("attention.value_length"))? {
        if v != head_dim {
            return Err(text.error("", format!("{} ({}) differs from the key length {}", key("attention.value_length"), v, head_dim)));
        }
    }
    let sections = match text.get_array(&key("rope.dimension_sections"))? {
        Some(a) if a.len() >= 3 && (3..a.len()).all(|i| a.u64_at(i) == Some(0)) => {
            let s: Option<Vec<u64>> = (0..3).map(|i| a.u64_at(i)).collect();
            s.ok_or_else(|| text.error("", format!("{} must hold non-negative integers", key("rope.dimension_sections"))))?
        }
        Some(a) => return Err(text.error("", format!("{} must be [t, h, w] (then zeros), got {} values", key("rope.dimension_sections"), a.len()))),
        None => return Err(text.error("", format!("metadata key '{}' is missing (the interleaved MRoPE sections)", key("rope.dimension_sections")))),
    };
    let theta = text.get_f64(&key("rope.freq_base"))?.ok_or_else(|| text.error("", format!("metadata key '{}' is missing", key("rope.freq_base"))))?;
    let eps = text.get_f64(&key("attention.layer_norm_rms_epsilon"))?.unwrap_or(1e-6);
    let ctx = text.get_u64(&key("context_length"))?.unwrap_or(128_000);
    let tied = text.tensor("output.weight").is_none();
    let bias = text.tensor("blk.0.attn_q.bias").is_some();

    let v = |k: &str| format!("clip.vision.{}", k);
    let vh = mmproj.need_usize(&v("embedding_length"))?;
    let patch = mmproj.need_usize(&v("patch_size"))?;
    let depth = mmproj.need_usize(&v("block_count"))?;
    let pe = mmproj.tensor(super::names::PATCH_SLICES[0]).ok_or_else(|| mmproj.error(super::names::PATCH_SLICES[0], "missing"))?;
    if pe.shape.len() != 4 || pe.shape[0] != vh || pe.shape[2] != patch || pe.shape[3] != patch {
        return Err(mmproj.error(&pe.name, format!("shape {:?} is not [{}, channels, {}, {}]", pe.shape, vh, patch, patch)));
    }
    let temporal = if mmproj.tensor(super::names::PATCH_SLICES[1]).is_some() { 2 } else { 1 };
    let pos = mmproj.tensor("v.position_embd.weight").ok_or_else(|| mmproj.error("v.position_embd.weight", "missing"))?;
    let num_pos = pos.shape.first().copied().unwrap_or(0);
    let deepstack: Vec<usize> = match mmproj.get_array(&v("is_deepstack_layers"))? {
        Some(Array::Bool(b)) => b.iter().enumerate().filter(|(_, &x)| x).map(|(i, _)| i).collect(),
        Some(_) => return Err(mmproj.error("", format!("metadata key '{}' must be an array of bools", v("is_deepstack_layers")))),
        None => Vec::new(),
    };
    if let Some(n) = text.get_u64(&key("n_deepstack_layers"))? {
        if n as usize != deepstack.len() {
            return Err(text.error("", format!("{} = {} but the mmproj has {} DeepStack layers", key("n_deepstack_layers"), n, deepstack.len())));
        }
    }
    let id = |t: &str| tok.token_to_id(t).ok_or_else(|| text.error("", format!("the tokenizer has no '{}' token", t)));
    let j = json!({
        "model_type": "qwen3_vl",
        "tie_word_embeddings": tied,
        "image_token_id": id("<|image_pad|>")?,
        "video_token_id": id("<|video_pad|>")?,
        "vision_start_token_id": id("<|vision_start|>")?,
        "vision_end_token_id": id("<|vision_end|>")?,
        "text_config": {
            "vocab_size": vocab, "hidden_size": hidden, "intermediate_size": text.need_usize(&key("feed_forward_length"))?,
            "num_hidden_layers": text.need_usize(&key("block_count"))?, "num_attention_heads": heads, "num_key_value_heads": kv_heads,
            "head_dim": head_dim, "rms_norm_eps": eps, "rope_theta": theta, "max_position_embeddings": ctx, "attention_bias": bias,
            "rope_scaling": {"rope_type": "default", "mrope_section": sections},
        },
        "vision_config": {
            "depth": depth, "hidden_size": vh, "intermediate_size": mmproj.need_usize(&v("feed_forward_length"))?,
            "num_heads": mmproj.need_usize(&v("attention.head_count"))?, "in_channels": pe.shape[1], "patch_size": patch,
            "spatial_merge_size": mmproj.get_u64(&v("spatial_merge_size"))?.unwrap_or(2), "temporal_patch_size": temporal,
            "out_hidden_size": mmproj.need_usize(&v("projection_dim"))?, "num_position_embeddings": num_pos,
            "deepstack_visual_indexes": deepstack,
        }
    });
    let files = format!("{} + {}", text.file(), mmproj.file());
    Config::from_json(&j.to_string(), &format!("{} (metadata)", files))
}

/// Image preprocessing from an mmproj: patch and merge sizes, mean and std from its metadata
/// (the pixel bounds of Qwen3-VL's processor, `clip.vision.image_min_pixels` /
/// `image_max_pixels` when present).
pub fn preprocess_config(mmproj: &Gguf, temporal: usize) -> Result<PreprocessConfig> {
    let mut c = PreprocessConfig::qwen3_vl_default();
    let v = |k: &str| format!("clip.vision.{}", k);
    c.patch_size = mmproj.need_usize(&v("patch_size"))?;
    c.merge_size = mmproj.get_u64(&v("spatial_merge_size"))?.unwrap_or(2) as usize;
    c.temporal_patch_size = temporal;
    let triple = |k: &str, dflt: [f32; 3]| -> Result<[f32; 3]> {
        match mmproj.get_array(&v(k))? {
            None => Ok(dflt),
            Some(a) if a.len() == 3 => {
                let mut out = [0.0f32; 3];
                for (i, o) in out.iter_mut().enumerate() {
                    *o = a.f64_at(i).ok_or_else(|| mmproj.error("", format!("{} must hold numbers", v(k))))? as f32;
                }
                Ok(out)
            }
            Some(a) => Err(mmproj.error("", format!("{} must hold 3 numbers, got {}", v(k), a.len()))),
        }
    };
    c.image_mean = triple("image_mean", c.image_mean)?;
    c.image_std = triple("image_std", c.image_std)?;
    if c.image_std.iter().any(|&s| !(s > 0.0)) || c.patch_size == 0 || c.merge_size == 0 {
        return Err(mmproj.error("", "image_std must be positive, patch_size and spatial_merge_size nonzero"));
    }
    if let Some(p) = mmproj.get_u64(&v("image_min_pixels"))? {
        c.min_pixels = p as usize;
    }
    if let Some(p) = mmproj.get_u64(&v("image_max_pixels"))? {
        c.max_pixels = p as usize;
    }
    Ok(c)
}

/// Writes the text model's metadata (architecture, sizes) for `cfg`.
pub fn write_text(w: &mut Writer, cfg: &Config, name: &str, file_type: u32) {
    let t = &cfg.text;
    w.set("general.architecture", Value::String(TEXT_ARCH.into()));
    w.set("general.type", Value::String("model".into()));
    w.set("general.name", Value::String(name.into()));
    w.set("general.file_type", Value::U32(file_type));
    w.set("general.quantization_version", Value::U32(2));
    let u = |x: usize| Value::U32(x as u32);
    w.set(&key("context_length"), u(t.max_position_embeddings));
    w.set(&key("embedding_length"), u(t.hidden_size));
    w.set(&key("block_count"), u(t.num_hidden_layers));
    w.set(&key("feed_forward_length"), u(t.intermediate_size));
    w.set(&key("attention.head_count"), u(t.num_attention_heads));
    w.set(&key("attention.head_count_kv"), u(t.num_key_value_heads));
    w.set(&key("attention.key_length"), u(t.head_dim));
    w.set(&key("attention.value_length"), u(t.head_dim));
    w.set(&key("attention.layer_norm_rms_epsilon"), Value::F32(t.rms_norm_eps));
    w.set(&key("rope.freq_base"), Value::F32(t.rope_theta as f32));
    let s = t.mrope_section;
    w.set(&key("rope.dimension_sections"), Value::Array(Array::I32(vec![s[0] as i32, s[1] as i32, s[2] as i32, 0])));
    w.set(&key("n_deepstack_layers"), u(cfg.vision.deepstack_visual_indexes.len()));
    w.set(&key("vocab_size"), u(t.vocab_size));
}

/// Writes the mmproj metadata for `cfg`'s vision tower and the preprocessing `pre`.
pub fn write_vision(w: &mut Writer, cfg: &Config, pre: &PreprocessConfig, name: &str, file_type: u32) {
    let v = &cfg.vision;
    let u = |x: usize| Value::U32(x as u32);
    w.set("general.architecture", Value::String(CLIP_ARCH.into()));
    w.set("general.type", Value::String("mmproj".into()));
    w.set("general.name", Value::String(name.into()));
    w.set("general.file_type", Value::U32(file_type));
    w.set("general.quantization_version", Value::U32(2));
    w.set("clip.projector_type", Value::String(PROJECTOR.into()));
    w.set("clip.has_vision_encoder", Value::Bool(true));
    w.set("clip.use_gelu", Value::Bool(true));
    let side = (v.num_position_embeddings as f64).sqrt() as usize;
    w.set("clip.vision.image_size", u(side * v.patch_size));
    w.set("clip.vision.patch_size", u(v.patch_size));
    w.set("clip.vision.embedding_length", u(v.hidden_size));
    w.set("clip.vision.feed_forward_length", u(v.intermediate_size));
    w.set("clip.vision.projection_dim", u(v.out_hidden_size));
    w.set("clip.vision.block_count", u(v.depth));
    w.set("clip.vision.attention.head_count", u(v.num_heads));
    w.set("clip.vision.attention.layer_norm_epsilon", Value::F32(cfg.text.rms_norm_eps));
    w.set("clip.vision.spatial_merge_size", u(v.spatial_merge_size));
    w.set("clip.vision.image_mean", Value::Array(Array::F32(pre.image_mean.to_vec())));
    w.set("clip.vision.image_std", Value::Array(Array::F32(pre.image_std.to_vec())));
    w.set("clip.vision.image_min_pixels", u(pre.min_pixels));
    w.set("clip.vision.image_max_pixels", u(pre.max_pixels));
    w.set("clip.vision.is_deepstack_layers", Value::Array(Array::Bool((0..v.depth).map(|i| v.deepstack_visual_indexes.contains(&i)).collect())));
}

/// An error in the metadata of `g` (for callers outside this module).
pub fn error(g: &Gguf, msg: impl Into<String>) -> Error {
    g.error("", msg)
}
