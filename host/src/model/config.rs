//! `config.json` of a Qwen3-VL checkpoint, in both forms seen in the wild: the hub's
//! (`rope_scaling` + `rope_theta`) and transformers 5's (`rope_parameters`). Every size comes
//! from here; nothing about the architecture is hard-coded elsewhere.

use crate::{Error, Result};
use serde_json::Value;
use std::path::Path;

/// The text decoder's shape.
#[derive(Clone, Debug, PartialEq)]
pub struct TextConfig {
    pub vocab_size: usize,
    pub hidden_size: usize,
    pub intermediate_size: usize,
    pub num_hidden_layers: usize,
    pub num_attention_heads: usize,
    pub num_key_value_heads: usize,
    pub head_dim: usize,
    pub rms_norm_eps: f32,
    pub rope_theta: f64,
    /// Frequencies per axis (t, h, w) of the interleaved multimodal RoPE; sums to head_dim / 2.
    pub mrope_section: [usize; 3],
    pub max_position_embeddings: usize,
    pub attention_bias: bool,
}

/// The vision tower's shape.
#[derive(Clone, Debug, PartialEq)]
pub struct VisionConfig {
    pub depth: usize,
    pub hidden_size: usize,
    pub intermediate_size: usize,
    pub num_heads: usize,
    pub in_channels: usize,
    pub patch_size: usize,
    pub spatial_merge_size: usize,
    pub temporal_patch_size: usize,
    pub out_hidden_size: usize,
    pub num_position_embeddings: usize,
    pub deepstack_visual_indexes: Vec<usize>,
}

#[derive(Clone, Debug, PartialEq)]
pub struct Config {
    pub text: TextConfig,
    pub vision: VisionConfig,
    pub tie_word_embeddings: bool,
    pub image_token_id: u32,
    pub video_token_id: u32,
    pub vision_start_token_id: u32,
    pub vision_end_token_id: u32,
}

impl Config {
    /// The image and video placeholder ids.
    pub fn vision_tokens(&self) -> super::positions::VisionTokens {
        super::positions::VisionTokens { image: self.image_token_id, video: self.video_token_id }
    }
}

/// Reads fields of one JSON object, naming the file and key path in errors.
struct Obj<'a> {
    file: &'a str,
    path: &'a str,
    v: &'a Value,
}

impl<'a> Obj<'a> {
    fn err(&self, key: &str, msg: &str) -> Error {
        Error::Config { file: self.file.to_string(), msg: format!("{}{}: {}", self.path, key, msg) }
    }
    fn get(&self, key: &str) -> Option<&'a Value> {
        self.v.get(key).filter(|v| !v.is_null())
    }
    fn usize_or(&self, key: &str, default: Option<usize>) -> Result<usize> {
        match self.get(key) {
            Some(v) => v.as_u64().map(|x| x as usize).ok_or_else(|| self.err(key, "must be a non-negative integer")),
            None => default.ok_or_else(|| self.err(key, "is missing")),
        }
    }
    fn usize(&self, key: &str) -> Result<usize> {
        self.usize_or(key, None)
    }
    fn f64_or(&self, key: &str, default: Option<f64>) -> Result<f64> {
        match self.get(key) {
            Some(v) => v.as_f64().ok_or_else(|| self.err(key, "must be a number")),
            None => default.ok_or_else(|| self.err(key, "is missing")),
        }
    }
    fn bool_or(&self, key: &str, default: bool) -> Result<bool> {
        match self.get(key) {
            Some(v) => v.as_bool().ok_or_else(|| self.err(key, "must be true or false")),
            None => Ok(default),
        }
    }
    fn str_or(&self, key: &str, default: &'a str) -> Result<&'a str> {
        match self.get(key) {
            Some(v) => v.as_str().ok_or_else(|| self.err(key, "must be a string")),
            None => Ok(default),
        }
    }
    fn child(&self, key: &'a str, path: &'a str) -> Result<Obj<'a>> {
        match self.get(key) {
            Some(v) if v.is_object() => Ok(Obj { file: self.file, path, v }),
            _ => Err(self.err(key, "is missing or not an object")),
        }
    }
}

impl Config {
    /// Reads `<dir>/config.json`.
    pub fn from_dir(dir: &Path) -> Result<Config> {
        let path = dir.join("config.json");
        let text = std::fs::read_to_string(&path).map_err(|e| Error::io(&path, e))?;
        Config::from_json(&text, &path.display().to_string())
    }

    /// Parses a config.json text; `file` names it in errors.
    pub fn from_json(text: &str, file: &str) -> Result<Config> {
        let v: Value = serde_json::from_str(text).map_err(|e| Error::Config { file: file.into(), msg: format!("not valid JSON: {}", e) })?;
        let root = Obj { file, path: "", v: &v };
        let mt = root.str_or("model_type", "qwen3_vl")?;
        if mt != "qwen3_vl" {
            return Err(root.err("model_type", &format!("'{}' is not supported (expected qwen3_vl)", mt)));
        }
        let text = parse_text(&root.child("text_config", "text_config.")?)?;
        let vision = parse_vision(&root.child("vision_config", "vision_config.")?)?;
        if vision.out_hidden_size != text.hidden_size {
            return Err(root.err("vision_config.out_hidden_size", &format!("{} differs from text_config.hidden_size {}", vision.out_hidden_size, text.hidden_size)));
        }
        let tc = root.child("text_config", "text_config.")?;
        let tie = match root.get("tie_word_embeddings") {
            Some(_) => root.bool_or("tie_word_embeddings", false)?,
            None => tc.bool_or("tie_word_embeddings", false)?,
        };
        let id = |key: &str, default: usize| -> Result<u32> {
            let v = root.usize_or(key, Some(default))?;
            u32::try_from(v).map_err(|_| root.err(key, &format!("{} is not a token id (ids are below 2^32)", v)))
        };
        let config = Config {
            text,
            vision,
            tie_word_embeddings: tie,
            image_token_id: id("image_token_id", 151_655)?,
            video_token_id: id("video_token_id", 151_656)?,
            vision_start_token_id: id("vision_start_token_id", 151_652)?,
            vision_end_token_id: id("vision_end_token_id", 151_653)?,
        };
        check_bounds(&config, file)?;
        Ok(config)
    }
}

/// The most a size in config.json may be, far above any Qwen3-VL checkpoint (the 2B's values
/// are in brackets) yet small enough that what is allocated from them before the weights are
/// compared against them (layer lists, RoPE tables, plans) stays small and no product of them
/// overflows: `(key, value, most)`. Every size must also be at least 1.
fn bounds(c: &Config) -> [(&'static str, usize, usize); 18] {
    let (t, v) = (&c.text, &c.vision);
    [
        ("text_config.vocab_size", t.vocab_size, 1 << 24),                       // [151,936]
        ("text_config.hidden_size", t.hidden_size, 1 << 16),                     // [2,048]
        ("text_config.intermediate_size", t.intermediate_size, 1 << 20),         // [6,144]
        ("text_config.num_hidden_layers", t.num_hidden_layers, 1024),            // [28]
        ("text_config.num_attention_heads", t.num_attention_heads, 1024),        // [16]
        ("text_config.num_key_value_heads", t.num_key_value_heads, 1024),        // [8]
        ("text_config.head_dim", t.head_dim, 1024),                              // [128]
        ("text_config.max_position_embeddings", t.max_position_embeddings, 1 << 24), // [262,144]
        ("vision_config.depth", v.depth, 1024),                                  // [24]
        ("vision_config.hidden_size", v.hidden_size, 1 << 16),                   // [1,024]
        ("vision_config.intermediate_size", v.intermediate_size, 1 << 20),       // [4,096]
        ("vision_config.num_heads", v.num_heads, 1024),                          // [16]
        ("vision_config.in_channels", v.in_channels, 16),                        // [3]
        ("vision_config.patch_size", v.patch_size, 256),                         // [16]
        ("vision_config.spatial_merge_size", v.spatial_merge_size, 16),          // [2]
        ("vision_config.temporal_patch_size", v.temporal_patch_size, 16),        // [2]
        ("vision_config.out_hidden_size", v.out_hidden_size, 1 << 16),           // [2,048]
        ("vision_config.num_position_embeddings", v.num_position_embeddings, 1 << 24), // [2,304]
    ]
}

/// Refuses a size outside [`bounds`], naming the key, its value and the limit.
fn check_bounds(c: &Config, file: &str) -> Result<()> {
    for (key, value, most) in bounds(c) {
        if value == 0 || value > most {
            return Err(Error::Config { file: file.into(), msg: format!("{} = {} is out of range (1 to {})", key, value, most) });
        }
    }
    for (key, x) in [("text_config.rms_norm_eps", c.text.rms_norm_eps as f64), ("text_config.rope_theta", c.text.rope_theta)] {
        if !(x.is_finite() && x > 0.0) {
            return Err(Error::Config { file: file.into(), msg: format!("{} = {} must be a positive finite number", key, x) });
        }
    }
    Ok(())
}

fn parse_text(t: &Obj<'_>) -> Result<TextConfig> {
    let hidden_size = t.usize("hidden_size")?;
    let num_attention_heads = t.usize("num_attention_heads")?;
    if num_attention_heads == 0 {
        return Err(t.err("num_attention_heads", "must be positive"));
    }
    let num_key_value_heads = t.usize_or("num_key_value_heads", Some(num_attention_heads))?;
    if num_key_value_heads == 0 || num_attention_heads % num_key_value_heads != 0 {
        return Err(t.err("num_key_value_heads", &format!("{} must divide num_attention_heads {}", num_key_value_heads, num_attention_heads)));
    }
    let head_dim = t.usize_or("head_dim", Some(hidden_size / num_attention_heads))?;
    if head_dim == 0 || head_dim % 2 != 0 {
        return Err(t.err("head_dim", "must be positive and even"));
    }
    let act = t.str_or("hidden_act", "silu")?;
    if act != "silu" {
        return Err(t.err("hidden_act", &format!("'{}' is not supported (expected silu)", act)));
    }
    // transformers 5: rope_parameters {rope_type, rope_theta, mrope_section, ...};
    // the hub: rope_scaling {rope_type | type, mrope_section, ...} beside rope_theta.
    let (rope, rope_path, theta) = if let Some(rp) = t.get("rope_parameters") {
        let o = Obj { file: t.file, path: "text_config.rope_parameters.", v: rp };
        let theta = o.f64_or("rope_theta", Some(t.f64_or("rope_theta", Some(5_000_000.0))?))?;
        (Some(rp), o.path, theta)
    } else {
        (t.get("rope_scaling"), "text_config.rope_scaling.", t.f64_or("rope_theta", Some(5_000_000.0))?)
    };
    let mut mrope_section = [24, 20, 20];
    if let Some(r) = rope {
        let o = Obj { file: t.file, path: rope_path, v: r };
        let kind = match o.get("rope_type") {
            Some(_) => o.str_or("rope_type", "default")?,
            None => o.str_or("type", "default")?,
        };
        if kind != "default" && kind != "mrope" {
            return Err(o.err("rope_type", &format!("'{}' is not supported (expected default)", kind)));
        }
        if let Some(sec) = o.get("mrope_section") {
            let xs: Vec<usize> = sec.as_array().map(|a| a.iter().filter_map(|x| x.as_u64().map(|x| x as usize)).collect()).unwrap_or_default();
            if xs.len() != 3 {
                return Err(o.err("mrope_section", "must be three integers [t, h, w]"));
            }
            mrope_section = [xs[0], xs[1], xs[2]];
        }
    }
    if mrope_section.iter().try_fold(0usize, |a, &x| a.checked_add(x)) != Some(head_dim / 2) {
        return Err(t.err("rope mrope_section", &format!("{:?} must sum to head_dim / 2 = {}", mrope_section, head_dim / 2)));
    }
    Ok(TextConfig {
        vocab_size: t.usize("vocab_size")?,
        hidden_size,
        intermediate_size: t.usize("intermediate_size")?,
        num_hidden_layers: t.usize("num_hidden_layers")?,
        num_attention_heads,
        num_key_value_heads,
        head_dim,
        rms_norm_eps: t.f64_or("rms_norm_eps", Some(1e-6))? as f32,
        rope_theta: theta,
        mrope_section,
        max_position_embeddings: t.usize_or("max_position_embeddings", Some(128_000))?,
        attention_bias: t.bool_or("attention_bias", false)?,
    })
}

fn parse_vision(v: &Obj<'_>) -> Result<VisionConfig> {
    let hidden_size = v.usize_or("hidden_size", Some(1152))?;
    let num_heads = v.usize_or("num_heads", Some(16))?;
    if num_heads == 0 || hidden_size % num_heads != 0 || (hidden_size / num_heads) % 4 != 0 {
        return Err(v.err("num_heads", &format!("{} must divide hidden_size {} into heads of a multiple of 4", num_heads, hidden_size)));
    }
    let act = v.str_or("hidden_act", "gelu_pytorch_tanh")?;
    if act != "gelu_pytorch_tanh" {
        return Err(v.err("hidden_act", &format!("'{}' is not supported (expected gelu_pytorch_tanh)", act)));
    }
    let depth = v.usize_or("depth", Some(27))?;
    let deepstack: Vec<usize> = match v.get("deepstack_visual_indexes") {
        Some(a) => a
            .as_array()
            .and_then(|a| a.iter().map(|x| x.as_u64().map(|x| x as usize)).collect::<Option<Vec<_>>>())
            .ok_or_else(|| v.err("deepstack_visual_indexes", "must be a list of integers"))?,
        None => vec![8, 16, 24],
    };
    if let Some(bad) = deepstack.iter().find(|&&i| i >= depth) {
        return Err(v.err("deepstack_visual_indexes", &format!("index {} is not below depth {}", bad, depth)));
    }
    Ok(VisionConfig {
        depth,
        hidden_size,
        intermediate_size: v.usize_or("intermediate_size", Some(4304))?,
        num_heads,
        in_channels: v.usize_or("in_channels", Some(3))?,
        patch_size: v.usize_or("patch_size", Some(16))?,
        spatial_merge_size: v.usize_or("spatial_merge_size", Some(2))?,
        temporal_patch_size: v.usize_or("temporal_patch_size", Some(2))?,
        out_hidden_size: v.usize_or("out_hidden_size", Some(3584))?,
        num_position_embeddings: v.usize_or("num_position_embeddings", Some(2304))?,
        deepstack_visual_indexes: deepstack,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hub_json(rope: &str) -> String {
        format!(
            r#"{{"model_type":"qwen3_vl","tie_word_embeddings":true,"image_token_id":151655,
            "text_config":{{"vocab_size":151936,"hidden_size":2048,"intermediate_size":6144,"num_hidden_layers":28,
              "num_attention_heads":16,"num_key_value_heads":8,"head_dim":128,"rms_norm_eps":1e-6,{} }},
            "vision_config":{{"depth":24,"hidden_size":1024,"intermediate_size":4096,"num_heads":16,"out_hidden_size":2048,
              "num_position_embeddings":2304,"deepstack_visual_indexes":[5,11,17]}}}}"#,
            rope
        )
    }

    #[test]
    fn both_rope_forms_parse_to_the_same_config() {
        let hub = hub_json(r#""rope_theta":5000000,"rope_scaling":{"rope_type":"default","mrope_section":[24,20,20],"mrope_interleaved":true}"#);
        let tf5 = hub_json(r#""rope_parameters":{"rope_type":"default","rope_theta":5000000.0,"mrope_section":[24,20,20],"mrope_interleaved":true}"#);
        let a = Config::from_json(&hub, "hub").unwrap();
        let b = Config::from_json(&tf5, "tf5").unwrap();
        assert_eq!(a, b);
        assert_eq!(a.text.num_hidden_layers, 28);
        assert_eq!((a.text.num_attention_heads, a.text.num_key_value_heads, a.text.head_dim), (16, 8, 128));
        assert_eq!(a.text.rope_theta, 5e6);
        assert!(a.tie_word_embeddings);
        assert_eq!(a.vision.deepstack_visual_indexes, vec![5, 11, 17]);
    }

    #[test]
    fn errors_name_the_file_and_key() {
        let e = Config::from_json(&hub_json(r#""rope_theta":1"#).replace("\"hidden_size\":2048,", ""), "x/config.json").unwrap_err().to_string();
        assert!(e.contains("x/config.json") && e.contains("text_config.hidden_size"), "{}", e);
        let e = Config::from_json(&hub_json(r#""rope_scaling":{"rope_type":"yarn"}"#), "c").unwrap_err().to_string();
        assert!(e.contains("yarn"), "{}", e);
        let e = Config::from_json(&hub_json(r#""rope_scaling":{"mrope_section":[24,20,21]}"#), "c").unwrap_err().to_string();
        assert!(e.contains("mrope_section") && e.contains("64"), "{}", e);
        let e = Config::from_json("{not json", "c").unwrap_err().to_string();
        assert!(e.contains("not valid JSON"), "{}", e);
    }

    /// Sizes past the bounds (a billion layers once aborted on a 440 GB allocation, 2^64 - 1
    /// panicked on a capacity overflow) and zero sizes are refused by name before anything is
    /// allocated from them.
    #[test]
    fn sizes_out_of_bounds_are_refused_by_name() {
        let base = hub_json(r#""rope_theta":5000000"#).replace("[5,11,17]", "[]");
        for (from, to, key) in [
            ("\"num_hidden_layers\":28", "\"num_hidden_layers\":1000000000", "text_config.num_hidden_layers = 1000000000"),
            ("\"num_hidden_layers\":28", "\"num_hidden_layers\":18446744073709551615", "text_config.num_hidden_layers = 18446744073709551615"),
            ("\"num_hidden_layers\":28", "\"num_hidden_layers\":0", "text_config.num_hidden_layers = 0"),
            ("\"vocab_size\":151936", "\"vocab_size\":99999999999", "text_config.vocab_size"),
            ("\"intermediate_size\":4096", "\"intermediate_size\":4294967296", "vision_config.intermediate_size"),
            ("\"depth\":24,", "\"depth\":0,", "vision_config.depth = 0"),
            ("\"image_token_id\":151655", "\"image_token_id\":4294967296", "image_token_id: 4294967296 is not a token id"),
            ("\"rms_norm_eps\":1e-6", "\"rms_norm_eps\":0", "text_config.rms_norm_eps"),
        ] {
            assert!(base.contains(from), "{}", from);
            let e = Config::from_json(&base.replace(from, to), "c").unwrap_err().to_string();
            assert!(e.contains(key), "{} -> {}", to, e);
        }
        let deep = base.replace("\"depth\":24", "\"depth\":2000");
        assert!(Config::from_json(&deep, "c").unwrap_err().to_string().contains("vision_config.depth = 2000 is out of range (1 to 1024)"));
        Config::from_json(&base, "c").unwrap();
    }
}
