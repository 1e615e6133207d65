//! Finding a model's files: a Hugging Face directory (config.json, safetensors), or GGUF files
//! (a text model and an mmproj vision tower) given as `-m model.gguf --mmproj mmproj.gguf` or as
//! a directory holding them (told apart by `general.architecture`: `clip` is the mmproj).

use super::config::Config;
use super::gguf_source::GgufPair;
use super::source::TensorSource;
use super::Checkpoint;
use crate::gguf::{meta, Gguf};
use crate::image::PreprocessConfig;
use crate::{Error, Result, Tokenizer};
use std::path::{Path, PathBuf};

/// Where a model's weights are.
#[derive(Clone, Debug, PartialEq)]
pub enum ModelFiles {
    /// A Hugging Face directory.
    Safetensors(PathBuf),
    /// A GGUF text model and its mmproj.
    Gguf { text: PathBuf, mmproj: PathBuf },
}

/// A model's files, opened: the configuration, the weights, and what GGUF metadata carries
/// besides (tokenizer, chat template, image preprocessing).
pub struct Opened {
    pub files: ModelFiles,
    pub config: Config,
    pub source: Box<dyn TensorSource>,
    pub tokenizer: Option<Tokenizer>,
    pub chat_template: Option<String>,
    pub preprocess: Option<PreprocessConfig>,
}

fn is_gguf(p: &Path) -> bool {
    let mut magic = [0u8; 4];
    std::fs::File::open(p).and_then(|mut f| std::io::Read::read_exact(&mut f, &mut magic)).is_ok() && &magic == b"GGUF"
}

fn cfg_err(p: &Path, msg: impl Into<String>) -> Error {
    Error::Config { file: p.display().to_string(), msg: msg.into() }
}

/// The GGUF files in `dir`, split into (text models, mmprojs) by their architecture.
fn gguf_files(dir: &Path) -> Result<(Vec<PathBuf>, Vec<PathBuf>)> {
    let (mut text, mut mmproj) = (Vec::new(), Vec::new());
    let mut entries: Vec<PathBuf> = std::fs::read_dir(dir).map_err(|e| Error::io(dir, e))?.filter_map(|e| e.ok().map(|e| e.path())).collect();
    entries.sort();
    for p in entries {
        if p.extension().map_or(false, |x| x.eq_ignore_ascii_case("gguf")) && p.is_file() && is_gguf(&p) {
            let g = Gguf::open(&p)?;
            if g.get_str("general.architecture")? == Some(meta::CLIP_ARCH) {
                mmproj.push(p);
            } else {
                text.push(p);
            }
        }
    }
    Ok((text, mmproj))
}

/// File names, comma-separated.
fn names(paths: &[PathBuf]) -> String {
    paths.iter().map(|p| p.file_name().map_or_else(|| p.display().to_string(), |n| n.to_string_lossy().into_owned())).collect::<Vec<_>>().join(", ")
}

/// What a directory holds, in words: `3 entries: a.txt, b/, c.bin` (the first 12, sorted), or
/// `nothing`.
fn listing(dir: &Path) -> String {
    let mut entries: Vec<String> = match std::fs::read_dir(dir) {
        Ok(rd) => rd.filter_map(|e| e.ok()).map(|e| format!("{}{}", e.file_name().to_string_lossy(), if e.path().is_dir() { "/" } else { "" })).collect(),
        Err(e) => return format!("entries that cannot be listed ({})", e),
    };
    entries.sort();
    match entries.len() {
        0 => "nothing".into(),
        n if n > 12 => format!("{} entries: {}, ...", n, entries[..12].join(", ")),
        n => format!("{} {}: {}", n, if n == 1 { "entry" } else { "entries" }, entries.join(", ")),
    }
}

fn one(kind: &str, dir: &Path, found: Vec<PathBuf>, hint: &str) -> Result<PathBuf> {
    match found.len() {
        1 => Ok(found.into_iter().next().unwrap_or_default()),
        0 => Err(cfg_err(dir, format!("holds no {} GGUF file ({})", kind, hint))),
        _ => Err(cfg_err(dir, format!("holds {} {} GGUF files ({}): name one with {}", found.len(), kind, found.iter().map(|p| p.display().to_string()).collect::<Vec<_>>().join(", "), hint))),
    }
}

impl ModelFiles {
    /// The files `-m MODEL [--mmproj FILE]` name: a directory with config.json is a Hugging
    /// Face checkpoint; a GGUF file is the text model (its mmproj given, or the only one beside
    /// it); a directory of GGUF files holds one text model and one mmproj.
    pub fn find(model: &Path, mmproj: Option<&Path>) -> Result<ModelFiles> {
        let meta = std::fs::metadata(model).map_err(|e| if e.kind() == std::io::ErrorKind::NotFound { cfg_err(model, "model directory does not exist (nor a GGUF file of that name)") } else { Error::io(model, e) })?;
        if let Some(m) = mmproj {
            if !m.is_file() {
                return Err(cfg_err(m, "--mmproj: not a file"));
            }
        }
        if meta.is_dir() && model.join("config.json").exists() {
            if mmproj.is_some() {
                return Err(cfg_err(model, "is a Hugging Face checkpoint (config.json); --mmproj is for GGUF models"));
            }
            return Ok(ModelFiles::Safetensors(model.to_path_buf()));
        }
        let (text, dir) = if meta.is_dir() {
            let (texts, mmprojs) = gguf_files(model)?;
            if texts.is_empty() {
                let gguf = if mmprojs.is_empty() { String::new() } else { format!(" (the GGUF files here are vision towers only: {})", names(&mmprojs)) };
                return Err(cfg_err(
                    model,
                    format!("is not a model directory: looked for config.json with *.safetensors (a Hugging Face checkpoint) or a GGUF text model (*.gguf, with its mmproj){}; it holds {}", gguf, listing(model)),
                ));
            }
            (one("text model", model, texts, "-m FILE.gguf")?, model.to_path_buf())
        } else if is_gguf(model) {
            (model.to_path_buf(), model.parent().map_or_else(|| PathBuf::from("."), Path::to_path_buf))
        } else {
            return Err(cfg_err(model, "is neither a model directory (config.json, *.safetensors, or *.gguf files) nor a GGUF file"));
        };
        let mmproj = match mmproj {
            Some(m) => m.to_path_buf(),
            None => {
                let (_, mm) = gguf_files(if dir.as_os_str().is_empty() { Path::new(".") } else { &dir })?;
                one("mmproj (vision tower)", &dir, mm, "--mmproj FILE.gguf")?
            }
        };
        Ok(ModelFiles::Gguf { text, mmproj })
    }

    /// The directory other files (tokenizer.json, generation_config.json,
    /// preprocessor_config.json) are looked for in.
    pub fn dir(&self) -> PathBuf {
        match self {
            ModelFiles::Safetensors(d) => d.clone(),
            ModelFiles::Gguf { text, .. } => text.parent().map_or_else(|| PathBuf::from("."), Path::to_path_buf),
        }
    }

    /// Opens the files: parses configuration and metadata, maps the weights (nothing is loaded).
    pub fn open(&self) -> Result<Opened> {
        match self {
            ModelFiles::Safetensors(dir) => {
                super::check_dir(dir)?;
                let config = Config::from_dir(dir)?;
                let ck = Checkpoint::open(dir)?;
                Ok(Opened { files: self.clone(), config, source: Box::new(ck), tokenizer: None, chat_template: None, preprocess: None })
            }
            ModelFiles::Gguf { text, mmproj } => {
                let t = Gguf::open(text)?;
                let m = Gguf::open(mmproj)?;
                meta::expect_arch(&t, meta::TEXT_ARCH)?;
                meta::expect_arch(&m, meta::CLIP_ARCH)?;
                let tok = Tokenizer::from_gguf(&t)?;
                let config = meta::config(&t, &m, &tok)?;
                let temporal = config.vision.temporal_patch_size;
                let preprocess = meta::preprocess_config(&m, temporal)?;
                let chat_template = t.get_str("tokenizer.chat_template")?.map(str::to_string);
                let deepstack = config.vision.deepstack_visual_indexes.clone();
                Ok(Opened { files: self.clone(), config, source: Box::new(GgufPair::new(t, m, deepstack)), tokenizer: Some(tok), chat_template, preprocess: Some(preprocess) })
            }
        }
    }
}
