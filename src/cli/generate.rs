//! `qwen3-vl generate`: one prompt, the reply streamed to stdout. Also the streaming of a
//! reply that `chat` shares.

use super::load::{describe_sampling, memory_report, render_prompt, stop_ids, user_turn, CliResult, ImageArgs, ModelArgs, PromptArgs, SamplingArgs};
use super::logger::quiet;
use super::ranges;
use super::structured::{constrain, StructuredArgs};
use qwen3_vl::template::Turn;
use qwen3_vl::engine::{Engine, EngineConfig, ImageInput, Request};
use qwen3_vl::generate::{Generated, Sampler, Stop};
use std::io::Write;
use std::time::Instant;

#[derive(clap::Args)]
pub struct GenerateArgs {
    #[clap(flatten)]
    model: ModelArgs,
    #[clap(flatten)]
    prompt: PromptArgs,
    #[clap(flatten)]
    pub images: ImageArgs,
    /// An optional system message.
    #[clap(long)]
    system: Option<String>,
    /// Most tokens to generate (1 to 16777216).
    #[clap(long, default_value = "256", value_parser = ranges::max_tokens, allow_hyphen_values = true)]
    max_tokens: usize,
    /// Feed the prompt as is, without the chat template.
    #[clap(long)]
    raw: bool,
    #[clap(flatten)]
    sampling: SamplingArgs,
    #[clap(flatten)]
    structured: StructuredArgs,
}

/// Streams one reply to stdout and returns the generation record: `prompt` (with `images`)
/// run alone through `engine`, whose prefix cache may hold its first tokens already (a chat's
/// earlier turns). `interrupted` is polled after each token (Ctrl-C in chat): when it turns
/// true the reply ends there.
#[allow(clippy::too_many_arguments)]
pub fn stream_reply(
    engine: &mut Engine<'_>,
    tok: &qwen3_vl::Tokenizer,
    prompt: &[u32],
    images: Option<ImageInput>,
    max_tokens: usize,
    sampler: Sampler,
    stops: &[u32],
    interrupted: &dyn Fn() -> bool,
) -> CliResult<Generated> {
    let mut dec = tok.stream_decoder(true);
    let mut out = std::io::stdout();
    let mut err: Option<qwen3_vl::Error> = None;
    let t0 = Instant::now();
    let mut n = 0usize;
    let req = Request { prompt: prompt.to_vec(), images, max_new: max_tokens, sampler, stop_ids: stops.to_vec() };
    let g = engine.generate(req, &mut |t| {
        n += 1;
        log::trace!("token {}: id {} at {:.3} s", n, t, t0.elapsed().as_secs_f64());
        if stops.contains(&t) {
            return false;
        }
        match dec.push(t) {
            Ok(s) => {
                // a closed stdout ends the process quietly (SIGPIPE is at its default)
                let _ = out.write_all(s.as_bytes());
                let _ = out.flush();
                !interrupted()
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
    Ok(g)
}

/// The one-line summary printed after a reply (not with -q).
pub fn summary(g: &Generated, why_length: &str) -> String {
    let n = g.tokens.len();
    format!(
        "[{} prompt tokens{} in {:.2} s ({:.1} tok/s); {} generated in {:.2} s ({:.2} tok/s); stop: {}]",
        g.prompt_tokens,
        if g.cached_tokens > 0 { format!(" ({} from the prefix cache)", g.cached_tokens) } else { String::new() },
        g.prefill_secs,
        g.prompt_tokens as f64 / g.prefill_secs.max(1e-9),
        n,
        g.decode_secs,
        n.saturating_sub(1) as f64 / g.decode_secs.max(1e-9),
        match g.stop {
            Stop::StopToken(_) => "end of reply",
            Stop::MaxTokens => why_length,
            Stop::Constraint => "a constraint rejected the token drawn",
        }
    )
}

pub fn run_generate(a: GenerateArgs) -> CliResult<()> {
    let t_start = Instant::now();
    // 1. every input, before the weights
    let text = a.prompt.read()?;
    let checked = a.model.check()?;
    let t_checked = Instant::now();
    let prepared = a.images.prepare(&checked.preprocess, &checked.video)?;
    if a.raw && !prepared.grids.is_empty() {
        return Err("--raw takes no --image or --video: write the placeholders yourself without --raw".into());
    }
    let text = if a.raw {
        text
    } else {
        let mut turns = Vec::new();
        if let Some(s) = &a.system {
            turns.push(Turn::text("system", s));
        }
        turns.push(user_turn(&text, &prepared.media));
        render_prompt(&checked.format, &turns, &prepared.media)?
    };
    let prompt = checked.tokenizer.encode(&text);
    let grammar = a.structured.compile(&checked.tokenizer)?;
    let limit = checked.config.text.max_position_embeddings;
    if prompt.len() + a.max_tokens > limit {
        return Err(format!("the prompt is {} tokens; with --max-tokens {} that exceeds the model's context of {} tokens", prompt.len(), a.max_tokens, limit).into());
    }
    let t_inputs = Instant::now();
    // 2. the weights
    // the tower's activations are planned for its largest pass (long videos go in slices)
    let image_tokens = qwen3_vl::model::vision::tower_tokens(&prepared.grids, checked.config.vision.spatial_merge_size);
    // the engine's KV cache: whole blocks for the prompt and the reply (its type once loaded)
    let mut cfg = EngineConfig::new(1, prompt.len() + a.max_tokens, qwen3_vl::DType::F32);
    let l = a.model.load(checked, cfg.cache_tokens(), Some(image_tokens).filter(|&n| n > 0))?;
    cfg.kv_dtype = l.kv_dtype;
    let t_loaded = Instant::now();
    // 3. the reply
    let mut engine = Engine::new(&l.model, &*l.backend, cfg)?;
    let params = a.sampling.params(&l.defaults);
    let g = stream_reply(&mut engine, &l.tokenizer, &prompt, prepared.input(), a.max_tokens, constrain(Sampler::new(params), grammar.as_ref()), &stop_ids(&l.tokenizer), &|| false)?;
    if !quiet() {
        eprintln!("{}", summary(&g, "--max-tokens reached"));
    }
    log::debug!(
        "timings: model files and tokenizer {:.2} s, images and prompt {:.2} s, weights {:.2} s, prefill {:.2} s, decode {:.2} s ({})",
        (t_checked - t_start).as_secs_f64(),
        (t_inputs - t_checked).as_secs_f64(),
        (t_loaded - t_inputs).as_secs_f64(),
        g.prefill_secs,
        g.decode_secs,
        describe_sampling(&params)
    );
    log::debug!("memory after generation: {}", memory_report(&*l.backend));
    Ok(())
}
