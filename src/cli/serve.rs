//! `qwen3-vl serve`: the OpenAI-compatible HTTP server (see `qwen3_vl::server`).

use super::load::{describe_sampling, stop_ids, CliResult, ModelArgs, SamplingArgs};
use super::ranges;
use qwen3_vl::server::{self, ServerConfig};
use qwen3_vl::signals;
use std::net::TcpListener;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

#[derive(clap::Args)]
pub struct ServeArgs {
    #[clap(flatten)]
    model: ModelArgs,
    /// Address to listen on. Anything but loopback exposes the model to the network.
    #[clap(long, default_value = "127.0.0.1")]
    host: String,
    /// Port to listen on (0: any free port, printed at start).
    #[clap(long, default_value = "8080", value_parser = ranges::port, allow_hyphen_values = true)]
    port: u16,
    /// The model name that /v1/models reports (default: the model directory's name).
    #[clap(long)]
    model_name: Option<String>,
    /// Require `Authorization: Bearer KEY` on /v1/ requests.
    #[clap(long)]
    api_key: Option<String>,
    /// Serve image_url file paths (absolute or file://) from inside this directory only.
    #[clap(long)]
    allowed_image_dir: Option<PathBuf>,
    /// Resize images above this many pixels down (default from preprocessor_config.json).
    #[clap(long, value_parser = ranges::max_pixels, allow_hyphen_values = true)]
    max_pixels: Option<usize>,
    /// Refuse images that declare more pixels than this, before decoding them.
    #[clap(long, default_value = "16777216", value_parser = ranges::max_pixels, allow_hyphen_values = true)]
    max_image_pixels: usize,
    /// Most images per request (0 to 256).
    #[clap(long, default_value = "8", value_parser = ranges::images, allow_hyphen_values = true)]
    max_images: usize,
    /// Most videos per request (0 to 256).
    #[clap(long, default_value = "2", value_parser = ranges::images, allow_hyphen_values = true)]
    max_videos: usize,
    /// Refuse videos longer than this many seconds, before decoding their frames.
    #[clap(long, default_value = "600", value_parser = ranges::seconds, allow_hyphen_values = true)]
    max_video_seconds: u64,
    /// Refuse videos of more frames than this, before decoding them.
    #[clap(long, default_value = "36000", value_parser = ranges::max_tokens, allow_hyphen_values = true)]
    max_video_frames: usize,
    #[clap(flatten)]
    video: super::load::VideoOpts,
    /// Largest request body, in MiB (1 to 4096; images travel base64-encoded inside it).
    #[clap(long, default_value = "32", value_parser = ranges::mib, allow_hyphen_values = true)]
    max_body_mib: usize,
    /// Most prompt tokens per request, image tokens included (default: 8192, at most the model's context).
    #[clap(long, value_parser = ranges::max_tokens, allow_hyphen_values = true)]
    max_prompt_tokens: Option<usize>,
    /// Most tokens generated per request; also the default max_tokens (default: 2048).
    #[clap(long, value_parser = ranges::max_tokens, allow_hyphen_values = true)]
    max_output_tokens: Option<usize>,
    /// Most requests waiting for the model; more get 429 with Retry-After (1 to 4096).
    #[clap(long, default_value = "16", value_parser = ranges::queue, allow_hyphen_values = true)]
    queue: usize,
    /// Most open connections, idle ones included; more are answered 503 (1 to 4096).
    #[clap(long, default_value = "1024", value_parser = ranges::connections, allow_hyphen_values = true)]
    max_connections: usize,
    /// Most open connections from one client address; more are answered 503 (1 to 4096; raise
    /// it behind a proxy, whose connections all come from one address).
    #[clap(long, default_value = "64", value_parser = ranges::connections, allow_hyphen_values = true)]
    max_client_connections: usize,
    /// Most chat requests being received and checked at once (each holds its body in memory);
    /// more get 503 (1 to 4096). Queued and generating requests hold none.
    #[clap(long, default_value = "64", value_parser = ranges::connections, allow_hyphen_values = true)]
    max_active_requests: usize,
    /// Seconds a client has to send a whole request, and that an idle connection stays open.
    #[clap(long, default_value = "30", value_parser = ranges::seconds, allow_hyphen_values = true)]
    read_timeout: u64,
    /// Requests generated at once, continuously batched (1 to 1024).
    #[clap(long, default_value = "16", value_parser = ranges::queue, allow_hyphen_values = true)]
    max_batch: usize,
    /// Tokens the KV cache holds over all running requests (default: 1,024 per --max-batch
    /// request up to 16,384, at least one request's prompt and output); requests wait for
    /// blocks beyond it.
    #[clap(long, value_parser = ranges::max_tokens, allow_hyphen_values = true)]
    kv_cache_tokens: Option<usize>,
    /// Prompt tokens read per engine step at most, so a long prompt does not stall the other
    /// streams (an image prompt is read whole).
    #[clap(long, default_value = "2048", value_parser = ranges::max_tokens, allow_hyphen_values = true)]
    max_prefill_tokens: usize,
    #[clap(flatten)]
    sampling: SamplingArgs,
}

pub fn run(a: ServeArgs) -> CliResult<()> {
    signals::install_server();
    // 1. every input, before the weights
    let checked = a.model.check()?;
    let context = checked.config.text.max_position_embeddings;
    let preprocess = server::images::cap_pixels(checked.preprocess.clone(), a.max_pixels)?;
    let allowed = match &a.allowed_image_dir {
        Some(d) => Some(std::fs::canonicalize(d).map_err(|e| format!("--allowed-image-dir {}: {}", d.display(), e))?),
        None => None,
    };
    if let Some(d) = &allowed {
        if !d.is_dir() {
            return Err(format!("--allowed-image-dir {} is not a directory", d.display()).into());
        }
    }
    let model_id = a.model_name.clone().unwrap_or_else(|| {
        std::fs::canonicalize(&a.model.model).ok().and_then(|p| p.file_name().map(|n| n.to_string_lossy().into_owned())).unwrap_or_else(|| "qwen3-vl".into())
    });
    let mut cfg = ServerConfig::new(model_id, context, preprocess);
    cfg.api_key = a.api_key.clone();
    cfg.images.allowed_dir = allowed;
    cfg.images.max_source_pixels = a.max_image_pixels;
    cfg.images.max_file_bytes = a.max_body_mib << 20;
    cfg.parse.max_images = a.max_images;
    cfg.parse.max_videos = a.max_videos;
    cfg.images.video = a.video.config(&checked.video)?;
    cfg.images.video_limits.max_bytes = (a.max_body_mib << 20) as u64;
    cfg.images.video_limits.max_duration = a.max_video_seconds as f64;
    cfg.images.video_limits.max_source_frames = a.max_video_frames;
    cfg.images.video_limits.ffmpeg = a.video.ffmpeg.clone();
    cfg.images.video_limits.timeout = std::time::Duration::from_secs(a.max_video_seconds.clamp(30, 600));
    cfg.http.max_body = a.max_body_mib << 20;
    if let Some(n) = a.max_prompt_tokens {
        cfg.tokens.max_prompt = n.min(context);
    }
    if let Some(n) = a.max_output_tokens {
        cfg.tokens.max_output = n.min(context);
    }
    cfg.queue_capacity = a.queue;
    cfg.max_batch = a.max_batch;
    cfg.kv_cache_tokens = a.kv_cache_tokens;
    cfg.max_prefill_tokens = a.max_prefill_tokens;
    cfg.max_connections = a.max_connections;
    cfg.max_client_connections = a.max_client_connections;
    cfg.max_active_requests = a.max_active_requests;
    cfg.read_timeout = Duration::from_secs(a.read_timeout);
    cfg.idle_timeout = Duration::from_secs(a.read_timeout);
    // 2. the socket (a taken port fails before the weights load), answering at once: /health
    //    says "loading" until the model is ready
    let listener = TcpListener::bind((a.host.as_str(), a.port)).map_err(|e| format!("cannot listen on {}:{}: {}", a.host, a.port, e))?;
    let addr = listener.local_addr()?;
    if !addr.ip().is_loopback() {
        log::warn!("listening on {}, reachable from the network{}", addr, if cfg.api_key.is_none() { " without an API key (--api-key)" } else { "" });
    }
    let per_request = (cfg.tokens.max_prompt + cfg.tokens.max_output).min(context);
    if let Some(n) = cfg.kv_cache_tokens {
        if n < per_request {
            return Err(format!("--kv-cache-tokens {} is less than one request may need ({} prompt + {} output tokens)", n, cfg.tokens.max_prompt, cfg.tokens.max_output).into());
        }
    }
    let kv_tokens = cfg.kv_cache_tokens.unwrap_or_else(|| server::default_kv_tokens(cfg.max_batch, per_request));
    let (model_id, queue, max_prompt, max_output, max_images, max_pixels) =
        (cfg.model_id.clone(), cfg.queue_capacity, cfg.tokens.max_prompt, cfg.tokens.max_output, cfg.parse.max_images, cfg.images.max_source_pixels);
    let front = server::Front::start(listener, cfg, Arc::new(signals::shutdown_requested))?;
    eprintln!("accepting connections on http://{} (loading the model)", addr);
    // a test aid: hold the loading state this long, so that tests can see it
    if let Some(ms) = std::env::var("QWEN3_VL_TEST_LOAD_DELAY_MS").ok().and_then(|v| v.parse::<u64>().ok()) {
        std::thread::sleep(Duration::from_millis(ms.min(60_000)));
    }
    // 3. the weights: the placement plans for the whole KV cache of the engine; any request
    //    may carry images, so under a budget the vision tower goes first
    let l = a.model.load(checked, kv_tokens, Some(per_request.min(kv_tokens)))?;
    let defaults = a.sampling.params(&l.defaults);
    log::info!(
        "serving '{}' at http://{}/v1 (sampling defaults: {}; queue {}, prompt <= {} tokens, output <= {} tokens, <= {} images of <= {} pixels)",
        model_id,
        addr,
        describe_sampling(&defaults),
        queue,
        max_prompt,
        max_output,
        max_images,
        max_pixels
    );
    let stop_ids = stop_ids(&l.tokenizer);
    let tokenizer = Arc::new(l.tokenizer);
    let loaded = server::Loaded { model: &l.model, backend: &*l.backend, tokenizer, stop_ids, defaults, kv_dtype: Some(l.kv_dtype), format: l.format };
    // the line that scripts and tests wait for (requests are taken by then), printed even with -q
    front.serve(loaded, || eprintln!("listening on http://{}", addr))?;
    Ok(())
}
