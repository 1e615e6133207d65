//! `qwen3-vl logits`: the logits after the last prompt token, as little-endian f32, for tests
//! and tools. `-o -` writes them to stdout.

use super::load::{CliResult, ImageArgs, ModelArgs, PromptArgs};
use qwen3_vl::generate::Session;
use std::io::Write;
use std::path::PathBuf;

#[derive(clap::Args)]
pub struct LogitsArgs {
    #[clap(flatten)]
    model: ModelArgs,
    #[clap(flatten)]
    prompt: PromptArgs,
    #[clap(flatten)]
    pub images: ImageArgs,
    /// Feed the prompt as is, without the chat template.
    #[clap(long)]
    raw: bool,
    /// Output file: vocab_size little-endian f32 values; "-" for stdout. Nothing else goes to
    /// stdout (the prompt's token count is in the log on stderr).
    #[clap(long, short = 'o')]
    out: PathBuf,
}

/// Where the logits go; a file is created before the weights load (so an unwritable path
/// fails early) and removed again if the run fails.
enum Out {
    Stdout,
    File(PathBuf, std::fs::File),
}

pub fn run(a: LogitsArgs) -> CliResult<()> {
    let mut out = if a.out.as_os_str() == "-" {
        Out::Stdout
    } else {
        let f = std::fs::File::create(&a.out).map_err(|e| format!("cannot write -o {}: {}", a.out.display(), e))?;
        Out::File(a.out.clone(), f)
    };
    let result = compute(&a).and_then(|(ids, logits)| write(&mut out, ids, &logits));
    if result.is_err() {
        if let Out::File(path, _) = &out {
            let _ = std::fs::remove_file(path);
        }
    }
    result
}

/// The prompt's ids and the logits after its last token.
fn compute(a: &LogitsArgs) -> CliResult<(usize, Vec<f32>)> {
    // 1. every input, before the weights
    let text = a.prompt.read()?;
    let checked = a.model.check()?;
    let prepared = a.images.prepare(&checked.preprocess, &checked.video)?;
    if a.raw && !prepared.grids.is_empty() {
        return Err("--raw takes no --image or --video: write the placeholders yourself without --raw".into());
    }
    let text = if a.raw {
        text
    } else {
        super::load::render_prompt(&checked.format, &[super::load::user_turn(&text, &prepared.media)], &prepared.media)?
    };
    let ids = checked.tokenizer.encode(&text);
    let limit = checked.config.text.max_position_embeddings;
    if ids.len() > limit {
        return Err(format!("the prompt is {} tokens, more than the model's context of {}", ids.len(), limit).into());
    }
    // 2. the weights, the forward pass
    // the tower's activations are planned for its largest pass (long videos go in slices)
    let image_tokens = qwen3_vl::model::vision::tower_tokens(&prepared.grids, checked.config.vision.spatial_merge_size);
    let l = a.model.load(checked, ids.len().max(1), Some(image_tokens).filter(|&n| n > 0))?;
    let mut session = Session::with_kv_dtype(&l.model, &*l.backend, ids.len().max(1), l.kv_dtype)?;
    let logits = session.feed_with_images(&ids, prepared.images().as_ref())?;
    Ok((ids.len(), logits))
}

fn write(out: &mut Out, ids: usize, logits: &[f32]) -> CliResult<()> {
    let bytes: Vec<u8> = logits.iter().flat_map(|v| v.to_le_bytes()).collect();
    match out {
        Out::Stdout => {
            let mut o = std::io::stdout();
            o.write_all(&bytes)?;
            o.flush()?;
            log::info!("{} prompt tokens; wrote {} logits to stdout", ids, logits.len());
        }
        Out::File(path, f) => {
            f.write_all(&bytes).map_err(|e| qwen3_vl::Error::io(&*path, e))?;
            f.flush()?;
            log::info!("{} prompt tokens; wrote {} logits to {}", ids, logits.len(), path.display());
        }
    }
    Ok(())
}
