//! The Qwen3-VL model: configuration, checkpoint loading, and the networks.

pub mod checkpoint;
pub mod config;
pub mod files;
pub mod gguf_source;
pub mod kv_cache;
pub mod names;
pub mod placement;
pub mod positions;
pub mod quantize;
pub mod rope;
pub mod source;
pub mod text;
pub mod vision;

pub use checkpoint::Checkpoint;
pub use config::{Config, TextConfig, VisionConfig};
pub use files::{ModelFiles, Opened};
pub use quantize::{LoadQuant, Mix};
pub use kv_cache::KvCache;
pub use placement::{Placement, Sizes, STREAM_MIN_ROWS};
pub use rope::Pos3;
pub use text::TextModel;
pub use vision::{Images, VisionModel, VisionOutput};

use crate::{Backend, Error, Result};
use std::path::Path;
use std::sync::Arc;

pub struct Model {
    pub config: Config,
    pub text: TextModel,
    pub vision: VisionModel,
    /// Token ids generation may produce: `0..sampled_vocab` (see [`Model::limit_sampling`]).
    sampled_vocab: usize,
}

/// The host side of a split load: the backend the parts not on the device go to, and the plan.
pub struct Offload<'a> {
    pub host: &'a Arc<dyn Backend>,
    pub placement: &'a Placement,
}

impl Model {
    /// Loads `config.json` and the safetensors weights in `dir` onto `backend`.
    /// `progress(done_bytes, total_bytes)` is called as tensors load.
    pub fn load(dir: &Path, backend: &dyn Backend, progress: &mut dyn FnMut(usize, usize)) -> Result<Model> {
        check_dir(dir)?;
        Model::load_opened(&ModelFiles::Safetensors(dir.to_path_buf()).open()?, None, backend, progress)
    }

    /// Loads opened model files onto `backend`, quantizing the weights as `quant` says (see
    /// [`quantize`]). Tensors the configuration does not use are an error.
    pub fn load_opened(opened: &Opened, quant: Option<Mix>, backend: &dyn Backend, progress: &mut dyn FnMut(usize, usize)) -> Result<Model> {
        Model::load_placed(opened, LoadQuant::mix(quant), backend, None, progress)
    }

    /// [`Model::load_opened`] with the parts `offload`'s placement keeps off the device on its
    /// host backend (see [`placement`]); `None`: everything on `backend`.
    pub fn load_placed(opened: &Opened, quant: LoadQuant, backend: &dyn Backend, offload: Option<Offload<'_>>, progress: &mut dyn FnMut(usize, usize)) -> Result<Model> {
        let config = opened.config.clone();
        let converted = quant.source(&*opened.source, &config);
        let src: &dyn source::TensorSource = match &converted {
            Some(q) => q,
            None => &*opened.source,
        };
        let total = src.total_bytes();
        let mut done = 0usize;
        let mut tick = |bytes: usize| {
            done += bytes;
            progress(done.min(total), total);
        };
        let all = Placement::all_on_device(config.text.num_hidden_layers);
        let (host, place) = match &offload {
            Some(o) if o.placement.is_split() => (Some(o.host), o.placement),
            _ => (None, &all),
        };
        let mut ld = checkpoint::Loader { src, backend, progress: &mut tick };
        // weights take exactly their bytes on the device, not the pool's reuse buckets
        struct Exact<'b>(&'b dyn Backend);
        impl Drop for Exact<'_> {
            fn drop(&mut self) {
                self.0.set_weight_loading(false);
            }
        }
        backend.set_weight_loading(true);
        let exact = Exact(backend);
        let text = TextModel::new_placed(&config.text, config.tie_word_embeddings, &mut ld, host, place)?;
        let vision = VisionModel::new_placed(&config.vision, &mut ld, host.filter(|_| !place.vision_on_device))?;
        drop(exact);
        let mut ignored = vec!["rope_freqs"];
        if config.tie_word_embeddings {
            ignored.push("lm_head.weight"); // a tied checkpoint may carry the copy anyway
            ignored.push("output.weight");
        }
        let unused = src.unused(&ignored);
        if !unused.is_empty() {
            let shown: Vec<&str> = unused.iter().take(5).map(|s| s.as_str()).collect();
            return Err(Error::Checkpoint {
                file: src.describe(),
                tensor: shown.join(", "),
                msg: format!("{} unexpected tensor(s) for this configuration (a different architecture or size?)", unused.len()),
            });
        }
        progress(total, total);
        let sampled_vocab = config.text.vocab_size;
        Ok(Model { config, text, vision, sampled_vocab })
    }

    /// The sizes [`Placement::plan`] works from for the model of `opened` (quantized as `quant`
    /// says) on `backend`, with sessions of `context` tokens and a KV cache of `kv_dtype`.
    pub fn sizes(opened: &Opened, quant: LoadQuant, backend: &dyn Backend, context: usize, image_tokens: usize, kv_dtype: crate::DType) -> Sizes {
        let config = opened.config.clone();
        let alloc = |n: usize| backend.alloc_size(n);
        let weights = |n: usize| backend.weight_alloc_size(n);
        let converted = quant.source(&*opened.source, &config);
        let src: &dyn source::TensorSource = match &converted {
            Some(q) => q,
            None => &*opened.source,
        };
        Sizes::estimate(src, &config, context, image_tokens, kv_dtype, &alloc, &weights)
    }

    /// Generation picks only ids below `n` (the LM head's other rows are never sampled, greedy
    /// included): the ids the tokenizer has, when its vocabulary is smaller than the head
    /// (Qwen3-VL's head has 151,936 rows for 151,669 token ids; the rest is padding, which
    /// random or lightly trained weights can rank first). Clamped to `1..=vocab_size`.
    pub fn limit_sampling(&mut self, n: usize) {
        self.sampled_vocab = n.clamp(1, self.config.text.vocab_size);
    }

    /// Token ids generation may produce: `0..sampled_vocab()` (the LM head's size unless
    /// [`Model::limit_sampling`] lowered it).
    pub fn sampled_vocab(&self) -> usize {
        self.sampled_vocab
    }

    /// Where the parts are.
    pub fn placement(&self) -> &Placement {
        self.text.placement()
    }

    /// Whether some part runs on the host backend.
    pub fn is_split(&self) -> bool {
        self.text.placement().is_split()
    }

    /// Weight bytes on the device `b` (as its pool allocates them) and on the host.
    pub fn placed_bytes(&self, b: &dyn Backend) -> (usize, usize) {
        let (dev, host) = self.text.placed_bytes(b);
        let v = self.vision.placed_bytes(b);
        if self.vision.on_host() {
            (dev, host + v)
        } else {
            (dev + v, host)
        }
    }
}

/// Fails unless `dir` is an existing directory, so that a mistyped model path is reported as
/// such rather than as the first file missing from it.
pub fn check_dir(dir: &Path) -> Result<()> {
    match std::fs::metadata(dir) {
        Ok(m) if m.is_dir() => Ok(()),
        Ok(_) => Err(Error::Config { file: dir.display().to_string(), msg: "is a file, not a model directory (config.json, *.safetensors, tokenizer.json)".into() }),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Err(Error::Config { file: dir.display().to_string(), msg: "model directory does not exist".into() }),
        Err(e) => Err(Error::io(dir, e)),
    }
}
