//! `qwen3-vl serve`: the OpenAI-compatible HTTP server (see `qwen3_vl::server`).

use super::load::CliResult;
use super::serving::{Prepared, ServingArgs};
use super::ranges;
use qwen3_vl::server;
use qwen3_vl::signals;
use std::net::TcpListener;
use std::sync::Arc;
use std::time::Duration;

#[derive(clap::Args)]
pub struct ServeArgs {
    #[clap(flatten)]
    serving: ServingArgs,
    /// Address to listen on. Anything but loopback exposes the model to the network.
    #[clap(long, default_value = "127.0.0.1")]
    host: String,
    /// Port to listen on (0: any free port, printed at start).
    #[clap(long, default_value = "8080", value_parser = ranges::port, allow_hyphen_values = true)]
    port: u16,
    /// Require `Authorization: Bearer KEY` on /v1/ requests.
    #[clap(long)]
    api_key: Option<String>,
    /// Largest request body, in MiB (1 to 4096; images travel base64-encoded inside it).
    #[clap(long, default_value = "32", value_parser = ranges::mib, allow_hyphen_values = true)]
    max_body_mib: usize,
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
    /// more wait for a place (their bodies unread) up to --read-timeout, then get 503 (1 to
    /// 4096). Queued and generating requests hold none.
    #[clap(long, default_value = "64", value_parser = ranges::connections, allow_hyphen_values = true)]
    max_active_requests: usize,
    /// Seconds a client has to send a whole request, and that an idle connection stays open.
    #[clap(long, default_value = "30", value_parser = ranges::seconds, allow_hyphen_values = true)]
    read_timeout: u64,
    /// On SIGTERM (or Ctrl-C), seconds the accepted requests have to finish while /health
    /// answers 503 "draining" and new ones get 503; then the ones still running end with what
    /// they have (finish reason "length") and the process exits 0 (0 to 3600). A second
    /// signal exits at once. Keep it below Kubernetes' terminationGracePeriodSeconds.
    #[clap(long, default_value = "25", value_parser = ranges::shutdown_seconds, allow_hyphen_values = true)]
    shutdown_timeout: u64,
}

pub fn run(a: ServeArgs) -> CliResult<()> {
    signals::install_server();
    // 1. every input, before the weights
    let Prepared { checked, mut cfg, kv_tokens, per_request, devices } = a.serving.prepare(a.max_body_mib)?;
    cfg.api_key = a.api_key.clone();
    cfg.http.max_body = a.max_body_mib << 20;
    cfg.queue_capacity = a.queue;
    cfg.max_connections = a.max_connections;
    cfg.max_client_connections = a.max_client_connections;
    cfg.max_active_requests = a.max_active_requests;
    cfg.read_timeout = Duration::from_secs(a.read_timeout);
    cfg.idle_timeout = Duration::from_secs(a.read_timeout);
    cfg.shutdown_timeout = Duration::from_secs(a.shutdown_timeout);
    // 2. the socket (a taken port fails before the weights load), answering at once: /health
    //    says "loading" until the model is ready
    let listener = TcpListener::bind((a.host.as_str(), a.port)).map_err(|e| format!("cannot listen on {}:{}: {}", a.host, a.port, e))?;
    let addr = listener.local_addr()?;
    if !addr.ip().is_loopback() {
        log::warn!("listening on {}, reachable from the network{}", addr, if cfg.api_key.is_none() { " without an API key (--api-key)" } else { "" });
    }
    let (model_id, queue, max_prompt, max_output, max_images, max_pixels) =
        (cfg.model_id.clone(), cfg.queue_capacity, cfg.tokens.max_prompt, cfg.tokens.max_output, cfg.parse.max_images, cfg.images.max_source_pixels);
    let front = server::Front::start(listener, cfg, Arc::new(signals::shutdown_requested))?;
    eprintln!("accepting connections on http://{} (loading the model)", addr);
    let loading = exit_if_stopped_while_loading();
    // a test aid: hold the loading state this long, so that tests can see it
    if let Some(ms) = std::env::var("QWEN3_VL_TEST_LOAD_DELAY_MS").ok().and_then(|v| v.parse::<u64>().ok()) {
        std::thread::sleep(Duration::from_millis(ms.min(60_000)));
    }
    // 3. the weights, once per replica
    let (model, format) = a.serving.load(checked, &devices, kv_tokens, per_request)?;
    log::info!(
        "serving '{}' at http://{}/v1 (queue {}, prompt <= {} tokens, output <= {} tokens, <= {} images of <= {} pixels)",
        model_id,
        addr,
        queue,
        max_prompt,
        max_output,
        max_images,
        max_pixels
    );
    let loaded = model.server(format);
    *loading.lock().unwrap_or_else(|p| p.into_inner()) = false;
    // the line that scripts and tests wait for (requests are taken by then), printed even with -q
    front.serve(loaded, || eprintln!("listening on http://{}", addr))?;
    Ok(())
}

/// Watches for a shutdown while the model loads: no request can be in flight then, so the
/// process exits 0 at once instead of finishing the load. Set the returned flag to false (the
/// model loaded) to stop watching; the watcher holds it while exiting, so the two never cross.
fn exit_if_stopped_while_loading() -> Arc<std::sync::Mutex<bool>> {
    let loading = Arc::new(std::sync::Mutex::new(true));
    let flag = Arc::clone(&loading);
    std::thread::spawn(move || loop {
        {
            let still = flag.lock().unwrap_or_else(|p| p.into_inner());
            if !*still {
                return;
            }
            if signals::shutdown_requested() {
                log::info!("shutting down while the model loads: nothing is in flight; server stopped");
                std::process::exit(0);
            }
        }
        std::thread::sleep(Duration::from_millis(20));
    });
    loading
}
