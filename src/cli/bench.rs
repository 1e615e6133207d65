//! `qwen3-vl bench`: prefill and decode speed of a checkpoint (random weights are fine),
//! printed as a table. Medians over several runs after a warm-up run.

use super::load::{progress_bar, CliResult};
use super::DeviceArgs;
use qwen3_vl::generate::sampling::argmax;
use qwen3_vl::generate::Session;
use qwen3_vl::model::Model;
use std::path::PathBuf;
use std::time::Instant;

#[derive(clap::Args)]
pub struct BenchArgs {
    /// Model directory (config.json and safetensors; tools/make_random_checkpoint.py makes one).
    #[clap(long, short = 'm')]
    model: PathBuf,
    #[clap(flatten)]
    device: DeviceArgs,
    /// Prompt length for the prefill measurement.
    #[clap(long, default_value = "64")]
    prompt_tokens: usize,
    /// Tokens generated per decode measurement.
    #[clap(long, default_value = "32")]
    gen_tokens: usize,
    /// Measured runs (after one warm-up run).
    #[clap(long, default_value = "3")]
    runs: usize,
    /// Also time the vision tower on one image of this many pixels per side (e.g. 1024); the
    /// patches are synthetic, the work is the real tower's.
    #[clap(long)]
    image_side: Option<usize>,
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.partial_cmp(b).unwrap_or(std::cmp::Ordering::Equal));
    v[v.len() / 2]
}

pub fn run(a: BenchArgs) -> CliResult<()> {
    let sel = qwen3_vl::select_device(a.device.device, a.device.threads)?;
    let b = &*sel.backend;
    let model = Model::load(&a.model, b, &mut progress_bar("loading weights"))?;
    let vocab = model.config.text.vocab_size as u64;
    // deterministic pseudo-random prompt of ordinary (non-special) ids
    let prompt: Vec<u32> = (0..a.prompt_tokens as u64).map(|i| ((i * 2_654_435_761 + 12_345) % vocab.min(150_000)) as u32).collect();
    let (mut prefill, mut decode) = (Vec::new(), Vec::new());
    for run in 0..=a.runs {
        let mut s = Session::new(&model, b, prompt.len() + a.gen_tokens)?;
        let t0 = Instant::now();
        let mut logits = s.feed(&prompt)?;
        let t_prefill = t0.elapsed().as_secs_f64();
        let t1 = Instant::now();
        for _ in 0..a.gen_tokens {
            let next = argmax(&logits);
            logits = s.feed(&[next])?;
        }
        let t_decode = t1.elapsed().as_secs_f64();
        if run > 0 {
            prefill.push(prompt.len() as f64 / t_prefill);
            decode.push(a.gen_tokens as f64 / t_decode);
        }
    }
    let c = &model.config.text;
    if let Some(side) = a.image_side {
        let v = &model.config.vision;
        let unit = v.patch_size * v.spatial_merge_size;
        let cells = side / unit * v.spatial_merge_size;
        let grid = [1, cells, cells];
        let row_len = v.in_channels * v.temporal_patch_size * v.patch_size * v.patch_size;
        let n = cells * cells;
        let patches: Vec<f32> = (0..n * row_len).map(|i| ((i * 7919) % 2001) as f32 / 1000.0 - 1.0).collect();
        let mut times = Vec::new();
        for run in 0..=a.runs.min(2) {
            let t0 = Instant::now();
            let x = b.upload_f32(&[n, row_len], &patches)?;
            let out = model.vision.forward(b, &x, &[grid])?;
            b.download_f32(&out.embeds)?;
            if run > 0 {
                times.push(t0.elapsed().as_secs_f64());
            }
        }
        println!("| backend | image | patches | tokens | vision tower s |");
        println!("|---|---|---|---|---|");
        println!("| {} | {}x{} | {} | {} | {:.2} (median of {}) |", b.describe(), cells * v.patch_size, cells * v.patch_size, n, n / 4, median(times.clone()), times.len());
    }
    println!("| backend | model | prompt tokens | prefill tok/s | decode tok/s | runs |");
    println!("|---|---|---|---|---|---|");
    println!(
        "| {} | {} layers, hidden {}, {} | {} | {:.1} | {:.2} | {} (median) |",
        b.describe(),
        c.num_hidden_layers,
        c.hidden_size,
        a.model.display(),
        prompt.len(),
        median(prefill),
        median(decode),
        a.runs
    );
    Ok(())
}
