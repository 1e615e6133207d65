//! Where the model's parts go when the device cannot hold them all (`--gpu-memory`,
//! `--gpu-layers`): text layers `[0, device_layers)` with their KV cache, the LM head (with the
//! final norm), the vision tower and the token embedding on the device, the rest on the host
//! (the CPU backend), the hidden state crossing at the boundaries.
//!
//! The plan is made before any weight loads, from [`Sizes`]: every tensor's bytes as it will be
//! stored (the checkpoint's type, or the load-time quantization's), rounded up as the device's
//! pool rounds allocations, the KV cache at the session's context, and a workspace bound for the
//! activations computed from the shapes. The tower's activations and the text prefill's are
//! never alive at once (the tower's are freed, and the pool gives cached blocks back when the
//! budget is reached), so the workspace is the larger of the two, not their sum.
//!
//! Order of preference, each part placed while it fits:
//! - text prompts: workspace, text layers from the first, LM head, vision tower, then an untied
//!   embedding (a gather of one row per token costs the host nothing);
//! - image prompts (`images`): the vision tower first, since on the CPU it takes seconds per
//!   image where a text layer costs milliseconds, then the same order. When the tower does not
//!   fit beside one text layer and the workspace it goes last, as for text.
//!
//! When some text layers stay on the host, a slot for the largest of their weights is kept on
//! the device (a device layer gives way when nothing else makes room): forwards of at least
//! [`STREAM_MIN_ROWS`] rows (prefill chunks) upload each host layer's weights into it and run
//! the layer on the device, as llama.cpp does for large batches; the layer's KV cache stays on
//! the host (a contiguous cache lends its rows to the device for the forward; the engine's
//! paged one appends on the host and sends each prefill chunk's gathered keys and values to
//! the device: `LayerKv::attend_streamed`). A prompt of a thousand tokens
//! then costs the uploads where the host's cores took seconds.
//! `QWEN3_VL_STREAM_LAYERS=0` plans without the slot (an A/B aid).

use super::config::Config;
use super::source::TensorSource;
use super::names::{TEXT_PREFIX, VISION_PREFIX};
use crate::{DType, Error, Result};

/// Bytes each part takes on the device.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Sizes {
    /// Weights of each text layer.
    pub layers: Vec<usize>,
    /// Keys and values of one layer at the context.
    pub kv_layer: usize,
    /// The token embedding.
    pub embed: usize,
    /// The LM head and the final norm (the embedding again when tied).
    pub head: usize,
    pub tied: bool,
    /// The vision tower's weights.
    pub vision: usize,
    /// Activations of a prefill of the whole context, logits, small buffers.
    pub text_work: usize,
    /// Activations of the vision tower on images filling the context.
    pub vision_work: usize,
}

/// Rows from which a forward streams the host layers' weights through the device.
pub const STREAM_MIN_ROWS: usize = 32;

/// Whether plans keep a slot for streaming host layers (`QWEN3_VL_STREAM_LAYERS=0`: no).
static STREAM: crate::switch::Switch = crate::switch::Switch::new("QWEN3_VL_STREAM_LAYERS");

/// Small buffers besides the activations: attention counters, cursors, recorded decode steps,
/// rotary tables.
const SMALL_BUFFERS: usize = 32 << 20;

impl Sizes {
    /// Sizes of the model of `cfg` whose tensors `src` holds, for sessions of `context` tokens
    /// with a KV cache of `kv_dtype` and prompts of up to `image_tokens` image tokens (the
    /// vision tower's activations; clamped to the context); `alloc` rounds one allocation as
    /// the device does, `weights` one weight (see `Backend::weight_alloc_size`).
    pub fn estimate(src: &dyn TensorSource, cfg: &Config, context: usize, image_tokens: usize, kv_dtype: DType, alloc: &dyn Fn(usize) -> usize, weights: &dyn Fn(usize) -> usize) -> Sizes {
        let t = &cfg.text;
        let (h, d, i) = (t.hidden_size, t.head_dim, t.intermediate_size);
        let (qd, kvd) = (t.num_attention_heads * d, t.num_key_value_heads * d);
        let w = |name: &str, shape: &[usize]| weights(src.stored_bytes(name, shape));
        let f32s = |n: usize| weights(n * 4);
        // 1. text layers: the fused qkv is one allocation, norms and biases are f32
        let layers = (0..t.num_hidden_layers)
            .map(|l| {
                let p = format!("{}layers.{}.", TEXT_PREFIX, l);
                let a = |proj: &str| format!("{}self_attn.{}.weight", p, proj);
                let qkv = src.stored_bytes(&a("q_proj"), &[qd, h]) + src.stored_bytes(&a("k_proj"), &[kvd, h]) + src.stored_bytes(&a("v_proj"), &[kvd, h]);
                let bias = if t.attention_bias { f32s(qd + 2 * kvd) + f32s(h) } else { 0 };
                weights(qkv) + bias + w(&a("o_proj"), &[h, qd]) + 2 * f32s(d) + 2 * f32s(h)
                    + w(&format!("{}mlp.gate_proj.weight", p), &[i, h])
                    + w(&format!("{}mlp.up_proj.weight", p), &[i, h])
                    + w(&format!("{}mlp.down_proj.weight", p), &[h, i])
            })
            .collect();
        let kv_layer = 2 * alloc(context * kvd * kv_dtype.size_of());
        let embed = w(&format!("{}embed_tokens.weight", TEXT_PREFIX), &[t.vocab_size, h]);
        let head = f32s(h) + if cfg.tie_word_embeddings { embed } else { w("lm_head.weight", &[t.vocab_size, h]) };
        // 2. the vision tower (the position table as f32)
        let v = &cfg.vision;
        let (vh, vi) = (v.hidden_size, v.intermediate_size);
        let row = v.in_channels * v.temporal_patch_size * v.patch_size * v.patch_size;
        let vp = VISION_PREFIX;
        let linear = |name: &str, out: usize, inp: usize| w(&format!("{}.weight", name), &[out, inp]) + f32s(out);
        let mut vision = w(&format!("{}patch_embed.proj.weight", vp), &[vh, v.in_channels, v.temporal_patch_size, v.patch_size, v.patch_size]) + f32s(vh) + f32s(v.num_position_embeddings * vh);
        for k in 0..v.depth {
            let p = format!("{}blocks.{}.", vp, k);
            let qkv = src.stored_bytes(&format!("{}attn.qkv.weight", p), &[3 * vh, vh]);
            vision += 3 * (weights(qkv / 3) + f32s(vh)) + 4 * f32s(vh);
            vision += linear(&format!("{}attn.proj", p), vh, vh) + linear(&format!("{}mlp.linear_fc1", p), vi, vh) + linear(&format!("{}mlp.linear_fc2", p), vh, vi);
        }
        let m = vh * v.spatial_merge_size * v.spatial_merge_size;
        let merger = |name: &str, norm: usize| 2 * f32s(norm) + linear(&format!("{}.linear_fc1", name), m, m) + linear(&format!("{}.linear_fc2", name), v.out_hidden_size, m);
        vision += merger(&format!("{}merger", vp), vh);
        for k in 0..v.deepstack_visual_indexes.len() {
            vision += merger(&format!("{}deepstack_merger_list.{}", vp, k), m);
        }
        // 3. activations: a prefill of `context` rows through one layer (x, its norm, the
        //    residual, qkv, queries, attention output, gate / up / their product), image
        //    embeddings and DeepStack features for as many rows, the logits; the vision tower
        //    on the patches of `image_tokens` image tokens
        let rows = |n: usize, width: usize| alloc(n * width * 4);
        let c = context;
        let text_work = 3 * rows(c, h) + rows(c, qd + 2 * kvd) + 2 * rows(c, qd) + 3 * rows(c, i)
            + (1 + v.deepstack_visual_indexes.len()) * rows(c, v.out_hidden_size)
            + 2 * rows(1, t.vocab_size)
            + SMALL_BUFFERS;
        let it = image_tokens.min(c);
        let patches = it * v.spatial_merge_size * v.spatial_merge_size;
        let vd = vh / v.num_heads.max(1);
        let vision_work = rows(patches, row) + 7 * rows(patches, vh) + 2 * rows(patches, vi) + 2 * rows(patches, vd / 2) + 2 * rows(it, m);
        Sizes { layers, kv_layer, embed, head, tied: cfg.tie_word_embeddings, vision, text_work, vision_work }
    }

    /// Everything on the device.
    pub fn total(&self) -> usize {
        self.layers.iter().sum::<usize>() + self.layers.len() * self.kv_layer + self.head + if self.tied { 0 } else { self.embed } + self.vision + self.text_work.max(self.vision_work)
    }

    /// The workspace the vision tower needs beyond the text's (the two are never alive at once).
    fn vision_extra(&self) -> usize {
        self.vision_work.saturating_sub(self.text_work)
    }
}

/// Which parts of the model run on the device and which on the host.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Placement {
    pub layers: usize,
    /// Text layers `[0, device_layers)` (weights and KV cache) are on the device.
    pub device_layers: usize,
    /// The LM head and the final norm.
    pub head_on_device: bool,
    pub embed_on_device: bool,
    pub vision_on_device: bool,
    /// Planned for image prompts: the vision tower was placed first.
    pub vision_first: bool,
    /// The vision tower's 16- and 32-bit weights load as Q8_0 (chosen by the caller when that
    /// is what lets more of the model on the device; see [`Placement::better_than`]).
    pub vision_q8: bool,
    /// Forwards of at least this many rows run the host layers on the device, their weights
    /// uploaded for the forward (see the module docs); `None`: never.
    pub stream_rows: Option<usize>,
    /// Estimated bytes on the device (weights, KV cache, workspace) and on the host (weights,
    /// KV cache), and the budget the plan was made for.
    pub device_bytes: usize,
    pub host_bytes: usize,
    pub budget: Option<usize>,
}

impl Placement {
    /// Everything on the device (what a plain load does).
    pub fn all_on_device(layers: usize) -> Placement {
        Placement { layers, device_layers: layers, head_on_device: true, embed_on_device: true, vision_on_device: true, vision_first: false, vision_q8: false, stream_rows: None, device_bytes: 0, host_bytes: 0, budget: None }
    }

    /// Whether any part runs on the host.
    pub fn is_split(&self) -> bool {
        self.device_layers < self.layers || !self.head_on_device || !self.embed_on_device || !self.vision_on_device
    }

    /// The placement of `s` within `budget` device bytes (`None`: no bound), with exactly
    /// `device_layers` text layers on the device when given, for image prompts when `images`
    /// (the vision tower placed first; see the module docs). Fails, naming the bytes needed and
    /// available, when the asked-for layers or (otherwise) one text layer with the workspace do
    /// not fit.
    pub fn plan(s: &Sizes, budget: Option<usize>, device_layers: Option<usize>, images: bool) -> Result<Placement> {
        if images {
            if let Ok(p) = Self::plan_ordered(s, budget, device_layers, true) {
                return Ok(p);
            }
        }
        Self::plan_ordered(s, budget, device_layers, false)
    }

    fn plan_ordered(s: &Sizes, budget: Option<usize>, device_layers: Option<usize>, vision_first: bool) -> Result<Placement> {
        let n = s.layers.len();
        let fits = |used: usize, more: usize| budget.map_or(true, |b| used + more <= b);
        let layer = |l: usize| s.layers[l] + s.kv_layer;
        let avail = budget.unwrap_or(usize::MAX);
        let tower = s.vision + s.vision_extra();
        // 1. workspace, the vision tower when it goes first, text layers
        let mut used = s.text_work;
        if vision_first {
            if !fits(used, tower + if n > 0 { layer(0) } else { 0 }) {
                return Err(Error::Budget { needed: used + tower, available: avail, msg: "the vision tower with its workspace and one text layer".into() });
            }
            used += tower;
        }
        let mut g = match device_layers {
            Some(g) if g > n => return Err(Error::Budget { needed: 0, available: avail, msg: format!("--gpu-layers {} but the model has {} text layers", g, n) }),
            Some(g) => {
                let need = used + (0..g).map(layer).sum::<usize>();
                if !fits(need, 0) {
                    return Err(Error::Budget { needed: need, available: avail, msg: format!("{} text layers with their KV cache ({} bytes) and the workspace ({} bytes)", g, need - used, used) });
                }
                used = need;
                g
            }
            None => {
                let mut g = 0;
                while g < n && fits(used, layer(g)) {
                    used += layer(g);
                    g += 1;
                }
                if g == 0 && n > 0 {
                    let need = used + layer(0);
                    return Err(Error::Budget {
                        needed: need,
                        available: avail,
                        msg: format!("the smallest placement is one text layer ({} bytes) with its KV cache ({} bytes) and the workspace ({} bytes); lower --context, raise --gpu-memory or run on the CPU", s.layers[0], s.kv_layer, used),
                    });
                }
                g
            }
        };
        // 1b. the slot for streaming host layers, a device layer giving way when it must
        let (mut stream_rows, mut slot) = (None, 0);
        if g < n && STREAM.on() {
            let largest = |g: usize| s.layers[g..].iter().copied().max().unwrap_or(0);
            if device_layers.is_none() && g > 0 && !fits(used, largest(g)) {
                g -= 1;
                used -= layer(g);
            }
            if fits(used, largest(g)) {
                slot = largest(g);
                used += slot;
                stream_rows = Some(STREAM_MIN_ROWS);
            }
        }
        // 2. LM head, vision tower (unless placed), untied embedding, each while it fits
        let mut take = |bytes: usize| {
            let ok = fits(used, bytes);
            if ok {
                used += bytes;
            }
            ok
        };
        let head_on_device = take(s.head);
        let vision_on_device = vision_first || take(tower);
        let embed_on_device = if s.tied { head_on_device } else { take(s.embed) };
        let all: usize = s.layers.iter().sum::<usize>() + n * s.kv_layer + s.head + s.vision + if s.tied { 0 } else { s.embed };
        let device_weights = used - slot - s.text_work - if vision_on_device { s.vision_extra() } else { 0 };
        let host_bytes = all - device_weights;
        Ok(Placement { layers: n, device_layers: g, head_on_device, embed_on_device, vision_on_device, vision_first, vision_q8: false, stream_rows, device_bytes: used, host_bytes, budget })
    }

    /// Whether this plan keeps more on the device than `other`, in the order its prompts need:
    /// the vision tower first for image prompts, then text layers, the LM head, the tower (for
    /// text prompts) and the embedding.
    pub fn better_than(&self, other: &Placement) -> bool {
        let rank = |p: &Placement| (self.vision_first && p.vision_on_device, p.device_layers, p.head_on_device, p.vision_on_device, p.embed_on_device);
        rank(self) > rank(other)
    }

    /// One line for the log and `info`: which parts are where.
    pub fn describe(&self) -> String {
        let side = |on: bool| if on { "GPU" } else { "CPU" };
        let layers = match self.device_layers {
            0 => format!("text layers 0-{} on the CPU", self.layers.saturating_sub(1)),
            g if g == self.layers => format!("all {} text layers on the GPU", g),
            g => format!("text layers 0-{} on the GPU, {}-{} on the CPU", g - 1, g, self.layers - 1),
        };
        format!(
            "{}; LM head on the {}, vision tower on the {}{}, embedding on the {}{}",
            layers,
            side(self.head_on_device),
            side(self.vision_on_device),
            if self.vision_q8 { " (as Q8_0)" } else { "" },
            side(self.embed_on_device),
            match (self.stream_rows, self.device_layers < self.layers) {
                (Some(r), true) => format!("; CPU layers stream their weights through the GPU for forwards of {}+ tokens", r),
                _ => String::new(),
            }
        )
    }
}

/// `2GiB`, `1500MiB`, `2G`, `512M`, `3.5GB`, plain bytes: binary units (K, M, G, T with or
/// without `i` / `iB`; `KB`, `MB`, `GB`, `TB` decimal).
pub fn parse_size(s: &str) -> std::result::Result<usize, String> {
    let t = s.trim();
    let split = t.find(|c: char| !(c.is_ascii_digit() || c == '.')).unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let value: f64 = num.parse().map_err(|_| format!("'{}' is not a size (like 2GiB, 1500MiB, 2G or plain bytes)", s))?;
    let mult: f64 = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 1.0,
        "k" | "ki" | "kib" => 1024.0,
        "m" | "mi" | "mib" => 1024.0 * 1024.0,
        "g" | "gi" | "gib" => 1024.0 * 1024.0 * 1024.0,
        "t" | "ti" | "tib" => 1024f64.powi(4),
        "kb" => 1e3,
        "mb" => 1e6,
        "gb" => 1e9,
        "tb" => 1e12,
        other => return Err(format!("unknown unit '{}' in '{}' (B, KiB, MiB, GiB, TiB, K, M, G, KB, MB, GB)", other, s)),
    };
    let bytes = value * mult;
    if bytes < 1.0 {
        return Err(format!("size '{}' is less than one byte: a GPU budget must hold at least one text layer and the workspace (to run without the GPU, use --device cpu)", s));
    }
    if !bytes.is_finite() || bytes >= usize::MAX as f64 {
        return Err(format!("size '{}' is larger than this machine can address", s));
    }
    Ok(bytes as usize)
}

/// Bytes as `1.23 GiB` / `456.0 MiB`.
pub fn human(bytes: usize) -> String {
    let b = bytes as f64;
    if b >= (1u64 << 30) as f64 {
        format!("{:.2} GiB", b / (1u64 << 30) as f64)
    } else {
        format!("{:.1} MiB", b / (1u64 << 20) as f64)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sizes() -> Sizes {
        Sizes { layers: vec![100; 4], kv_layer: 10, embed: 300, head: 301, tied: true, vision: 200, text_work: 50, vision_work: 50 }
    }

    #[test]
    fn sizes_parse() {
        assert_eq!(parse_size("2GiB"), Ok(2 << 30));
        assert_eq!(parse_size("1500MiB"), Ok(1500 << 20));
        assert_eq!(parse_size("2G"), Ok(2 << 30));
        assert_eq!(parse_size("123"), Ok(123));
        assert_eq!(parse_size("1.5GB"), Ok(1_500_000_000));
        assert!(parse_size("two").is_err() && parse_size("2 parsecs").is_err());
        assert!(parse_size("0").unwrap_err().contains("--device cpu"));
        assert!(parse_size("1e30").is_err() && parse_size("99999999999TiB").unwrap_err().contains("larger than"));
    }

    #[test]
    fn no_budget_is_everything_on_the_device() {
        let p = Placement::plan(&sizes(), None, None, false).unwrap();
        assert!(!p.is_split());
        assert_eq!(p.device_bytes, sizes().total());
    }

    #[test]
    fn budget_fills_layers_then_head_then_vision() {
        let s = sizes();
        // workspace 50 + 2 layers 220 = 270; a third (110) does not fit 300, nor does the
        // streaming slot (100) beside two: the second layer gives way to it (50 + 110 + 100)
        let p = Placement::plan(&s, Some(300), None, false).unwrap();
        assert_eq!((p.device_layers, p.head_on_device, p.vision_on_device, p.embed_on_device), (1, false, false, false));
        assert_eq!((p.device_bytes, p.stream_rows), (260, Some(STREAM_MIN_ROWS)));
        assert_eq!(p.host_bytes, 3 * 110 + 301 + 200);
        // room for two layers and the slot: no layer gives way
        let p = Placement::plan(&s, Some(370), None, false).unwrap();
        assert_eq!((p.device_layers, p.device_bytes, p.stream_rows), (2, 370, Some(STREAM_MIN_ROWS)));
        // all layers (440) + head (301) = 791; the vision tower (200, its work shared with the
        // text's) does not fit 900
        let p = Placement::plan(&s, Some(900), None, false).unwrap();
        assert_eq!((p.device_layers, p.head_on_device, p.vision_on_device, p.embed_on_device), (4, true, false, true));
        assert_eq!((p.host_bytes, p.stream_rows), (200, None));
        assert!(Placement::plan(&s, Some(991), None, false).unwrap().vision_on_device);
    }

    #[test]
    fn image_prompts_place_the_vision_tower_first() {
        let s = Sizes { vision_work: 80, ..sizes() };
        // text order: 4 layers (440 + 50) fill 500; the tower (200 + 30 more workspace) is left out
        let p = Placement::plan(&s, Some(500), None, false).unwrap();
        assert_eq!((p.device_layers, p.vision_on_device, p.vision_first), (4, false, false));
        // image order: workspace 50, tower 230, then 2 layers (220) = 500; the second layer
        // gives way to the streaming slot (100)
        let p = Placement::plan(&s, Some(500), None, true).unwrap();
        assert_eq!((p.device_layers, p.head_on_device, p.vision_on_device, p.vision_first), (1, false, true, true));
        assert_eq!((p.device_bytes, p.stream_rows), (490, Some(STREAM_MIN_ROWS)));
        assert_eq!(p.host_bytes, 3 * 110 + 301);
        assert!(p.better_than(&Placement::plan(&s, Some(500), None, false).unwrap()));
        // the tower and one layer do not fit: text order, the tower on the CPU
        let p = Placement::plan(&s, Some(300), None, true).unwrap();
        assert_eq!((p.device_layers, p.vision_on_device, p.vision_first), (1, false, false));
        // everything fits: the same plan either way, the workspace counted once
        let p = Placement::plan(&s, None, None, true).unwrap();
        assert_eq!(p.device_bytes, s.total());
        assert_eq!(s.total(), 4 * 110 + 301 + 200 + 80);
    }

    #[test]
    fn too_small_budget_names_bytes() {
        let e = Placement::plan(&sizes(), Some(100), None, false).unwrap_err();
        assert!(matches!(e, Error::Budget { needed: 160, available: 100, .. }), "{}", e);
        let e = Placement::plan(&sizes(), Some(300), Some(3), false).unwrap_err();
        assert!(matches!(e, Error::Budget { needed: 380, available: 300, .. }), "{}", e);
        assert!(Placement::plan(&sizes(), None, Some(5), false).is_err());
    }

    #[test]
    fn forced_layers_without_budget() {
        let p = Placement::plan(&sizes(), None, Some(1), false).unwrap();
        assert_eq!((p.device_layers, p.head_on_device, p.vision_on_device), (1, true, true));
        assert!(p.is_split());
    }
}
