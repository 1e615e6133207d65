//! GPU-vs-CPU agreement for every kernel, written once per op and run on the CUDA backend
//! when this machine has one (skipped with a note otherwise; with QWEN3_VL_EXPECT_GPU=1 a
//! missing GPU fails instead). Outputs are poisoned with NaN before every launch, so an
//! element a kernel fails to write cannot agree. Shapes sweep 1, 63, tile±1 and large.

mod common;

use common::{agree, cpu, gpu, random, upload};
use qwen3_vl::{Backend, DType, Result, Tensor};

/// (m, n, k): rows, outputs, inputs. m <= 4 takes the GEMV kernels, larger m the tiled
/// matmul (64 × 64 tiles, k stages of 16); on compute_80, 2 to 32 rows with `k % 8 == 0` take
/// the few-row tensor-core kernel (see `few_rows_agree_around_the_skinny_variants`).
const LINEAR_SHAPES: &[(usize, usize, usize)] = &[
    (1, 1, 1),
    (1, 63, 17),
    (1, 64, 64),
    (1, 65, 1000),
    (1, 4096, 2048),
    (3, 257, 129),
    (4, 65, 63),
    (5, 63, 16),
    (63, 64, 15),
    (64, 64, 64),
    (65, 65, 65),
    (130, 257, 300),
    (129, 130, 129),
    (200, 1024, 2048),
];

#[test]
fn linear_agrees_for_every_weight_dtype_and_shape() {
    // every kernel module: compute_61 takes the SIMT tiles (`matmul_big_*` from BIG_MIN_ROWS
    // rows; its staging loads whole vectors when k is a multiple of 4, element by element
    // otherwise)
    for g in common::gpus("linear") {
        linear_agrees_on(&*g);
    }
}

fn linear_agrees_on(g: &dyn Backend) {
    for (i, &(m, n, k)) in LINEAR_SHAPES.iter().enumerate() {
        let (a, w, bias) = (random(m * k, 1 + i as u32), random(n * k, 100 + i as u32), random(n, 200 + i as u32));
        for dtype in [DType::F32, DType::F16, DType::BF16] {
            let with_bias = i % 2 == 0;
            let op = |b: &dyn Backend| -> Result<Tensor> {
                let at = b.upload_f32(&[m, k], &a)?;
                let wt = upload(b, &[n, k], &w, dtype)?;
                let bt = if with_bias { Some(b.upload_f32(&[n], &bias)?) } else { None };
                b.linear(&at, &wt, bt.as_ref())
            };
            let name = format!("linear m={} n={} k={} w={} bias={} on {:?}", m, n, k, dtype, with_bias, common::kernels_arch(g));
            agree(&name, g, &op, 1e-5 * (k as f32).sqrt() * 4.0, 1e-4);
        }
    }
}

#[test]
fn rms_norm_agrees() {
    let g = match gpu("rms_norm") {
        Some(g) => g,
        None => return,
    };
    for &(rows, cols) in &[(1, 1), (1, 63), (3, 255), (2, 256), (5, 257), (64, 2048), (7, 5000)] {
        let (x, w) = (random(rows * cols, 7), random(cols, 8));
        let op = |b: &dyn Backend| -> Result<Tensor> { b.rms_norm(&b.upload_f32(&[rows, cols], &x)?, &b.upload_f32(&[cols], &w)?, 1e-6) };
        agree(&format!("rms_norm {}x{}", rows, cols), &*g, &op, 1e-5, 1e-4);
    }
}

#[test]
fn softmax_agrees_including_masked_entries() {
    let g = match gpu("softmax") {
        Some(g) => g,
        None => return,
    };
    for &(rows, cols) in &[(1, 1), (1, 63), (3, 255), (2, 256), (5, 257), (16, 4096), (2, 151_936)] {
        let mut x: Vec<f32> = random(rows * cols, 9).iter().map(|v| v * 20.0).collect();
        // mask a causal-like tail in every row, and the whole last row when there are several
        for r in 0..rows {
            for c in (cols / 2 + r).min(cols)..cols {
                if c > 0 {
                    x[r * cols + c] = f32::NEG_INFINITY;
                }
            }
        }
        if rows > 1 {
            x[(rows - 1) * cols..].iter_mut().for_each(|v| *v = f32::NEG_INFINITY);
        }
        let op = |b: &dyn Backend| -> Result<Tensor> { b.softmax(&b.upload_f32(&[rows, cols], &x)?) };
        agree(&format!("softmax {}x{}", rows, cols), &*g, &op, 1e-7, 1e-4);
    }
}

#[test]
fn silu_mul_agrees() {
    let g = match gpu("silu_mul") {
        Some(g) => g,
        None => return,
    };
    for &len in &[1usize, 63, 255, 256, 257, 100_000, 3_000_000] {
        let (gate, up) = (random(len, 10).iter().map(|v| v * 8.0).collect::<Vec<_>>(), random(len, 11));
        let op = |b: &dyn Backend| -> Result<Tensor> { b.silu_mul(&b.upload_f32(&[len], &gate)?, &b.upload_f32(&[len], &up)?) };
        agree(&format!("silu_mul {}", len), &*g, &op, 1e-6, 1e-5);
    }
}

#[test]
fn launch_errors_are_errors_not_panics() {
    let g = match gpu("launch errors") {
        Some(g) => g,
        None => return,
    };
    let a = g.upload_f32(&[2, 3], &[0.0; 6]).unwrap();
    let w = g.upload_f32(&[4, 5], &[0.0; 20]).unwrap();
    let e = g.linear(&a, &w, None).unwrap_err().to_string();
    assert!(e.contains("linear") && e.contains("[2, 3]"), "{}", e);
    // a CPU tensor handed to the GPU backend
    let c = cpu().upload_f32(&[2, 3], &[0.0; 6]).unwrap();
    let e = g.softmax(&c).unwrap_err().to_string();
    assert!(e.contains("softmax") && e.contains("CPU"), "{}", e);
}

#[test]
fn memory_pool_reuses_freed_blocks() {
    let g = match gpu("memory pool") {
        Some(g) => g,
        None => return,
    };
    let x = random(1 << 16, 3);
    let first = g.upload_f32(&[1 << 16], &x).unwrap();
    drop(first);
    let before = g.memory_stats();
    for _ in 0..10 {
        let t = g.upload_f32(&[1 << 16], &x).unwrap();
        let _y = g.softmax(&t).unwrap();
    }
    let after = g.memory_stats();
    assert!(after.cached > 0, "{:?}", after);
    // one new block for the softmax output, none for the ten re-uploads
    assert!(after.device_allocs <= before.device_allocs + 1, "{:?} -> {:?}", before, after);
    assert!(after.peak >= 2 * (1 << 18), "{:?}", after);
}

#[test]
fn add_agrees() {
    let g = match gpu("add") {
        Some(g) => g,
        None => return,
    };
    for &len in &[1usize, 255, 257, 1_000_003] {
        let (a, b) = (random(len, 12), random(len, 13));
        let op = |be: &dyn Backend| -> Result<Tensor> { be.add(&be.upload_f32(&[len], &a)?, &be.upload_f32(&[len], &b)?) };
        agree(&format!("add {}", len), &*g, &op, 0.0, 0.0);
    }
}

#[test]
fn embedding_agrees_for_every_table_dtype() {
    let g = match gpu("embedding") {
        Some(g) => g,
        None => return,
    };
    for &(vocab, hidden) in &[(1, 1), (50, 63), (1000, 257)] {
        let table = random(vocab * hidden, 14);
        let ids: Vec<u32> = (0..37u32).map(|i| (i * 7919) % vocab as u32).collect();
        for dtype in [DType::F32, DType::F16, DType::BF16] {
            let op = |b: &dyn Backend| -> Result<Tensor> { b.embedding(&upload(b, &[vocab, hidden], &table, dtype)?, &ids) };
            agree(&format!("embedding {}x{} {}", vocab, hidden, dtype), &*g, &op, 0.0, 0.0);
        }
    }
    let t = g.upload_f32(&[4, 2], &[0.0; 8]).unwrap();
    let e = g.embedding(&t, &[1, 4]).unwrap_err().to_string();
    assert!(e.contains("token id 4") && e.contains("vocabulary of 4"), "{}", e);
}

#[test]
fn rope_agrees() {
    let g = match gpu("rope") {
        Some(g) => g,
        None => return,
    };
    for &(rows, heads, d) in &[(1, 1, 2), (3, 16, 128), (65, 8, 64), (17, 2, 80)] {
        let x = random(rows * heads * d, 15);
        let ang: Vec<f32> = random(rows * d / 2, 16).iter().map(|a| a * 100.0).collect();
        let (cos, sin): (Vec<f32>, Vec<f32>) = ang.iter().map(|a| (a.cos(), a.sin())).unzip();
        let op = |b: &dyn Backend| -> Result<Tensor> {
            b.rope(&b.upload_f32(&[rows, heads, d], &x)?, &b.upload_f32(&[rows, d / 2], &cos)?, &b.upload_f32(&[rows, d / 2], &sin)?)
        };
        agree(&format!("rope {}x{}x{}", rows, heads, d), &*g, &op, 1e-6, 1e-5);
    }
}

#[test]
fn attention_agrees_causal_full_gqa_and_cached() {
    let g = match gpu("attention") {
        Some(g) => g,
        None => return,
    };
    // (t, heads, kv_heads, d, cap, kv_len, q_pos0, causal)
    let cases = [
        (1, 1, 1, 1, 1, 1, 0, true),
        (7, 4, 2, 16, 7, 7, 0, true),        // prefill, GQA
        (1, 16, 8, 128, 300, 257, 256, true), // decode step from a cache
        (5, 16, 8, 128, 300, 205, 200, true), // chunked prefill after a cache
        (64, 2, 2, 80, 64, 64, 0, false),     // vision-style full attention
        (33, 8, 1, 256, 40, 40, 0, false),    // MQA, widest head
    ];
    for &(t, heads, kvh, d, cap, kv_len, q_pos0, causal) in &cases {
        let (q, k, v) = (random(t * heads * d, 17), random(cap * kvh * d, 18), random(cap * kvh * d, 19));
        let p = qwen3_vl::AttnParams { kv_len, q_pos0, causal, scale: 1.0 / (d as f32).sqrt() };
        let op = |b: &dyn Backend| -> Result<Tensor> {
            b.attention(&b.upload_f32(&[t, heads, d], &q)?, &b.upload_f32(&[cap, kvh, d], &k)?, &b.upload_f32(&[cap, kvh, d], &v)?, p)
        };
        let (abs, rel) = common::attention_tolerance(&*g);
        agree(&format!("attention t={} h={}/{} d={} kv={} causal={}", t, heads, kvh, d, kv_len, causal), &*g, &op, abs, rel);
    }
}

#[test]
fn kv_rows_round_trip() {
    let g = match gpu("write_rows/take_rows") {
        Some(g) => g,
        None => return,
    };
    let src = random(3 * 2 * 4, 20);
    let op = |b: &dyn Backend| -> Result<Tensor> {
        let mut cache = b.zeros(&[10, 2, 4])?;
        b.write_rows(&mut cache, 6, &b.upload_f32(&[3, 2, 4], &src)?)?;
        b.take_rows(&cache, 5, 5)
    };
    agree("write_rows + take_rows", &*g, &op, 0.0, 0.0);
    // an f16 cache: the rows taken keep their type (widened here to compare)
    let op = |b: &dyn Backend| -> Result<Tensor> {
        let mut cache = b.upload_half(&[10, 2, 4], DType::F16, &[0u16; 80])?;
        b.write_rows(&mut cache, 6, &b.upload_f32(&[3, 2, 4], &src)?)?;
        let rows = b.take_rows(&cache, 5, 5)?;
        assert_eq!((rows.dtype(), rows.shape()), (DType::F16, &[5usize, 2, 4][..]));
        let wide: Vec<f32> = b.download_half(&rows)?.iter().map(|&h| half::f16::from_bits(h).to_f32()).collect();
        b.upload_f32(&[5, 2, 4], &wide)
    };
    agree("write_rows + take_rows, f16", &*g, &op, 0.0, 0.0);
}

#[test]
fn scatter_rows_agrees_for_replace_and_add() {
    let g = match gpu("scatter_rows") {
        Some(g) => g,
        None => return,
    };
    let (n, width) = (40, 257);
    let rows: Vec<usize> = vec![3, 4, 5, 17, 39, 0];
    let (x, src) = (random(n * width, 21), random(rows.len() * width, 22));
    for add in [false, true] {
        let op = |b: &dyn Backend| -> Result<Tensor> { b.scatter_rows(&b.upload_f32(&[n, width], &x)?, &rows, &b.upload_f32(&[rows.len(), width], &src)?, add) };
        agree(&format!("scatter_rows add={}", add), &*g, &op, 0.0, 0.0);
    }
}

#[test]
fn blend_rows_agrees_and_checks_its_ids() {
    // the checks are the shared shape rules: the CPU says them with no GPU here
    let c = cpu();
    let table = c.upload_f32(&[5, 3], &random(15, 30)).unwrap();
    let e = c.blend_rows(&table, &[0, 5], &[0.5, 0.5], 2).unwrap_err().to_string();
    assert!(e.contains("id 5 is outside the 5 rows"), "{}", e);
    let e = c.blend_rows(&table, &[0, 1, 2], &[0.5, 0.5, 0.5], 2).unwrap_err().to_string();
    assert!(e.contains("rows of 2 entries"), "{}", e);
    let g = match gpu("blend_rows") {
        Some(g) => g,
        None => return,
    };
    // the vision tower's shape class (four corners a row) and odd widths
    for &(vocab, width, rows, per_row) in &[(1, 1, 1, 1), (7, 63, 5, 3), (2304, 1024, 300, 4), (49, 257, 64, 4)] {
        let table = random(vocab * width, 31);
        let ids: Vec<u32> = (0..rows * per_row).map(|i| ((i * 7 + 3) % vocab) as u32).collect();
        let weights = random(rows * per_row, 32);
        let op = |b: &dyn Backend| -> Result<Tensor> { b.blend_rows(&b.upload_f32(&[vocab, width], &table)?, &ids, &weights, per_row) };
        agree(&format!("blend_rows {}x{} rows={} k={}", vocab, width, rows, per_row), &*g, &op, 1e-6, 1e-5);
    }
}

#[test]
fn layer_norm_agrees() {
    let g = match gpu("layer_norm") {
        Some(g) => g,
        None => return,
    };
    for &(rows, cols) in &[(1, 1), (3, 63), (5, 257), (64, 1024), (2, 4096)] {
        let x: Vec<f32> = random(rows * cols, 23).iter().map(|v| v * 3.0 + 0.5).collect();
        let (w, bias) = (random(cols, 24), random(cols, 25));
        let op = |b: &dyn Backend| -> Result<Tensor> {
            b.layer_norm(&b.upload_f32(&[rows, cols], &x)?, &b.upload_f32(&[cols], &w)?, &b.upload_f32(&[cols], &bias)?, 1e-6)
        };
        agree(&format!("layer_norm {}x{}", rows, cols), &*g, &op, 1e-5, 1e-4);
    }
}

#[test]
fn gelu_agrees_in_both_forms() {
    let g = match gpu("gelu") {
        Some(g) => g,
        None => return,
    };
    for kind in [qwen3_vl::Gelu::Tanh, qwen3_vl::Gelu::Erf] {
        for &len in &[1usize, 257, 100_000] {
            let x: Vec<f32> = random(len, 26).iter().map(|v| v * 8.0).collect();
            let op = |b: &dyn Backend| -> Result<Tensor> { b.gelu(&b.upload_f32(&[len], &x)?, kind) };
            agree(&format!("gelu {:?} {}", kind, len), &*g, &op, 1e-6, 1e-5);
        }
    }
}

/// The few-row tensor-core kernels (`matmul_skinny_*`, compute_80: 2 to 32 rows, the batched
/// decode) on row counts around their 16 / 32 variants (and past them, where the tiles take over), with a bias, a residual and a
/// GELU epilogue, bf16 and f16 weights (rows past f16's range: `gpu_decode_ops.rs`). Both
/// modules run it (compute_61 takes its own kernels for these shapes).
#[test]
fn few_rows_agree_around_the_skinny_variants() {
    for g in common::gpus("skinny linear") {
        for (i, &(n, k)) in [(257usize, 136usize), (2048, 2048), (40, 6144)].iter().enumerate() {
            for &m in &[2usize, 7, 16, 17, 31, 32, 33, 63, 64] {
                let seed = (i * 100 + m) as u32;
                let (a, w, bias, res) = (random(m * k, seed), random(n * k, seed + 1), random(n, seed + 2), random(m * n, seed + 3));
                for dtype in [DType::F16, DType::BF16] {
                    let op = |b: &dyn Backend| -> Result<Tensor> {
                        let (at, wt) = (b.upload_f32(&[m, k], &a)?, upload(b, &[n, k], &w, dtype)?);
                        let r = b.linear_residual(&at, &wt, Some(&b.upload_f32(&[n], &bias)?), &b.upload_f32(&[m, n], &res)?)?;
                        let gl = b.linear_gelu(&at, &wt, None, qwen3_vl::Gelu::Tanh)?;
                        b.add(&r, &gl)
                    };
                    agree(&format!("skinny m={} n={} k={} w={} on {}", m, n, k, dtype, g.describe()), &*g, &op, 1e-5 * (k as f32).sqrt() * 8.0, 1e-4);
                }
            }
        }
    }
}

/// `Precision::Bf16`: the tensor-core linears' 16-bit-activation variants (the few-row
/// `*_a16_*`, and `cast_a16_*` then `matmul_mma_pipe_*` on every tile, 128 × 256 (2,050 rows
/// of 2,312 outputs on a 132-SM device), 128 × 128 and 64 × 128 included, and split-K: on compute 9.0 merged in a thread-block cluster, 9 slices cut to 8
/// at m = 40, k = 6144) against the CPU's f32 product. Each activation is rounded
/// once to bf16 (unit roundoff 2^-9) or, scaled per row, to f16 (2^-11), so an output may move
/// by at most 2^-9 · Σ_k |a·w| beside f32 rounding: the bound is that sum (from the CPU, on
/// |a| and |w|) times 2^-8, plus 1e-5 · √k. Rows up to 3·10⁵ check the f16 row scales. On
/// compute_80 the result must differ from the f32 mode's (the variant really ran); on compute_61
/// the mode stays f32 and the result is bit-identical.
#[test]
fn bf16_precision_linears_stay_within_one_activation_rounding() {
    let cpu = cpu();
    for g in common::gpus("bf16 precision linear") {
        let a16 = common::tensor_cores(&*g);
        for (i, &(m, n, k)) in [(2usize, 257usize, 136usize), (16, 2048, 2048), (17, 40, 6144), (32, 264, 512), (64, 2048, 2048), (40, 2048, 6144), (200, 1024, 2048), (512, 520, 1024), (300, 4100, 72), (1030, 2312, 264), (2050, 2312, 264)].iter().enumerate() {
            let seed = 7000 + i as u32 * 10;
            let mut a = random(m * k, seed);
            for (r, row) in a.chunks_mut(k).enumerate() {
                if r % 3 == 1 {
                    row.iter_mut().for_each(|v| *v *= 3.0e5); // past f16's range
                }
            }
            let (w, bias) = (random(n * k, seed + 1), random(n, seed + 2));
            for dtype in [DType::F16, DType::BF16] {
                let op = |b: &dyn Backend, a: &[f32], w: &[f32], bias: Option<&[f32]>| -> Vec<f32> {
                    let at = b.upload_f32(&[m, k], a).unwrap();
                    let wt = upload(b, &[n, k], w, dtype).unwrap();
                    let bt = bias.map(|x| b.upload_f32(&[n], x).unwrap());
                    b.download_f32(&b.linear(&at, &wt, bt.as_ref()).unwrap()).unwrap()
                };
                let name = format!("bf16 precision linear m={} n={} k={} w={} on {}", m, n, k, dtype, g.describe());
                let want = op(&*cpu, &a, &w, Some(&bias));
                let (aa, wa): (Vec<f32>, Vec<f32>) = (a.iter().map(|v| v.abs()).collect(), w.iter().map(|v| v.abs()).collect());
                let absdot = op(&*cpu, &aa, &wa, None);
                g.set_precision(qwen3_vl::Precision::F32);
                let f32_mode = op(&*g, &a, &w, Some(&bias));
                g.set_precision(qwen3_vl::Precision::Bf16);
                assert_eq!(g.precision() == qwen3_vl::Precision::Bf16, a16, "{}: the mode taken", name);
                g.set_poison_outputs(true);
                let got = op(&*g, &a, &w, Some(&bias));
                g.set_precision(qwen3_vl::Precision::F32);
                let mut worst = 0.0f64;
                for j in 0..got.len() {
                    let bound = absdot[j] as f64 / 256.0 + 1e-5 * (k as f64).sqrt();
                    let d = (got[j] as f64 - want[j] as f64).abs();
                    assert!(d <= bound, "{}: element {}: got {} want {} (|diff| {:.3e} > bound {:.3e})", name, j, got[j], want[j], d, bound);
                    worst = worst.max(d / bound);
                }
                let moved = got.iter().zip(&f32_mode).any(|(x, y)| x.to_bits() != y.to_bits());
                assert_eq!(moved, a16, "{}: the bf16 mode must {} the f32 mode's result", name, if a16 { "differ from" } else { "equal" });
                if std::env::var("QWEN3_VL_REPORT").map_or(false, |v| v == "1") {
                    eprintln!("report: {}: worst |diff| / bound = {:.3}", name, worst);
                }
            }
        }
    }
}

/// `Precision::Bf16`'s SwiGLU product in one pipelined kernel (`gate_up_pipe_*`: 128 × 128 and
/// 64 × 128 tiles, also for 33-64 rows, the gate's and the up projection's rows interleaved by
/// eights) against the
/// CPU's f32 `silu(a·gateᵀ) ⊙ (a·upᵀ)`. Each product may move by one activation rounding
/// (`δ = 2^-8 · Σ|a·w|`, as above); the output by at most `1.1·δg·(|u| + δu) + (|silu(g)| +
/// 1.1·δg)·δu` (silu's slope stays below 1.1), plus 1e-5 · √k. Rows up to 3·10⁵ check the f16
/// row scales. On compute_80 the result must differ from the f32 mode's.
#[test]
fn bf16_precision_gate_up_stays_within_one_activation_rounding() {
    for g in common::gpus("bf16 precision gate/up") {
        let a16 = common::tensor_cores(&*g);
        for (i, &(m, n, k)) in [(512usize, 1100usize, 256usize), (1030, 2100, 136), (600, 6144, 512), (40, 2100, 264)].iter().enumerate() {
            for dtype in [DType::F16, DType::BF16] {
                check_gate_up(&*g, a16, (m, n, k), dtype, 8000 + i as u32 * 10);
            }
        }
    }
}

/// One case of `bf16_precision_gate_up_stays_within_one_activation_rounding` (seeds from `seed`).
fn check_gate_up(g: &dyn Backend, a16: bool, (m, n, k): (usize, usize, usize), dtype: DType, seed: u32) {
    let cpu = cpu();
    let mut a = random(m * k, seed);
    for (r, row) in a.chunks_mut(k).enumerate() {
        if r % 5 == 2 {
            row.iter_mut().for_each(|v| *v *= 3.0e5);
        }
    }
    let (gw, uw) = (random(n * k, seed + 1), random(n * k, seed + 2));
    let name = format!("bf16 precision gate/up m={} n={} k={} w={} on {}", m, n, k, dtype, g.describe());
    let lin = |b: &dyn Backend, a: &[f32], w: &[f32]| -> Vec<f32> { b.download_f32(&b.linear(&b.upload_f32(&[m, k], a).unwrap(), &upload(b, &[n, k], w, dtype).unwrap(), None).unwrap()).unwrap() };
    let op = |b: &dyn Backend| -> Vec<f32> {
        let at = b.upload_f32(&[m, k], &a).unwrap();
        b.download_f32(&b.gate_up_silu(&at, &upload(b, &[n, k], &gw, dtype).unwrap(), &upload(b, &[n, k], &uw, dtype).unwrap()).unwrap()).unwrap()
    };
    let (gv, uv, want) = (lin(&*cpu, &a, &gw), lin(&*cpu, &a, &uw), op(&*cpu));
    let aa: Vec<f32> = a.iter().map(|v| v.abs()).collect();
    let (gd, ud) = (lin(&*cpu, &aa, &gw.iter().map(|v| v.abs()).collect::<Vec<_>>()), lin(&*cpu, &aa, &uw.iter().map(|v| v.abs()).collect::<Vec<_>>()));
    g.set_precision(qwen3_vl::Precision::F32);
    let f32_mode = op(g);
    g.set_precision(qwen3_vl::Precision::Bf16);
    g.set_poison_outputs(true);
    let got = op(g);
    g.set_precision(qwen3_vl::Precision::F32);
    for j in 0..got.len() {
        let (dg, du) = (gd[j] as f64 / 256.0, ud[j] as f64 / 256.0);
        let silu = gv[j] as f64 / (1.0 + (-(gv[j] as f64)).exp());
        let bound = 1.1 * dg * ((uv[j] as f64).abs() + du) + (silu.abs() + 1.1 * dg) * du + 1e-5 * (k as f64).sqrt();
        let d = (got[j] as f64 - want[j] as f64).abs();
        assert!(d <= bound, "{}: element {}: got {} want {} (|diff| {:.3e} > bound {:.3e})", name, j, got[j], want[j], d, bound);
    }
    let moved = got.iter().zip(&f32_mode).any(|(x, y)| x.to_bits() != y.to_bits());
    assert_eq!(moved, a16, "{}: the bf16 mode must {} the f32 mode's result", name, if a16 { "differ from" } else { "equal" });
}

/// `Precision::Bf16`'s norm-fed products (`rms_norm_a16_bf16` writes the normed rows in bf16
/// straight for the pipelined GEMM and the fused gate/up) against the CPU: `rms_norm_linear` and
/// `rms_norm_gate_up_silu` on prefill-sized rows, bounded as above with the CPU's normed rows as
/// the activations (one rounding of each).
#[test]
fn bf16_precision_normed_products_stay_within_one_activation_rounding() {
    // tiles (600 rows), few rows (the norm, then the few-row kernel; k split or not), and a
    // batched decode step's 33-64 rows (64-row tiles)
    for (m, n, k) in [(600, 3000, 512), (16, 3000, 512), (5, 1000, 2048), (32, 700, 512), (48, 3000, 512)] {
        check_normed_products((m, n, k));
    }
}

fn check_normed_products((m, n, k): (usize, usize, usize)) {
    let cpu = cpu();
    for g in common::gpus("bf16 precision normed products") {
        let a16 = common::tensor_cores(&*g);
        let (x, nw, w, u) = (random(m * k, 9001), random(k, 9002), random(n * k, 9003), random(n * k, 9004));
        let nw: Vec<f32> = nw.iter().map(|v| 1.0 + v).collect();
        let up = |b: &dyn Backend, v: &[f32], rows: usize| upload(b, &[rows, k], v, DType::BF16).unwrap();
        let xn = cpu.download_f32(&cpu.rms_norm(&cpu.upload_f32(&[m, k], &x).unwrap(), &cpu.upload_f32(&[k], &nw).unwrap(), 1e-6).unwrap()).unwrap();
        let lin = |a: &[f32], w: &[f32]| cpu.download_f32(&cpu.linear(&cpu.upload_f32(&[m, k], a).unwrap(), &up(&*cpu, w, n), None).unwrap()).unwrap();
        let abs = |v: &[f32]| v.iter().map(|x| x.abs()).collect::<Vec<f32>>();
        let (wv, uv, wd, ud) = (lin(&xn, &w), lin(&xn, &u), lin(&abs(&xn), &abs(&w)), lin(&abs(&xn), &abs(&u)));
        let run = |b: &dyn Backend| -> (Vec<f32>, Vec<f32>) {
            let (xt, nt) = (b.upload_f32(&[m, k], &x).unwrap(), b.upload_f32(&[k], &nw).unwrap());
            let l = b.download_f32(&b.rms_norm_linear(&xt, &nt, 1e-6, &up(b, &w, n), None).unwrap()).unwrap();
            let s = b.download_f32(&b.rms_norm_gate_up_silu(&xt, &nt, 1e-6, &up(b, &w, n), &up(b, &u, n)).unwrap()).unwrap();
            (l, s)
        };
        let want = run(&*cpu);
        g.set_precision(qwen3_vl::Precision::F32);
        let f32_mode = run(&*g);
        g.set_precision(qwen3_vl::Precision::Bf16);
        g.set_poison_outputs(true);
        let got = run(&*g);
        g.set_precision(qwen3_vl::Precision::F32);
        let name = format!("bf16 precision normed products m={} n={} k={} on {}", m, n, k, g.describe());
        for j in 0..m * n {
            let (dw, du) = (wd[j] as f64 / 256.0 + 1e-5 * (k as f64).sqrt(), ud[j] as f64 / 256.0 + 1e-5 * (k as f64).sqrt());
            let d = (got.0[j] as f64 - want.0[j] as f64).abs();
            assert!(d <= dw, "{}: rms_norm_linear element {}: got {} want {} (|diff| {:.3e} > {:.3e})", name, j, got.0[j], want.0[j], d, dw);
            let silu = wv[j] as f64 / (1.0 + (-(wv[j] as f64)).exp());
            let bound = 1.1 * dw * ((uv[j] as f64).abs() + du) + (silu.abs() + 1.1 * dw) * du;
            let d = (got.1[j] as f64 - want.1[j] as f64).abs();
            assert!(d <= bound, "{}: rms_norm_gate_up_silu element {}: got {} want {} (|diff| {:.3e} > {:.3e})", name, j, got.1[j], want.1[j], d, bound);
        }
        let moved = |a: &[f32], b: &[f32]| a.iter().zip(b).any(|(x, y)| x.to_bits() != y.to_bits());
        assert_eq!(moved(&got.0, &f32_mode.0) && moved(&got.1, &f32_mode.1), a16, "{}: the bf16 mode must {} the f32 mode's results", name, if a16 { "differ from" } else { "equal" });
    }
}

/// `Precision::Bf16`'s LayerNorm-fed products (`layer_norm_a16_bf16` writes the normed rows in
/// bf16 once for every pipelined GEMM of `layer_norm_linears`: the vision tower's q, k, v and
/// its MLP's GELU layer) against the CPU, bounded by one rounding of the activations; the f32
/// mode agrees with the CPU as a plain linear layer does.
#[test]
fn bf16_precision_layer_normed_products_stay_within_one_activation_rounding() {
    let cpu = cpu();
    for g in common::gpus("bf16 precision layer-normed products") {
        let a16 = common::tensor_cores(&*g);
        let (m, n, k) = (700usize, 1040usize, 512usize);
        let (x, nw, nb, w, u, bias) = (random(m * k, 9101), random(k, 9102), random(k, 9103), random(n * k, 9104), random(n * k, 9105), random(n, 9106));
        let nw: Vec<f32> = nw.iter().map(|v| 1.0 + v).collect();
        let up = |b: &dyn Backend, v: &[f32]| upload(b, &[n, k], v, DType::BF16).unwrap();
        let run = |b: &dyn Backend| -> Vec<Vec<f32>> {
            let (xt, wt, bt, biast) = (b.upload_f32(&[m, k], &x).unwrap(), b.upload_f32(&[k], &nw).unwrap(), b.upload_f32(&[k], &nb).unwrap(), b.upload_f32(&[n], &bias).unwrap());
            let (wq, wu) = (up(b, &w), up(b, &u));
            let outs = b.layer_norm_linears(&xt, (&wt, &bt, 1e-6), &[(&wq, Some(&biast), None), (&wu, None, Some(qwen3_vl::Gelu::Tanh))]).unwrap();
            outs.iter().map(|t| b.download_f32(t).unwrap()).collect()
        };
        let want = run(&*cpu);
        // the bound: the normed rows rounded once (2^-8 of each product term), GELU's slope < 1.13
        let xn = cpu.download_f32(&cpu.layer_norm(&cpu.upload_f32(&[m, k], &x).unwrap(), &cpu.upload_f32(&[k], &nw).unwrap(), &cpu.upload_f32(&[k], &nb).unwrap(), 1e-6).unwrap()).unwrap();
        let abs = |v: &[f32]| v.iter().map(|x| x.abs()).collect::<Vec<f32>>();
        let lin = |a: &[f32], w: &[f32]| cpu.download_f32(&cpu.linear(&cpu.upload_f32(&[m, k], a).unwrap(), &up(&*cpu, w), None).unwrap()).unwrap();
        let (wd, ud) = (lin(&abs(&xn), &abs(&w)), lin(&abs(&xn), &abs(&u)));
        g.set_precision(qwen3_vl::Precision::F32);
        let f32_mode = run(&*g);
        g.set_precision(qwen3_vl::Precision::Bf16);
        g.set_poison_outputs(true);
        let got = run(&*g);
        g.set_precision(qwen3_vl::Precision::F32);
        let name = format!("bf16 precision layer-normed products m={} n={} k={} on {}", m, n, k, g.describe());
        let slack = 1e-5 * (k as f64).sqrt();
        for j in 0..m * n {
            for (o, (d, scale)) in [(0, (wd[j] as f64, 1.0)), (1, (ud[j] as f64, 1.13))] {
                let bound = scale * (d / 256.0 + slack);
                let diff = (got[o][j] as f64 - want[o][j] as f64).abs();
                assert!(diff <= bound, "{}: product {} element {}: got {} want {} (|diff| {:.3e} > {:.3e})", name, o, j, got[o][j], want[o][j], diff, bound);
                let f32_diff = (f32_mode[o][j] as f64 - want[o][j] as f64).abs();
                assert!(f32_diff <= 1e-3 * (1.0 + (want[o][j] as f64).abs()), "{}: f32 mode, product {} element {}: got {} want {}", name, o, j, f32_mode[o][j], want[o][j]);
            }
        }
        let moved = |a: &[f32], b: &[f32]| a.iter().zip(b).any(|(x, y)| x.to_bits() != y.to_bits());
        assert_eq!(moved(&got[0], &f32_mode[0]) && moved(&got[1], &f32_mode[1]), a16, "{}: the bf16 mode must {} the f32 mode's results", name, if a16 { "differ from" } else { "equal" });
    }
}

/// `Precision::Bf16`'s MLP blocks with a 16-bit middle: `rms_norm_swiglu_residual` (the gate/up
/// kernel writes `silu(g) ⊙ u` in bf16 for the down projection) and `layer_norm_gelu_mlp` (fc1
/// writes `gelu(·)` in bf16 for fc2) against the CPU, on prefill-sized rows. The bound: the
/// normed rows rounded once (2^-8 of each first-layer term, carried through the SiLU product or
/// GELU's slope < 1.13), the middle rounded once (2^-8 of each second-layer term) and the
/// second layer's weights times the first one's error; the f32 mode agrees as a linear layer.
#[test]
fn bf16_precision_mlp_blocks_stay_within_two_activation_roundings() {
    for g in common::gpus("bf16 precision MLP blocks") {
        // the middles' tiles: gate/up 64 × 128 (fc1 64 × 64: the composite), gate/up 128 × 128
        // and fc1 64 × 128, both 128 × 128 (on 132 SMs: gate/up 128 × 256); then 2,000 rows, where
        // gate/up takes 128 × 256 and fc1 too past k = 1,024, and 2,050 (a 17th row tile: both
        // 64 × 128 on 132 SMs); 48 rows (a batched decode step: gate/up 64 × 128, fc1 split-K,
        // the composite); 64 and 33 rows of the 64 × 128 pair over deep k: the decoder's 6,144
        // columns over 2,048 and 1,000 columns over 2,056
        for (m, n, k) in [(600, 1536, 512), (600, 3072, 512), (1024, 2048, 512), (2000, 2048, 1032), (2050, 2048, 1032), (48, 2048, 512), (64, 6144, 2048), (33, 1000, 2056)] {
            check_mlp_blocks(&*g, common::tensor_cores(&*g), (m, n, k));
        }
    }
}

fn check_mlp_blocks(g: &dyn Backend, a16: bool, (m, n, k): (usize, usize, usize)) {
    let cpu = cpu();
    let (x, nw, nb) = (random(m * k, 9201), random(k, 9202), random(k, 9203));
    let (w1, w2, w3, b1, b2) = (random(n * k, 9204), random(n * k, 9205), random(k * n, 9206), random(n, 9207), random(k, 9208));
    let nw: Vec<f32> = nw.iter().map(|v| 1.0 + v).collect();
    let up = |b: &dyn Backend, v: &[f32], s: [usize; 2]| upload(b, &s, v, DType::BF16).unwrap();
    let run = |b: &dyn Backend| -> [Vec<f32>; 2] {
        let (xt, nwt, nbt) = (b.upload_f32(&[m, k], &x).unwrap(), b.upload_f32(&[k], &nw).unwrap(), b.upload_f32(&[k], &nb).unwrap());
        let (g1, u1, d1) = (up(b, &w1, [n, k]), up(b, &w2, [n, k]), up(b, &w3, [k, n]));
        let (b1t, b2t) = (b.upload_f32(&[n], &b1).unwrap(), b.upload_f32(&[k], &b2).unwrap());
        let s = b.rms_norm_swiglu_residual(&xt, &nwt, 1e-6, &g1, &u1, &d1).unwrap();
        let v = b.layer_norm_gelu_mlp(&xt, (&nwt, &nbt, 1e-6), (&g1, Some(&b1t)), qwen3_vl::Gelu::Tanh, (&d1, Some(&b2t))).unwrap();
        [b.download_f32(&s).unwrap(), b.download_f32(&v).unwrap()]
    };
    let want = run(&*cpu);
    // the bound's parts, from the CPU's normed rows and middles
    let t = |v: &[f32], s: &[usize]| cpu.upload_f32(s, v).unwrap();
    let lin = |a: &[f32], w: &[f32], out: usize, inner: usize| cpu.download_f32(&cpu.linear(&t(a, &[m, inner]), &up(&*cpu, w, [out, inner]), None).unwrap()).unwrap();
    let abs = |v: &[f32]| v.iter().map(|x| x.abs()).collect::<Vec<f32>>();
    let xr = cpu.download_f32(&cpu.rms_norm(&t(&x, &[m, k]), &t(&nw, &[k]), 1e-6).unwrap()).unwrap();
    let xl = cpu.download_f32(&cpu.layer_norm(&t(&x, &[m, k]), &t(&nw, &[k]), &t(&nb, &[k]), 1e-6).unwrap()).unwrap();
    let slack = 1e-5 * (k as f64).sqrt();
    // swiglu: the first layer's error in g and u, carried through silu(g)·u
    let (gv, uv, gd, ud) = (lin(&xr, &w1, n, k), lin(&xr, &w2, n, k), lin(&abs(&xr), &abs(&w1), n, k), lin(&abs(&xr), &abs(&w2), n, k));
    let (mut h_abs, mut h_err) = (vec![0.0f32; m * n], vec![0.0f32; m * n]);
    for j in 0..m * n {
        let (dg, du) = (gd[j] as f64 / 256.0 + slack, ud[j] as f64 / 256.0 + slack);
        let silu = gv[j] as f64 / (1.0 + (-(gv[j] as f64)).exp());
        h_abs[j] = (silu * uv[j] as f64).abs() as f32;
        h_err[j] = (1.1 * dg * ((uv[j] as f64).abs() + du) + (silu.abs() + 1.1 * dg) * du) as f32;
    }
    // gelu: fc1's error through the slope
    let (fv, fd) = (lin(&xl, &w1, n, k), lin(&abs(&xl), &abs(&w1), n, k));
    let gelu = |v: f64| 0.5 * v * (1.0 + ((2.0 / std::f64::consts::PI).sqrt() * (v + 0.044715 * v * v * v)).tanh());
    let a_abs: Vec<f32> = (0..m * n).map(|j| gelu(fv[j] as f64 + b1[j % n] as f64).abs() as f32).collect();
    let a_err: Vec<f32> = fd.iter().map(|d| (1.13 * (*d as f64 / 256.0 + slack)) as f32).collect();
    // per block: Σ |second-layer terms| and the first layer's error through the second
    let terms = [lin(&h_abs, &abs(&w3), k, n), lin(&a_abs, &abs(&w3), k, n)];
    let carried = [lin(&h_err, &abs(&w3), k, n), lin(&a_err, &abs(&w3), k, n)];
    g.set_precision(qwen3_vl::Precision::F32);
    let f32_mode = run(g);
    g.set_precision(qwen3_vl::Precision::Bf16);
    g.set_poison_outputs(true);
    let got = run(g);
    g.set_precision(qwen3_vl::Precision::F32);
    let name = format!("bf16 precision MLP blocks m={} n={} k={} on {}", m, n, k, g.describe());
    let slack2 = 1e-5 * (n as f64).sqrt();
    for o in 0..2 {
        for j in 0..m * k {
            let (sum, w) = (terms[o][j] as f64, want[o][j] as f64);
            let bound = 1.01 * sum / 256.0 + carried[o][j] as f64 + slack2;
            let diff = (got[o][j] as f64 - w).abs();
            assert!(diff <= bound, "{}: block {} element {}: got {} want {} (|diff| {:.3e} > {:.3e})", name, o, j, got[o][j], w, diff, bound);
            let f32_tol = 1e-3 * (1.0 + w.abs()) + sum / 16384.0;
            assert!((f32_mode[o][j] as f64 - w).abs() <= f32_tol, "{}: f32 mode, block {} element {}: got {} want {}", name, o, j, f32_mode[o][j], w);
        }
    }
    let moved = |a: &[f32], b: &[f32]| a.iter().zip(b).any(|(x, y)| x.to_bits() != y.to_bits());
    assert_eq!(moved(&got[0], &f32_mode[0]) && moved(&got[1], &f32_mode[1]), a16, "{}: the bf16 mode must {} the f32 mode's results", name, if a16 { "differ from" } else { "equal" });
}

/// The warpgroup GEMMs (`gpu/src/wgmma.rs`: sm_90a, where a compute 9.0 device loads the
/// compute_80 module) in place of the pipelined bf16 kernels of the same tiles: linear layers
/// with bias and residual within one activation rounding of the CPU's f32 product (the bound of
/// `bf16_precision_linears_stay_within_one_activation_rounding`) at 4,000 rows of 2,000 outputs
/// over k = 2,056 (128 × 256: partial last row and column tiles and stage), at a batched decode
/// step's 40 rows of 16,000 and 8,000 outputs (64 × 128, 64 × 64) and 48 rows of 2,048 over
/// 2,056 (64 × 64 split over `k` in a cluster); the SwiGLU pair at 600 rows of 6,144 over 512
/// (128 × 256) and 40 of 2,100 over 264 (64 × 128) (`check_gate_up`); then the MLP blocks
/// (`check_mlp_blocks`) at 2,000 rows over k = 1,032 and 64 rows of 6,144 over 2,048, whose fc1
/// and gate/up pair write bf16 through the `c16` kernels. The launch counts show every
/// warpgroup kernel ran. Elsewhere (no sm_90a module) the test says so and checks nothing.
#[cfg(feature = "cuda")]
#[test]
fn warpgroup_gemms_stay_within_one_activation_rounding() {
    use qwen3_vl::cuda::LinearAlgo;
    use qwen3_vl::kernels::Kernel;
    for g in common::gpus("warpgroup GEMMs") {
        let Some(c) = g.as_any().downcast_ref::<qwen3_vl::cuda::CudaBackend>() else { continue };
        if !c.warpgroup_kernels() {
            eprintln!("skip: {} has no sm_90a module (warpgroup GEMMs run on compute 9.0 only)", g.describe());
            continue;
        }
        let kernels = [
            Kernel::MatmulWgmma128x256Bf16,
            Kernel::MatmulWgmma128x256C16Bf16,
            Kernel::GateUpWgmma128x256Bf16,
            Kernel::GateUpWgmma128x256C16Bf16,
            Kernel::MatmulWgmma64x128Bf16,
            Kernel::MatmulWgmma64x64Bf16,
            Kernel::MatmulWgmma64x64ClusterBf16,
            Kernel::GateUpWgmma64x128Bf16,
            Kernel::GateUpWgmma64x128C16Bf16,
        ];
        let before: Vec<u64> = kernels.iter().map(|&k| c.kernel_launches(k)).collect();
        let cases = [((4000, 2000, 2056), LinearAlgo::Mma(128, 256, 1)), ((40, 16_000, 256), LinearAlgo::Mma(64, 128, 1)), ((40, 8000, 256), LinearAlgo::Mma(64, 64, 1))];
        for (i, &((m, n, k), tile)) in cases.iter().enumerate() {
            check_warpgroup_linear(&*g, (m, n, k), |algo| assert_eq!(algo, tile, "the tile of m={} n={} k={}", m, n, k), 9400 + 10 * i as u32);
        }
        check_warpgroup_linear(&*g, (48, 2048, 2056), |algo| assert!(matches!(algo, LinearAlgo::Mma(64, 64, s) if s > 1), "the split tile: {:?}", algo), 9450);
        check_gate_up(&*g, true, (600, 6144, 512), DType::BF16, 9500);
        check_gate_up(&*g, true, (40, 2100, 264), DType::BF16, 9510);
        check_mlp_blocks(&*g, true, (2000, 2048, 1032));
        check_mlp_blocks(&*g, true, (64, 6144, 2048));
        for (i, &kernel) in kernels.iter().enumerate() {
            assert!(c.kernel_launches(kernel) > before[i], "{}: {} did not run", g.describe(), kernel.name());
        }
    }
}

/// One linear layer of `warpgroup_gemms_stay_within_one_activation_rounding`: bf16 weights, bias
/// and residual, `Precision::Bf16`; `tile` checks the backend's pick for the shape.
#[cfg(feature = "cuda")]
fn check_warpgroup_linear(g: &dyn Backend, (m, n, k): (usize, usize, usize), tile: impl Fn(qwen3_vl::cuda::LinearAlgo), seed: u32) {
    let cpu = cpu();
    let c = g.as_any().downcast_ref::<qwen3_vl::cuda::CudaBackend>().expect("a CUDA backend");
    let (a, w, bias, res) = (random(m * k, seed), random(n * k, seed + 1), random(n, seed + 2), random(m * n, seed + 3));
    let op = |b: &dyn Backend, a: &[f32], w: &[f32], extra: bool| -> Vec<f32> {
        let (at, wt) = (b.upload_f32(&[m, k], a).unwrap(), upload(b, &[n, k], w, DType::BF16).unwrap());
        let out = match extra {
            true => b.linear_residual(&at, &wt, Some(&b.upload_f32(&[n], &bias).unwrap()), &b.upload_f32(&[m, n], &res).unwrap()).unwrap(),
            false => b.linear(&at, &wt, None).unwrap(),
        };
        b.download_f32(&out).unwrap()
    };
    let want = op(&*cpu, &a, &w, true);
    let (aa, wa): (Vec<f32>, Vec<f32>) = (a.iter().map(|v| v.abs()).collect(), w.iter().map(|v| v.abs()).collect());
    let absdot = op(&*cpu, &aa, &wa, false);
    g.set_precision(qwen3_vl::Precision::Bf16);
    tile(c.pick_linear(m, n, k, DType::BF16));
    g.set_poison_outputs(true);
    let got = op(g, &a, &w, true);
    g.set_precision(qwen3_vl::Precision::F32);
    let name = format!("warpgroup linear m={} n={} k={} on {}", m, n, k, g.describe());
    for j in 0..got.len() {
        let bound = absdot[j] as f64 / 256.0 + 1e-5 * (k as f64).sqrt();
        let d = (got[j] as f64 - want[j] as f64).abs();
        assert!(d <= bound, "{}: element {}: got {} want {} (|diff| {:.3e} > bound {:.3e})", name, j, got[j], want[j], d, bound);
    }
}
