//! CPU linear-layer benchmark: `cargo bench --bench linear`.
//!
//! Times `out[m, n] = a[m, k] · w[n, k]ᵀ` on Qwen3-VL-2B's projection shapes for decode
//! (m = 1), a short batch (m = 8) and prefill (m = 64), on every SIMD path this CPU has, and
//! prints a table of medians. Weights are bf16 (plus f16/f32 rows for one shape, and rows
//! through the `Backend` trait); activations f32.
//!
//! The weights rotate through copies spanning at least `POOL_BYTES`, so each timed call reads
//! weights that are not in cache, as in a real forward pass over the whole model.
//!
//! Reference rows: the machine's raw read bandwidth over 1 GiB with the same threads (a plain
//! summing loop, and the same loop with software prefetch), and per shape a `read` row that sums
//! the very weight bytes the kernels stream (same rotation, with prefetch); `% read` compares
//! each kernel's weight GB/s with that row. The machine is shared, so rows taken minutes apart
//! can differ by more than the kernels do: compare `% read`, and the min column.
//!
//! Environment knobs: `LINEAR_BENCH_THREADS` (default 2), `LINEAR_BENCH_PATHS` (e.g.
//! `avx512,scalar`), `LINEAR_BENCH_M` (e.g. `1,64`), `LINEAR_BENCH_SHAPES` (e.g. `q,lm_head`),
//! `LINEAR_BENCH_SECS` (minimum timed seconds per row, default 1).

use qwen3_vl::cpu::{linear_on, CpuBackend, Isa, Weights};
use qwen3_vl::{Backend, DType};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Barrier};
use std::time::Instant;

/// Weights span at least this many bytes over the rotation of copies (beyond the caches).
const POOL_BYTES: usize = 1 << 30;
/// Where the reference sums go, so they are not optimised away.
static SINK: AtomicU64 = AtomicU64::new(0);
const SHAPES: [(&str, usize, usize); 6] =
    [("q", 2048, 2048), ("k/v", 1024, 2048), ("o", 2048, 2048), ("gate/up", 6144, 2048), ("down", 2048, 6144), ("lm_head", 151_936, 2048)];

fn main() {
    let threads: usize = env("LINEAR_BENCH_THREADS").and_then(|s| s.parse().ok()).unwrap_or(2);
    // `linear_on` splits its work over the pool installed on the calling thread
    let pool = qwen3_vl::cpu::Pool::new(threads).expect("worker threads");
    pool.install(|| run(threads));
}

fn run(threads: usize) {
    let secs: f64 = env("LINEAR_BENCH_SECS").and_then(|s| s.parse().ok()).unwrap_or(1.0);
    let paths: Vec<Isa> = match env("LINEAR_BENCH_PATHS") {
        Some(s) => Isa::available().into_iter().filter(|i| s.split(',').any(|p| p == i.name())).collect(),
        None => Isa::available(),
    };
    let ms: Vec<usize> = env("LINEAR_BENCH_M").map_or(vec![1, 8, 64], |s| s.split(',').filter_map(|x| x.parse().ok()).collect());
    let shape_filter = env("LINEAR_BENCH_SHAPES");
    let shapes: Vec<_> =
        SHAPES.iter().filter(|(name, _, _)| shape_filter.as_ref().map_or(true, |f| f.split(',').any(|x| x == *name))).collect();

    println!(
        "CPU linear benchmark: {} threads, paths available {:?}, dispatched {}",
        threads,
        Isa::available().iter().map(|i| i.name()).collect::<Vec<_>>(),
        Isa::detect().name()
    );
    println!("medians over >= {} s per row; weights rotate over >= {} MiB of copies (cold in cache)\n", secs, POOL_BYTES >> 20);
    header();
    let reader = Reader::new(threads);
    let big: Vec<u64> = (0..(1u64 << 27)).collect();
    for (label, prefetch) in [("memory read 1 GiB", false), ("  + sw prefetch", true)] {
        let t = time(secs.max(2.0), |_| reader.read(&big, prefetch));
        let gbs = (8usize << 27) as f64 / t.median / 1e9;
        println!(
            "{:<22} {:>4} {:>5} {:>7} {:>9} {:>9} {:>9.1} {:>8} {:>6}",
            label,
            "-",
            "-",
            "read",
            fmt_ms(t.median),
            fmt_ms(t.min),
            gbs,
            "-",
            "-"
        );
    }
    drop(big);

    for &&(name, n, k) in &shapes {
        let pool = WeightPool::new(n, k, Dt::Bf16);
        // the same bytes, same rotation, just summed: what streaming them can reach right now
        let read = time(secs, |i| pool.read(&reader, i));
        let read_gbs = (n * k * 2) as f64 / read.median / 1e9;
        row(name, n, k, 0, Dt::Bf16, "read", &read, None);
        for &m in &ms {
            let a = pseudo(m * k, 7);
            for &isa in &paths {
                if isa == Isa::Scalar && m > 1 && n * k > 64 << 20 {
                    continue; // seconds per call: not worth the wait
                }
                let mut out = vec![0.0f32; m * n];
                let t = time(secs, |i| linear_on(isa, &a, pool.get(i), None, m, n, k, &mut out));
                row(name, n, k, m, Dt::Bf16, isa.name(), &t, Some(read_gbs));
            }
        }
    }

    // other dtypes on one shape, dispatched path
    let (n, k) = (2048, 2048);
    for dt in [Dt::F16, Dt::F32] {
        let pool = WeightPool::new(n, k, dt);
        for &m in &ms {
            let a = pseudo(m * k, 7);
            let mut out = vec![0.0f32; m * n];
            let t = time(secs, |i| linear_on(Isa::detect(), &a, pool.get(i), None, m, n, k, &mut out));
            row("q", n, k, m, dt, Isa::detect().name(), &t, None);
        }
    }

    // the same through the Backend trait (its own pool, output allocation, tensor wrapping)
    let backend = CpuBackend::new(Some(threads)).expect("cpu backend");
    let (n, k) = (2048, 2048);
    let bits = pseudo_bf16(n * k, 3);
    let copies = (POOL_BYTES / (n * k * 2)).max(1);
    let ws: Vec<_> = (0..copies).map(|_| backend.upload_half(&[n, k], DType::BF16, &bits).expect("upload")).collect();
    for &m in &ms {
        let a = backend.upload_f32(&[m, k], &pseudo(m * k, 7)).expect("upload");
        let t = time(secs, |i| {
            backend.linear(&a, &ws[i % copies], None).expect("linear");
        });
        row("q (Backend)", n, k, m, Dt::Bf16, Isa::detect().name(), &t, None);
    }
}

fn header() {
    println!(
        "{:<22} {:>4} {:>5} {:>7} {:>9} {:>9} {:>9} {:>8} {:>6}",
        "shape (n x k)", "m", "dtype", "path", "median ms", "min ms", "GB/s w", "GFLOP/s", "% read"
    );
    println!("{}", "-".repeat(22 + 5 + 6 + 8 + 10 + 10 + 10 + 9 + 7));
}

/// Seconds per call: median and fastest.
struct Timing {
    median: f64,
    min: f64,
}

/// One table row (`m = 0`: a plain read of the weights). GB/s counts the weight bytes read,
/// GFLOP/s `2·m·n·k`, both at the median; `% read` compares GB/s with `read_gbs`.
#[allow(clippy::too_many_arguments)]
fn row(name: &str, n: usize, k: usize, m: usize, dt: Dt, path: &str, t: &Timing, read_gbs: Option<f64>) {
    let shape = format!("{} {}x{}", name, n, k);
    let gbs = (n * k * dt.size()) as f64 / t.median / 1e9;
    let gflops = (2 * m * n * k) as f64 / t.median / 1e9;
    let pct = read_gbs.map_or("-".to_string(), |r| format!("{:.0}%", 100.0 * gbs / r));
    let (m, gflops) = if m == 0 { ("-".to_string(), "-".to_string()) } else { (m.to_string(), format!("{:.1}", gflops)) };
    println!(
        "{:<22} {:>4} {:>5} {:>7} {:>9} {:>9} {:>9.1} {:>8} {:>6}",
        shape,
        m,
        dt.name(),
        path,
        fmt_ms(t.median),
        fmt_ms(t.min),
        gbs,
        gflops,
        pct
    );
}

fn fmt_ms(s: f64) -> String {
    format!("{:.3}", s * 1e3)
}

/// Runs `f(i)` with i = 0, 1, 2, ... (two warm-up calls, then at least 5 timed calls and at
/// least `secs` seconds) and returns median / min seconds per call.
fn time(secs: f64, mut f: impl FnMut(usize)) -> Timing {
    let mut i = 0;
    for _ in 0..2 {
        f(i);
        i += 1;
    }
    let mut samples = Vec::new();
    let start = Instant::now();
    while samples.len() < 5 || (start.elapsed().as_secs_f64() < secs && samples.len() < 1000) {
        let t = Instant::now();
        f(i);
        samples.push(t.elapsed().as_secs_f64());
        i += 1;
    }
    samples.sort_by(|a, b| a.partial_cmp(b).unwrap());
    Timing { median: samples[samples.len() / 2], min: samples[0] }
}

#[derive(Clone, Copy)]
enum Dt {
    Bf16,
    F16,
    F32,
}

impl Dt {
    fn name(self) -> &'static str {
        match self {
            Dt::Bf16 => "bf16",
            Dt::F16 => "f16",
            Dt::F32 => "f32",
        }
    }

    fn size(self) -> usize {
        if let Dt::F32 = self {
            4
        } else {
            2
        }
    }
}

/// Copies of one `n × k` weight matrix spanning at least `POOL_BYTES`.
enum WeightPool {
    Half(Dt, Vec<u16>, usize),
    F32(Vec<f32>, usize),
}

impl WeightPool {
    fn new(n: usize, k: usize, dt: Dt) -> WeightPool {
        let len = n * k;
        let bytes = len * dt.size();
        let copies = ((POOL_BYTES + bytes - 1) / bytes).max(2);
        match dt {
            Dt::F32 => {
                let one = pseudo(len, 5);
                let mut v = Vec::with_capacity(len * copies);
                (0..copies).for_each(|_| v.extend_from_slice(&one));
                WeightPool::F32(v, len)
            }
            _ => {
                let one = if let Dt::Bf16 = dt {
                    pseudo_bf16(len, 5)
                } else {
                    pseudo(len, 5).iter().map(|&x| half::f16::from_f32(x).to_bits()).collect()
                };
                let mut v = Vec::with_capacity(len * copies);
                (0..copies).for_each(|_| v.extend_from_slice(&one));
                WeightPool::Half(dt, v, len)
            }
        }
    }

    /// Sums the `i`-th call's copy with `reader` (with software prefetch).
    fn read(&self, reader: &Reader, i: usize) {
        match self.get(i) {
            Weights::F32(s) => reader.read(s, true),
            Weights::F16(s) | Weights::Bf16(s) => reader.read(s, true),
        }
    }

    /// The `i`-th call's copy.
    fn get(&self, i: usize) -> Weights<'_> {
        match self {
            WeightPool::Half(dt, v, len) => {
                let s = &v[(i % (v.len() / len)) * len..][..*len];
                if let Dt::Bf16 = dt {
                    Weights::Bf16(s)
                } else {
                    Weights::F16(s)
                }
            }
            WeightPool::F32(v, len) => Weights::F32(&v[(i % (v.len() / len)) * len..][..*len]),
        }
    }
}

/// `threads` persistent threads that sum a byte range between two barriers: the plain
/// read-bandwidth reference (no thread start-up inside the timing). With `prefetch`, each
/// thread also software-prefetches `PREFETCH_AHEAD` bytes ahead of its sums, as the dot
/// kernels do; on this kind of VM that reads markedly faster than relying on the hardware
/// prefetchers alone.
struct Reader {
    go: Arc<Barrier>,
    done: Arc<Barrier>,
    /// (pointer, words, prefetch as 0/1) of the current job
    job: Arc<[AtomicUsize; 3]>,
}

const PREFETCH_AHEAD: usize = 4096;

impl Reader {
    fn new(threads: usize) -> Reader {
        let (go, done) = (Arc::new(Barrier::new(threads + 1)), Arc::new(Barrier::new(threads + 1)));
        let job = Arc::new([AtomicUsize::new(0), AtomicUsize::new(0), AtomicUsize::new(0)]);
        for t in 0..threads {
            let (go, done, job) = (Arc::clone(&go), Arc::clone(&done), Arc::clone(&job));
            std::thread::spawn(move || loop {
                go.wait();
                let (ptr, words) = (job[0].load(Ordering::Acquire) as *const u64, job[1].load(Ordering::Acquire));
                let prefetch = job[2].load(Ordering::Acquire) != 0;
                let per = words / threads;
                // SAFETY: `read` publishes a live `&[u64]` of `words` words and waits on `done`
                // before returning, so the slice outlives this use.
                let s = unsafe { std::slice::from_raw_parts(ptr.add(t * per), per) };
                // 8 independent lanes (one cache line) so the sum is not one dependency chain
                let mut acc = [0u64; 8];
                for c in s.chunks_exact(8) {
                    if prefetch {
                        prefetch_line((c.as_ptr() as *const u8).wrapping_add(PREFETCH_AHEAD));
                    }
                    for l in 0..8 {
                        acc[l] = acc[l].wrapping_add(c[l]);
                    }
                }
                SINK.fetch_add(acc.iter().fold(0, |a, &b| a.wrapping_add(b)), Ordering::Relaxed);
                done.wait();
            });
        }
        Reader { go, done, job }
    }

    /// Sums `data` (its whole aligned 8-byte words) on all threads.
    fn read<T>(&self, data: &[T], prefetch: bool) {
        // SAFETY: the weights and the reference buffer are plain integers / floats, so any
        // aligned run of their initialised bytes is a valid `u64`.
        let (_, words, _) = unsafe { data.align_to::<u64>() };
        self.job[0].store(words.as_ptr() as usize, Ordering::Release);
        self.job[1].store(words.len(), Ordering::Release);
        self.job[2].store(prefetch as usize, Ordering::Release);
        self.go.wait();
        self.done.wait();
    }
}

/// Prefetch hint for the line at `p` (nothing off x86-64).
#[inline(always)]
fn prefetch_line(p: *const u8) {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: SSE is baseline on x86-64; a prefetch never faults, whatever the address.
    unsafe {
        std::arch::x86_64::_mm_prefetch::<{ std::arch::x86_64::_MM_HINT_T0 }>(p as *const i8)
    };
    #[cfg(not(target_arch = "x86_64"))]
    let _ = p;
}

fn env(key: &str) -> Option<String> {
    std::env::var(key).ok().filter(|s| !s.is_empty())
}

fn pseudo(n: usize, seed: u32) -> Vec<f32> {
    let mut s = seed.wrapping_mul(2_654_435_761).wrapping_add(12345);
    (0..n)
        .map(|_| {
            s ^= s << 13;
            s ^= s >> 17;
            s ^= s << 5;
            (s % 2001) as f32 / 1000.0 - 1.0
        })
        .collect()
}

fn pseudo_bf16(n: usize, seed: u32) -> Vec<u16> {
    pseudo(n, seed).iter().map(|x| (x.to_bits() >> 16) as u16).collect()
}
