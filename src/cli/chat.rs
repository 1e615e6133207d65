//! `qwen3-vl chat`: an interactive conversation on stdin / stdout.
//!
//! Each turn runs through the engine as the whole conversation so far plus the new message,
//! rendered with the model's chat template; the engine's prefix cache holds the earlier turns'
//! keys and values, so only the new tokens (and the last partial block) are computed. When a new turn (plus room for the reply) does not fit
//! the context, the oldest turns are dropped, with a note, and the rest of the conversation is
//! read again. Images come with `-i` (first message) or `/image PATH`,
//! videos with `--video` or `/video PATH`
//! (next message). Ctrl-C stops the reply being written; the conversation goes on.

use super::generate::{stream_reply, summary};
use super::load::{prepare_images, prepare_video, render_prompt, stop_ids, user_turn, CliResult, ImageArgs, Loaded, ModelArgs, Prepared, SamplingArgs};
use qwen3_vl::video::{VideoConfig, VideoLimits};
use super::logger::quiet;
use super::ranges;
use super::structured::{constrain, StructuredArgs};
use qwen3_vl::generate::grammar::Grammar;
use qwen3_vl::template::Turn;
use qwen3_vl::engine::{Engine, EngineConfig};
use qwen3_vl::generate::{Sampler, SamplingParams, Stop};
use qwen3_vl::signals;
use std::io::{BufRead, Write};
use std::path::{Path, PathBuf};

#[derive(clap::Args)]
pub struct ChatArgs {
    #[clap(flatten)]
    model: ModelArgs,
    /// An optional system message.
    #[clap(long)]
    system: Option<String>,
    /// Images and videos for the first message.
    #[clap(flatten)]
    pub attach: ImageArgs,
    /// Most tokens per reply (1 to 16777216).
    #[clap(long, default_value = "512", value_parser = ranges::max_tokens, allow_hyphen_values = true)]
    max_tokens: usize,
    /// Context size in tokens for the whole conversation (16 and up, capped by the model's).
    #[clap(long, default_value = "4096", value_parser = ranges::context, allow_hyphen_values = true)]
    context: usize,
    #[clap(flatten)]
    sampling: SamplingArgs,
    #[clap(flatten)]
    structured: StructuredArgs,
}

const HELP: &str = "commands:
  /image PATH   attach an image (JPEG, PNG, WebP) to your next message
  /video PATH   attach a video (GIF, WebP; MP4, WebM, MOV, ... via ffmpeg) to your next message
  /reset        start a new conversation
  /help         this list
  /exit, /quit  leave (Ctrl-D too)
Ctrl-C stops the reply being written; the conversation goes on. Ctrl-C at the prompt quits.
Start a message with // to send text that begins with /.";

/// One finished exchange: the user's message and the reply.
struct Exchange {
    user: String,
    images: Prepared,
    reply: String,
}

struct Chat<'a> {
    l: &'a Loaded,
    capacity: usize,
    max_tokens: usize,
    system: Option<String>,
    engine: Engine<'a>,
    sampling: SamplingParams,
    stops: Vec<u32>,
    /// What every reply must match (`--json-schema`, `--regex`, `--grammar`).
    grammar: Option<std::sync::Arc<Grammar>>,
    /// The exchanges so far (their tokens stay in the engine's prefix cache while its blocks
    /// last).
    turns: Vec<Exchange>,
    /// Images for the next message.
    attached: Prepared,
}

impl<'a> Chat<'a> {
    fn reset(&mut self) -> CliResult<()> {
        self.turns.clear();
        self.attached = Prepared::default();
        Ok(())
    }

    /// The tokens and images of the whole conversation from exchange `first` on, plus `user`.
    fn rebuilt(&self, first: usize, user: &str, images: &Prepared) -> CliResult<(Vec<u32>, Prepared)> {
        let mut turns: Vec<Turn> = self.system.iter().map(|s| Turn::text("system", s)).collect();
        let mut all = Prepared::default();
        for t in &self.turns[first..] {
            turns.push(user_turn(&t.user, &t.images.media));
            turns.push(Turn::text("assistant", &t.reply));
            all.extend(&t.images);
        }
        turns.push(user_turn(user, &images.media));
        all.extend(images);
        let text = render_prompt(&self.l.format, &turns, &all.media)?;
        Ok((self.l.tokenizer.encode(&text), all))
    }

    /// Answers one user message.
    fn turn(&mut self, user: &str) -> CliResult<()> {
        let images = std::mem::take(&mut self.attached);
        // 1. the whole conversation (the engine finds the earlier turns in its prefix cache);
        //    when the reply has no room, the oldest exchanges are dropped until it has
        let mut dropped = 0;
        let (mut all, mut all_images) = match self.rebuilt(0, user, &images) {
            Ok(r) => r,
            Err(e) => {
                eprintln!("(not sent: {})", e);
                return Ok(());
            }
        };
        while all.len() + self.max_tokens > self.capacity && dropped < self.turns.len() {
            dropped += 1;
            (all, all_images) = self.rebuilt(dropped, user, &images)?;
        }
        if all.len() + 1 > self.capacity {
            eprintln!(
                "(this message needs {} tokens{}, more than the context of {} (--context): nothing was sent)",
                all.len() + 1,
                if images.grids.is_empty() { "" } else { " with its images" },
                self.capacity
            );
            return Ok(());
        }
        if dropped > 0 {
            eprintln!("(the context is full: dropped the {} oldest turn{}, {} remain)", dropped, if dropped == 1 { "" } else { "s" }, self.turns.len() - dropped);
            self.turns.drain(..dropped);
        }
        let budget = self.max_tokens.min(self.capacity - all.len());
        // 3. the reply; Ctrl-C ends it early
        let reply = signals::Reply::start();
        let g = stream_reply(&mut self.engine, &self.l.tokenizer, &all, all_images.input(), budget, constrain(Sampler::new(self.sampling), self.grammar.as_ref()), &self.stops, &|| reply.interrupted())?;
        let interrupted = reply.interrupted();
        drop(reply);
        if interrupted {
            eprintln!("(stopped)");
        } else if !quiet() {
            log::debug!("{}", summary(&g, "--max-tokens reached"));
            if g.stop == Stop::MaxTokens && budget < self.max_tokens {
                eprintln!("\n(the reply stopped after {} tokens: the context of {} tokens (--context) is full; the next message drops the oldest turns)", g.tokens.len(), self.capacity);
            } else if g.stop == Stop::MaxTokens {
                eprintln!("\n(the reply stopped at --max-tokens {})", self.max_tokens);
            }
        }
        // 4. remember it (the template closes the reply's turn when the next one is rendered)
        let kept = match g.stop {
            Stop::StopToken(_) | Stop::Constraint => &g.tokens[..g.tokens.len() - 1],
            Stop::MaxTokens => &g.tokens[..],
        };
        let text = self.l.tokenizer.decode(kept, true)?;
        self.turns.push(Exchange { user: user.to_string(), images, reply: text });
        Ok(())
    }

    /// `/image PATH`: decode now, send with the next message.
    fn attach(&mut self, path: &str, base: &qwen3_vl::image::PreprocessConfig, max_pixels: Option<usize>) {
        match prepare_images(&[PathBuf::from(path)], base, max_pixels) {
            Ok(p) => {
                eprintln!("(attached {}: {} image tokens; it goes with your next message)", path, p.tokens());
                self.attached.extend(&p);
            }
            Err(e) => eprintln!("(not attached: {})", e),
        }
    }

    /// `/video PATH`: decode and sample now, send with the next message.
    fn attach_video(&mut self, path: &str, cfg: &VideoConfig, limits: &VideoLimits) {
        match prepare_video(Path::new(path), cfg, limits) {
            Ok(p) => {
                eprintln!("(attached {}: {} video tokens; it goes with your next message)", path, p.tokens());
                self.attached.extend(&p);
            }
            Err(e) => eprintln!("(not attached: {})", e),
        }
    }
}

pub fn run_chat(a: ChatArgs) -> CliResult<()> {
    signals::install_chat();
    // 1. every input, before the weights
    let checked = a.model.check()?;
    let capacity = a.context.min(checked.config.text.max_position_embeddings);
    let preprocess = checked.preprocess.clone();
    let video_cfg = a.attach.video.config(&checked.video)?;
    let video_limits = a.attach.video.limits();
    let first_images = a.attach.prepare(&preprocess, &checked.video)?;
    let mut first: Vec<Turn> = a.system.iter().map(|s| Turn::text("system", s)).collect();
    first.push(user_turn("", &first_images.media));
    let grammar = a.structured.compile(&checked.tokenizer)?;
    let needed = checked.tokenizer.encode(&render_prompt(&checked.format, &first, &first_images.media)?).len() + 1;
    if needed > capacity {
        return Err(format!("the system message and images need about {} tokens, more than the context of {} (raise --context)", needed, capacity).into());
    }
    // 2. the weights
    // images may come at any turn (`/image`): under a budget the vision tower goes first
    // the engine's KV cache: whole blocks for the context (its type once loaded)
    let mut cfg = EngineConfig::new(1, capacity, qwen3_vl::DType::F32);
    let l = a.model.load(checked, cfg.cache_tokens(), Some(capacity))?;
    cfg.kv_dtype = l.kv_dtype;
    let engine = Engine::new(&l.model, &*l.backend, cfg)?;
    let mut chat = Chat {
        l: &l,
        capacity,
        max_tokens: a.max_tokens,
        system: a.system.clone(),
        engine,
        sampling: a.sampling.params(&l.defaults),
        stops: stop_ids(&l.tokenizer),
        grammar,
        turns: Vec::new(),
        attached: first_images,
    };
    if !quiet() {
        eprintln!("chat with {} ({} tokens of context). /help lists the commands; Ctrl-C stops a reply, Ctrl-D or /exit quits.", a.model.model.display(), capacity);
        if !chat.attached.grids.is_empty() {
            eprintln!("({} image(s) and video(s) from -i / --video go with your first message)", chat.attached.grids.len());
        }
    }
    // 3. the conversation
    let stdin = std::io::stdin();
    loop {
        eprint!("> ");
        let _ = std::io::stderr().flush();
        let mut line = String::new();
        if stdin.lock().read_line(&mut line)? == 0 {
            eprintln!();
            break;
        }
        let line = line.trim_end_matches(&['\r', '\n'][..]);
        let trimmed = line.trim();
        let (cmd, arg) = match trimmed.split_once(char::is_whitespace) {
            Some((c, rest)) => (c, rest.trim()),
            None => (trimmed, ""),
        };
        match cmd {
            "" => continue,
            "/exit" | "/quit" => break,
            "/help" => eprintln!("{}", HELP),
            "/reset" => {
                chat.reset()?;
                eprintln!("(conversation reset)");
            }
            "/image" if arg.is_empty() => eprintln!("(usage: /image PATH)"),
            "/image" => chat.attach(arg, &preprocess, a.attach.max_pixels),
            "/video" if arg.is_empty() => eprintln!("(usage: /video PATH)"),
            "/video" => chat.attach_video(arg, &video_cfg, &video_limits),
            c if c.starts_with('/') && !c.starts_with("//") => eprintln!("(unknown command {}; /help lists the commands)", c),
            _ => {
                let text = line.strip_prefix("//").map(|rest| format!("/{}", rest)).unwrap_or_else(|| line.to_string());
                chat.turn(&text)?;
            }
        }
    }
    Ok(())
}
