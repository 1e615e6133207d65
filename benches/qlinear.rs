//! CPU quantized linear benchmark: `cargo bench --bench qlinear`.
//!
//! Times `out[m, n] = a[m, k] · w[n, k]ᵀ` with block-quantized weights (Q8_0, Q4_K, Q6_K) on
//! Qwen3-VL-2B's projection shapes, for decode (m = 1) and prefill (m = 64), on every
//! instruction-set path this CPU has, and prints medians with the weight bytes streamed per
//! second (decode is bound by them) and the multiply-adds per second (prefill).
//!
//! The weights rotate through copies spanning at least `POOL_BYTES`, so each timed call reads
//! weights that are not in cache, as in a real forward pass over the whole model.
//!
//! Environment knobs: `QLINEAR_BENCH_THREADS` (default 2), `QLINEAR_BENCH_PATHS` (e.g.
//! `avx512vnni,avx2`), `QLINEAR_BENCH_M` (e.g. `1,64`), `QLINEAR_BENCH_TYPES` (e.g.
//! `q4_k,q6_k`), `QLINEAR_BENCH_SHAPES` (e.g. `q,lm_head`), `QLINEAR_BENCH_SECS` (minimum timed
//! seconds per row, default 0.5).

use qwen3_vl::cpu::qlinear::{linear_on, QIsa};
use qwen3_vl::{quant, DType};
use std::time::Instant;

/// Weights span at least this many bytes over the rotation of copies (beyond the caches).
const POOL_BYTES: usize = 512 << 20;
const SHAPES: [(&str, usize, usize); 5] = [("q", 2048, 2048), ("k/v", 1024, 2048), ("gate/up", 6144, 2048), ("down", 2048, 6144), ("lm_head", 151_936, 2048)];
const TYPES: [DType; 3] = [DType::Q8_0, DType::Q4K, DType::Q6K];

fn env(name: &str) -> Option<String> {
    std::env::var(name).ok().filter(|s| !s.is_empty())
}

fn list<T>(name: &str, all: Vec<T>, key: impl Fn(&T) -> String) -> Vec<T> {
    match env(name) {
        Some(s) => all.into_iter().filter(|x| s.split(',').any(|p| p == key(x))).collect(),
        None => all,
    }
}

fn main() {
    let threads: usize = env("QLINEAR_BENCH_THREADS").and_then(|s| s.parse().ok()).unwrap_or(2);
    // `linear_on` splits its work over the pool installed on the calling thread
    let pool = qwen3_vl::cpu::Pool::new(threads).expect("worker threads");
    pool.install(|| run(threads));
}

fn run(threads: usize) {
    let secs: f64 = env("QLINEAR_BENCH_SECS").and_then(|s| s.parse().ok()).unwrap_or(0.5);
    let paths = list("QLINEAR_BENCH_PATHS", QIsa::available(), |i| i.name().to_string());
    let types = list("QLINEAR_BENCH_TYPES", TYPES.to_vec(), |t| t.name().to_string());
    let shapes = list("QLINEAR_BENCH_SHAPES", SHAPES.to_vec(), |s| s.0.to_string());
    let ms: Vec<usize> = env("QLINEAR_BENCH_M").map_or(vec![1, 64], |s| s.split(',').filter_map(|x| x.parse().ok()).collect());
    println!("CPU quantized linear benchmark: {} threads, paths {:?}, dispatched {}", threads, paths.iter().map(|p| p.name()).collect::<Vec<_>>(), QIsa::detect().name());
    println!("| type | shape (n×k) | m | path | median µs | min µs | weight GB/s | GMAC/s |");
    println!("|---|---|---|---|---|---|---|---|");
    for &wt in &types {
        for &(name, n, k) in &shapes {
            // 1. weights: one quantized matrix, copied until the copies span POOL_BYTES
            let src: Vec<f32> = (0..n * k).map(|i| ((i.wrapping_mul(2_654_435_761) >> 7) % 2001) as f32 / 1000.0 - 1.0).collect();
            let one = quant::quantize_vec(wt, &src).expect("whole blocks");
            drop(src);
            let copies = (POOL_BYTES + one.len() - 1) / one.len();
            let pool: Vec<Vec<u8>> = (0..copies.max(2)).map(|_| one.clone()).collect();
            for &m in &ms {
                let a: Vec<f32> = (0..m * k).map(|i| ((i * 7919) % 1000) as f32 / 500.0 - 1.0).collect();
                let mut out = vec![0f32; m * n];
                for &isa in &paths {
                    // 2. warm up, then time calls until `secs` have passed (at least 5)
                    linear_on(isa, &a, wt, &pool[0], None, m, n, k, &mut out);
                    let mut times = Vec::new();
                    let start = Instant::now();
                    let mut i = 0;
                    while times.len() < 5 || start.elapsed().as_secs_f64() < secs {
                        let w = &pool[i % pool.len()];
                        i += 1;
                        let t0 = Instant::now();
                        linear_on(isa, &a, wt, w, None, m, n, k, &mut out);
                        times.push(t0.elapsed().as_secs_f64());
                    }
                    times.sort_by(|x, y| x.partial_cmp(y).unwrap());
                    let med = times[times.len() / 2];
                    println!(
                        "| {} | {} {}×{} | {} | {} | {:.0} | {:.0} | {:.1} | {:.1} |",
                        wt.name(),
                        name,
                        n,
                        k,
                        m,
                        isa.name(),
                        med * 1e6,
                        times[0] * 1e6,
                        one.len() as f64 / med / 1e9,
                        (m * n * k) as f64 / med / 1e9
                    );
                }
            }
        }
    }
}
