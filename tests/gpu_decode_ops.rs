//! GPU-vs-CPU agreement of the decode path's fused ops (issue 7): every CUDA override against
//! the CPU's default composite body, on NaN-poisoned outputs, over odd shapes. Skipped without
//! a GPU (failing instead with QWEN3_VL_EXPECT_GPU=1).
//!
//! Tolerances: f32 arithmetic in a different order than the CPU's: 1e-5 absolute plus 1e-4
//! relative per element for short reductions, scaled with √k for the GEMVs. Values written into
//! an f16 cache are compared after the same rounding on both sides (f32 → f16 round-to-nearest-
//! even), so they may differ by one f16 step where the f32 inputs differed in the last bits.

mod common;

use common::{agree, agree_host, cpu, download_any, gpu, random, upload};
use qwen3_vl::gpu::params::{sample_tile, CURSOR_FIELDS};
use qwen3_vl::backend::{DeviceSampling, QkvRope};
use qwen3_vl::{Backend, DType, Result, Tensor};

/// A cursor `[t, 4]` for rows at cache rows `row0 ..`, rotary positions `(p, p + dh, p + dw)`
/// so that the three MRoPE axes differ (as after an image).
fn cursor_rows(t: usize, row0: usize, pos0: u32) -> Vec<u32> {
    (0..t).flat_map(|i| {
        let p = pos0 + i as u32;
        vec![p, p + 3, p + 7, (row0 + i) as u32]
    })
    .collect()
}

// names the CUDA backend's kernels: built only with the cuda feature
#[cfg(feature = "cuda")]
#[test]
fn linear_agrees_for_every_kernel_with_bias_residual_and_gelu() {
    let g = match gpu("linear kernels") {
        Some(g) => g,
        None => return,
    };
    use qwen3_vl::cuda::LinearAlgo;
    let cuda = g.as_any().downcast_ref::<qwen3_vl::cuda::CudaBackend>().expect("the GPU backend is CUDA");
    let tensor_cores = cuda.kernels_module().0 >= qwen3_vl::kernels::Arch::Compute80;
    // (m, n, k): the vector GEMV needs one row and k·size a multiple of 16 bytes; the tiled
    // kernels take any shape (tails of 64 / 128 / 32 around the model's sizes)
    let shapes = [(1, 1, 8), (1, 65, 24), (1, 257, 136), (2, 257, 136), (3, 64, 1000), (4, 33, 2048), (1, 4096, 2048), (1, 1024, 6144), (4, 2048, 6144), (5, 7, 8), (63, 129, 40), (128, 128, 32), (129, 257, 1000), (200, 1024, 2048)];
    for (i, &(m, n, k)) in shapes.iter().enumerate() {
        let (a, w, bias, res) = (random(m * k, 30 + i as u32), random(n * k, 40 + i as u32), random(n, 50 + i as u32), random(m * n, 60 + i as u32));
        for dtype in [DType::F32, DType::F16, DType::BF16] {
            // the tiled kernels whole and split-K into 3 slices (fewer when k is shallow)
            let mut algos = vec![LinearAlgo::Gemv, LinearAlgo::Tiled, LinearAlgo::Big(1), LinearAlgo::Big(3)];
            if m == 1 && LinearAlgo::vector_rows(k, dtype) {
                algos.push(LinearAlgo::GemvVec);
            }
            if tensor_cores && dtype != DType::F32 && LinearAlgo::vector_rows(k, dtype) {
                algos.extend(qwen3_vl::gpu::params::mma_tile::TILES.iter().map(|&(tm, tn)| LinearAlgo::Mma(tm, tn, 1)));
                algos.push(LinearAlgo::Mma(64, 64, 3));
            }
            for &algo in &algos {
                if matches!(algo, LinearAlgo::Gemv | LinearAlgo::GemvVec) && m > 4 {
                    continue;
                }
                for (with_bias, with_res) in [(false, false), (true, false), (false, true), (true, true)] {
                    let op = |b: &dyn Backend| -> Result<Tensor> {
                        let at = b.upload_f32(&[m, k], &a)?;
                        let wt = upload(b, &[n, k], &w, dtype)?;
                        let bt = if with_bias { Some(b.upload_f32(&[n], &bias)?) } else { None };
                        let rt = b.upload_f32(&[m, n], &res)?;
                        match b.as_any().downcast_ref::<qwen3_vl::cuda::CudaBackend>() {
                            Some(c) => c.linear_with(algo, &at, &wt, bt.as_ref(), if with_res { Some(&rt) } else { None }),
                            None if with_res => b.linear_residual(&at, &wt, bt.as_ref(), &rt),
                            None => b.linear(&at, &wt, bt.as_ref()),
                        }
                    };
                    let name = format!("{:?} m={} n={} k={} w={} bias={} residual={}", algo, m, n, k, dtype, with_bias, with_res);
                    // the tensor-core kernel splits each activation into two 16-bit parts (error
                    // ~2^-16 relative) and accumulates in the tensor cores' f32: allowed 4x the
                    // f32 kernels' reassociation error
                    let abs = 1e-5 * (k as f32).sqrt() * if matches!(algo, LinearAlgo::Mma(..)) { 16.0 } else { 4.0 };
                    agree(&name, &*g, &op, abs, if matches!(algo, LinearAlgo::Mma(..)) { 4e-4 } else { 1e-4 });
                }
            }
        }
    }
    // the GELU epilogue of the tiled kernels (and the composite path for decode-sized inputs)
    for &(m, n, k) in &[(1, 40, 64), (7, 300, 136), (200, 512, 1024)] {
        let (a, w, bias) = (random(m * k, 90), random(n * k, 91), random(n, 92));
        for kind in [qwen3_vl::Gelu::Tanh, qwen3_vl::Gelu::Erf] {
            for dtype in [DType::F32, DType::BF16] {
                let op = |b: &dyn Backend| -> Result<Tensor> { b.linear_gelu(&b.upload_f32(&[m, k], &a)?, &upload(b, &[n, k], &w, dtype)?, Some(&b.upload_f32(&[n], &bias)?), kind) };
                let tc = tensor_cores && dtype != DType::F32 && m > 4;
                let abs = 1e-5 * (k as f32).sqrt() * if tc { 16.0 } else { 4.0 };
                agree(&format!("linear_gelu {:?} m={} n={} k={} {}", kind, m, n, k, dtype), &*g, &op, abs, if tc { 4e-4 } else { 1e-4 });
            }
        }
    }
}

#[test]
fn gate_up_silu_agrees() {
    let g = match gpu("gate_up_silu") {
        Some(g) => g,
        None => return,
    };
    // one row with 16-byte rows takes the fused GEMV; on compute_80, 2 to 32 rows with 16-byte
    // rows the few-row tensor-core gate/up kernel; the others the composite path
    for &(m, n, k) in &[(1, 1, 8), (1, 6144, 2048), (2, 65, 264), (4, 129, 1024), (3, 17, 9), (9, 100, 64), (16, 6144, 2048), (17, 300, 1024), (31, 33, 64), (32, 40, 6144), (33, 64, 128)] {
        let (x, gw, uw) = (random(m * k, 70), random(n * k, 71), random(n * k, 72));
        for dtype in [DType::F32, DType::F16, DType::BF16] {
            let op = |b: &dyn Backend| -> Result<Tensor> { b.gate_up_silu(&b.upload_f32(&[m, k], &x)?, &upload(b, &[n, k], &gw, dtype)?, &upload(b, &[n, k], &uw, dtype)?) };
            agree(&format!("gate_up_silu m={} n={} k={} {}", m, n, k, dtype), &*g, &op, 1e-5 * (k as f32).sqrt() * 8.0, 1e-4);
        }
    }
}

#[test]
fn rms_norm_fused_into_the_gemvs_agrees() {
    let g = match gpu("rms_norm_linear / rms_norm_gate_up_silu") {
        Some(g) => g,
        None => return,
    };
    // one row with 16-byte weight rows fuses the norm into the GEMV; the others compose
    for &(m, n, k) in &[(1, 1, 8), (1, 4096, 2048), (1, 6144, 2048), (1, 65, 12_288), (1, 33, 12), (2, 129, 256), (7, 70, 64)] {
        let (x, gw, uw, nw, bias) = (random(m * k, 73), random(n * k, 74), random(n * k, 75), random(k, 76), random(n, 77));
        let x: Vec<f32> = x.iter().map(|v| v * 5.0).collect(); // a norm that matters
        for dtype in [DType::F32, DType::BF16] {
            let op = |b: &dyn Backend| -> Result<Tensor> {
                let (xt, nt) = (b.upload_f32(&[m, k], &x)?, b.upload_f32(&[k], &nw)?);
                b.rms_norm_linear(&xt, &nt, 1e-6, &upload(b, &[n, k], &gw, dtype)?, Some(&b.upload_f32(&[n], &bias)?))
            };
            agree(&format!("rms_norm_linear m={} n={} k={} {}", m, n, k, dtype), &*g, &op, 1e-5 * (k as f32).sqrt() * 8.0, 1e-4);
            let op = |b: &dyn Backend| -> Result<Tensor> {
                let (xt, nt) = (b.upload_f32(&[m, k], &x)?, b.upload_f32(&[k], &nw)?);
                b.rms_norm_gate_up_silu(&xt, &nt, 1e-6, &upload(b, &[n, k], &gw, dtype)?, &upload(b, &[n, k], &uw, dtype)?)
            };
            agree(&format!("rms_norm_gate_up_silu m={} n={} k={} {}", m, n, k, dtype), &*g, &op, 1e-5 * (k as f32).sqrt() * 16.0, 1e-4);
        }
    }
}

#[test]
fn qkv_rope_append_agrees_for_both_cache_types() {
    let g = match gpu("qkv_rope_append") {
        Some(g) => g,
        None => return,
    };
    // (t, heads, kv_heads, d, cap, row0, section)
    let cases = [(1, 16, 8, 128, 300, 257, [24, 20, 20]), (5, 4, 2, 16, 9, 3, [3, 3, 2]), (3, 4, 4, 32, 3, 0, [6, 5, 5]), (2, 2, 1, 256, 64, 62, [48, 40, 40]), (1, 1, 1, 2, 1, 0, [1, 0, 0])];
    for &(t, heads, kvh, d, cap, row0, section) in &cases {
        let width = (heads + 2 * kvh) * d;
        let (qkv, qn, kn) = (random(t * width, 80), random(d, 81), random(d, 82));
        let inv: Vec<f32> = (0..d / 2).map(|j| 1.0 / 5_000_000f32.powf(2.0 * j as f32 / d as f32)).collect();
        let cur = cursor_rows(t, row0, 4000 + row0 as u32);
        for kv in [DType::F32, DType::F16] {
            let op = |b: &dyn Backend| -> Result<Vec<f32>> {
                let (qn_t, kn_t, inv_t) = (b.upload_f32(&[d], &qn)?, b.upload_f32(&[d], &kn)?, b.upload_f32(&[d / 2], &inv)?);
                let p = QkvRope { heads, kv_heads: kvh, head_dim: d, q_norm: &qn_t, k_norm: &kn_t, eps: 1e-6, inv_freq: &inv_t, section };
                let fill = random(cap * kvh * d, 83);
                let (mut kc, mut vc) = (upload(b, &[cap, kvh, d], &fill, kv)?, upload(b, &[cap, kvh, d], &fill, kv)?);
                let cursor = b.upload_u32(&[t, CURSOR_FIELDS], &cur)?;
                let q = b.qkv_rope_append(&b.upload_f32(&[t, width], &qkv)?, &p, &cursor, &mut kc, &mut vc, None)?;
                let mut out = b.download_f32(&q)?;
                out.extend(download_any(b, &kc)?);
                out.extend(download_any(b, &vc)?);
                Ok(out)
            };
            let tol = if kv == DType::F16 { 2e-3 } else { 1e-5 };
            agree_host(&format!("qkv_rope_append t={} h={}/{} d={} row0={} {} cache", t, heads, kvh, d, row0, kv), &*g, &op, tol, 1e-4);
        }
    }
}

#[test]
fn qkv_rope_append_keeps_values_past_f16s_range_with_row_scales() {
    // v heads at 10^5 to 10^7 (past f16's 65504) into an f16 cache with row scales: the cache
    // rows times their scales are the f32 cache's rows within f16's rounding, on the GPU
    // kernel and the CPU's composite body alike
    let (t, heads, kvh, d, cap) = (4, 4, 2, 64, 10);
    let width = (heads + 2 * kvh) * d;
    let mut qkv = random(t * width, 84);
    for (i, x) in qkv.iter_mut().enumerate() {
        let (row, col) = (i / width, i % width);
        if col >= (heads + kvh) * d {
            *x *= 1e5 * (1 + 30 * row) as f32;
        }
    }
    let (qn, kn) = (random(d, 85), random(d, 86));
    let inv: Vec<f32> = (0..d / 2).map(|j| 1.0 / 10_000f32.powf(2.0 * j as f32 / d as f32)).collect();
    let cur = cursor_rows(t, 3, 7);
    let run = |b: &dyn Backend, kv: DType| -> Result<Vec<f32>> {
        let (qn_t, kn_t, inv_t) = (b.upload_f32(&[d], &qn)?, b.upload_f32(&[d], &kn)?, b.upload_f32(&[d / 2], &inv)?);
        let p = QkvRope { heads, kv_heads: kvh, head_dim: d, q_norm: &qn_t, k_norm: &kn_t, eps: 1e-6, inv_freq: &inv_t, section: [12, 10, 10] };
        let (mut kc, mut vc) = (upload(b, &[cap, kvh, d], &vec![0.0; cap * kvh * d], kv)?, upload(b, &[cap, kvh, d], &vec![0.0; cap * kvh * d], kv)?);
        let mut sc = if kv == DType::F16 { Some(b.upload_f32(&[cap, kvh, 2], &vec![1.0; cap * kvh * 2])?) } else { None };
        let cursor = b.upload_u32(&[t, CURSOR_FIELDS], &cur)?;
        b.qkv_rope_append(&b.upload_f32(&[t, width], &qkv)?, &p, &cursor, &mut kc, &mut vc, sc.as_mut())?;
        // the cache's rows as f32 values: stored element times its row's scale
        let s = match &sc {
            Some(s) => b.download_f32(s)?,
            None => vec![1.0; cap * kvh * 2],
        };
        let mut out = Vec::new();
        for (which, c) in [&kc, &vc].iter().enumerate() {
            for (i, vec) in download_any(b, c)?.chunks(d).enumerate() {
                out.extend(vec.iter().map(|x| x * s[2 * i + which]));
            }
        }
        Ok(out)
    };
    let want = run(&*common::cpu(), DType::F32).unwrap();
    let mut backends = vec![common::cpu()];
    backends.extend(gpu("qkv_rope_append past f16's range"));
    for b in backends {
        let got = run(&*b, DType::F16).unwrap();
        for (i, (g, w)) in got.iter().zip(&want).enumerate() {
            assert!((g - w).abs() <= 1e-3 * w.abs() + 1e-3, "{}: element {}: {} vs {}", b.describe(), i, g, w);
        }
    }
}

#[test]
fn cached_attention_agrees_on_every_path() {
    let g = match gpu("attention_cached") {
        Some(g) => g,
        None => return,
    };
    // contexts around the chunking (one chunk up to MIN_KEYS keys, a new chunk at each further
    // multiple) and the warps' 32-key blocks; 4096 with many chunks
    let cap = 4200;
    let min_keys = qwen3_vl::gpu::params::attn_split_tile::MIN_KEYS;
    let mut cases: Vec<(usize, usize, usize, usize, usize)> = vec![];
    for &ctx in &[1usize, 31, 32, 33, 63, 64, 65, min_keys - 1, min_keys, min_keys + 1, 2 * min_keys + 1, 1000, 4095, 4096, 4097] {
        cases.push((1, 16, 8, 128, ctx)); // GQA 2 (Qwen3-VL-2B)
        cases.push((1, 8, 8, 128, ctx)); // GQA 1
    }
    cases.extend_from_slice(&[(4, 16, 8, 128, 70), (2, 4, 2, 16, 33), (3, 2, 2, 32, 300), (1, 4, 1, 256, 129), (1, 16, 2, 64, 77), (1, 2, 1, 48, 40), (6, 4, 2, 128, 50)]);
    for &(t, heads, kvh, d, ctx) in &cases {
        let (q, kf, vf) = (random(t * heads * d, 90), random(cap * kvh * d, 91), random(cap * kvh * d, 92));
        let cur = cursor_rows(t, ctx - t, 11);
        for kv in [DType::F32, DType::F16] {
            let op = |b: &dyn Backend| -> Result<Tensor> {
                let cursor = b.upload_u32(&[t, CURSOR_FIELDS], &cur)?;
                b.attention_cached(&b.upload_f32(&[t, heads, d], &q)?, &upload(b, &[cap, kvh, d], &kf, kv)?, &upload(b, &[cap, kvh, d], &vf, kv)?, None, &cursor, 1.0 / (d as f32).sqrt())
            };
            // shapes outside the split kernel's range go to flash attention (tensor cores on
            // compute_80): more rows or vectors per group, head dims not a power of two in 32..=256
            use qwen3_vl::gpu::params::attn_split_tile::{MAX_D, MAX_GROUP_QV, MAX_ROWS};
            let split = t <= MAX_ROWS && t * (heads / kvh) <= MAX_GROUP_QV && d.is_power_of_two() && (32..=MAX_D).contains(&d);
            let (abs, rel) = if split { (1e-5, 1e-4) } else { common::attention_tolerance(&*g) };
            agree(&format!("attention_cached t={} h={}/{} d={} ctx={} {}", t, heads, kvh, d, ctx, kv), &*g, &op, abs, rel);
        }
    }
}

#[test]
fn sampling_on_the_device_picks_what_the_host_picks() {
    let g = match gpu("sample_step") {
        Some(g) => g,
        None => return,
    };
    let settings = [
        DeviceSampling::greedy(),
        DeviceSampling { temperature: 0.7, top_k: 20, top_p: 0.8, seed: 5 },
        DeviceSampling { temperature: 1.3, top_k: sample_tile::MAX_K, top_p: 1.0, seed: 6 },
        DeviceSampling { temperature: 0.2, top_k: 3, top_p: 0.5, seed: 7 },
    ];
    // (rows, vocab, candidate ids): the Qwen3-VL head's 151,936 rows with the tokenizer's
    // 151,669 ids, and padding columns in multi-row batches
    for &(rows, vocab, n) in &[(1usize, 151_936usize, 151_936usize), (1, 151_936, 151_669), (2, 1000, 1000), (2, 1000, 900), (1, 70, 70), (3, 5000, 4999)] {
        // spread logits, with exact ties to exercise the id-ascending order, and the padding
        // columns far above the rest, as a random head can make them
        let logits: Vec<f32> = random(rows * vocab, 93)
            .iter()
            .enumerate()
            .map(|(i, v)| if i % vocab >= n { 50.0 } else if i % 97 == 0 { 2.5 } else { v * 3.0 })
            .collect();
        for s in &settings {
            if s.top_k > n {
                continue;
            }
            for step in 0..6u32 {
                let op = |b: &dyn Backend| -> Result<Vec<f32>> {
                    let mut ids = b.upload_u32(&[rows], &vec![0; rows])?;
                    let mut cursor = b.upload_u32(&[rows, CURSOR_FIELDS], &cursor_rows(rows, 100 + step as usize, 5))?;
                    b.sample_step(&b.upload_f32(&[rows, vocab], &logits)?, s, n, None, &mut ids, &mut cursor)?;
                    let mut out: Vec<f32> = b.download_u32(&ids)?.iter().map(|&i| i as f32).collect();
                    out.extend(b.download_u32(&cursor)?.iter().map(|&c| c as f32));
                    Ok(out)
                };
                let name = format!("sample_step rows={} vocab={} n={} {:?} step {}", rows, vocab, n, s, step);
                let picks = op(&*cpu()).unwrap();
                assert!(picks[..rows].iter().all(|&id| (id as usize) < n), "{}: picked a padding id: {:?}", name, &picks[..rows]);
                agree_host(&name, &*g, &op, 0.0, 0.0);
            }
        }
    }
}

#[test]
fn sampling_each_row_with_its_own_settings_picks_what_the_host_picks() {
    let g = match gpu("sample_step_rows") {
        Some(g) => g,
        None => return,
    };
    // a batch whose rows sample differently: greedy, hot, nucleus, a small top-k, and the same
    // settings with another seed; the launch ranks the largest top-k, each row picks in its own
    let rows_settings = [
        DeviceSampling::greedy(),
        DeviceSampling { temperature: 0.7, top_k: 20, top_p: 0.8, seed: 5 },
        DeviceSampling { temperature: 1.3, top_k: 40, top_p: 1.0, seed: 6 },
        DeviceSampling { temperature: 0.2, top_k: 3, top_p: 0.5, seed: 7 },
        DeviceSampling { temperature: 0.7, top_k: 20, top_p: 0.8, seed: u64::MAX - 3 },
    ];
    let rows = rows_settings.len();
    let words: Vec<u32> = rows_settings.iter().flat_map(|s| s.row_words()).collect();
    for &(vocab, n, k) in &[(151_936usize, 151_669usize, 64usize), (1000, 900, 40), (5000, 4999, 64)] {
        let logits: Vec<f32> = random(rows * vocab, 97).iter().enumerate().map(|(i, v)| if i % vocab >= n { 50.0 } else if i % 89 == 0 { 2.5 } else { v * 3.0 }).collect();
        for step in 0..6u32 {
            let op = |b: &dyn Backend| -> Result<Vec<f32>> {
                let mut ids = b.upload_u32(&[rows], &vec![0; rows])?;
                let mut cursor = b.upload_u32(&[rows, CURSOR_FIELDS], &cursor_rows(rows, 100 + step as usize, 5))?;
                let settings = b.upload_u32(&[rows, qwen3_vl::gpu::params::sample_row::WORDS], &words)?;
                b.sample_step_rows(&b.upload_f32(&[rows, vocab], &logits)?, &settings, k, n, None, &mut ids, &mut cursor)?;
                let mut out: Vec<f32> = b.download_u32(&ids)?.iter().map(|&i| i as f32).collect();
                out.extend(b.download_u32(&cursor)?.iter().map(|&c| c as f32));
                Ok(out)
            };
            let name = format!("sample_step_rows vocab={} n={} k={} step {}", vocab, n, k, step);
            let picks = op(&*cpu()).unwrap();
            // each row as its own settings would pick it alone
            for (r, s) in rows_settings.iter().enumerate() {
                let alone = |b: &dyn Backend| -> Result<u32> {
                    let mut ids = b.upload_u32(&[1], &[0])?;
                    let mut cursor = b.upload_u32(&[1, CURSOR_FIELDS], &cursor_rows(rows, 100 + step as usize, 5)[r * CURSOR_FIELDS..(r + 1) * CURSOR_FIELDS])?;
                    b.sample_step(&b.upload_f32(&[1, vocab], &logits[r * vocab..(r + 1) * vocab])?, s, n, None, &mut ids, &mut cursor)?;
                    Ok(b.download_u32(&ids)?[0])
                };
                assert_eq!(picks[r] as u32, alone(&*cpu()).unwrap(), "{}: row {} against its settings alone", name, r);
            }
            agree_host(&name, &*g, &op, 0.0, 0.0);
        }
    }
}

/// Masks of allowed ids for the rows of one launch (`[rows, ceil(n / 32)]` words), row by row:
/// all ones (a row free of constraints beside masked ones), the last id alone, a sparse set
/// without the row's best, three ids (fewer than most top-k), and all but the best and the
/// padding-adjacent ids. Row `r`'s logits are `logits[r * vocab..]`.
fn test_masks(logits: &[f32], rows: usize, vocab: usize, n: usize) -> Vec<u32> {
    use qwen3_vl::pick::mask_words;
    let words = mask_words(n);
    let mut m = vec![0u32; rows * words];
    let set = |m: &mut [u32], r: usize, t: usize| m[r * words + t / 32] |= 1 << (t % 32);
    for r in 0..rows {
        let row = &logits[r * vocab..r * vocab + n];
        let best = qwen3_vl::pick::argmax(row) as usize;
        for t in 0..n {
            let allowed = match r % 5 {
                0 => true,
                1 => t == n - 1,
                2 => t % 7 == 3 && t != best,
                3 => [n / 3, n / 2, n - 2].contains(&t),
                _ => t != best && t + 2 < n,
            };
            if allowed {
                set(&mut m, r, t);
            }
        }
    }
    m
}

/// The masked pick, checked without the sampler's code: never a cleared id; greedy the first
/// maximum among the allowed; a row allowing one id takes it whatever the settings.
fn check_masked_picks(name: &str, logits: &[f32], mask: &[u32], vocab: usize, n: usize, greedy: &[bool], picks: &[u32]) {
    use qwen3_vl::pick::{mask_allows, mask_words};
    let words = mask_words(n);
    for (r, &id) in picks.iter().enumerate() {
        let m = &mask[r * words..(r + 1) * words];
        assert!((id as usize) < n && mask_allows(m, id as usize), "{}: row {} picked {}, which its mask clears", name, r, id);
        let allowed: Vec<usize> = (0..n).filter(|&t| mask_allows(m, t)).collect();
        if allowed.len() == 1 {
            assert_eq!(id as usize, allowed[0], "{}: row {} allows one id", name, r);
        }
        if greedy[r] {
            let row = &logits[r * vocab..];
            let first_max = allowed.iter().copied().fold(allowed[0], |b, t| if row[t] > row[b] { t } else { b });
            assert_eq!(id as usize, first_max, "{}: row {}: greedy is the first maximum among the allowed", name, r);
        }
    }
}

/// Sampling under masks of allowed ids (a grammar's next tokens), on every backend against the
/// CPU: rows with and without masks in one launch, a row allowing a single id, greedy and
/// sampled rows, shared settings and each row's own. The picks are checked against the masks
/// directly too, and a row whose mask is all ones picks what it picks in a launch without a
/// mask.
#[test]
fn masked_sampling_picks_only_allowed_ids_on_every_backend() {
    use qwen3_vl::gpu::params::sample_row;
    use qwen3_vl::pick::mask_words;
    let rows = 5;
    let shared = [
        DeviceSampling::greedy(),
        DeviceSampling { temperature: 0.7, top_k: 20, top_p: 0.8, seed: 5 },
        DeviceSampling { temperature: 1.3, top_k: sample_tile::MAX_K, top_p: 1.0, seed: 6 },
    ];
    let each = [
        DeviceSampling { temperature: 1.3, top_k: 40, top_p: 1.0, seed: 6 },
        DeviceSampling { temperature: 2.0, top_k: 64, top_p: 1.0, seed: 8 },
        DeviceSampling::greedy(),
        DeviceSampling { temperature: 0.9, top_k: 16, top_p: 0.95, seed: 9 },
        DeviceSampling { temperature: 0.5, top_k: 3, top_p: 1.0, seed: 10 },
    ];
    for b in common::backends("masked sample_step") {
        for &(vocab, n) in &[(151_936usize, 151_669usize), (1000, 900), (70, 70), (5000, 4999)] {
            let logits: Vec<f32> = random(rows * vocab, 91).iter().enumerate().map(|(i, v)| if i % vocab >= n { 50.0 } else if i % 97 == 0 { 2.5 } else { v * 3.0 }).collect();
            let mask = test_masks(&logits, rows, vocab, n);
            for step in 0..4u32 {
                let cur = cursor_rows(rows, 100 + step as usize, 5);
                let run = |b: &dyn Backend, s: Option<&DeviceSampling>, masked: bool| -> Result<Vec<f32>> {
                    let mut ids = b.upload_u32(&[rows], &vec![0; rows])?;
                    let mut cursor = b.upload_u32(&[rows, CURSOR_FIELDS], &cur)?;
                    let l = b.upload_f32(&[rows, vocab], &logits)?;
                    let m = if masked { Some(b.upload_u32(&[rows, mask_words(n)], &mask)?) } else { None };
                    match s {
                        Some(s) => b.sample_step(&l, s, n, m.as_ref(), &mut ids, &mut cursor)?,
                        None => {
                            let w: Vec<u32> = each.iter().flat_map(|s| s.row_words()).collect();
                            b.sample_step_rows(&l, &b.upload_u32(&[rows, sample_row::WORDS], &w)?, 64.min(n), n, m.as_ref(), &mut ids, &mut cursor)?
                        }
                    }
                    let mut out: Vec<f32> = b.download_u32(&ids)?.iter().map(|&i| i as f32).collect();
                    out.extend(b.download_u32(&cursor)?.iter().map(|&c| c as f32));
                    Ok(out)
                };
                let settings: Vec<Option<&DeviceSampling>> = shared.iter().filter(|s| s.top_k <= n).map(Some).chain([None]).collect();
                for s in settings {
                    let name = format!("masked sample_step on {} vocab={} n={} {:?} step {}", b.describe(), vocab, n, s, step);
                    let got = run(&*b, s, true).unwrap();
                    let picks: Vec<u32> = got[..rows].iter().map(|&i| i as u32).collect();
                    let greedy: Vec<bool> = (0..rows).map(|r| s.unwrap_or(&each[r]).is_greedy()).collect();
                    check_masked_picks(&name, &logits, &mask, vocab, n, &greedy, &picks);
                    let free = run(&*b, s, false).unwrap();
                    assert_eq!(got[0], free[0], "{}: the row whose mask is all ones picks as without a mask", name);
                    assert_eq!(got[rows..], free[rows..], "{}: cursors advanced alike", name);
                    // the same picks as the CPU's, with every output written (NaN-poisoned on a GPU)
                    agree_host(&name, &*b, &|b: &dyn Backend| run(b, s, true), 0.0, 0.0);
                }
            }
        }
        // a mask of the wrong shape or type is an error naming it, not a launch
        let mut ids = b.upload_u32(&[2], &[0, 0]).unwrap();
        let mut cursor = b.upload_u32(&[2, CURSOR_FIELDS], &[0; 2 * CURSOR_FIELDS]).unwrap();
        let l = b.upload_f32(&[2, 100], &random(200, 3)).unwrap();
        for bad in [b.upload_u32(&[2, 3], &[u32::MAX; 6]).unwrap(), b.upload_u32(&[1, 4], &[u32::MAX; 4]).unwrap(), b.upload_f32(&[2, 4], &[0.0; 8]).unwrap()] {
            let e = b.sample_step(&l, &DeviceSampling::greedy(), 100, Some(&bad), &mut ids, &mut cursor).unwrap_err().to_string();
            assert!(e.contains("sample_step"), "{}", e);
        }
    }
}

#[test]
fn device_ids_embedding_narrowing_and_f16_rows_agree() {
    let g = match gpu("embedding_gather / narrow_cols / write_rows f16") {
        Some(g) => g,
        None => return,
    };
    let (vocab, hidden) = (300, 72);
    let table = random(vocab * hidden, 94);
    let ids: Vec<u32> = vec![0, 299, 17, 17, 150];
    for dtype in [DType::F32, DType::F16, DType::BF16] {
        let op = |b: &dyn Backend| -> Result<Tensor> { b.embedding_gather(&upload(b, &[vocab, hidden], &table, dtype)?, &b.upload_u32(&[ids.len()], &ids)?) };
        agree(&format!("embedding_gather {}", dtype), &*g, &op, 0.0, 0.0);
    }
    let x = random(7 * 40, 95);
    for &(c0, w) in &[(0, 40), (3, 5), (39, 1), (10, 0)] {
        let op = |b: &dyn Backend| -> Result<Tensor> { b.narrow_cols(&b.upload_f32(&[7, 40], &x)?, c0, w) };
        agree(&format!("narrow_cols {}+{}", c0, w), &*g, &op, 0.0, 0.0);
    }
    let src: Vec<f32> = random(3 * 2 * 4, 96).iter().map(|v| v * 70_000.0).collect(); // some overflow f16
    let op = |b: &dyn Backend| -> Result<Vec<f32>> {
        let mut cache = upload(b, &[10, 2, 4], &[0.5; 80], DType::F16)?;
        b.write_rows(&mut cache, 6, &b.upload_f32(&[3, 2, 4], &src)?)?;
        download_any(b, &cache)
    };
    agree_host("write_rows into f16", &*g, &op, 0.0, 0.0);
}

/// Rows of `[m, k]` activations with massive values (real LLMs have channels of 10^5 and more
/// in the MLP's down-projection input): row 0 scaled to reach 3·10^5, row 1 tiny (10^-4),
/// every fourth row one spike of 2·10^5 among ordinary values, the rest ordinary.
#[cfg(feature = "cuda")]
fn massive_rows(m: usize, k: usize, seed: u32) -> Vec<f32> {
    let mut a = random(m * k, seed);
    for r in 0..m {
        let row = &mut a[r * k..(r + 1) * k];
        match r % 4 {
            0 => row.iter_mut().for_each(|v| *v *= 3.0e5),
            1 => row.iter_mut().for_each(|v| *v *= 1.0e-4),
            2 => row[(r * 7) % k] = 2.0e5,
            _ => {}
        }
    }
    a
}

/// Each output against the CPU's f32 product within `rel` of the row's Σ|a·w| (the scale a
/// dot product's rounding error has), plus a tiny absolute floor.
#[cfg(feature = "cuda")]
fn assert_products_close(name: &str, got: &[f32], want: &[f32], a: &[f32], w: &[f32], (m, n, k): (usize, usize, usize), rel: f32) {
    for r in 0..m {
        for c in 0..n {
            let mag: f32 = (0..k).map(|j| (a[r * k + j] * w[c * k + j]).abs()).sum();
            let (g, x) = (got[r * n + c], want[r * n + c]);
            assert!(g.is_finite(), "{}: row {} column {}: {} (an f16 overflow?)", name, r, c, g);
            assert!((g - x).abs() <= rel * mag + 1e-6, "{}: row {} column {}: {} vs {} (Σ|a·w| = {:.3e})", name, r, c, g, x, mag);
        }
    }
}

#[cfg(feature = "cuda")]
#[test]
fn activations_past_the_f16_range_give_the_f32_product() {
    use qwen3_vl::cuda::LinearAlgo;
    use qwen3_vl::Blocks;
    let cpu = cpu();
    for g in common::gpus("massive activations") {
        let cuda = g.as_any().downcast_ref::<qwen3_vl::cuda::CudaBackend>().expect("the GPU backend is CUDA");
        let tensor_cores = cuda.kernels_module().0 >= qwen3_vl::kernels::Arch::Compute80;
        for (i, &(m, n, k)) in [(9usize, 130usize, 256usize), (130, 257, 1024), (300, 64, 2048)].iter().enumerate() {
            let a = massive_rows(m, k, 70 + i as u32);
            let w = random(n * k, 80 + i as u32);
            // f16 weights: every kernel this module has for them, and the default pick
            let wf16: Vec<f32> = w.iter().map(|&x| half::f16::from_f32(x).to_f32()).collect();
            let mut algos: Vec<Option<LinearAlgo>> = vec![None, Some(LinearAlgo::Big(1)), Some(LinearAlgo::Big(3))];
            if tensor_cores {
                algos.extend(qwen3_vl::gpu::params::mma_tile::TILES.iter().map(|&(tm, tn)| Some(LinearAlgo::Mma(tm, tn, 1))));
                algos.push(Some(LinearAlgo::Mma(64, 64, 3)));
                // the few-row kernel whole and in 3 k slices (the last one shorter)
                algos.extend([16u32, 32].iter().filter(|&&r| m <= r as usize).flat_map(|&r| [Some(LinearAlgo::Skinny(r, 1)), Some(LinearAlgo::Skinny(r, 3))]));
            }
            let want = cpu.download_f32(&cpu.linear(&cpu.upload_f32(&[m, k], &a).unwrap(), &upload(&*cpu, &[n, k], &w, DType::F16).unwrap(), None).unwrap()).unwrap();
            for algo in algos {
                let (at, wt) = (g.upload_f32(&[m, k], &a).unwrap(), upload(&*g, &[n, k], &w, DType::F16).unwrap());
                g.set_poison_outputs(true);
                let out = match algo {
                    Some(algo) => cuda.linear_with(algo, &at, &wt, None, None),
                    None => g.linear(&at, &wt, None),
                }
                .unwrap();
                let name = format!("{} f16 {:?} m={} n={} k={}", g.describe(), algo, m, n, k);
                assert_products_close(&name, &g.download_f32(&out).unwrap(), &want, &a, &wf16, (m, n, k), 2e-5);
            }
            // Q8_0 weights: more than 8 rows take the dequantize-to-f16 GEMM
            let q = qwen3_vl::quant::quantize_vec(DType::Q8_0, &w).unwrap();
            let deq = qwen3_vl::quant::dequantize_vec(DType::Q8_0, &q, n * k).unwrap();
            let want = cpu.download_f32(&cpu.linear(&cpu.upload_f32(&[m, k], &a).unwrap(), &cpu.upload_f32(&[n, k], &deq).unwrap(), None).unwrap()).unwrap();
            let wq = g.upload_blocks(&[n, k], DType::Q8_0, Blocks::Owned(q)).unwrap();
            g.set_poison_outputs(true);
            let out = g.linear(&g.upload_f32(&[m, k], &a).unwrap(), &wq, None).unwrap();
            // the prefill path dequantizes Q8_0 to f16 (scale × int8 rounded to 11 bits: up to
            // 2^-11 of each weight, README), so the bound is that rounding, not the split's
            assert_products_close(&format!("{} q8_0 m={} n={} k={}", g.describe(), m, n, k), &g.download_f32(&out).unwrap(), &want, &a, &deq, (m, n, k), 5e-4);
        }
    }
}
