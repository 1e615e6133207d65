//! Command-line interface: argument parsing, logging, and one module per subcommand.

mod bench;
mod chat;
mod generate;
mod info;
mod load;
mod logger;
mod logits;
mod ranges;
mod serve;

use clap::{Parser, Subcommand};
use qwen3_vl::DeviceRequest;

#[derive(Parser)]
#[clap(name = "qwen3-vl", version, about = "Qwen3-VL inference: Rust GPU kernels (CUDA, compute 6.1+) with a pure-Rust CPU fallback")]
pub struct Cli {
    /// More detail on stderr (-v: sampling settings, timings per phase, placement, memory;
    /// -vv: every token); QWEN3_VL_LOG=error|warn|info|debug|trace also works.
    #[clap(short, long, parse(from_occurrences), global = true)]
    verbose: u8,
    /// Print only results (and errors): no progress, statistics or notes.
    #[clap(short, long, global = true, conflicts_with = "verbose")]
    quiet: bool,
    #[clap(subcommand)]
    command: Command,
}

/// Options every model-running subcommand shares.
#[derive(clap::Args, Clone, Debug)]
pub struct DeviceArgs {
    /// Where to run: auto (CUDA if a device works, else CPU), cpu or cuda.
    #[clap(long, default_value = "auto")]
    pub device: DeviceRequest,
    /// CPU worker threads, 1 to 1024 (default: all cores).
    #[clap(long, value_parser = ranges::threads, allow_hyphen_values = true)]
    pub threads: Option<usize>,
}

#[derive(Subcommand)]
enum Command {
    /// Answer one prompt, streaming the reply (tokens/s at the end).
    Generate(generate::GenerateArgs),
    /// Interactive multi-turn chat, with images (-i, /image).
    Chat(chat::ChatArgs),
    /// OpenAI-compatible HTTP server (POST /v1/chat/completions, GET /v1/models, /health, /metrics).
    Serve(serve::ServeArgs),
    /// Write the logits after the last prompt token to a file (little-endian f32).
    Logits(logits::LogitsArgs),
    /// Measure prefill and decode speed (tokens/s) of a checkpoint.
    Bench(bench::BenchArgs),
    /// Show which backend would run and why, with the kernels this build carries.
    Info(info::InfoArgs),
    /// Print the embedded PTX (for ptxas and other tools).
    Ptx,
}

/// Parses the arguments, runs the subcommand, and returns the process exit code.
pub fn run() -> i32 {
    let cli = Cli::parse();
    logger::init(cli.verbose, cli.quiet);
    // A closed stdout (`| head`) ends the program quietly; the server handles its sockets' errors
    // itself and keeps SIGPIPE ignored.
    if !matches!(cli.command, Command::Serve(_)) {
        qwen3_vl::signals::default_sigpipe();
    }
    let result = match cli.command {
        Command::Generate(a) => generate::run_generate(a),
        Command::Chat(a) => chat::run_chat(a),
        Command::Serve(a) => serve::run(a),
        Command::Logits(a) => logits::run(a),
        Command::Bench(a) => bench::run(a),
        Command::Info(a) => info::run(a),
        Command::Ptx => info::print_ptx(),
    };
    match result {
        Ok(()) => 0,
        Err(e) => {
            eprintln!("error: {}", e);
            1
        }
    }
}
