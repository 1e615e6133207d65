//! `qwen3-vl generate` (one prompt, streamed reply) and `qwen3-vl chat` (interactive).

use super::load::{stop_ids, CliResult, ImageArgs, ModelArgs, SamplingArgs};
use qwen3_vl::generate::chat::{render, render_turn, Message, GENERATION_PROMPT};
use qwen3_vl::generate::{Sampler, Session, Stop};
use std::io::{BufRead, Write};

#[derive(clap::Args)]
pub struct GenerateArgs {
    #[clap(flatten)]
    model: ModelArgs,
    /// The user's message.
    #[clap(long, short = 'p')]
    prompt: String,
    #[clap(flatten)]
    images: ImageArgs,
    /// An optional system message.
    #[clap(long)]
    system: Option<String>,
    /// Most tokens to generate.
    #[clap(long, default_value = "256")]
    max_tokens: usize,
    /// Feed the prompt as is, without the chat template.
    #[clap(long)]
    raw: bool,
    #[clap(flatten)]
    sampling: SamplingArgs,
}

#[derive(clap::Args)]
pub struct ChatArgs {
    #[clap(flatten)]
    model: ModelArgs,
    /// An optional system message.
    #[clap(long)]
    system: Option<String>,
    /// Most tokens per reply.
    #[clap(long, default_value = "512")]
    max_tokens: usize,
    /// Context size in tokens for the whole conversation (capped by the model's limit).
    #[clap(long, default_value = "4096")]
    context: usize,
    #[clap(flatten)]
    sampling: SamplingArgs,
}

/// Streams one reply: prints text as tokens complete and returns why it stopped.
fn stream_reply(
    session: &mut Session<'_>,
    tok: &qwen3_vl::Tokenizer,
    prompt: &[u32],
    images: Option<&qwen3_vl::model::Images<'_>>,
    max_tokens: usize,
    sampler: &mut Sampler,
    stops: &[u32],
) -> CliResult<(Vec<u32>, qwen3_vl::generate::Generated)> {
    let mut dec = tok.stream_decoder(true);
    let mut out = std::io::stdout();
    let mut err: Option<qwen3_vl::Error> = None;
    let g = session.generate_with_images(prompt, images, max_tokens, sampler, stops, &mut |t| {
        if stops.contains(&t) {
            return false;
        }
        match dec.push(t) {
            Ok(s) => {
                let _ = out.write_all(s.as_bytes());
                let _ = out.flush();
                true
            }
            Err(e) => {
                err = Some(e);
                false
            }
        }
    })?;
    if let Some(e) = err {
        return Err(e.into());
    }
    print!("{}", dec.finish());
    println!();
    Ok((g.tokens.clone(), g))
}

pub fn run_generate(a: GenerateArgs) -> CliResult<()> {
    let l = a.model.load()?;
    let prepared = a.images.prepare(&a.model.model)?;
    if a.raw && !prepared.grids.is_empty() {
        return Err("--raw takes no --image: write the <|image_pad|> placeholders yourself without --raw".into());
    }
    let text = if a.raw {
        a.prompt.clone()
    } else {
        let mut msgs = Vec::new();
        if let Some(s) = &a.system {
            msgs.push(Message::system(s));
        }
        let mut user = Message::user(&a.prompt);
        user.image_tokens = prepared.tokens.clone();
        msgs.push(user);
        render(&msgs, true)
    };
    let prompt = l.tokenizer.encode(&text);
    let capacity = (prompt.len() + a.max_tokens).min(l.model.config.text.max_position_embeddings);
    let mut session = Session::new(&l.model, &*l.backend, capacity)?;
    let mut sampler = Sampler::new(a.sampling.params(&a.model.model));
    let (_, g) = stream_reply(&mut session, &l.tokenizer, &prompt, prepared.images().as_ref(), a.max_tokens, &mut sampler, &stop_ids(&l.tokenizer))?;
    let n = g.tokens.len();
    eprintln!(
        "[{} prompt tokens in {:.2} s ({:.1} tok/s); {} generated in {:.2} s ({:.2} tok/s); stop: {}]",
        g.prompt_tokens,
        g.prefill_secs,
        g.prompt_tokens as f64 / g.prefill_secs.max(1e-9),
        n,
        g.decode_secs,
        n.saturating_sub(1) as f64 / g.decode_secs.max(1e-9),
        match g.stop {
            Stop::StopToken(_) => "end of reply",
            Stop::MaxTokens => "--max-tokens reached",
        }
    );
    Ok(())
}

pub fn run_chat(a: ChatArgs) -> CliResult<()> {
    let l = a.model.load()?;
    let capacity = a.context.min(l.model.config.text.max_position_embeddings);
    let mut session = Session::new(&l.model, &*l.backend, capacity)?;
    let mut sampler = Sampler::new(a.sampling.params(&a.model.model));
    let stops = stop_ids(&l.tokenizer);
    eprintln!("chat with {} ({} tokens of context). Empty line or /exit to quit, /reset to start over.", a.model.model.display(), capacity);
    // text of the conversation not yet fed to the model
    let mut pending = a.system.as_deref().map(|s| render_turn(&Message::system(s))).unwrap_or_default();
    let stdin = std::io::stdin();
    loop {
        eprint!("> ");
        let _ = std::io::stderr().flush();
        let mut line = String::new();
        if stdin.lock().read_line(&mut line)? == 0 {
            break;
        }
        let line = line.trim_end_matches(&['\r', '\n'][..]);
        match line.trim() {
            "" | "/exit" | "/quit" => break,
            "/reset" => {
                session = Session::new(&l.model, &*l.backend, capacity)?;
                pending = a.system.as_deref().map(|s| render_turn(&Message::system(s))).unwrap_or_default();
                eprintln!("(conversation reset)");
                continue;
            }
            _ => {}
        }
        pending.push_str(&render_turn(&Message::user(line)));
        pending.push_str(GENERATION_PROMPT);
        let prompt = l.tokenizer.encode(&pending);
        let room = session.capacity() - session.len();
        if prompt.len() + 1 > room {
            eprintln!("(the conversation is full: {} tokens left, this turn needs {}; /reset to start over)", room, prompt.len() + 1);
            pending.clear();
            continue;
        }
        let budget = a.max_tokens.min(room - prompt.len());
        let (tokens, g) = stream_reply(&mut session, &l.tokenizer, &prompt, None, budget, &mut sampler, &stops)?;
        // The reply's last token was sampled but not fed; the template closes the turn with
        // <|im_end|>\n, which goes in front of the next user turn.
        pending = match g.stop {
            Stop::StopToken(t) => format!("{}\n", l.tokenizer.decode(&[t], false)?),
            Stop::MaxTokens => format!("{}<|im_end|>\n", l.tokenizer.decode(&tokens[tokens.len().saturating_sub(1)..], false)?),
        };
    }
    Ok(())
}
