//! `qwen3-vl logits`: the logits after the last prompt token, as little-endian f32, for tests
//! and tools.

use super::load::{CliResult, ImageArgs, ModelArgs};
use qwen3_vl::generate::chat::{render, Message};
use qwen3_vl::generate::Session;
use std::io::Write;
use std::path::PathBuf;

#[derive(clap::Args)]
pub struct LogitsArgs {
    #[clap(flatten)]
    model: ModelArgs,
    /// The user's message (rendered with the chat template unless --raw).
    #[clap(long, short = 'p')]
    prompt: String,
    #[clap(flatten)]
    images: ImageArgs,
    /// Feed the prompt as is, without the chat template.
    #[clap(long)]
    raw: bool,
    /// Output file: vocab_size little-endian f32 values.
    #[clap(long, short = 'o')]
    out: PathBuf,
}

pub fn run(a: LogitsArgs) -> CliResult<()> {
    let l = a.model.load()?;
    let prepared = a.images.prepare(&a.model.model)?;
    let text = if a.raw {
        a.prompt.clone()
    } else {
        let mut user = Message::user(&a.prompt);
        user.image_tokens = prepared.tokens.clone();
        render(&[user], true)
    };
    let ids = l.tokenizer.encode(&text);
    let mut session = Session::new(&l.model, &*l.backend, ids.len().max(1))?;
    let logits = session.feed_with_images(&ids, prepared.images().as_ref())?;
    let mut f = std::io::BufWriter::new(std::fs::File::create(&a.out).map_err(|e| qwen3_vl::Error::io(&a.out, e))?);
    for v in &logits {
        f.write_all(&v.to_le_bytes())?;
    }
    f.flush()?;
    println!("{}", ids.len());
    log::info!("{} prompt tokens; wrote {} logits to {}", ids.len(), logits.len(), a.out.display());
    Ok(())
}
