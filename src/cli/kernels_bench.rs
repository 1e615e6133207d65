//! `qwen3-vl kernels-bench`: the decode kernels one by one on the GPU, on the shapes of a model
//! config: each GEMV's weight-read bandwidth beside the device's measured copy bandwidth, and
//! split-KV attention's KV-read bandwidth at several context lengths; flash attention's TFLOP/s
//! on the prefill and vision-tower shapes. Weights are random and
//! rotated among enough copies to exceed the L2 cache, so every launch reads device memory.
//! Times are device events around a recorded graph of many launches (as decode replays its
//! step), after a warm-up, median of the repetitions.

use super::load::CliResult;
use super::DeviceArgs;
use std::path::PathBuf;

#[derive(clap::Args)]
pub struct KernelsBenchArgs {
    /// Model directory whose config.json gives the shapes.
    #[clap(long, short = 'm')]
    model: PathBuf,
    #[clap(flatten)]
    device: DeviceArgs,
    /// Repetitions (the median is reported).
    #[clap(long, default_value = "15")]
    reps: usize,
    /// Print the results as one JSON object on stdout (the tables go to stderr).
    #[clap(long)]
    json: bool,
    /// Time only these sections (comma-separated: gemv, batched, quant, attention, matmul,
    /// tiles, flash); all by default.
    #[clap(long, value_delimiter = ',')]
    only: Vec<String>,
}

#[cfg(not(feature = "cuda"))]
pub fn run(_a: KernelsBenchArgs) -> CliResult<()> {
    Err("kernels-bench needs a build with --features cuda".into())
}

#[cfg(feature = "cuda")]
pub fn run(a: KernelsBenchArgs) -> CliResult<()> {
    cuda_bench::run(a)
}

#[cfg(feature = "cuda")]
mod cuda_bench {
    use super::*;
    use qwen3_vl::cuda::{CudaBackend, LinearAlgo};
    use qwen3_vl::gpu::params::CURSOR_FIELDS;
    use qwen3_vl::model::Config;
    use qwen3_vl::{Backend, DType, Tensor};

    /// Bytes of weight copies to rotate through (well above any L2 cache).
    const ROTATE_BYTES: usize = 512 << 20;

    fn median(mut v: Vec<f64>) -> f64 {
        v.sort_by(|a, b| a.partial_cmp(b).unwrap_or(std::cmp::Ordering::Equal));
        v[v.len() / 2]
    }

    /// Median seconds of one `launch(i)` over `reps` timed passes of `per_pass` launches each.
    /// The pass is recorded as a CUDA graph and replayed (as the decode step is), so the host's
    /// launch cost is not in the numbers; plain launches where recording fails.
    fn time(b: &CudaBackend, reps: usize, per_pass: usize, launch: &mut dyn FnMut(usize) -> qwen3_vl::Result<()>) -> CliResult<f64> {
        let mut pass = || -> qwen3_vl::Result<()> {
            for i in 0..per_pass {
                launch(i)?;
            }
            Ok(())
        };
        let recording = b.record(&mut pass)?;
        let run = |pass: &mut dyn FnMut() -> qwen3_vl::Result<()>| -> qwen3_vl::Result<()> {
            match &recording {
                Some(r) => b.replay(r),
                None => pass(),
            }
        };
        run(&mut pass)?; // warm-up
        let mut t = Vec::new();
        for _ in 0..reps {
            let m0 = b.mark()?;
            run(&mut pass)?;
            let m1 = b.mark()?;
            t.push(b.seconds_between(&m0, &m1)? / per_pass as f64);
        }
        Ok(median(t))
    }

    /// Copies of an `[n, k]` weight of `wd` (two matrices a copy when `pair`: gate and up) to
    /// rotate through, past any L2: the bytes one launch reads, the copies, the tensors (copy
    /// `c` at `c`, or `2c` and `2c + 1`), random from `seed` on.
    fn rotated_weights(b: &CudaBackend, wd: DType, (n, k): (usize, usize), pair: bool, seed: u32) -> CliResult<(usize, usize, Vec<Tensor>)> {
        let per = n * k * wd.size_of() * if pair { 2 } else { 1 };
        let copies = (ROTATE_BYTES / per).max(2);
        let ws = (0..copies * if pair { 2 } else { 1 }).map(|c| b.upload_half(&[n, k], wd, &random_bits(n * k, seed + c as u32))).collect::<Result<_, _>>()?;
        Ok((per, copies, ws))
    }

    /// One of the decoder's products over weight copy `c` of [`rotated_weights`]: the SwiGLU
    /// pair (`pair`) or a linear layer by `algo`, of `rms_norm(x)` when `normed`, as the model
    /// calls them.
    fn decoder_product(b: &CudaBackend, algo: LinearAlgo, (pair, normed): (bool, bool), x: &Tensor, norm_w: &Tensor, ws: &[Tensor], c: usize) -> qwen3_vl::Result<()> {
        match (pair, normed) {
            (true, false) => b.gate_up_silu(x, &ws[2 * c], &ws[2 * c + 1]).map(drop),
            (true, true) => b.rms_norm_gate_up_silu(x, norm_w, 1e-6, &ws[2 * c], &ws[2 * c + 1]).map(drop),
            (false, false) => b.linear_with(algo, x, &ws[c], None, None).map(drop),
            (false, true) => b.rms_norm_linear(x, norm_w, 1e-6, &ws[c], None).map(drop),
        }
    }

    fn random_bits(n: usize, seed: u32) -> Vec<u16> {
        let mut s = seed | 1;
        (0..n)
            .map(|_| {
                s ^= s << 13;
                s ^= s >> 17;
                s ^= s << 5;
                // bf16 / f16 values of moderate size (exponent around 1)
                0x3c00 | (s as u16 & 0x83ff)
            })
            .collect()
    }

    pub fn run(a: KernelsBenchArgs) -> CliResult<()> {
        let sel = a.device.select()?;
        let b = sel.backend.as_any().downcast_ref::<CudaBackend>().ok_or("kernels-bench needs the CUDA backend (--device cuda)")?;
        let Config { text: cfg, vision: vc, .. } = Config::from_dir(&a.model)?;
        let wd = DType::BF16;
        let mut rows = Vec::new();
        // 1. the copy ceiling: device-to-device, bytes read + written
        let n = 256 << 20; // f32 elements = 1 GiB
        let (src, dst) = (b.zeros(&[n])?, b.zeros(&[n])?);
        // plain copies: the driver's copy engine path is slower inside a graph
        let mut t = Vec::new();
        for _ in 0..a.reps {
            let m0 = b.mark()?;
            b.copy_device(&dst, &src, n * 4)?;
            let m1 = b.mark()?;
            t.push(b.seconds_between(&m0, &m1)?);
        }
        let t = median(t);
        let copy_gbs = 2.0 * (n * 4) as f64 / t / 1e9;
        report!(a.json, "device: {}  copy bandwidth (read + write): {:.0} GB/s", b.describe(), copy_gbs);
        report!(a.json, "| kernel | shape (k -> n) | bytes read | us | GB/s | % of copy |");
        report!(a.json, "|---|---|---|---|---|---|");
        // 2. each GEMV of the decoder, m = 1
        let (h, i, d) = (cfg.hidden_size, cfg.intermediate_size, cfg.head_dim);
        let (qd, kvd) = (cfg.num_attention_heads * d, cfg.num_key_value_heads * d);
        let section = |name: &str| a.only.is_empty() || a.only.iter().any(|s| s == name);
        // (name, k, n, with the RMSNorm prologue)
        let shapes: Vec<(&str, usize, usize, bool)> = vec![
            ("qkv_proj (fused)", h, qd + 2 * kvd, false),
            ("qkv_proj + rms_norm", h, qd + 2 * kvd, true),
            ("q_proj / o_proj", h, qd, false),
            ("k_proj / v_proj", h, kvd, false),
            ("gate+up (fused)", h, i, false),
            ("gate+up + rms_norm", h, i, true),
            ("down_proj", i, h, false),
            ("lm_head", h, cfg.vocab_size, false),
        ];
        let norm_w = b.upload_f32(&[h], &vec![1.0; h])?;
        for &(name, k, nout, normed) in shapes.iter().filter(|_| section("gemv")) {
            let fused = name.starts_with("gate+up");
            let (per, copies, ws) = rotated_weights(b, wd, (nout, k), fused, 7)?;
            let x = b.upload_f32(&[1, k], &vec![0.01; k])?;
            let t = time(b, a.reps, copies, &mut |c| decoder_product(b, LinearAlgo::GemvVec, (fused, normed), &x, &norm_w, &ws, c))?;
            let gbs = per as f64 / t / 1e9;
            report!(a.json, "| gemv{} | {} -> {} {} | {:.1} MB | {:.1} | {:.0} | {:.0}% |", if fused { "_gate_up" } else { "_vec" }, k, nout, name, per as f64 / 1e6, t * 1e6, gbs, 100.0 * gbs / copy_gbs);
            rows.push(serde_json::json!({"kernel": name, "k": k, "n": nout, "bytes": per, "us": t * 1e6, "gb_per_s": gbs, "fraction_of_copy": gbs / copy_gbs}));
        }
        // 2a. the same layers for 16 and 64 rows (batched decode steps) on the kernel the
        //     backend picks (with the compute_80 module: the few-row tensor-core kernels for 16,
        //     the 64-row tiles, split-K, for 64)
        //     (the "+ rms_norm" rows: the decoder's norm and its product, as one op)
        let few: Vec<(&str, usize, usize, bool)> = vec![
            ("qkv_proj (fused)", h, qd + 2 * kvd, false),
            ("qkv_proj + rms_norm", h, qd + 2 * kvd, true),
            ("o_proj", qd, h, false),
            ("gate+up (fused)", h, i, false),
            ("gate+up + rms_norm", h, i, true),
            ("down_proj", i, h, false),
            ("lm_head", h, cfg.vocab_size, false),
        ];
        for rows_n in [16usize, 64].into_iter().filter(|_| section("batched")) {
            report!(a.json, "| batched kernel | {} x k -> n | bytes read | us | GB/s | % of copy |", rows_n);
            report!(a.json, "|---|---|---|---|---|---|");
            for &(name, k, nout, normed) in &few {
                let fused = name.starts_with("gate+up");
                let (per, copies, ws) = rotated_weights(b, wd, (nout, k), fused, 11)?;
                let x = b.upload_f32(&[rows_n, k], &(0..rows_n * k).map(|j| 0.01 * ((j % 13) as f32 - 6.0)).collect::<Vec<_>>())?;
                let algo = b.pick_linear(rows_n, nout, k, wd);
                let t = time(b, a.reps, copies, &mut |c| decoder_product(b, algo, (fused, normed), &x, &norm_w, &ws, c))?;
                let gbs = per as f64 / t / 1e9;
                report!(a.json, "| {:?} | {} -> {} {} | {:.1} MB | {:.1} | {:.0} | {:.0}% |", algo, k, nout, name, per as f64 / 1e6, t * 1e6, gbs, 100.0 * gbs / copy_gbs);
                rows.push(serde_json::json!({"kernel": format!("{:?}", algo), "rows": rows_n, "shape": name, "k": k, "n": nout, "bytes": per, "us": t * 1e6, "gb_per_s": gbs, "fraction_of_copy": gbs / copy_gbs}));
            }
            // the decoder's whole MLP as it calls it: norm, the gate/up pair, down with the residual
            let (per_pair, pairs, gu) = rotated_weights(b, wd, (i, h), true, 21)?;
            let (per_down, downs, dw) = rotated_weights(b, wd, (h, i), false, 41)?;
            let copies = pairs.min(downs);
            let x = b.upload_f32(&[rows_n, h], &(0..rows_n * h).map(|j| 0.01 * ((j % 13) as f32 - 6.0)).collect::<Vec<_>>())?;
            let t = time(b, a.reps, copies, &mut |c| b.rms_norm_swiglu_residual(&x, &norm_w, 1e-6, &gu[2 * c], &gu[2 * c + 1], &dw[c]).map(drop))?;
            let per = per_pair + per_down;
            let gbs = per as f64 / t / 1e9;
            let tile = b.gate_up_tile(rows_n, i, h, wd);
            report!(a.json, "| {:?} | {} -> {} -> {} MLP block + rms_norm | {:.1} MB | {:.1} | {:.0} | {:.0}% |", tile, h, i, h, per as f64 / 1e6, t * 1e6, gbs, 100.0 * gbs / copy_gbs);
            rows.push(serde_json::json!({"kernel": format!("mlp {:?}", tile), "rows": rows_n, "shape": "MLP block + rms_norm", "k": h, "n": i, "bytes": per, "us": t * 1e6, "gb_per_s": gbs, "fraction_of_copy": gbs / copy_gbs}));
        }
        // 2b. the same GEMVs with block-quantized weights (activation quantization included)
        if section("quant") {
            quant_rows(b, &a, &cfg, copy_gbs, &mut rows)?;
        }
        // 3. split-KV attention of one decode step, f16 cache, at several contexts
        let (heads, kvh) = (cfg.num_attention_heads, cfg.num_key_value_heads);
        for &ctx in [64usize, 512, 4096, 16384].iter().filter(|_| section("attention")) {
            let cap = ctx + 128;
            let kc = b.upload_half(&[cap, kvh, d], DType::F16, &random_bits(cap * kvh * d, 3))?;
            let vc = b.upload_half(&[cap, kvh, d], DType::F16, &random_bits(cap * kvh * d, 4))?;
            // row scales as a cache has them (all 1: rows within f16's range)
            let sc = b.upload_f32(&[cap, kvh, 2], &vec![1.0; cap * kvh * 2])?;
            let q = b.upload_f32(&[1, heads, d], &vec![0.1; heads * d])?;
            let cursor = b.upload_u32(&[1, CURSOR_FIELDS], &[ctx as u32 - 1, ctx as u32 - 1, ctx as u32 - 1, ctx as u32 - 1])?;
            let t = time(b, a.reps, 20, &mut |_| b.attention_cached(&q, &kc, &vc, Some(&sc), &cursor, 0.088).map(drop))?;
            let bytes = 2 * ctx * kvh * d * 2;
            let gbs = bytes as f64 / t / 1e9;
            report!(a.json, "| attention_split_f16 + combine | ctx {} ({} splits) | {:.1} MB | {:.1} | {:.0} | {:.0}% |", ctx, b.attention_splits(cap, kvh), bytes as f64 / 1e6, t * 1e6, gbs, 100.0 * gbs / copy_gbs);
            rows.push(serde_json::json!({"kernel": "attention_split_f16", "context": ctx, "bytes": bytes, "us": t * 1e6, "gb_per_s": gbs}));
        }
        // 3b. the engine's paged attention of one decode step (f16 cache with row scales, blocks
        //     of 16): one row at several contexts, then batches; the kernel the backend picks
        //     (QWEN3_VL_PAGED_MMA=0 keeps it off the tensor cores)
        let block = 16usize;
        for &(nrows, ctx) in [(1usize, 64usize), (1, 512), (1, 4096), (1, 32768), (16, 512), (16, 4096), (64, 512)].iter().filter(|_| section("attention")) {
            let per = ctx.div_ceil(block);
            let slots = nrows * per * block;
            let kc = b.upload_half(&[slots, kvh, d], DType::F16, &random_bits(slots * kvh * d, 5))?;
            let vc = b.upload_half(&[slots, kvh, d], DType::F16, &random_bits(slots * kvh * d, 6))?;
            let sc = b.upload_f32(&[slots, kvh, 2], &vec![1.0; slots * kvh * 2])?;
            let q = b.upload_f32(&[nrows, heads, d], &vec![0.1; nrows * heads * d])?;
            // row r's blocks: r · per .. (r + 1) · per, in order
            let tables: Vec<Vec<u32>> = (0..nrows).map(|r| (r * per..(r + 1) * per).map(|x| x as u32).collect()).collect();
            let spec: Vec<(&[u32], usize)> = tables.iter().map(|t| (t.as_slice(), ctx)).collect();
            let pages = qwen3_vl::Pages::new(b, block, slots, &spec)?;
            let t = time(b, a.reps, 20, &mut |_| b.attention_paged(&q, &kc, &vc, Some(&sc), &pages, 0.088).map(drop))?;
            let bytes = nrows * 2 * ctx * kvh * d * 2;
            let gbs = bytes as f64 / t / 1e9;
            report!(a.json, "| attention_paged (engine) | {} row(s) × ctx {} | {:.1} MB | {:.1} | {:.0} | {:.0}% |", nrows, ctx, bytes as f64 / 1e6, t * 1e6, gbs, 100.0 * gbs / copy_gbs);
            rows.push(serde_json::json!({"kernel": "attention_paged", "rows": nrows, "context": ctx, "bytes": bytes, "us": t * 1e6, "gb_per_s": gbs}));
        }
        // 4. prefill / vision matmuls (m = 64, 512, 1,040: a loaded server's step, 2,048, 4,096) on the kernel the backend picks
        let peak = b.fp32_peak_tflops();
        report!(a.json, "| matmul (kernel) | m x k -> n | TFLOP/s | % of FP32 peak ({:.1}) |", peak);
        report!(a.json, "|---|---|---|---|");
        let (vh, vi) = (vc.hidden_size, vc.intermediate_size);
        let gemms: Vec<(&str, usize, usize)> = vec![("text qkv_proj", h, qd + 2 * kvd), ("text o_proj", qd, h), ("text gate/up", h, i), ("text down_proj", i, h), ("vision qkv", vh, 3 * vh), ("vision fc1", vh, vi), ("vision fc2", vi, vh)];
        if section("matmul") {
            // every layer's weights, the same at every m: the GEMMs', the vision MLP's as the
            // tower runs it (its shapes from config.json), the text SwiGLU pair's
            let ws: Vec<Tensor> = gemms.iter().map(|&(_, k, nout)| b.upload_half(&[nout, k], wd, &random_bits(nout * k, 9))).collect::<Result<_, _>>()?;
            let (w1, w2) = (b.upload_half(&[vi, vh], wd, &random_bits(vi * vh, 14))?, b.upload_half(&[vh, vi], wd, &random_bits(vh * vi, 15))?);
            let (b1, b2) = (b.upload_f32(&[vi], &vec![0.01; vi])?, b.upload_f32(&[vh], &vec![0.01; vh])?);
            let (nw, nb) = (b.upload_f32(&[vh], &vec![1.0; vh])?, b.upload_f32(&[vh], &vec![0.0; vh])?);
            let (gw, uw) = (b.upload_half(&[i, h], wd, &random_bits(i * h, 12))?, b.upload_half(&[i, h], wd, &random_bits(i * h, 13))?);
            for &m in &[64usize, 512, 1040, 2048, 4096] {
                for (&(name, k, nout), w) in gemms.iter().zip(&ws) {
                    let algo = b.pick_linear(m, nout, k, wd);
                    let x = b.upload_f32(&[m, k], &vec![0.01; m * k])?;
                    let t = time(b, a.reps.min(5), 5, &mut |_| b.linear_with(algo, &x, w, None, None).map(drop))?;
                    let tflops = 2.0 * (m * k * nout) as f64 / t / 1e12;
                    report!(a.json, "| {} ({:?}) | {} x {} -> {} | {:.1} | {:.0}% |", name, algo, m, k, nout, tflops, 100.0 * tflops / peak);
                    rows.push(serde_json::json!({"kernel": format!("{:?}", algo), "shape": name, "m": m, "k": k, "n": nout, "us": t * 1e6, "tflops": tflops}));
                }
                // the vision MLP as the tower runs it: LayerNorm, fc1 with GELU (bf16 out), fc2 with
                // the residual
                let x = b.upload_f32(&[m, vh], &(0..m * vh).map(|j| 0.01 * ((j % 29) as f32 - 14.0)).collect::<Vec<_>>())?;
                let t = time(b, a.reps.min(5), 5, &mut |_| b.layer_norm_gelu_mlp(&x, (&nw, &nb, 1e-6), (&w1, Some(&b1)), qwen3_vl::Gelu::Tanh, (&w2, Some(&b2))).map(drop))?;
                let tflops = 4.0 * (m * vh * vi) as f64 / t / 1e12;
                report!(a.json, "| vision MLP (norm, fc1 + GELU, fc2) | {} x {} -> {} -> {} | {:.1} | {:.0}% |", m, vh, vi, vh, tflops, 100.0 * tflops / peak);
                rows.push(serde_json::json!({"kernel": "layer_norm_gelu_mlp", "shape": "vision MLP", "m": m, "k": vh, "n": vi, "us": t * 1e6, "tflops": tflops}));
                // the SwiGLU pair in one kernel (gate and up, 2 · i outputs)
                let x = b.upload_f32(&[m, h], &vec![0.01; m * h])?;
                let t = time(b, a.reps.min(5), 5, &mut |_| b.gate_up_silu(&x, &gw, &uw).map(drop))?;
                let tflops = 4.0 * (m * h * i) as f64 / t / 1e12;
                let tile = b.gate_up_tile(m, i, h, wd);
                report!(a.json, "| text gate+up pair ({:?}) | {} x {} -> 2 x {} | {:.1} | {:.0}% |", tile, m, h, i, tflops, 100.0 * tflops / peak);
                rows.push(serde_json::json!({"kernel": format!("gate_up {:?}", tile), "shape": "text gate+up pair", "m": m, "k": h, "n": 2 * i, "us": t * 1e6, "tflops": tflops}));
            }
        }
        // 4b. every pipelined tile beside the picked one, at row counts around multiples of 128
        //     (a step's prefill budget plus its decode rows, image prompts, towers of a few
        //     images), on the text and vision GEMMs (the gate/up pair as one product of 2i
        //     columns) and, at few rows, the LM head
        if section("tiles") {
            report!(a.json, "| shape | m | picked | 128x256 | 128x128 | 64x128 | 64x64 (us) |");
            report!(a.json, "|---|---|---|---|---|---|---|");
            let shapes: Vec<(&str, usize, usize, usize)> = vec![("text qkv_proj", h, qd + 2 * kvd, 8192), ("text o_proj", qd, h, 8192), ("text gate+up", h, 2 * i, 8192), ("text down_proj", i, h, 8192), ("vision q/k/v/o", vh, vh, 16384), ("vision fc1", vh, vi, 16384), ("vision fc2", vi, vh, 16384), ("lm_head", h, cfg.vocab_size, 256)];
            for &(name, k, nout, max_m) in &shapes {
                let w = b.upload_half(&[nout, k], wd, &random_bits(nout * k, 9))?;
                // (the LM head also at a batched decode step's 33-64 rows, which take no split)
                let few: &[usize] = if name == "lm_head" { &[33, 48, 64] } else { &[] };
                for &m in few.iter().chain([65usize, 128, 256, 300, 512, 700, 1024, 1054, 1500, 2048, 2112, 3000, 4096, 8192, 16384].iter()).filter(|&&m| m <= max_m) {
                    let x = b.upload_f32(&[m, k], &vec![0.01; m * k])?;
                    let picked = b.pick_linear(m, nout, k, wd);
                    let mut us = Vec::new();
                    for algo in std::iter::once(picked).chain(qwen3_vl::cuda::PIPE_TILES.iter().map(|&(tm, tn)| LinearAlgo::Mma(tm, tn, 1))) {
                        us.push(time(b, a.reps.min(5), 3, &mut |_| b.linear_with(algo, &x, &w, None, None).map(drop))? * 1e6);
                    }
                    report!(a.json, "| {} | {} | {:?} {:.1} | {:.1} | {:.1} | {:.1} | {:.1} |", name, m, picked, us[0], us[1], us[2], us[3], us[4]);
                    rows.push(serde_json::json!({"kernel": "tiles", "shape": name, "m": m, "k": k, "n": nout, "picked": format!("{:?}", picked), "us": us}));
                }
            }
        }
        // 5. flash attention: prefill against the cache and the vision tower
        if section("flash") {
            flash_rows(b, &a, &cfg, &vc, &mut rows)?;
        }
        if a.json {
            println!("{}", serde_json::json!({"device": b.describe(), "copy_gb_per_s": copy_gbs, "fp32_peak_tflops": peak, "kernels": rows}));
        }
        Ok(())
    }

    /// The decoder's GEMVs (m = 1) with `Q8_0`, `Q4_K` and `Q6_K` weights: weight-read GB/s of
    /// `linear` / `gate_up_silu` (the 8-bit activation quantizer's launch included), and the
    /// decoder's `rms_norm_linear` / `rms_norm_gate_up_silu` (the norm fused in that launch).
    /// Weight rows are 64 quantized random rows repeated (rows are independent blocks).
    fn quant_rows(b: &CudaBackend, a: &KernelsBenchArgs, cfg: &qwen3_vl::model::TextConfig, copy_gbs: f64, rows: &mut Vec<serde_json::Value>) -> CliResult<()> {
        let (h, i, d) = (cfg.hidden_size, cfg.intermediate_size, cfg.head_dim);
        let (qd, kvd) = (cfg.num_attention_heads * d, cfg.num_key_value_heads * d);
        // (name, k, n, gate and up, with the RMSNorm)
        let shapes: Vec<(&str, usize, usize, bool, bool)> = vec![
            ("q_proj / o_proj", h, qd, false, false),
            ("k_proj / v_proj", h, kvd, false, false),
            ("qkv_proj + rms_norm", h, qd + 2 * kvd, false, true),
            ("gate+up (fused)", h, i, true, false),
            ("gate+up + rms_norm", h, i, true, true),
            ("down_proj", i, h, false, false),
            ("lm_head", h, cfg.vocab_size, false, false),
        ];
        for dt in [DType::Q8_0, DType::Q4K, DType::Q6K] {
            for &(name, k, nout, fused, normed) in &shapes {
                let rb = dt.row_bytes(k).ok_or("rows are not whole blocks")?;
                let seed: Vec<f32> = (0..64 * k).map(|e| ((e * 7919 % 2001) as f32 / 1000.0 - 1.0) * 0.05).collect();
                let q = qwen3_vl::quant::quantize_vec(dt, &seed).ok_or("quantize")?;
                let bytes: Vec<u8> = (0..nout).flat_map(|r| q[(r % 64) * rb..(r % 64 + 1) * rb].iter().copied()).collect();
                let per = nout * rb * if fused { 2 } else { 1 };
                let copies = (ROTATE_BYTES / per).max(2);
                let ws: Vec<Tensor> = (0..copies * if fused { 2 } else { 1 }).map(|_| b.upload_blocks(&[nout, k], dt, qwen3_vl::Blocks::Owned(bytes.clone()))).collect::<Result<_, _>>()?;
                let x = b.upload_f32(&[1, k], &vec![0.01; k])?;
                let g = b.upload_f32(&[k], &vec![1.0; k])?;
                let t = time(b, a.reps, copies, &mut |c| match (fused, normed) {
                    (true, true) => b.rms_norm_gate_up_silu(&x, &g, 1e-6, &ws[2 * c], &ws[2 * c + 1]).map(drop),
                    (true, false) => b.gate_up_silu(&x, &ws[2 * c], &ws[2 * c + 1]).map(drop),
                    (false, true) => b.rms_norm_linear(&x, &g, 1e-6, &ws[c], None).map(drop),
                    (false, false) => b.linear(&x, &ws[c], None).map(drop),
                })?;
                let gbs = per as f64 / t / 1e9;
                report!(a.json, "| mmvq{}_{} | {} -> {} {} | {:.1} MB | {:.1} | {:.0} | {:.0}% |", if fused { "_gate_up" } else { "" }, dt, k, nout, name, per as f64 / 1e6, t * 1e6, gbs, 100.0 * gbs / copy_gbs);
                rows.push(serde_json::json!({"kernel": format!("mmvq_{}", dt), "shape": name, "k": k, "n": nout, "bytes": per, "us": t * 1e6, "gb_per_s": gbs, "fraction_of_copy": gbs / copy_gbs}));
            }
        }
        Ok(())
    }

    /// Flash attention on the model's shapes: causal prefill of 512 and 4,096 tokens against an
    /// f16 cache (text heads), and one 1024×1024 image's 4,096 patches through the vision
    /// tower's block-sparse attention with the rotary embedding applied in the op (vision
    /// heads, from the model's config). TFLOP/s counts the useful products (4·t·keys·d per
    /// head, keys halved when causal).
    fn flash_rows(b: &CudaBackend, a: &KernelsBenchArgs, cfg: &qwen3_vl::model::TextConfig, vcfg: &qwen3_vl::model::VisionConfig, rows: &mut Vec<serde_json::Value>) -> CliResult<()> {
        report!(a.json, "| kernel | shape | us | TFLOP/s |");
        report!(a.json, "|---|---|---|---|");
        let (heads, kvh, d) = (cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim);
        for &t in &[512usize, 4096] {
            let kc = b.upload_half(&[t, kvh, d], DType::F16, &random_bits(t * kvh * d, 5))?;
            let vc = b.upload_half(&[t, kvh, d], DType::F16, &random_bits(t * kvh * d, 6))?;
            let sc = b.upload_f32(&[t, kvh, 2], &vec![1.0; t * kvh * 2])?;
            let q = b.upload_f32(&[t, heads, d], &(0..t * heads * d).map(|i| ((i * 7919) % 2001) as f32 / 1000.0 - 1.0).collect::<Vec<_>>())?;
            let cur: Vec<u32> = (0..t as u32).flat_map(|i| vec![i, i, i, i]).collect();
            let cursor = b.upload_u32(&[t, CURSOR_FIELDS], &cur)?;
            let secs = time(b, a.reps, 5, &mut |_| b.attention_cached(&q, &kc, &vc, Some(&sc), &cursor, 1.0 / (d as f32).sqrt()).map(drop))?;
            let flops = 4.0 * (t * t) as f64 / 2.0 * (d * heads) as f64;
            report!(a.json, "| flash attention, causal prefill, f16 cache | t {} heads {}/{} d {} | {:.1} | {:.1} |", t, heads, kvh, d, secs * 1e6, flops / secs / 1e12);
            rows.push(serde_json::json!({"kernel": "flash_attention prefill", "t": t, "us": secs * 1e6, "tflops": flops / secs / 1e12}));
        }
        let (vh, vd) = (vcfg.num_heads, vcfg.hidden_size / vcfg.num_heads);
        let n = 4096;
        for images in [1usize, 4] {
            let x = |seed: usize| b.upload_f32(&[n, vh, vd], &(0..n * vh * vd).map(|i| ((i * 7919 + seed) % 2001) as f32 / 1000.0 - 1.0).collect::<Vec<_>>());
            let (q, k, v) = (x(1)?, x(2)?, x(3)?);
            let angles: Vec<f32> = (0..n * vd / 2).map(|i| (i % 977) as f32 * 0.01).collect();
            let cos = b.upload_f32(&[n, vd / 2], &angles.iter().map(|a| a.cos()).collect::<Vec<_>>())?;
            let sin = b.upload_f32(&[n, vd / 2], &angles.iter().map(|a| a.sin()).collect::<Vec<_>>())?;
            let mask = qwen3_vl::BlockMask::block_diagonal(b, &vec![n / images; images])?;
            let secs = time(b, a.reps, 5, &mut |_| b.attention_block_sparse(&q, &k, &v, &mask, 1.0 / (vd as f32).sqrt(), Some((&cos, &sin))).map(drop))?;
            let flops = 4.0 * (n * n / images) as f64 * (vd * vh) as f64;
            report!(a.json, "| flash attention, vision block-sparse + rotary | {} patches in {} image(s), heads {} d {} | {:.1} | {:.1} |", n, images, vh, vd, secs * 1e6, flops / secs / 1e12);
            rows.push(serde_json::json!({"kernel": "flash_attention vision", "patches": n, "images": images, "us": secs * 1e6, "tflops": flops / secs / 1e12}));
        }
        Ok(())
    }
}
