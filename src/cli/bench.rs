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
