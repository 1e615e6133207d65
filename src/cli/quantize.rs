//! `qwen3-vl quantize IN_DIR OUT_DIR --type q8_0|q4_k_m|f16`: a Hugging Face checkpoint to two
//! GGUF files with llama.cpp's names and metadata for Qwen3-VL: the text model with its
//! tokenizer (`<name>-<TYPE>.gguf`, arch `qwen3vl`) and the vision tower
//! (`mmproj-<name>-<TYPE>.gguf`, arch `clip`). See `qwen3_vl::model::quantize` for the mixes.

use super::load::CliResult;
use qwen3_vl::gguf::{meta, names, Writer};
use qwen3_vl::model::quantize::{type_for, Mix, MixReport};
use qwen3_vl::model::{Checkpoint, Config};
use qwen3_vl::{DType, Tokenizer};
use std::path::{Path, PathBuf};
use std::time::Instant;

#[derive(clap::Args)]
pub struct QuantizeArgs {
    /// Hugging Face model directory (config.json, *.safetensors, tokenizer.json).
    input: PathBuf,
    /// Where to write the two GGUF files (created if missing).
    output: PathBuf,
    /// q8_0, q4_k_m or f16.
    #[clap(long = "type", value_parser = parse_mix)]
    mix: Mix,
    /// CPU worker threads (default: all cores).
    #[clap(long)]
    threads: Option<usize>,
}

fn parse_mix(s: &str) -> Result<Mix, String> {
    Mix::parse(s).ok_or_else(|| format!("unknown type '{}': expected q8_0, q4_k_m or f16", s))
}

/// The chat template of a Hugging Face directory, in the order `serve` looks for it:
/// chat_template.jinja, chat_template.json, tokenizer_config.json.
fn chat_template(dir: &Path) -> Option<String> {
    if let Ok(t) = std::fs::read_to_string(dir.join("chat_template.jinja")) {
        return Some(t);
    }
    ["chat_template.json", "tokenizer_config.json"].iter().find_map(|file| {
        let v: serde_json::Value = serde_json::from_slice(&std::fs::read(dir.join(file)).ok()?).ok()?;
        v.get("chat_template").and_then(|t| t.as_str()).map(str::to_string)
    })
}

/// The type a tensor is written in: the mix's for weights, f32 for the rest.
fn stored(mix: Mix, cfg: &Config, name: &str, shape: &[usize]) -> DType {
    type_for(mix, cfg, name, shape).unwrap_or(DType::F32)
}

pub fn run(a: QuantizeArgs) -> CliResult<()> {
    let t0 = Instant::now();
    let pool = rayon::ThreadPoolBuilder::new().num_threads(a.threads.unwrap_or(0)).build().map_err(|e| format!("threads: {}", e))?;
    qwen3_vl::model::check_dir(&a.input)?;
    let cfg = Config::from_dir(&a.input)?;
    let ck = Checkpoint::open(&a.input)?;
    let tok = Tokenizer::from_file(&a.input.join("tokenizer.json"))?;
    let pre = qwen3_vl::server::images::preprocess_config(&a.input, None)?;
    std::fs::create_dir_all(&a.output).map_err(|e| format!("{}: {}", a.output.display(), e))?;
    let base = std::fs::canonicalize(&a.input).ok().and_then(|p| p.file_name().map(|n| n.to_string_lossy().into_owned())).unwrap_or_else(|| "model".into());
    let (tname, vname) = (format!("{}-{}.gguf", base, a.mix.name()), format!("mmproj-{}-{}.gguf", base, a.mix.vision().name()));
    let ds = &cfg.vision.deepstack_visual_indexes;

    // 1. which checkpoint tensor goes where, under which name and type
    let mut text: Vec<(String, String, Vec<usize>, DType)> = Vec::new();
    let mut vision: Vec<(String, String, Vec<usize>, DType)> = Vec::new();
    let mut patch: Option<Vec<usize>> = None;
    for name in ck.names() {
        let shape = ck.shape_of(name).unwrap_or(&[]).to_vec();
        if name == "lm_head.weight" && cfg.tie_word_embeddings {
            continue;
        }
        if name == names::PATCH_EMBED {
            patch = Some(shape);
        } else if let Some(g) = names::text_name(name) {
            text.push((name.to_string(), g, shape.clone(), stored(a.mix, &cfg, name, &shape)));
        } else if let Some(g) = names::vision_name(name, ds) {
            vision.push((name.to_string(), g, shape.clone(), stored(a.mix, &cfg, name, &shape)));
        } else {
            return Err(format!("{}: tensor '{}' has no GGUF name (not a Qwen3-VL checkpoint?)", a.input.display(), name).into());
        }
    }
    // what the mix makes of each file, and the tensors that cannot take the type asked for
    let report = |list: &[(String, String, Vec<usize>, DType)]| {
        MixReport::of(a.mix, &cfg, list.iter().map(|(name, _, shape, _)| (name.as_str(), &shape[..], DType::F32)))
    };
    let (text_mix, vision_mix) = (report(&text), report(&vision));
    for (what, r) in [("text model", &text_mix), ("vision tower", &vision_mix)] {
        if let Some(w) = r.warning() {
            log::warn!("{}: {}", what, w);
        }
    }
    let patch = patch.ok_or_else(|| format!("{}: no {}", a.input.display(), names::PATCH_EMBED))?;
    if patch.len() != 5 || patch[2] > names::PATCH_SLICES.len() {
        return Err(format!("{}: patch embedding of shape {:?} (expected [hidden, C, T <= 2, P, P])", a.input.display(), patch).into());
    }

    // 2. the text model
    let mut w = Writer::new();
    meta::write_text(&mut w, &cfg, &base, a.mix.file_type());
    qwen3_vl::tokenizer::gguf::export(&tok, cfg.text.vocab_size, chat_template(&a.input).as_deref(), &mut w);
    for (_, g, shape, dt) in &text {
        w.add_tensor(g, shape, *dt)?;
    }
    let tpath = a.output.join(&tname);
    write(&pool, &w, &tpath, &ck, &text, None)?;
    eprintln!("wrote {} ({} tensors, {:.2} GB): {}", tpath.display(), text.len(), std::fs::metadata(&tpath).map(|m| m.len()).unwrap_or(0) as f64 / 1e9, text_mix.describe());

    // 3. the vision tower: the Conv3d kernel as its temporal slices, in f32
    let mut w = Writer::new();
    meta::write_vision(&mut w, &cfg, &pre, &base, a.mix.vision().file_type());
    let slice_shape = vec![patch[0], patch[1], patch[3], patch[4]];
    for s in names::PATCH_SLICES.iter().take(patch[2]) {
        w.add_tensor(s, &slice_shape, DType::F32)?;
    }
    for (_, g, shape, dt) in &vision {
        w.add_tensor(g, shape, *dt)?;
    }
    let vpath = a.output.join(&vname);
    write(&pool, &w, &vpath, &ck, &vision, Some(&patch))?;
    eprintln!(
        "wrote {} ({} tensors, {:.2} GB): {} and the f32 patch embedding, in {:.1} s",
        vpath.display(),
        vision.len() + patch[2],
        std::fs::metadata(&vpath).map(|m| m.len()).unwrap_or(0) as f64 / 1e9,
        vision_mix.describe(),
        t0.elapsed().as_secs_f64()
    );
    Ok(())
}

/// Writes `w` with the data of `tensors` (after the patch slices, when `patch` is given).
fn write(pool: &rayon::ThreadPool, w: &Writer, path: &Path, ck: &Checkpoint, tensors: &[(String, String, Vec<usize>, DType)], patch: Option<&Vec<usize>>) -> CliResult<()> {
    let slices = patch.map_or(0, |p| p[2]);
    let patch_f32 = match patch {
        Some(p) => ck.read_f32(names::PATCH_EMBED, p)?,
        None => Vec::new(),
    };
    let name = path.file_name().map_or_else(|| path.display().to_string(), |n| n.to_string_lossy().into_owned());
    let bar = super::progress::Progress::count(&format!("writing {}", name), (slices + tensors.len()) as u64, "tensors");
    let tensor_bytes = |i: usize| -> qwen3_vl::Result<Vec<u8>> {
        if i < slices {
            let p = patch.expect("slices only with a patch embedding");
            let (hc, t, pp) = (p[0] * p[1], p[2], p[3] * p[4]);
            let mut out = Vec::with_capacity(hc * pp * 4);
            for r in 0..hc {
                for x in &patch_f32[(r * t + i) * pp..(r * t + i + 1) * pp] {
                    out.extend_from_slice(&x.to_le_bytes());
                }
            }
            return Ok(out);
        }
        let (name, _, shape, dt) = &tensors[i - slices];
        let f = ck.read_f32(name, shape)?;
        let rows = if shape.len() >= 2 { shape[..shape.len() - 1].iter().product() } else { 1 };
        pool.install(|| qwen3_vl::quant::quantize_vec_par(*dt, &f, rows)).ok_or_else(|| qwen3_vl::Error::Checkpoint { file: path.display().to_string(), tensor: name.clone(), msg: format!("cannot store {:?} as {}", shape, dt) })
    };
    w.write(path, |i| {
        let bytes = tensor_bytes(i);
        bar.inc();
        bytes
    })?;
    bar.clear();
    Ok(())
}
