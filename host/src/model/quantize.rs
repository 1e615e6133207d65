//! Quantization mixes, applied at load (`--quant`) or when writing GGUF files (`quantize`).
//!
//! * `q8_0`: every 2-D weight (text and vision) in `Q8_0`.
//! * `q4_k_m`: llama.cpp's Q4_K_M rules for the text model: `Q6_K` for the LM head (and for
//!   the token embedding when it is the tied head), `Q6_K` for `attn_v` and `ffn_down` in the
//!   layers llama.cpp's `use_more_bits` picks (the first and last eighth, and every third layer
//!   between), `Q4_K` for every other weight. One deviation: in the layers where `attn_v` is
//!   `Q6_K`, `attn_q` and `attn_k` are too, so that the three stack into the fused QKV weight
//!   without converting any of them (about 1.5 % more bytes on the 2B model). The vision tower
//!   takes `Q8_0` (as the published Q4_K_M files pair with a Q8_0 or F16 mmproj).
//! * `f16`: every 2-D weight in F16.
//!
//! As in llama.cpp, norms and biases (1-D) stay f32 and the vision position and patch
//! embeddings are not quantized; a row length that is not a whole number of blocks falls back
//! to `Q8_0` (for K-quants, where llama.cpp would use `Q5_0`, a type this engine does not
//! have), then to the stored type.

use super::config::Config;
use super::source::{to_f32, Raw, TensorSource};
use crate::{DType, Result};
use std::borrow::Cow;

/// A quantization mix.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mix {
    Q8_0,
    Q4KM,
    F16,
}

impl Mix {
    pub fn parse(s: &str) -> Option<Mix> {
        match s.to_ascii_lowercase().as_str() {
            "q8_0" => Some(Mix::Q8_0),
            "q4_k_m" => Some(Mix::Q4KM),
            "f16" => Some(Mix::F16),
            _ => None,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Mix::Q8_0 => "Q8_0",
            Mix::Q4KM => "Q4_K_M",
            Mix::F16 => "F16",
        }
    }

    /// llama.cpp's `general.file_type` of the text model.
    pub fn file_type(self) -> u32 {
        use crate::gguf::meta::file_type::*;
        match self {
            Mix::Q8_0 => MOSTLY_Q8_0,
            Mix::Q4KM => MOSTLY_Q4_K_M,
            Mix::F16 => MOSTLY_F16,
        }
    }

    /// The type of the vision tower's weights under this mix.
    pub fn vision(self) -> Mix {
        if self == Mix::F16 {
            Mix::F16
        } else {
            Mix::Q8_0
        }
    }
}

/// llama.cpp's `use_more_bits`: the layers of a Q4_K_M model that get 6 bits.
pub fn use_more_bits(layer: usize, layers: usize) -> bool {
    layer < layers / 8 || layer >= 7 * layers / 8 || (layer as isize - (layers / 8) as isize).rem_euclid(3) == 2
}

/// The layer of a text checkpoint name, if any.
fn layer_of(name: &str) -> Option<usize> {
    name.strip_prefix("model.language_model.layers.")?.split('.').next()?.parse().ok()
}

/// The type `mix` gives the checkpoint tensor `name` of `shape`, or `None` to keep it as stored:
/// [`wanted_type`], or `Q8_0` when the rows are not whole blocks of it (then the stored type
/// when they are not whole `Q8_0` blocks either).
pub fn type_for(mix: Mix, cfg: &Config, name: &str, shape: &[usize]) -> Option<DType> {
    let want = wanted_type(mix, cfg, name, shape)?;
    [want, DType::Q8_0].iter().copied().find(|d| d.row_bytes(shape[1]).is_some())
}

/// The type `mix`'s rules ask for the checkpoint tensor `name` of `shape`, before any fallback
/// for rows that are not whole blocks; `None` for tensors the mix keeps as stored.
pub fn wanted_type(mix: Mix, cfg: &Config, name: &str, shape: &[usize]) -> Option<DType> {
    let is_weight = name.ends_with(".weight") && shape.len() == 2 && !name.contains("norm");
    if !is_weight || name.contains("pos_embed") || name.contains("patch_embed") {
        return None;
    }
    let vision = name.starts_with("model.visual.");
    let mix = if vision { mix.vision() } else { mix };
    let want = match mix {
        Mix::F16 => DType::F16,
        Mix::Q8_0 => DType::Q8_0,
        Mix::Q4KM => {
            let layers = cfg.text.num_hidden_layers;
            let more = layer_of(name).map_or(false, |l| use_more_bits(l, layers));
            let head = name == "lm_head.weight" || (cfg.tie_word_embeddings && name.ends_with("embed_tokens.weight"));
            let six = name.contains("v_proj") || name.contains("down_proj") || name.contains("q_proj") || name.contains("k_proj");
            if head || (more && six) {
                DType::Q6K
            } else {
                DType::Q4K
            }
        }
    };
    Some(want)
}

/// What a mix made of a checkpoint: tensors and bytes per type, and the tensors that could not
/// take the type the mix asked for (rows that are not whole blocks of it).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct MixReport {
    /// `(type, tensors, bytes)`, in the order first seen.
    pub by_type: Vec<(DType, usize, usize)>,
    /// `(tensor, asked for, got, row length)`.
    pub fallbacks: Vec<(String, DType, DType, usize)>,
}

impl MixReport {
    /// The report of `mix` over the tensors `(name, shape, stored type)` of a checkpoint.
    pub fn of<'a>(mix: Mix, cfg: &Config, tensors: impl IntoIterator<Item = (&'a str, &'a [usize], DType)>) -> MixReport {
        let mut r = MixReport::default();
        for (name, shape, stored) in tensors {
            let wanted = wanted_type(mix, cfg, name, shape);
            r.add(name, shape, wanted, type_for(mix, cfg, name, shape).unwrap_or(stored));
        }
        r
    }

    /// Counts tensor `name` of `shape`, stored as `got` where the mix asked for `wanted`.
    pub fn add(&mut self, name: &str, shape: &[usize], wanted: Option<DType>, got: DType) {
        let cols = shape.last().copied().unwrap_or(1);
        let rows: usize = shape[..shape.len().saturating_sub(1)].iter().product();
        let bytes = rows * got.row_bytes(cols).unwrap_or(cols * got.size_of());
        match self.by_type.iter_mut().find(|(d, _, _)| *d == got) {
            Some(e) => {
                e.1 += 1;
                e.2 += bytes;
            }
            None => self.by_type.push((got, 1, bytes)),
        }
        if let Some(w) = wanted.filter(|&w| w != got) {
            self.fallbacks.push((name.to_string(), w, got, cols));
        }
    }

    /// `q4_k 1.10 GB (168 tensors), q6_k 401.2 MB (30), f32 3.1 MB (113)`, largest first.
    pub fn describe(&self) -> String {
        let size = |b: usize| match b as f64 {
            x if x >= 1e9 => format!("{:.2} GB", x / 1e9),
            x if x >= 1e6 => format!("{:.1} MB", x / 1e6),
            x => format!("{:.1} kB", x / 1e3),
        };
        let mut v = self.by_type.clone();
        v.sort_by(|a, b| b.2.cmp(&a.2));
        v.iter()
            .enumerate()
            .map(|(i, (d, n, bytes))| format!("{} {} ({}{})", d, size(*bytes), n, if i == 0 { " tensors" } else { "" }))
            .collect::<Vec<_>>()
            .join(", ")
    }

    /// A warning naming the tensors that did not get the type asked for, or `None`.
    pub fn warning(&self) -> Option<String> {
        let (name, want, got, cols) = self.fallbacks.first()?;
        let shown: Vec<&str> = self.fallbacks.iter().take(4).map(|f| f.0.as_str()).collect();
        Some(format!(
            "{} tensor(s) could not take the type asked for: rows of {} values are not whole {}-value blocks of {}, so {} is {} instead{} ({}{})",
            self.fallbacks.len(),
            cols,
            want.block_size(),
            want,
            name,
            got,
            if self.fallbacks.len() > 1 { ", and so on" } else { "" },
            shown.join(", "),
            if self.fallbacks.len() > shown.len() { ", ..." } else { "" }
        ))
    }
}

/// A source whose weights are quantized as `mix` says while loading.
pub struct Quantized<'a> {
    pub inner: &'a dyn TensorSource,
    pub mix: Mix,
    pub config: Config,
    /// Only the vision tower's 16- and 32-bit weights change (to what `mix` asks of them);
    /// everything else, and weights stored quantized already, load as stored.
    pub vision_only: bool,
}

/// What a load converts: the whole checkpoint to a mix (`--quant`), and/or the vision tower's
/// 16- and 32-bit weights to Q8_0 (what a placement under a memory budget may choose, so the
/// tower fits on the device).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct LoadQuant {
    pub mix: Option<Mix>,
    pub vision_q8: bool,
}

impl LoadQuant {
    pub fn mix(mix: Option<Mix>) -> LoadQuant {
        LoadQuant { mix, vision_q8: false }
    }

    /// The converting view of `inner` this load reads through; `None`: `inner` as stored.
    pub fn source<'a>(self, inner: &'a dyn TensorSource, config: &Config) -> Option<Quantized<'a>> {
        match (self.mix, self.vision_q8) {
            (Some(mix), _) => Some(Quantized { inner, mix, config: config.clone(), vision_only: false }),
            (None, true) => Some(Quantized { inner, mix: Mix::Q8_0, config: config.clone(), vision_only: true }),
            (None, false) => None,
        }
    }
}

impl Quantized<'_> {
    fn skips(&self, name: &str) -> bool {
        self.vision_only && !name.starts_with("model.visual.")
    }
}

impl TensorSource for Quantized<'_> {
    fn describe(&self) -> String {
        if self.vision_only {
            format!("{} (vision tower quantized to {} while loading)", self.inner.describe(), self.mix.vision().name())
        } else {
            format!("{} (quantized to {} while loading)", self.inner.describe(), self.mix.name())
        }
    }
    fn contains(&self, name: &str) -> bool {
        self.inner.contains(name)
    }
    fn bytes_of(&self, name: &str) -> usize {
        self.inner.bytes_of(name)
    }
    fn total_bytes(&self) -> usize {
        self.inner.total_bytes()
    }
    fn stored_bytes(&self, name: &str, shape: &[usize]) -> usize {
        let stored = self.inner.stored_bytes(name, shape);
        match type_for(self.mix, &self.config, name, shape) {
            // a vision-only load leaves weights stored quantized as they are
            Some(t) if self.vision_only && !self.skips(name) => stored.min(shape[0] * t.row_bytes(shape[1]).unwrap_or(usize::MAX)),
            Some(t) if self.inner.contains(name) && !self.skips(name) => shape[0] * t.row_bytes(shape[1]).unwrap_or(0),
            _ => stored,
        }
    }
    fn raw(&self, name: &str, shape: &[usize]) -> Result<Raw<'_>> {
        let r = self.inner.raw(name, shape)?;
        if self.skips(name) || (self.vision_only && r.dtype.is_quantized()) {
            return Ok(r);
        }
        match type_for(self.mix, &self.config, name, shape) {
            Some(t) if t != r.dtype => {
                let f = to_f32(name, shape, &r)?;
                let bytes = crate::quant::quantize_vec_par(t, &f, shape[0]).expect("type_for checked the row length");
                Ok(Raw { dtype: t, bytes: Cow::Owned(bytes), mapped: None, file: r.file })
            }
            _ => Ok(r),
        }
    }
    fn unused(&self, ignored_prefixes: &[&str]) -> Vec<String> {
        self.inner.unused(ignored_prefixes)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn more_bits_layers_match_llama_cpp_for_28_layers() {
        let picked: Vec<usize> = (0..28).filter(|&l| use_more_bits(l, 28)).collect();
        assert_eq!(picked, vec![0, 1, 2, 5, 8, 11, 14, 17, 20, 23, 24, 25, 26, 27]);
    }

    #[test]
    fn the_mix_report_counts_bytes_per_type_and_names_fallbacks() {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures/text/tied_gqa");
        let cfg = Config::from_dir(&dir).unwrap();
        // hidden 64: a row is two Q8_0 blocks but no whole 256-value K-quant block
        let tensors: Vec<(&str, Vec<usize>, DType)> = vec![
            ("model.language_model.layers.0.mlp.up_proj.weight", vec![128, 64], DType::F32),
            ("model.language_model.layers.0.mlp.down_proj.weight", vec![64, 128], DType::F32),
            ("model.language_model.layers.0.input_layernorm.weight", vec![64], DType::F32),
        ];
        let r = MixReport::of(Mix::Q4KM, &cfg, tensors.iter().map(|(n, s, d)| (*n, &s[..], *d)));
        assert_eq!(r.by_type, vec![(DType::Q8_0, 2, 2 * 128 * 2 * 34), (DType::F32, 1, 256)]);
        assert_eq!(r.fallbacks.len(), 2);
        let w = r.warning().unwrap();
        assert!(w.starts_with("2 tensor(s) could not take the type asked for: rows of 64 values are not whole 256-value blocks of q"), "{}", w);
        assert!(w.contains("up_proj") && w.contains("q8_0 instead"), "{}", w);
        assert_eq!(r.describe(), "q8_0 17.4 kB (2 tensors), f32 0.3 kB (1)");
        // Q8_0 takes these rows: nothing to warn about
        let r = MixReport::of(Mix::Q8_0, &cfg, tensors.iter().map(|(n, s, d)| (*n, &s[..], *d)));
        assert!(r.warning().is_none() && r.fallbacks.is_empty());
    }
}
