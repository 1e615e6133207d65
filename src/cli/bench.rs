//! `qwen3-vl bench`: prefill and decode speed of a checkpoint (random weights are fine), as a
//! table, and with `--json` as one JSON object on stdout (the table then goes to stderr).
//! Every number is the median of `--runs` measured runs after a warm-up run, timed with the
//! backend's marks (device events on a GPU). Decode is measured after `--context` tokens are
//! already in the KV cache, through the same decode path as `generate` (recorded CUDA graphs
//! where the backend records).

use super::progress::Progress;
use super::load::CliResult;
use qwen3_vl::model::placement::human;
use super::DeviceArgs;
use qwen3_vl::generate::{Sampler, SamplingParams, Session};
use qwen3_vl::{Backend, Mark};
use std::path::PathBuf;

#[derive(clap::Args)]
pub struct BenchArgs {
    /// Model: a directory (config.json and safetensors; tools/make_random_checkpoint.py makes
    /// one), a GGUF text model file, or a directory of GGUF files.
    #[clap(long, short = 'm')]
    model: PathBuf,
    /// The GGUF vision tower (mmproj) of a GGUF model.
    #[clap(long)]
    mmproj: Option<PathBuf>,
    /// Quantize a safetensors checkpoint while loading: q8_0 or q4_k_m.
    #[clap(long, value_parser = super::load::parse_quant)]
    quant: Option<qwen3_vl::model::Mix>,
    #[clap(flatten)]
    device: DeviceArgs,
    /// Prompt length for the prefill measurement.
    #[clap(long, default_value = "64")]
    prompt_tokens: usize,
    /// Tokens already in the KV cache when decode is measured (default: the prompt length).
    #[clap(long)]
    context: Option<usize>,
    /// Tokens generated per decode measurement.
    #[clap(long, default_value = "128")]
    gen_tokens: usize,
    /// Measured runs (after one warm-up run); the median is reported.
    #[clap(long, default_value = "5")]
    runs: usize,
    /// Also time the vision tower on one image of this many pixels per side (e.g. 1024); the
    /// patches are synthetic, the work is the real tower's.
    #[clap(long)]
    image_side: Option<usize>,
    /// Also time a video: decoded and processed as `generate --video` does (GIF and WebP
    /// natively, the rest through ffmpeg), then the tower and the first token of a prompt
    /// holding it.
    #[clap(long)]
    video: Option<PathBuf>,
    /// Also time the tower on a synthetic video of this many frames (with --video-side).
    #[clap(long, requires = "video_side")]
    video_frames: Option<usize>,
    /// The frames' side in pixels for --video-frames (rounded down to a multiple of 32).
    #[clap(long, requires = "video_frames")]
    video_side: Option<usize>,
    #[clap(flatten)]
    video_opts: super::load::VideoOpts,
    /// Decode with plain launches instead of recorded steps (CUDA graphs), for comparison.
    #[clap(long)]
    no_graphs: bool,
    /// Print the results as one JSON object on stdout (the tables go to stderr).
    #[clap(long)]
    json: bool,
    /// Run N sequences at once through the batching engine (as llama-batched-bench): prefill,
    /// aggregate and per-sequence decode tok/s.
    #[clap(long)]
    batch: Option<usize>,
    /// With --batch: rows of an engine step that reads prompts at most, decode rows included.
    #[clap(long, default_value = "2048")]
    max_prefill_tokens: usize,
    /// Decode under the JSON schema in FILE (structured output): every measured token is drawn
    /// under its mask, the schema starting again after each complete reply. Needs the
    /// checkpoint's tokenizer (tokenizer.json beside it, or the GGUF's).
    #[clap(long, value_name = "FILE")]
    json_schema: Option<PathBuf>,
}

fn median(mut v: Vec<f64>) -> f64 {
    if v.is_empty() {
        return f64::NAN;
    }
    v.sort_by(|a, b| a.partial_cmp(b).unwrap_or(std::cmp::Ordering::Equal));
    v[v.len() / 2]
}

/// A deterministic pseudo-random prompt of ordinary (non-special) ids.
fn prompt(n: usize, vocab: u64, salt: u64) -> Vec<u32> {
    (0..n as u64).map(|i| (((i + salt) * 2_654_435_761 + 12_345) % vocab.min(150_000)) as u32).collect()
}


fn seconds(b: &dyn Backend, a: &Mark, c: &Mark) -> CliResult<f64> {
    Ok(b.seconds_between(a, c)?)
}

pub fn run(a: BenchArgs) -> CliResult<()> {
    if a.runs == 0 || a.gen_tokens == 0 || a.prompt_tokens == 0 {
        return Err("--runs, --gen-tokens and --prompt-tokens must be at least 1".into());
    }
    let sel = a.device.select()?;
    let b = &*sel.backend;
    let mut opened = qwen3_vl::model::ModelFiles::find(&a.model, a.mmproj.as_deref())?.open()?;
    // the schema's grammar, before the weights (a bad schema fails fast)
    let schema = match &a.json_schema {
        Some(path) => {
            let tok = match opened.tokenizer.take() {
                Some(t) => t,
                None => qwen3_vl::Tokenizer::from_file(&a.model.join("tokenizer.json")).map_err(|e| format!("--json-schema needs the checkpoint's tokenizer: {}", e))?,
            };
            Some(super::structured::bench_schema(path, &tok)?)
        }
        None => None,
    };
    // greedy sampling, under the schema when there is one
    let sampler = || match &schema {
        Some((g, eos)) => Sampler::new(SamplingParams::greedy()).with_constraint(Box::new(super::structured::Restarting::new(std::sync::Arc::clone(g), *eos))),
        None => Sampler::new(SamplingParams::greedy()),
    };
    let context = a.context.unwrap_or(a.prompt_tokens).max(1);
    let capacity = context.max(a.prompt_tokens) + a.gen_tokens;
    // the vision work to time, if any (a real video is decoded before the weights load)
    let v = opened.config.vision.clone();
    let vision = vision_workload(&a, &v)?;
    if [a.image_side.is_some(), a.video.is_some(), a.video_frames.is_some()].iter().filter(|&&x| x).count() > 1 {
        return Err("time one of --image-side, --video and --video-frames per run".into());
    }
    // the placement covers the longest session: the text one, or the vision prompt's
    let image_session = vision.as_ref().map_or(0, |w| w.prompt_ids(&opened.config).len() + a.prompt_tokens + 1);
    if let Some(n) = a.batch {
        if n == 0 || vision.is_some() || a.context.is_some() {
            return Err("--batch takes a count of at least 1, and none of --image-side, --video, --video-frames or --context".into());
        }
    }
    let sessions = a.batch.unwrap_or(1);
    let tower = vision.as_ref().map(|w| qwen3_vl::model::vision::tower_tokens(&[w.grid], v.spatial_merge_size));
    let (model, _host) = super::load::load_model(&a.device, b, &opened, a.quant, (capacity * sessions).max(image_session), tower)?;
    if let Some(n) = a.batch {
        return run_batched(&a, b, &model, n, &sampler);
    }
    let weights = model.text.weights_summary();
    let (gpu_bytes, cpu_bytes) = model.placed_bytes(b);
    let c = &model.config.text;
    let vocab = c.vocab_size as u64;
    let kv = a.device.kv_dtype(b);
    let mut sess = Session::with_kv_dtype(&model, b, capacity, kv)?;
    sess.set_recording(!a.no_graphs);
    let (mut prefill, mut decode) = (Vec::new(), Vec::new());
    // 1. prefill of the prompt, then decode after `context` tokens, warm-up run first
    let bar = Progress::count("prefill + decode runs (a warm-up first)", a.runs as u64 + 1, "runs");
    for run in 0..=a.runs {
        bar.set(run as u64, a.runs as u64 + 1);
        sess.reset();
        let t0 = b.mark()?;
        sess.feed(&prompt(a.prompt_tokens, vocab, 0))?;
        let t1 = b.mark()?;
        let t_prefill = seconds(b, &t0, &t1)?;
        if context != a.prompt_tokens {
            sess.reset();
            sess.feed(&prompt(context, vocab, 7))?;
        }
        let mut next = 1000u32;
        let mut greedy = sampler();
        let mut profile = super::bench_batch::ProfileWindow::new();
        let t2 = b.mark()?;
        for i in 0..a.gen_tokens {
            profile.before_step(b, i)?;
            next = sess.decode(next, &mut greedy)?;
            greedy.accept(next)?;
        }
        profile.finish(b)?;
        let t3 = b.mark()?;
        if run > 0 {
            prefill.push(a.prompt_tokens as f64 / t_prefill);
            decode.push(a.gen_tokens as f64 / seconds(b, &t2, &t3)?);
        }
    }
    bar.finish("runs");
    eprintln!();
    // 2. the vision tower on one synthetic image, and the time to the first token of a prompt
    //    holding that image (tower, prefill of image + text tokens, first logits)
    let (mut vision_ms, mut ttft_ms) = (None, None);
    if let Some(w) = &vision {
        // the tower as `VisionModel::encode` runs it (one step on the tower's backend), the upload
        // aside; an input past `TOWER_SLICE_TOKENS` goes in slices of whole frames, uploads
        // included
        let merge = v.spatial_merge_size;
        let sliced = qwen3_vl::model::vision::tower_tokens(&[w.grid], merge) < w.tokens(merge);
        let x = if sliced { None } else { Some(model.vision.backend(b).upload_f32(&[w.patches.len() / w.row_len, w.row_len], &w.patches)?) };
        let mut times = Vec::new();
        let bar = Progress::count("vision tower runs (a warm-up first)", a.runs as u64 + 1, "runs");
        for run in 0..=a.runs {
            bar.set(run as u64, a.runs as u64 + 1);
            let t0 = b.mark()?;
            let out = match &x {
                Some(x) => {
                    let mut out = None;
                    model.vision.backend(b).within(&mut || {
                        out = Some(model.vision.forward(b, x, &[w.grid])?);
                        Ok(())
                    })?;
                    out
                }
                None => Some(model.vision.encode(b, &w.patches, w.row_len, &[w.grid])?),
            };
            let t1 = b.mark()?;
            b.synchronize()?;
            drop(out);
            if run > 0 {
                times.push(seconds(b, &t0, &t1)? * 1e3);
            }
        }
        bar.finish("runs");
        eprintln!();
        let mut ids = w.prompt_ids(&model.config);
        ids.extend(prompt(a.prompt_tokens, vocab, 3));
        let images = qwen3_vl::model::Images { patches: &w.patches, row_len: w.row_len, grids: &[w.grid] };
        let mut s = Session::with_kv_dtype(&model, b, ids.len() + 1, kv)?;
        let mut first = Vec::new();
        let bar = Progress::count("vision + prompt, first tokens (a warm-up first)", a.runs as u64 + 1, "runs");
        for run in 0..=a.runs {
            bar.set(run as u64, a.runs as u64 + 1);
            s.reset();
            let t0 = b.mark()?;
            s.feed_with_images(&ids, Some(&images))?;
            let t1 = b.mark()?;
            if run > 0 {
                first.push(seconds(b, &t0, &t1)? * 1e3);
            }
        }
        bar.finish("runs");
        eprintln!();
        vision_ms = Some(median(times.clone()));
        ttft_ms = Some(median(first));
        let n = w.patches.len() / w.row_len;
        report!(a.json, "| backend | {} | patches | tokens | vision tower ms | first token ms ({} + {} text tokens) |", w.what, w.what, a.prompt_tokens);
        report!(a.json, "|---|---|---|---|---|---|");
        report!(a.json,
            "| {} | {} | {} | {} | {:.1} (median of {}{}) | {:.1} |",
            b.describe(),
            w.describe,
            n,
            w.tokens(v.spatial_merge_size),
            vision_ms.unwrap_or(f64::NAN),
            times.len(),
            if sliced { "; in slices, uploads included" } else { "" },
            ttft_ms.unwrap_or(f64::NAN)
        );
    }
    let (p, d) = (median(prefill), median(decode));
    let peak = b.memory_stats().peak;
    report!(a.json, "| backend | model (weights) | prompt tokens | prefill tok/s | context | decode tok/s | kv cache | runs |");
    report!(a.json, "|---|---|---|---|---|---|---|---|");
    report!(a.json,
        "| {} | {} layers, hidden {}, {} weights, {} | {} | {:.1} | {} | {:.1} | {} | {} (median) |",
        b.describe(),
        c.num_hidden_layers,
        c.hidden_size,
        weights,
        a.model.display(),
        a.prompt_tokens,
        p,
        context,
        d,
        kv,
        a.runs
    );
    let on_gpu = b.kind() == qwen3_vl::DeviceKind::Cuda;
    let placement = if on_gpu { model.placement().describe() } else { "everything on the CPU".into() };
    let (gpu_bytes, cpu_bytes) = if on_gpu { (gpu_bytes, cpu_bytes) } else { (0, gpu_bytes + cpu_bytes) };
    if let Some(path) = &a.json_schema {
        report!(a.json, "decode constrained by the JSON schema {} (masks computed on the host, applied in the sampling step)", path.display());
    }
    report!(a.json,
        "placement: {}; weights {} on the GPU, {} on the CPU; peak device memory {}{}",
        placement,
        human(gpu_bytes),
        human(cpu_bytes),
        human(peak),
        b.memory_cap().map_or(String::new(), |cap| format!(" (budget {})", human(cap)))
    );
    if a.json {
        let module = kernels_module(b);
        let j = serde_json::json!({
            "device": b.describe(),
            "kernels_module": module,
            "precision": b.precision().name(),
            "prompt_tokens": a.prompt_tokens,
            "context": context,
            "gen_tokens": a.gen_tokens,
            "prefill_tokens_per_s": p,
            "decode_tokens_per_s": d,
            "vision_encode_ms": vision_ms,
            "image_time_to_first_token_ms": ttft_ms,
            "vision_input": vision.as_ref().map(|w| w.describe.clone()),
            "vision_tokens": vision.as_ref().map(|w| w.tokens(v.spatial_merge_size)),
            "video_frames": vision.as_ref().and_then(|w| w.frames),
            "video_decode_ms": vision.as_ref().and_then(|w| w.decode_ms),
            "peak_device_bytes": peak,
            "weights_dtype": weights,
            "gpu_weight_bytes": gpu_bytes,
            "cpu_weight_bytes": cpu_bytes,
            "gpu_budget_bytes": b.memory_cap(),
            "gpu_layers": if on_gpu { model.placement().device_layers } else { 0 },
            "placement": placement,
            "kv_cache": kv.name(),
            "graphs": !a.no_graphs,
            "json_schema": a.json_schema.as_ref().map(|p| p.display().to_string()),
            "runs": a.runs,
        });
        println!("{}", j);
    }
    Ok(())
}

/// `bench --batch N`: the engine's batched runs, reported as the single-stream numbers are.
fn run_batched(a: &BenchArgs, b: &dyn Backend, model: &qwen3_vl::model::Model, n: usize, sampler: &dyn Fn() -> Sampler) -> CliResult<()> {
    let kv = a.device.kv_dtype(b);
    let vocab = model.config.text.vocab_size as u64;
    let (mut prefill, mut decode, mut steps) = (Vec::new(), Vec::new(), 0);
    let (mut host_share, mut step_us, mut record) = (Vec::new(), Vec::new(), (0, 0.0));
    let bar = Progress::count("batched runs (a warm-up first)", a.runs as u64 + 1, "runs");
    for run in 0..=a.runs {
        bar.set(run as u64, a.runs as u64 + 1);
        let r = super::bench_batch::run_batch(model, b, kv, n, a.prompt_tokens, a.gen_tokens, a.max_prefill_tokens, &|len, salt| prompt(len, vocab, salt), sampler)?;
        if run > 0 {
            prefill.push(r.prefill_tokens_per_s);
            decode.push(r.decode_tokens_per_s);
            host_share.push(r.host_share);
            step_us.push(r.step_us);
            record = (r.recordings, r.record_ms);
            steps = r.steps;
        }
    }
    bar.finish("runs");
    eprintln!();
    let (p, d) = (median(prefill), median(decode));
    let (host_share, step_us) = (median(host_share), median(step_us));
    let peak = b.memory_stats().peak;
    let c = &model.config.text;
    report!(a.json, "| backend | model (weights) | batch | prompt tokens | gen tokens | prefill tok/s | decode tok/s (all) | decode tok/s (per sequence) | steps | kv cache | runs |");
    report!(a.json, "|---|---|---|---|---|---|---|---|---|---|---|");
    report!(a.json,
        "| {} | {} layers, hidden {}, {} weights, {} | {} | {} | {} | {:.1} | {:.1} | {:.1} | {} | {} | {} (median) |",
        b.describe(), c.num_hidden_layers, c.hidden_size, model.text.weights_summary(), a.model.display(), n, a.prompt_tokens, a.gen_tokens, p, d, d / n as f64, steps, kv, a.runs
    );
    if let Some(path) = &a.json_schema {
        report!(a.json, "every sequence constrained by the JSON schema {} (masks computed on the host, applied in the sampling step)", path.display());
    }
    report!(a.json, "decode-only steps: {:.1} µs each, {:.1}% of it host work between device waits; {} recorded (the last run), in {:.1} ms", step_us, 100.0 * host_share, record.0, record.1);
    report!(a.json, "peak device memory {}", human(peak));
    if a.json {
        let j = serde_json::json!({
            "device": b.describe(),
            "kernels_module": kernels_module(b),
            "precision": b.precision().name(),
            "batch": n,
            "decode_step_us": step_us,
            "decode_host_share": host_share,
            "decode_recordings": record.0,
            "decode_record_ms": record.1,
            "prompt_tokens": a.prompt_tokens,
            "gen_tokens": a.gen_tokens,
            "max_prefill_tokens": a.max_prefill_tokens,
            "json_schema": a.json_schema.as_ref().map(|p| p.display().to_string()),
            "prefill_tokens_per_s": p,
            "decode_tokens_per_s": d,
            "decode_tokens_per_s_per_sequence": d / n as f64,
            "steps": steps,
            "peak_device_bytes": peak,
            "weights_dtype": model.text.weights_summary(),
            "kv_cache": kv.name(),
            "runs": a.runs,
        });
        println!("{}", j);
    }
    Ok(())
}

/// The loaded kernel module's name on CUDA, `null` elsewhere.
fn kernels_module(b: &dyn Backend) -> serde_json::Value {
    #[cfg(feature = "cuda")]
    if let Some(c) = b.as_any().downcast_ref::<qwen3_vl::cuda::CudaBackend>() {
        return serde_json::Value::from(c.kernels_module().0.name());
    }
    let _ = b;
    serde_json::Value::Null
}

/// The vision input a bench times: its patches (synthetic, or a real video's), grid and prompt.
struct VisionWork {
    /// "image" or "video".
    what: &'static str,
    describe: String,
    patches: Vec<f32>,
    row_len: usize,
    grid: [usize; 3],
    /// Seconds of each temporal patch (videos).
    timestamps: Option<Vec<f64>>,
    /// Sampled frames, and the decode + processing time of a real video.
    frames: Option<usize>,
    decode_ms: Option<f64>,
}

impl VisionWork {
    fn tokens(&self, merge: usize) -> usize {
        self.grid.iter().product::<usize>() / (merge * merge)
    }

    /// `<|vision_start|>` + placeholders + `<|vision_end|>` as the processor lays them out; a
    /// video's timestamps stand as 5 text tokens each (what `<12.5 seconds>` takes).
    fn prompt_ids(&self, cfg: &qwen3_vl::model::Config) -> Vec<u32> {
        let per = self.grid[1] * self.grid[2] / (cfg.vision.spatial_merge_size * cfg.vision.spatial_merge_size);
        let mut ids = vec![cfg.vision_start_token_id];
        match &self.timestamps {
            None => ids.extend(std::iter::repeat(cfg.image_token_id).take(per * self.grid[0])),
            Some(ts) => {
                for (k, _) in ts.iter().enumerate() {
                    ids.extend(prompt(5, 150_000, 11 + k as u64));
                    ids.push(cfg.vision_start_token_id);
                    ids.extend(std::iter::repeat(cfg.video_token_id).take(per));
                    ids.push(cfg.vision_end_token_id);
                }
            }
        }
        ids.push(cfg.vision_end_token_id);
        ids
    }
}

/// Synthetic patches of `n` rows.
fn synthetic(n: usize, row_len: usize) -> Vec<f32> {
    (0..n * row_len).map(|i| ((i * 7919) % 2001) as f32 / 1000.0 - 1.0).collect()
}

fn vision_workload(a: &BenchArgs, v: &qwen3_vl::model::VisionConfig) -> CliResult<Option<VisionWork>> {
    let unit = v.patch_size * v.spatial_merge_size;
    let row_len = v.in_channels * v.temporal_patch_size * v.patch_size * v.patch_size;
    if let Some(side) = a.image_side {
        let cells = side / unit * v.spatial_merge_size;
        if cells == 0 {
            return Err(format!("--image-side {} is below one merged patch ({} pixels)", side, unit).into());
        }
        let grid = [1, cells, cells];
        let describe = format!("{}x{}", cells * v.patch_size, cells * v.patch_size);
        return Ok(Some(VisionWork { what: "image", describe, patches: synthetic(cells * cells, row_len), row_len, grid, timestamps: None, frames: None, decode_ms: None }));
    }
    if let (Some(frames), Some(side)) = (a.video_frames, a.video_side) {
        let cells = side / unit * v.spatial_merge_size;
        if cells == 0 || frames == 0 {
            return Err(format!("--video-frames {} and --video-side {} must give at least one frame of one merged patch ({} pixels)", frames, side, unit).into());
        }
        let t = (frames + v.temporal_patch_size - 1) / v.temporal_patch_size;
        let grid = [t, cells, cells];
        let describe = format!("{} frames of {}x{}", frames, cells * v.patch_size, cells * v.patch_size);
        let timestamps = Some((0..t).map(|k| k as f64).collect());
        return Ok(Some(VisionWork { what: "video", describe, patches: synthetic(t * cells * cells, row_len), row_len, grid, timestamps, frames: Some(frames), decode_ms: None }));
    }
    if let Some(path) = &a.video {
        let dir = if a.model.is_dir() { a.model.clone() } else { a.model.parent().map(|p| p.to_path_buf()).unwrap_or_default() };
        let file = dir.join("video_preprocessor_config.json");
        let base = if file.exists() { qwen3_vl::video::VideoConfig::from_file(&file)? } else { qwen3_vl::video::VideoConfig::qwen3_vl_default() };
        let cfg = a.video_opts.config(&base)?;
        let t0 = std::time::Instant::now();
        let vid = qwen3_vl::video::load_video(path, &cfg, &a.video_opts.limits())?;
        let decode_ms = t0.elapsed().as_secs_f64() * 1e3;
        let p = vid.patches;
        let describe = format!("{} ({}x{}, {:.1} s, {} of {} frames, processed {}x{})", path.display(), vid.info.width, vid.info.height, vid.info.duration, vid.indices.len(), vid.info.frames, p.grid_thw[1] * v.patch_size, p.grid_thw[2] * v.patch_size);
        eprintln!("video: {}: decoded and processed in {:.0} ms", describe, decode_ms);
        return Ok(Some(VisionWork { what: "video", describe, row_len: p.row_len, grid: p.grid_thw, timestamps: Some(p.timestamps), frames: Some(vid.indices.len()), decode_ms: Some(decode_ms), patches: p.patches }));
    }
    Ok(None)
}
