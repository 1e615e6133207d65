//! Command-line interface: argument parsing, logging, and one module per subcommand.

/// Prints one line of a human-readable report: on stdout, or on stderr when `--json` keeps
/// stdout for the one JSON document.
macro_rules! report {
    ($json:expr, $($arg:tt)*) => {
        if $json {
            eprintln!($($arg)*)
        } else {
            println!($($arg)*)
        }
    };
}

mod batch;
mod bench;
mod bench_batch;
mod chat;
mod generate;
mod info;
mod kernels_bench;
mod load;
mod logger;
mod logits;
mod progress;
mod quantize;
mod replicas;
mod serve;
mod serving;
mod structured;

use clap::{Parser, Subcommand};
use qwen3_vl::kernels::KernelsRequest;
use qwen3_vl::loading::ranges;
use qwen3_vl::Precision;
use qwen3_vl::{Backend, DType, DeviceRequest, Selection};

#[derive(Parser)]
#[clap(name = "qwen3-vl", version, about = "Qwen3-VL inference: Rust GPU kernels (CUDA, compute 6.1+) with a pure-Rust CPU fallback")]
pub struct Cli {
    /// More detail on stderr (-v: sampling settings, timings per phase, placement, memory;
    /// -vv: every token); QWEN3_VL_LOG=error|warn|info|debug|trace also works.
    #[clap(short, long, action = clap::ArgAction::Count, global = true)]
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
    /// Where to run: auto (CUDA device 0 if it works, else CPU), cpu, cuda or cuda:N (the CUDA
    /// device of ordinal N).
    #[clap(long, default_value = "auto")]
    pub device: DeviceRequest,
    /// CPU worker threads, 1 to 1024 (default: all cores).
    #[clap(long, value_parser = ranges::threads, allow_hyphen_values = true)]
    pub threads: Option<usize>,
    /// GPU kernel module: auto (the newest the device supports), compute_61 (every GPU since
    /// Pascal) or compute_80 (Ampere and newer, tensor cores).
    #[clap(long, default_value = "auto")]
    pub kernels: KernelsRequest,
    /// How the tensor-core GEMMs round activations: auto (bf16), f32 (split into two 16-bit
    /// parts: f32-faithful) or bf16 (rounded once: faster, within transformers bf16's error).
    /// The CPU and the compute_61 module always compute in f32.
    #[clap(long, default_value = "auto", value_parser = parse_precision)]
    pub precision: PrecisionArg,
    /// KV-cache element type: auto (f16 on a GPU, f32 on the CPU), f32 or f16.
    #[clap(long, default_value = "auto", value_parser = parse_kv_cache)]
    pub kv_cache: KvCacheArg,
    /// The most the engine puts on the GPU: 2GiB, 1500MiB, 2G, 3.5GB or bytes (default: the
    /// device's free memory less 5%, at least 256 MiB). What does not fit (text layers from the
    /// last, LM head, vision tower, embedding) runs on the CPU.
    #[clap(long, value_parser = qwen3_vl::model::placement::parse_size)]
    pub gpu_memory: Option<usize>,
    /// Exactly N text layers on the GPU (the first N; the rest on the CPU) instead of as many
    /// as --gpu-memory holds.
    #[clap(long)]
    pub gpu_layers: Option<usize>,
}

/// `--kv-cache`: a float type, or the backend's default.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct KvCacheArg(pub Option<DType>);

fn parse_kv_cache(s: &str) -> Result<KvCacheArg, String> {
    qwen3_vl::loading::parse_kv_cache(s).map(KvCacheArg)
}

/// `--precision`: a mode, or the default ([`qwen3_vl::loading::DEFAULT_PRECISION`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PrecisionArg(pub Option<Precision>);

fn parse_precision(s: &str) -> Result<PrecisionArg, String> {
    qwen3_vl::loading::parse_precision(s).map(PrecisionArg)
}

impl DeviceArgs {
    /// The library's options of these flags.
    pub fn options(&self) -> qwen3_vl::loading::DeviceOptions {
        qwen3_vl::loading::DeviceOptions {
            device: self.device,
            threads: self.threads,
            kernels: self.kernels,
            precision: self.precision.0,
            kv_cache: self.kv_cache.0,
            gpu_memory: self.gpu_memory,
            gpu_layers: self.gpu_layers,
            reserve: 0,
        }
    }

    /// The backend these options ask for (logs the choice and why), set to the precision asked
    /// for.
    pub fn select(&self) -> Result<Selection, qwen3_vl::Error> {
        self.options().select()
    }

    /// The KV-cache type on `backend`.
    pub fn kv_dtype(&self, backend: &dyn Backend) -> DType {
        self.options().kv_dtype(backend)
    }
}

#[derive(Subcommand)]
enum Command {
    /// Answer one prompt, streaming the reply (tokens/s at the end).
    Generate(generate::GenerateArgs),
    /// Interactive multi-turn chat, with images (-i, /image).
    Chat(chat::ChatArgs),
    /// OpenAI-compatible HTTP server (POST /v1/chat/completions, GET /v1/models, /health, /metrics).
    Serve(serve::ServeArgs),
    /// Run a file of requests in the OpenAI Batch format (JSONL in, JSONL out), resumable.
    Batch(batch::BatchArgs),
    /// Write the logits after the last prompt token to a file (little-endian f32).
    Logits(logits::LogitsArgs),
    /// Measure prefill and decode speed (tokens/s) of a checkpoint.
    Bench(bench::BenchArgs),
    /// Write a Hugging Face checkpoint as GGUF files (text model + mmproj): q8_0, q4_k_m or f16.
    Quantize(quantize::QuantizeArgs),
    /// Time the GPU decode kernels on a model's shapes against the copy bandwidth.
    KernelsBench(kernels_bench::KernelsBenchArgs),
    /// Show which backend would run and why, with the kernels this build carries.
    Info(info::InfoArgs),
    /// Print an embedded PTX module (for ptxas and other tools).
    Ptx(info::PtxArgs),
}

/// Parses the arguments, runs the subcommand, and returns the process exit code.
pub fn run() -> i32 {
    use clap::{CommandFactory, FromArgMatches};
    let matches = Cli::command().get_matches();
    let mut cli = match Cli::from_arg_matches(&matches) {
        Ok(c) => c,
        Err(e) => e.exit(),
    };
    // images and videos in the order given on the command line
    if let Some((_, sub)) = matches.subcommand() {
        match &mut cli.command {
            Command::Generate(a) => a.images.order = load::media_order(sub, "images", "videos"),
            Command::Logits(a) => a.images.order = load::media_order(sub, "images", "videos"),
            Command::Chat(a) => a.attach.order = load::media_order(sub, "images", "videos"),
            _ => {}
        }
    }
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
        Command::Batch(a) => batch::run(a),
        Command::Logits(a) => logits::run(a),
        Command::Bench(a) => bench::run(a),
        Command::Quantize(a) => quantize::run(a),
        Command::KernelsBench(a) => kernels_bench::run(a),
        Command::Info(a) => info::run(a),
        Command::Ptx(a) => info::print_ptx(a),
    };
    match result {
        Ok(()) => 0,
        Err(e) => {
            eprintln!("error: {}", e);
            1
        }
    }
}

#[cfg(test)]
mod tests {
    use super::Cli;
    use clap::CommandFactory;

    /// clap's own consistency checks over every subcommand (argument ids named by groups,
    /// `requires` and `conflicts_with` exist, no duplicate flags); they run only when the
    /// command is built, so a typo would otherwise panic at the first use of that subcommand.
    #[test]
    fn the_command_line_definition_is_consistent() {
        Cli::command().debug_assert();
    }
}
