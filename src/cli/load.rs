//! Loading a model directory for the model-running subcommands: backend selection, config and
//! weights with a progress bar, tokenizer, and the generation defaults of the checkpoint.

use super::DeviceArgs;
use qwen3_vl::generate::SamplingParams;
use qwen3_vl::model::Model;
use qwen3_vl::{Backend, Tokenizer};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;

/// Where the model comes from.
#[derive(clap::Args, Clone, Debug)]
pub struct ModelArgs {
    /// Model directory as published on Hugging Face (config.json, *.safetensors, tokenizer.json).
    #[clap(long, short = 'm')]
    pub model: PathBuf,
    /// tokenizer.json to use instead of the model directory's.
    #[clap(long)]
    pub tokenizer: Option<PathBuf>,
    #[clap(flatten)]
    pub device: DeviceArgs,
}

pub struct Loaded {
    pub backend: Arc<dyn Backend>,
    pub model: Model,
    pub tokenizer: Tokenizer,
}

pub type CliResult<T> = Result<T, Box<dyn std::error::Error>>;

extern "C" {
    fn isatty(fd: i32) -> i32;
}

fn stderr_is_terminal() -> bool {
    // SAFETY: isatty only inspects the descriptor.
    unsafe { isatty(2) == 1 }
}

/// A text progress bar on stderr: `label [#####.....]  52%  1.1/2.1 GB`, redrawn in place on a
/// terminal; elsewhere (logs, pipes) only the finished bar is printed.
pub fn progress_bar(label: &str) -> impl FnMut(usize, usize) + '_ {
    let mut last = usize::MAX;
    let live = stderr_is_terminal();
    move |done, total| {
        let pct = if total == 0 { 100 } else { done * 100 / total };
        if pct == last || (!live && done < total) {
            return;
        }
        last = pct;
        let filled = pct * 30 / 100;
        eprint!(
            "\r{} [{}{}] {:>3}%  {:.2}/{:.2} GB",
            label,
            "#".repeat(filled),
            ".".repeat(30 - filled),
            pct,
            done as f64 / 1e9,
            total as f64 / 1e9
        );
        if done >= total {
            eprintln!();
        }
        let _ = std::io::stderr().flush();
    }
}

impl ModelArgs {
    pub fn load(&self) -> CliResult<Loaded> {
        let sel = qwen3_vl::select_device(self.device.device, self.device.threads)?;
        let tok_path = self.tokenizer.clone().unwrap_or_else(|| self.model.join("tokenizer.json"));
        let tokenizer = Tokenizer::from_file(&tok_path)?;
        let t0 = Instant::now();
        let model = Model::load(&self.model, &*sel.backend, &mut progress_bar("loading weights"))?;
        log::info!(
            "loaded {} ({} layers, hidden {}, {} heads / {} KV heads) in {:.1} s",
            self.model.display(),
            model.config.text.num_hidden_layers,
            model.config.text.hidden_size,
            model.config.text.num_attention_heads,
            model.config.text.num_key_value_heads,
            t0.elapsed().as_secs_f64()
        );
        if tokenizer.vocab_size() > model.config.text.vocab_size {
            log::warn!("the tokenizer knows {} tokens but the model only {}", tokenizer.vocab_size(), model.config.text.vocab_size);
        }
        Ok(Loaded { backend: sel.backend, model, tokenizer })
    }
}

/// Images attached to the user's message.
#[derive(clap::Args, Clone, Debug)]
pub struct ImageArgs {
    /// An image (JPEG, PNG or WebP) to ask about; repeat for several, they come before the text.
    #[clap(long = "image", short = 'i')]
    pub images: Vec<PathBuf>,
    /// Resize images above this many pixels down (bounds memory and time; default from
    /// preprocessor_config.json).
    #[clap(long)]
    pub max_pixels: Option<usize>,
}

/// Preprocessed images: concatenated patch rows, per-image grids and placeholder counts.
pub struct Prepared {
    pub patches: Vec<f32>,
    pub row_len: usize,
    pub grids: Vec<[usize; 3]>,
    pub tokens: Vec<usize>,
}

impl Prepared {
    pub fn images(&self) -> Option<qwen3_vl::model::Images<'_>> {
        if self.grids.is_empty() {
            None
        } else {
            Some(qwen3_vl::model::Images { patches: &self.patches, row_len: self.row_len, grids: &self.grids })
        }
    }
}

impl ImageArgs {
    /// Decodes and preprocesses every image as the model directory's preprocessor_config.json
    /// says (Qwen3-VL's defaults when it has none).
    pub fn prepare(&self, model_dir: &Path) -> CliResult<Prepared> {
        use qwen3_vl::image::{load_image, preprocess, PreprocessConfig};
        let mut out = Prepared { patches: Vec::new(), row_len: 0, grids: Vec::new(), tokens: Vec::new() };
        if self.images.is_empty() {
            return Ok(out);
        }
        let cfg_path = model_dir.join("preprocessor_config.json");
        let mut cfg = if cfg_path.exists() { PreprocessConfig::from_file(&cfg_path)? } else { PreprocessConfig::qwen3_vl_default() };
        if let Some(m) = self.max_pixels {
            cfg.max_pixels = m;
            cfg.min_pixels = cfg.min_pixels.min(m);
        }
        for path in &self.images {
            let t0 = Instant::now();
            let img = load_image(path)?;
            let p = preprocess(&img, &cfg)?;
            log::info!(
                "{}: {}x{} -> {} patches ({}x{} grid), {} image tokens, {:.0} ms",
                path.display(),
                img.width,
                img.height,
                p.rows(),
                p.grid_thw[1],
                p.grid_thw[2],
                p.num_tokens(cfg.merge_size),
                t0.elapsed().as_secs_f64() * 1e3
            );
            out.row_len = p.row_len;
            out.tokens.push(p.num_tokens(cfg.merge_size));
            out.grids.push(p.grid_thw);
            out.patches.extend_from_slice(&p.patches);
        }
        Ok(out)
    }
}

/// Token ids that end a reply: `<|im_end|>` and `<|endoftext|>` when the tokenizer has them.
pub fn stop_ids(tok: &Tokenizer) -> Vec<u32> {
    ["<|im_end|>", "<|endoftext|>"].iter().filter_map(|t| tok.token_to_id(t)).collect()
}

/// Sampling flags; unset ones come from the model's generation_config.json, else greedy.
#[derive(clap::Args, Clone, Debug)]
pub struct SamplingArgs {
    /// Sampling temperature; 0 is greedy.
    #[clap(long)]
    pub temperature: Option<f32>,
    /// Sample among the k most likely tokens (0: all).
    #[clap(long)]
    pub top_k: Option<usize>,
    /// Sample from the smallest set of tokens whose probability reaches p.
    #[clap(long)]
    pub top_p: Option<f32>,
    /// Penalty > 1 for tokens already in the context.
    #[clap(long)]
    pub repetition_penalty: Option<f32>,
    /// Random seed.
    #[clap(long, default_value = "0")]
    pub seed: u64,
    /// Greedy decoding (same as --temperature 0).
    #[clap(long)]
    pub greedy: bool,
}

impl SamplingArgs {
    pub fn params(&self, model_dir: &Path) -> SamplingParams {
        let mut p = SamplingParams::greedy();
        if let Ok(text) = std::fs::read_to_string(model_dir.join("generation_config.json")) {
            if let Ok(v) = serde_json::from_str::<serde_json::Value>(&text) {
                if v.get("do_sample").and_then(|x| x.as_bool()) == Some(true) {
                    p.temperature = v.get("temperature").and_then(|x| x.as_f64()).unwrap_or(1.0) as f32;
                    p.top_k = v.get("top_k").and_then(|x| x.as_u64()).unwrap_or(0) as usize;
                    p.top_p = v.get("top_p").and_then(|x| x.as_f64()).unwrap_or(1.0) as f32;
                }
                p.repetition_penalty = v.get("repetition_penalty").and_then(|x| x.as_f64()).unwrap_or(1.0) as f32;
            }
        }
        if let Some(t) = self.temperature {
            p.temperature = t;
        }
        if let Some(k) = self.top_k {
            p.top_k = k;
        }
        if let Some(x) = self.top_p {
            p.top_p = x;
        }
        if let Some(r) = self.repetition_penalty {
            p.repetition_penalty = r;
        }
        if self.greedy {
            p.temperature = 0.0;
        }
        p.seed = self.seed;
        p
    }
}
