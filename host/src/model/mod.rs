//! The Qwen3-VL model: configuration, checkpoint loading, and the networks.

pub mod checkpoint;
pub mod config;
pub mod kv_cache;
pub mod positions;
pub mod rope;
pub mod text;
pub mod vision;

pub use checkpoint::Checkpoint;
pub use config::{Config, TextConfig, VisionConfig};
pub use kv_cache::KvCache;
pub use rope::Pos3;
pub use text::TextModel;
pub use vision::{Images, VisionModel, VisionOutput};

use crate::{Backend, Error, Result};
use std::path::Path;

pub struct Model {
    pub config: Config,
    pub text: TextModel,
    pub vision: VisionModel,
}

impl Model {
    /// Loads `config.json` and the safetensors weights in `dir` onto `backend`.
    /// `progress(done_bytes, total_bytes)` is called as tensors load.
    pub fn load(dir: &Path, backend: &dyn Backend, progress: &mut dyn FnMut(usize, usize)) -> Result<Model> {
        check_dir(dir)?;
        let config = Config::from_dir(dir)?;
        let ckpt = Checkpoint::open(dir)?;
        let total = ckpt.total_bytes();
        let mut done = 0usize;
        let mut tick = |bytes: usize| {
            done += bytes;
            progress(done, total);
        };
        let mut ld = checkpoint::Loader { ckpt: &ckpt, backend, progress: &mut tick };
        let text = TextModel::new(&config.text, config.tie_word_embeddings, &mut ld)?;
        let vision = VisionModel::new(&config.vision, &mut ld)?;
        let mut ignored = Vec::new();
        if config.tie_word_embeddings {
            ignored.push("lm_head.weight"); // a tied checkpoint may carry the copy anyway
        }
        let unused = ckpt.unused(&ignored);
        if !unused.is_empty() {
            let shown: Vec<&str> = unused.iter().take(5).map(|s| s.as_str()).collect();
            return Err(Error::Checkpoint {
                file: dir.display().to_string(),
                tensor: shown.join(", "),
                msg: format!("{} unexpected tensor(s) for this configuration (a different architecture or size?)", unused.len()),
            });
        }
        progress(total, total);
        Ok(Model { config, text, vision })
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
