//! Flash attention (issue 8) against the CPU on every kernel module the GPU supports, each forced
//! in turn (compute_61: FP32 SIMT kernels; compute_80: tensor cores): dense attention from 1 to
//! 4,100 keys, causal and not, GQA ratios 1, 2 and 4, head dims 8 … 128 (and 256, which takes the
//! one-warp-per-row kernel), positions from the host or from the device cursor; block-sparse
//! attention with random block masks (the CPU's composite body first checked against a direct
//! f64 masked reference); the vision tower's block-diagonal mask with the rotary embedding
//! applied inside the op; attention over keys read at shuffled cache slots (a prefill chunk of
//! the paged engine). Outputs are NaN-poisoned before every launch. Tolerances:
//! `common::attention_tolerance` (f32: 1e-5 + 1e-4 relative; tensor cores: f16 operands).
//! Skipped without a GPU (failing instead with QWEN3_VL_EXPECT_GPU=1), except the CPU-only
//! reference checks.

mod common;

use common::{agree, attention_tolerance, backends, cpu, gpus, random, upload};
use qwen3_vl::gpu::params::CURSOR_FIELDS;
use qwen3_vl::{AttnParams, Backend, BlockMask, DType, Result, Tensor};

/// Key counts around the tiles of both kernel families (32 and 64 keys) and long contexts.
const KEYS: &[usize] = &[1, 2, 15, 16, 17, 31, 32, 33, 63, 64, 65, 127, 128, 129, 1000, 4096, 4100];

/// A small deterministic generator for masks (xorshift64).
struct Rng(u64);

impl Rng {
    fn below(&mut self, n: usize) -> usize {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        (self.0 % n.max(1) as u64) as usize
    }
}

#[allow(clippy::too_many_arguments)]
fn dense_case(g: &dyn Backend, t: usize, heads: usize, kvh: usize, d: usize, kv_len: usize, causal: bool, kv: DType) {
    let cap = kv_len + 3;
    let (q, k, v) = (random(t * heads * d, (t + 7 * kv_len) as u32), random(cap * kvh * d, 3 + d as u32), random(cap * kvh * d, 5 + kv_len as u32));
    let q_pos0 = if causal { kv_len - t } else { 0 };
    let p = AttnParams { kv_len, q_pos0, causal, scale: 1.0 / (d as f32).sqrt() };
    let op = |b: &dyn Backend| -> Result<Tensor> { b.attention(&b.upload_f32(&[t, heads, d], &q)?, &upload(b, &[cap, kvh, d], &k, kv)?, &upload(b, &[cap, kvh, d], &v, kv)?, p) };
    let (abs, rel) = attention_tolerance(g);
    agree(&format!("attention t={} h={}/{} d={} keys={} causal={} {} on {}", t, heads, kvh, d, kv_len, causal, kv, g.describe()), g, &op, abs, rel);
}

#[test]
fn dense_attention_agrees_from_1_to_4100_keys() {
    for g in gpus("flash attention, dense") {
        for &n in KEYS {
            // causal prefill of the last rows, Qwen3-VL-2B's text shape (GQA 2, d 128)
            for kv in [DType::F16, DType::F32] {
                dense_case(&*g, n.min(129), 16, 8, 128, n, true, kv);
            }
            // full attention, GQA 1, the vision head dim
            dense_case(&*g, 17, 4, 4, 64, n, false, DType::F32);
            // GQA 4, a head dim between the classes
            dense_case(&*g, n.min(33), 8, 2, 72, n, true, DType::F16);
        }
    }
}

#[test]
fn dense_attention_agrees_over_query_counts_and_head_dims() {
    for g in gpus("flash attention, shapes") {
        for &t in &[1, 15, 16, 17, 127, 128, 129] {
            dense_case(&*g, t, 4, 2, 128, 300, true, DType::F16);
            dense_case(&*g, t, 2, 1, 64, 300, false, DType::F32);
        }
        // the tiny fixtures' head dim, the smallest the flash kernels take, and one they do not
        for &d in &[8, 16, 24, 40, 256] {
            dense_case(&*g, 70, 4, 2, d, 90, true, DType::F32);
            dense_case(&*g, 33, 2, 2, d, 65, false, DType::F16);
        }
        // long: a vision tower's 4,096 patches, a 4,096-token prefill
        dense_case(&*g, 4096, 2, 2, 64, 4096, false, DType::F32);
        dense_case(&*g, 4096, 4, 2, 128, 4096, true, DType::F16);
    }
}

#[test]
fn prefill_against_the_cache_reads_positions_from_the_cursor() {
    for g in gpus("flash attention, cursor") {
        let (abs, rel) = attention_tolerance(&*g);
        // (t, heads, kv_heads, d, rows already cached); the cache holds 4,200 rows
        for &(t, heads, kvh, d, row0) in &[(5, 16, 8, 128, 0), (64, 16, 8, 128, 36), (300, 16, 8, 128, 3800), (129, 4, 1, 64, 1000), (17, 2, 2, 16, 0)] {
            let cap = 4200;
            let (q, k, v) = (random(t * heads * d, 61), random(cap * kvh * d, 62), random(cap * kvh * d, 63));
            let cur: Vec<u32> = (0..t).flat_map(|i| vec![7, 7, 7, (row0 + i) as u32]).collect();
            for kv in [DType::F32, DType::F16] {
                let op = |b: &dyn Backend| -> Result<Tensor> {
                    let cursor = b.upload_u32(&[t, CURSOR_FIELDS], &cur)?;
                    b.attention_cached(&b.upload_f32(&[t, heads, d], &q)?, &upload(b, &[cap, kvh, d], &k, kv)?, &upload(b, &[cap, kvh, d], &v, kv)?, None, &cursor, 1.0 / (d as f32).sqrt())
                };
                agree(&format!("attention_cached t={} h={}/{} d={} row0={} {} on {}", t, heads, kvh, d, row0, kv, g.describe()), &*g, &op, abs, rel);
            }
        }
    }
}

/// Random block bounds over `n` (blocks of 1 … `max` rows, some empty), and random allowed
/// flags (density about `dense` / 8, every block pair with some chance).
fn random_mask(rng: &mut Rng, t: usize, kv: usize, max: usize, dense: usize) -> (Vec<usize>, Vec<usize>, Vec<bool>) {
    let mut bounds = |n: usize| {
        let mut b = vec![0];
        while *b.last().unwrap() < n {
            let step = if rng.below(10) == 0 { 0 } else { 1 + rng.below(max) };
            b.push((b.last().unwrap() + step).min(n));
        }
        b
    };
    let (qb, kb) = (bounds(t), bounds(kv));
    let allowed = (0..(qb.len() - 1) * (kb.len() - 1)).map(|_| rng.below(8) < dense).collect();
    (qb, kb, allowed)
}

/// The block-sparse attention of `q [t, heads, d]` over `k`, `v` `[kv, kv_heads, d]` computed
/// directly in f64, row by row, from `mask.sees`.
fn masked_reference(q: &[f32], k: &[f32], v: &[f32], (t, heads, kvh, d, kv): (usize, usize, usize, usize, usize), mask: &BlockMask, scale: f64) -> Vec<f32> {
    let mut out = vec![0.0f32; t * heads * d];
    for i in 0..t {
        for h in 0..heads {
            let kh = h / (heads / kvh);
            let qv = &q[(i * heads + h) * d..(i * heads + h + 1) * d];
            let seen: Vec<usize> = (0..kv).filter(|&j| mask.sees(i, j)).collect();
            if seen.is_empty() {
                continue;
            }
            let s: Vec<f64> = seen.iter().map(|&j| qv.iter().zip(&k[(j * kvh + kh) * d..(j * kvh + kh + 1) * d]).map(|(a, b)| *a as f64 * *b as f64).sum::<f64>() * scale).collect();
            let m = s.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
            let w: Vec<f64> = s.iter().map(|x| (x - m).exp()).collect();
            let z: f64 = w.iter().sum();
            for e in 0..d {
                let o: f64 = seen.iter().zip(&w).map(|(&j, wj)| wj * v[(j * kvh + kh) * d + e] as f64).sum();
                out[(i * heads + h) * d + e] = (o / z) as f32;
            }
        }
    }
    out
}

#[test]
fn the_composite_block_sparse_attention_is_masked_attention() {
    // the CPU path (the oracle of the GPU tests below) against a direct evaluation of the mask
    let b = cpu();
    let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
    for &(t, kv, heads, kvh, d, max, dense) in &[(40, 40, 2, 1, 16, 9, 4), (100, 300, 4, 2, 32, 50, 3), (7, 250, 2, 2, 8, 300, 6), (257, 129, 2, 1, 64, 20, 2)] {
        for kv_dtype in [DType::F32, DType::F16] {
            let (qb, kb, allowed) = random_mask(&mut rng, t, kv, max, dense);
            let mask = BlockMask::new(&*b, &qb, &kb, &allowed).unwrap();
            let (q, k, v) = (random(t * heads * d, 71), random(kv * kvh * d, 72), random(kv * kvh * d, 73));
            // the reference reads the values the f16 tensors hold
            let round = |x: &[f32]| -> Vec<f32> { if kv_dtype == DType::F16 { x.iter().map(|v| half::f16::from_f32(*v).to_f32()).collect() } else { x.to_vec() } };
            let want = masked_reference(&q, &round(&k), &round(&v), (t, heads, kvh, d, kv), &mask, 1.0 / (d as f64).sqrt());
            let got = b.attention_block_sparse(&b.upload_f32(&[t, heads, d], &q).unwrap(), &upload(&*b, &[kv, kvh, d], &k, kv_dtype).unwrap(), &upload(&*b, &[kv, kvh, d], &v, kv_dtype).unwrap(), &mask, 1.0 / (d as f32).sqrt(), None).unwrap();
            let got = b.download_f32(&got).unwrap();
            for (i, (g, w)) in got.iter().zip(&want).enumerate() {
                assert!((g - w).abs() <= 1e-5 + 1e-4 * w.abs(), "t={} kv={} {}: element {}: {} vs {}", t, kv, kv_dtype, i, g, w);
            }
        }
    }
    // a mask must cover the operands
    let mask = BlockMask::block_diagonal(&*b, &[3, 4]).unwrap();
    let (q, k) = (b.upload_f32(&[8, 1, 8], &[0.5; 64]).unwrap(), b.upload_f32(&[8, 1, 8], &[0.5; 64]).unwrap());
    assert!(b.attention_block_sparse(&q, &k, &k, &mask, 1.0, None).is_err());
    assert!(BlockMask::new(&*b, &[0, 5, 3], &[0, 4], &[true, true]).is_err());
    assert!(BlockMask::new(&*b, &[0, 4], &[0, 4], &[true, true]).is_err());
}

#[test]
fn block_sparse_attention_agrees_with_random_masks() {
    for g in gpus("block-sparse attention") {
        let (abs, rel) = attention_tolerance(&*g);
        let mut rng = Rng(0x2545_f491_4f6c_dd1d);
        // (t, keys, heads, kv_heads, d, largest block, density / 8)
        let cases = [(1, 1, 1, 1, 8, 1, 8), (17, 65, 2, 1, 16, 10, 4), (200, 200, 4, 2, 64, 70, 3), (129, 1000, 4, 4, 128, 300, 5), (1000, 4100, 2, 1, 64, 900, 2), (4096, 4096, 2, 2, 64, 1100, 1), (300, 257, 8, 2, 72, 1, 4)];
        for &(t, kv, heads, kvh, d, max, dense) in &cases {
            for kv_dtype in [DType::F32, DType::F16] {
                let (qb, kb, allowed) = random_mask(&mut rng, t, kv, max, dense);
                let (q, k, v) = (random(t * heads * d, 81), random(kv * kvh * d, 82), random(kv * kvh * d, 83));
                let op = |b: &dyn Backend| -> Result<Tensor> {
                    let mask = BlockMask::new(b, &qb, &kb, &allowed)?;
                    b.attention_block_sparse(&b.upload_f32(&[t, heads, d], &q)?, &upload(b, &[kv, kvh, d], &k, kv_dtype)?, &upload(b, &[kv, kvh, d], &v, kv_dtype)?, &mask, 1.0 / (d as f32).sqrt(), None)
                };
                let what = format!("block-sparse t={} keys={} h={}/{} d={} blocks {}x{} {} on {}", t, kv, heads, kvh, d, qb.len() - 1, kb.len() - 1, kv_dtype, g.describe());
                agree(&what, &*g, &op, abs, rel);
            }
        }
    }
}

#[test]
fn vision_attention_with_fused_rotary_agrees() {
    for g in gpus("vision attention") {
        let (abs, rel) = attention_tolerance(&*g);
        // images of 864, 1024, 4 and 300 patches (one, and all in one pass), Qwen3-VL-2B's
        // vision heads; and the tiny fixture tower's shape
        for (segments, heads, d) in [(vec![1024], 16, 64), (vec![864, 1024, 4, 300], 16, 64), (vec![64, 36], 2, 16)] {
            let n: usize = segments.iter().sum();
            let (q, k, v) = (random(n * heads * d, 91), random(n * heads * d, 92), random(n * heads * d, 93));
            let angles = random(n * d / 2, 94);
            let (cos, sin): (Vec<f32>, Vec<f32>) = angles.iter().map(|a| ((a * 40.0).cos(), (a * 40.0).sin())).unzip();
            let op = |b: &dyn Backend| -> Result<Tensor> {
                let mask = BlockMask::block_diagonal(b, &segments)?;
                let (c, s) = (b.upload_f32(&[n, d / 2], &cos)?, b.upload_f32(&[n, d / 2], &sin)?);
                let t = |x: &[f32]| b.upload_f32(&[n, heads, d], x);
                b.attention_block_sparse(&t(&q)?, &t(&k)?, &t(&v)?, &mask, 1.0 / (d as f32).sqrt(), Some((&c, &s)))
            };
            agree(&format!("vision attention segments {:?} h={} d={} on {}", segments, heads, d, g.describe()), &*g, &op, abs, rel);
        }
    }
}

/// The flash kernels by warpgroups (sm_90a `wgmma`, `gpu/src/flash_mma.rs`), which every test
/// here runs on a compute 9.0 device: causal prefill with Qwen3-VL-2B's text heads (d 128, GQA
/// 2) over 4,100 keys and over a partial last tile, the vision heads (d 64, two warpgroups a
/// block) with and without the block-diagonal mask, and a head dim between the classes (72:
/// dims past it zero in the staged tiles); the launch counts show both kernels ran. Elsewhere
/// (or with `QWEN3_VL_FLASH_WGMMA=0`) the test says so and checks nothing.
#[cfg(feature = "cuda")]
#[test]
fn warpgroup_flash_attention_agrees_and_runs() {
    use qwen3_vl::kernels::Kernel;
    for g in gpus("warpgroup flash attention") {
        let Some(c) = g.as_any().downcast_ref::<qwen3_vl::cuda::CudaBackend>() else { continue };
        if !c.warpgroup_kernels() || std::env::var("QWEN3_VL_FLASH_WGMMA").map_or(false, |v| v == "0") {
            eprintln!("skip: {} has no sm_90a module or QWEN3_VL_FLASH_WGMMA=0 (warpgroup flash attention runs on compute 9.0 only)", g.describe());
            continue;
        }
        let kernels = [Kernel::FlashAttentionWgmmaD64F16, Kernel::FlashAttentionWgmmaD128F16];
        let before: Vec<u64> = kernels.iter().map(|&k| c.kernel_launches(k)).collect();
        dense_case(&*g, 300, 16, 8, 128, 4100, true, DType::F16);
        dense_case(&*g, 129, 16, 8, 128, 1000, true, DType::F32);
        dense_case(&*g, 200, 16, 16, 64, 333, false, DType::F16);
        dense_case(&*g, 65, 8, 2, 72, 700, true, DType::F16);
        let (abs, rel) = attention_tolerance(&*g);
        let (segments, heads, d) = (vec![700, 4, 300], 16, 64);
        let n: usize = segments.iter().sum();
        let (q, k, v) = (random(n * heads * d, 81), random(n * heads * d, 82), random(n * heads * d, 83));
        let op = |b: &dyn Backend| -> Result<Tensor> {
            let mask = BlockMask::block_diagonal(b, &segments)?;
            let t = |x: &[f32]| b.upload_f32(&[n, heads, d], x);
            b.attention_block_sparse(&t(&q)?, &t(&k)?, &t(&v)?, &mask, 1.0 / (d as f32).sqrt(), None)
        };
        agree(&format!("warpgroup vision attention segments {:?} on {}", segments, g.describe()), &*g, &op, abs, rel);
        for (i, &kernel) in kernels.iter().enumerate() {
            assert!(c.kernel_launches(kernel) > before[i], "{}: {} did not run", g.describe(), kernel.name());
        }
    }
}

/// `n` distinct cache rows (or blocks) out of `cap`, shuffled (a sequence's keys scattered over a
/// pool).
fn shuffled_slots(rng: &mut Rng, n: usize, cap: usize) -> Vec<u32> {
    let mut ids: Vec<u32> = (0..cap as u32).collect();
    for i in (1..ids.len()).rev() {
        ids.swap(i, rng.below(i + 1));
    }
    ids.truncate(n);
    ids
}

#[test]
fn the_composite_slot_attention_is_attention_over_the_gathered_keys() {
    // the CPU's composite body against dense attention over the slots' rows laid out in order
    let b = cpu();
    let mut rng = Rng(0x51075);
    let (heads, kvh, d, n, cap, t) = (4, 2, 16, 37, 50, 9);
    let slots = shuffled_slots(&mut rng, n, cap);
    let (kp, vp, q) = (random(cap * kvh * d, 21), random(cap * kvh * d, 22), random(t * heads * d, 23));
    let sc: Vec<f32> = (0..cap * kvh * 2).map(|i| [1.0, 2.0, 0.5, 4.0][i % 4]).collect();
    let p = AttnParams { kv_len: n, q_pos0: n - t, causal: true, scale: 0.3 };
    let qt = b.upload_f32(&[t, heads, d], &q).unwrap();
    let st = b.upload_u32(&[n], &slots).unwrap();
    let sct = b.upload_f32(&[cap, kvh, 2], &sc).unwrap();
    let got = b.download_f32(&b.attention_slots(&qt, &b.upload_f32(&[cap, kvh, d], &kp).unwrap(), &b.upload_f32(&[cap, kvh, d], &vp).unwrap(), Some(&sct), &st, p).unwrap()).unwrap();
    let gather = |pool: &[f32], w: usize| -> Vec<f32> { slots.iter().flat_map(|&s| pool[s as usize * kvh * w..(s as usize + 1) * kvh * w].to_vec()).collect() };
    let (k, v, g) = (b.upload_f32(&[n, kvh, d], &gather(&kp, d)).unwrap(), b.upload_f32(&[n, kvh, d], &gather(&vp, d)).unwrap(), b.upload_f32(&[n, kvh, 2], &gather(&sc, 2)).unwrap());
    let want = b.download_f32(&b.attention_scaled(&qt, &k, &v, Some(&g), p).unwrap()).unwrap();
    assert_eq!(got, want);
    // slots of another length, or not u32, are refused
    assert!(b.attention_slots(&qt, &k, &v, None, &b.upload_u32(&[n - 1], &slots[1..]).unwrap(), p).is_err());
    assert!(b.attention_slots(&qt, &k, &v, None, &b.upload_f32(&[n], &vec![0.0; n]).unwrap(), p).is_err());
}

#[test]
fn slot_attention_agrees_over_lengths_head_dims_and_scales() {
    // a prefill chunk of the engine: the last `t` of `n` keys, each at a shuffled slot of a pool
    // (f16, or f32), read in place by the paged tensor-core kernel (head dims 65 ..= 128). The
    // scaled pools are written as the engine writes its cache (`write_kv_rows`: rows past f16's
    // range, or tiny, stored divided by their row scales, which the writer flags)
    for g in gpus("attention over key slots") {
        let mut rng = Rng(0x5107);
        for &(heads, kvh, d) in &[(16usize, 8usize, 128usize), (8, 2, 64), (4, 4, 72), (2, 1, 256)] {
            for &n in &[1usize, 17, 64, 65, 130, 2100] {
                let (t, cap) = (n.min(70), n + 37);
                let slots = shuffled_slots(&mut rng, n, cap);
                let (kp, vp, q) = (random(cap * kvh * d, 31 + n as u32), random(cap * kvh * d, 32), random(t * heads * d, 33 + d as u32));
                // every third (row, head) value vector at 10^5, every fifth key vector at 10^-3
                let scaled = |x: &[f32], every: usize, f: f32| -> Vec<f32> { x.chunks(d).enumerate().flat_map(|(i, r)| r.iter().map(move |e| if i % every == 0 { e * f } else { *e })).collect() };
                let (kb, vb) = (scaled(&kp, 5, 1e-3), scaled(&vp, 3, 1e5));
                let p = AttnParams { kv_len: n, q_pos0: n - t, causal: true, scale: 1.0 / (d as f32).sqrt() };
                for (kv, with_scales) in [(DType::F16, true), (DType::F16, false), (DType::F32, false)] {
                    let op = |b: &dyn Backend| -> Result<Tensor> {
                        let (k, v, sc) = kv_pools(b, [cap, kvh, d], kv, (&kp, &vp), with_scales.then(|| (&kb[..], &vb[..])))?;
                        b.attention_slots(&b.upload_f32(&[t, heads, d], &q)?, &k, &v, sc.as_ref(), &b.upload_u32(&[n], &slots)?, p)
                    };
                    let name = format!("slot attention t={} of {} keys h={}/{} d={} {} cache, row scales {} on {}", t, n, heads, kvh, d, kv, with_scales, g.describe());
                    agree_attention(&name, &*g, &op, with_scales);
                }
            }
        }
    }
}

/// K/V pools `[cap, kvh, d]` of `kv`: `plain` as given, or with row scales `scaled` written as the
/// engine writes its cache (`write_kv_rows`: rows past f16's range, or tiny, stored divided by
/// their row scales, which the writer flags).
fn kv_pools(b: &dyn Backend, shape: [usize; 3], kv: DType, plain: (&[f32], &[f32]), scaled: Option<(&[f32], &[f32])>) -> Result<(Tensor, Tensor, Option<Tensor>)> {
    let [cap, kvh, _] = shape;
    let (kp, vp) = match scaled {
        None => return Ok((upload(b, &shape, plain.0, kv)?, upload(b, &shape, plain.1, kv)?, None)),
        Some(s) => s,
    };
    let zeros = vec![0.0; shape.iter().product()];
    let mut sc = b.upload_f32(&[cap, kvh, 2], &vec![1.0; cap * kvh * 2])?;
    let (mut k, mut v) = (upload(b, &shape, &zeros, kv)?, upload(b, &shape, &zeros, kv)?);
    b.write_kv_rows(&mut k, Some((&mut sc, 0)), 0, &b.upload_f32(&shape, kp)?)?;
    b.write_kv_rows(&mut v, Some((&mut sc, 1)), 0, &b.upload_f32(&shape, vp)?)?;
    Ok((k, v, Some(sc)))
}

/// `op` on the GPU against the CPU: within [`attention_tolerance`], or with `scaled` pools (values
/// at 10^5: outputs that are their differences) every output finite and within f16's rounding
/// of the largest.
fn agree_attention(name: &str, g: &dyn Backend, op: &dyn Fn(&dyn Backend) -> Result<Tensor>, scaled: bool) {
    if !scaled {
        let (abs, rel) = attention_tolerance(g);
        return agree(name, g, op, abs, rel);
    }
    let want = cpu().download_f32(&op(&*cpu()).unwrap()).unwrap();
    g.set_poison_outputs(true);
    let got_t = op(g).unwrap_or_else(|e| panic!("{}: {}", name, e));
    g.set_poison_outputs(false);
    assert_eq!(got_t.device(), qwen3_vl::DeviceKind::Cuda, "{}", name);
    let got = g.download_f32(&got_t).unwrap();
    assert!(got.iter().all(|x| x.is_finite()), "{}: an output was not written, or overflowed", name);
    close_to_max(name, &got, &want, if common::tensor_cores(g) { 8e-3 } else { 2e-3 });
}

/// A step's prefill chunks in one op (`Backend::attention_chunks`: on a device every chunk's keys
/// gathered at once, one masked flash attention with a per-row cursor) against the CPU's one
/// attention per chunk: new prompts and chunks after a history, a chunk of one row, chunks
/// sharing a cached prefix (the same slots, so more keys than the pool has rows), rows around
/// the kernels' 64-key and 128-row tiles, f16 pools with and without row scales, GQA and head
/// dims 64, 72 and 128.
#[test]
fn chunk_attention_agrees_with_one_attention_per_chunk() {
    use qwen3_vl::chunks::Chunks;
    for g in gpus("attention over several prefill chunks") {
        let mut rng = Rng(0xc4a7);
        for &(heads, kvh, d) in &[(16usize, 8usize, 128usize), (8, 2, 64), (4, 4, 72)] {
            // (rows, earlier keys) per chunk
            for layout in [vec![(5usize, 0usize), (70, 0), (1, 0), (33, 200)], vec![(128, 0), (64, 136), (3, 0)], vec![(40, 100), (40, 100)]] {
                let keys: usize = layout.iter().map(|&(r, h)| r + h).sum();
                let cap = keys + 19;
                let pool = shuffled_slots(&mut rng, cap, cap);
                // each chunk its own rows of the pool; the last layout's second chunk shares the
                // first's earlier keys (a cached prefix)
                let (mut slots, mut at) = (Vec::<Vec<u32>>::new(), 0);
                for (c, &(r, h)) in layout.iter().enumerate() {
                    let s: Vec<u32> = if c == 1 && layout.len() == 2 {
                        let mut s = slots[0][..h].to_vec();
                        s.extend_from_slice(&pool[at..at + r]);
                        at += r;
                        s
                    } else {
                        at += r + h;
                        pool[at - r - h..at].to_vec()
                    };
                    slots.push(s);
                }
                let t: usize = layout.iter().map(|l| l.0).sum();
                let (kp, vp, q) = (random(cap * kvh * d, 41 + d as u32), random(cap * kvh * d, 42), random(t * heads * d, 43 + t as u32));
                // every fifth key vector at 10^-3 and every third value vector at 10^5 (row scales)
                let scaled = |x: &[f32], every: usize, f: f32| -> Vec<f32> { x.chunks(d).enumerate().flat_map(|(i, r)| r.iter().map(move |e| if i % every == 0 { e * f } else { *e })).collect() };
                let (kb, vb) = (scaled(&kp, 5, 1e-3), scaled(&vp, 3, 1e5));
                for with_scales in [false, true] {
                    let op = |b: &dyn Backend| -> Result<Tensor> {
                        let (k, v, sc) = kv_pools(b, [cap, kvh, d], DType::F16, (&kp, &vp), with_scales.then(|| (&kb[..], &vb[..])))?;
                        let ids = slots.iter().map(|s| b.upload_u32(&[s.len()], s)).collect::<Result<Vec<_>>>()?;
                        let parts: Vec<(usize, &[u32])> = layout.iter().zip(&slots).map(|(l, s)| (l.0, s.as_slice())).collect();
                        let chunks = Chunks::new(b, &parts, ids)?;
                        let qt = b.upload_f32(&[t, heads, d], &q)?;
                        // q rows that are not the chunks' are refused
                        assert!(b.attention_chunks(&b.take_rows(&qt, 0, t - 1)?, &k, &v, sc.as_ref(), &chunks, 0.1).is_err());
                        b.attention_chunks(&qt, &k, &v, sc.as_ref(), &chunks, 1.0 / (d as f32).sqrt())
                    };
                    let name = format!("chunk attention {:?} h={}/{} d={} row scales {} on {}", layout, heads, kvh, d, with_scales, g.describe());
                    agree_attention(&name, &*g, &op, with_scales);
                }
            }
        }
    }
}

/// A paged cache for [`paged_case`]: `rows` sequences of `lens[i]` keys in blocks of `block` rows
/// taken from a shuffled pool (ids far apart and out of order), with `spare` unused blocks.
fn paged_tables(rng: &mut Rng, lens: &[usize], block: usize, spare: usize) -> (Vec<Vec<u32>>, usize) {
    let need: usize = lens.iter().map(|l| (l + block - 1) / block).sum();
    let total = need + spare;
    let ids = shuffled_slots(rng, total, total);
    let mut at = 0;
    let tables = lens.iter().map(|l| {
        let n = (l + block - 1) / block;
        at += n;
        ids[at - n..at].to_vec()
    }).collect();
    (tables, total * block)
}

#[test]
fn the_composite_paged_attention_is_attention_over_each_rows_keys() {
    // the CPU's composite body against dense attention over each row's keys laid out contiguously
    let b = cpu();
    let mut rng = Rng(0x5eed);
    let (heads, kvh, d, block) = (4, 2, 16, 4);
    let lens = [1usize, 4, 5, 13, 32];
    let (tables, slots) = paged_tables(&mut rng, &lens, block, 3);
    let (kp, vp) = (random(slots * kvh * d, 11), random(slots * kvh * d, 12));
    let q = random(lens.len() * heads * d, 13);
    let rows: Vec<(&[u32], usize)> = tables.iter().zip(&lens).map(|(t, &l)| (t.as_slice(), l)).collect();
    let pages = qwen3_vl::Pages::new(&*b, block, slots, &rows).unwrap();
    let (kt, vt) = (b.upload_f32(&[slots, kvh, d], &kp).unwrap(), b.upload_f32(&[slots, kvh, d], &vp).unwrap());
    let got = b.download_f32(&b.attention_paged(&b.upload_f32(&[lens.len(), heads, d], &q).unwrap(), &kt, &vt, None, &pages, 0.25).unwrap()).unwrap();
    for (i, &n) in lens.iter().enumerate() {
        let slot = |j: usize| tables[i][j / block] as usize * block + j % block;
        let gather = |pool: &[f32]| -> Vec<f32> { (0..n).flat_map(|j| pool[slot(j) * kvh * d..(slot(j) + 1) * kvh * d].to_vec()).collect() };
        let (k, v) = (b.upload_f32(&[n, kvh, d], &gather(&kp)).unwrap(), b.upload_f32(&[n, kvh, d], &gather(&vp)).unwrap());
        let qi = b.upload_f32(&[1, heads, d], &q[i * heads * d..(i + 1) * heads * d]).unwrap();
        let want = b.download_f32(&b.attention(&qi, &k, &v, AttnParams { kv_len: n, q_pos0: 0, causal: false, scale: 0.25 }).unwrap()).unwrap();
        assert_eq!(&got[i * heads * d..(i + 1) * heads * d], &want[..], "row {} of {} keys", i, n);
    }
    // tables that do not hold their keys, or point outside the cache, are refused
    assert!(qwen3_vl::Pages::new(&*b, block, slots, &[(&tables[0][..], 5)]).is_err());
    assert!(qwen3_vl::Pages::new(&*b, block, block, &[(&[7u32][..], 1)]).is_err());
    assert!(qwen3_vl::Pages::new(&*b, 3, slots, &[(&tables[0][..], 1)]).is_err());
}

#[test]
fn paged_decode_attention_agrees_over_rows_lengths_and_groups() {
    for g in gpus("paged attention") {
        let mut rng = Rng(0xbeef);
        for &(heads, kvh, d) in &[(16usize, 8usize, 128usize), (4, 1, 64), (8, 8, 32), (32, 4, 128), (2, 1, 256)] {
            // one long row and three (split over the keys, up to 64 chunks, some of them empty
            // at the longest row's tail), five, a batch of 16 and of 64 (a chunk per row)
            for &(rows, max_len) in &[(1usize, 40usize), (1, 4099), (3, 1500), (5, 300), (16, 1000), (64, 130)] {
                let lens: Vec<usize> = (0..rows).map(|i| if i == 0 { max_len } else { 1 + rng.below(max_len) }).collect();
                let block = [16usize, 4, 32][rows % 3];
                let (tables, slots) = paged_tables(&mut rng, &lens, block, 2);
                let (kp, vp, q) = (random(slots * kvh * d, rows as u32), random(slots * kvh * d, 9 + d as u32), random(rows * heads * d, 17));
                for kv in [DType::F32, DType::F16] {
                    let op = |b: &dyn Backend| -> Result<Tensor> {
                        let rs: Vec<(&[u32], usize)> = tables.iter().zip(&lens).map(|(t, &l)| (t.as_slice(), l)).collect();
                        let pages = qwen3_vl::Pages::new(b, block, slots, &rs)?;
                        b.attention_paged(&b.upload_f32(&[rows, heads, d], &q)?, &upload(b, &[slots, kvh, d], &kp, kv)?, &upload(b, &[slots, kvh, d], &vp, kv)?, None, &pages, 1.0 / (d as f32).sqrt())
                    };
                    // the SIMT kernels are FP32; the tensor-core kernel (head dim 128, f16 cache,
                    // compute_80) splits queries and probabilities into two f16 parts
                    agree(&format!("paged attention {} rows up to {} keys, heads {}/{} d {} blocks of {}, {} cache, {}", rows, max_len, heads, kvh, d, block, kv, g.describe()), &*g, &op, 1e-5, 1e-4);
                }
            }
        }
    }
}

/// `(q, k, v)` of `[t, heads, d]`, `[n, kvh, d]`, `[n, kvh, d]` with operands past f16's range
/// (65504) but products in range: `case` 0 values of some (row, head) vectors at 10^5 to 10^7,
/// growing along the keys (so later key tiles raise the largest value scale); 1 keys at 10^6
/// with queries at 10^-6; 2 queries at 10^6 with keys at 10^-6.
fn massive_qkv(case: usize, t: usize, heads: usize, kvh: usize, n: usize, d: usize) -> (Vec<f32>, Vec<f32>, Vec<f32>) {
    let (mut q, mut k, mut v) = (random(t * heads * d, 31 + case as u32), random(n * kvh * d, 37), random(n * kvh * d, 41));
    let scale_vectors = |x: &mut [f32], f: &dyn Fn(usize) -> f32| x.chunks_mut(d).enumerate().for_each(|(i, vec)| vec.iter_mut().for_each(|e| *e *= f(i)));
    match case {
        0 => scale_vectors(&mut v, &|i| if i % 3 == 0 { 1e5 * (1.0 + 100.0 * (i / kvh) as f32 / n as f32) } else { 1.0 }),
        1 => {
            scale_vectors(&mut k, &|i| if i % 2 == 0 { 1e6 } else { 1.0 });
            scale_vectors(&mut q, &|_| 1e-6);
        }
        _ => {
            scale_vectors(&mut q, &|i| if i % 2 == 1 { 1e6 } else { 1.0 });
            scale_vectors(&mut k, &|_| 1e-6);
        }
    }
    (q, k, v)
}

/// Asserts `got` is `want` within `tol` of `want`'s largest magnitude (the outputs of massive
/// values are massive too; an overflow gives infinities or NaN).
fn close_to_max(what: &str, got: &[f32], want: &[f32], tol: f32) {
    assert_eq!(got.len(), want.len(), "{}", what);
    let scale = want.iter().fold(0.0f32, |m, x| m.max(x.abs()));
    let err = got.iter().zip(want).fold(0.0f32, |m, (g, w)| m.max((g - w).abs()));
    assert!(err.is_finite() && err <= tol * scale, "{}: largest error {} against {} of {} ({} allowed)", what, err, tol, scale, tol * scale);
}

#[test]
fn attention_past_f16s_range_gives_the_f32_answer() {
    // keys, values or queries beyond f16's range: f32 K/V on every kernel (the tensor cores
    // narrow them with row scales first), and f16 caches written with row scales, read by the
    // flash, split and paged kernels; the reference is the CPU's f32 attention of the exact
    // values. f16's rounding (2^-11) is what remains.
    let cpu = cpu();
    for g in gpus("attention past f16's range") {
        let tol = if common::tensor_cores(&*g) { 8e-3 } else { 2e-3 };
        for case in 0..3 {
            let (heads, kvh, d, n) = (8, 2, 64, 200);
            for &t in &[1usize, 40] {
                let (q, k, v) = massive_qkv(case, t, heads, kvh, n, d);
                let p = AttnParams { kv_len: n, q_pos0: n - t, causal: true, scale: 1.0 / (d as f32).sqrt() };
                let dense = |b: &dyn Backend| -> Result<Vec<f32>> { b.download_f32(&b.attention(&b.upload_f32(&[t, heads, d], &q)?, &b.upload_f32(&[n, kvh, d], &k)?, &b.upload_f32(&[n, kvh, d], &v)?, p)?) };
                let want = dense(&*cpu).unwrap();
                assert!(want.iter().all(|x| x.is_finite()));
                let what = format!("case {} t {} on {}", case, t, g.describe());
                close_to_max(&format!("f32 K/V, {}", what), &dense(&*g).unwrap(), &want, tol);
                // an f16 cache with row scales, written by write_kv_rows, read through a cursor
                // (split kernel for one row, flash for 40)
                let cached = |b: &dyn Backend| -> Result<Vec<f32>> {
                    let (mut kc, mut vc) = (upload(b, &[n, kvh, d], &vec![0.0; n * kvh * d], DType::F16)?, upload(b, &[n, kvh, d], &vec![0.0; n * kvh * d], DType::F16)?);
                    let mut sc = b.upload_f32(&[n, kvh, 2], &vec![1.0; n * kvh * 2])?;
                    b.write_kv_rows(&mut kc, Some((&mut sc, 0)), 0, &b.upload_f32(&[n, kvh, d], &k)?)?;
                    b.write_kv_rows(&mut vc, Some((&mut sc, 1)), 0, &b.upload_f32(&[n, kvh, d], &v)?)?;
                    let cur: Vec<u32> = (n - t..n).flat_map(|r| [r as u32; CURSOR_FIELDS]).collect();
                    let cursor = b.upload_u32(&[t, CURSOR_FIELDS], &cur)?;
                    b.download_f32(&b.attention_cached(&b.upload_f32(&[t, heads, d], &q)?, &kc, &vc, Some(&sc), &cursor, p.scale)?)
                };
                close_to_max(&format!("scaled f16 cache, CPU, {}", what), &cached(&*cpu).unwrap(), &want, 2e-3);
                close_to_max(&format!("scaled f16 cache, {}", what), &cached(&*g).unwrap(), &want, tol);
            }
            // paged: every row its own sequence over blocks of 16 in reverse order
            let (rows, block) = (3usize, 16usize);
            let (q, k, v) = massive_qkv(case, rows, heads, kvh, n, d);
            let paged = |b: &dyn Backend| -> Result<Vec<f32>> {
                let table: Vec<u32> = (0..(n + block - 1) / block).rev().map(|x| x as u32).collect();
                let slots = table.len() * block;
                let lens = [n, n / 2, 17];
                let rs: Vec<(&[u32], usize)> = lens.iter().map(|&l| (&table[..(l + block - 1) / block], l)).collect();
                let pages = qwen3_vl::Pages::new(b, block, slots, &rs)?;
                // logical key j of every row at cache row table[j / block] · block + j % block
                let (mut kp, mut vp) = (vec![0.0f32; slots * kvh * d], vec![0.0f32; slots * kvh * d]);
                for j in 0..n {
                    let r = table[j / block] as usize * block + j % block;
                    kp[r * kvh * d..(r + 1) * kvh * d].copy_from_slice(&k[j * kvh * d..(j + 1) * kvh * d]);
                    vp[r * kvh * d..(r + 1) * kvh * d].copy_from_slice(&v[j * kvh * d..(j + 1) * kvh * d]);
                }
                let (mut kc, mut vc) = (upload(b, &[slots, kvh, d], &vec![0.0; slots * kvh * d], DType::F16)?, upload(b, &[slots, kvh, d], &vec![0.0; slots * kvh * d], DType::F16)?);
                let mut sc = b.upload_f32(&[slots, kvh, 2], &vec![1.0; slots * kvh * 2])?;
                b.write_kv_rows(&mut kc, Some((&mut sc, 0)), 0, &b.upload_f32(&[slots, kvh, d], &kp)?)?;
                b.write_kv_rows(&mut vc, Some((&mut sc, 1)), 0, &b.upload_f32(&[slots, kvh, d], &vp)?)?;
                b.download_f32(&b.attention_paged(&b.upload_f32(&[rows, heads, d], &q)?, &kc, &vc, Some(&sc), &pages, 0.125)?)
            };
            // the reference: each row's dense f32 attention over its first keys
            let mut want = Vec::new();
            for (i, &l) in [n, n / 2, 17].iter().enumerate() {
                let qi = cpu.upload_f32(&[1, heads, d], &q[i * heads * d..(i + 1) * heads * d]).unwrap();
                let (ki, vi) = (cpu.upload_f32(&[n, kvh, d], &k).unwrap(), cpu.upload_f32(&[n, kvh, d], &v).unwrap());
                want.extend(cpu.download_f32(&cpu.attention(&qi, &ki, &vi, AttnParams { kv_len: l, q_pos0: 0, causal: false, scale: 0.125 }).unwrap()).unwrap());
            }
            close_to_max(&format!("paged scaled f16, case {}, CPU", case), &paged(&*cpu).unwrap(), &want, 2e-3);
            close_to_max(&format!("paged scaled f16, case {}, {}", case, g.describe()), &paged(&*g).unwrap(), &want, tol);
            // block-sparse (the vision tower's path): two blocks of 100 keys, f32 K/V
            let (t, nb) = (n, 100);
            let (q, k, v) = massive_qkv(case, t, 4, 4, n, d);
            let mask = |b: &dyn Backend| BlockMask::new(b, &[0, nb, t], &[0, nb, n], &[true, false, false, true]);
            let sparse = |b: &dyn Backend| -> Result<Vec<f32>> {
                b.download_f32(&b.attention_block_sparse(&b.upload_f32(&[t, 4, d], &q)?, &b.upload_f32(&[n, 4, d], &k)?, &b.upload_f32(&[n, 4, d], &v)?, &mask(b)?, 0.125, None)?)
            };
            close_to_max(&format!("block-sparse f32, case {}, {}", case, g.describe()), &sparse(&*g).unwrap(), &sparse(&*cpu).unwrap(), tol);
        }
    }
}

#[test]
fn batched_paged_attention_past_f16s_range_gives_the_f32_answer() {
    // the tensor-core kernel (`attention_paged_mma_f16`, head dim 128: a chunk per row for 40
    // rows × 2 KV heads, at least half the multiprocessors; each row split over its keys for 2
    // rows) against each row's dense f32 attention, with queries, keys or values past f16's
    // range in an f16 cache with row scales; rows of every length from 1 key to n, blocks of 16
    // in reverse order
    let cpu = cpu();
    for g in gpus("batched paged attention past f16's range") {
        let tol = if common::tensor_cores(&*g) { 8e-3 } else { 2e-3 };
        let (heads, kvh, d, n, block) = (8usize, 2usize, 128usize, 200usize, 16usize);
        for (rows, case) in [40usize, 2].into_iter().flat_map(|r| (0..3).map(move |c| (r, c))) {
            let lens: Vec<usize> = (0..rows).map(|i| if i == 0 { n } else { 1 + (i * 37) % n }).collect();
            let (q, k, v) = massive_qkv(case, rows, heads, kvh, n, d);
            let table: Vec<u32> = (0..(n + block - 1) / block).rev().map(|x| x as u32).collect();
            let slots = table.len() * block;
            let (mut kp, mut vp) = (vec![0.0f32; slots * kvh * d], vec![0.0f32; slots * kvh * d]);
            for j in 0..n {
                let r = table[j / block] as usize * block + j % block;
                kp[r * kvh * d..(r + 1) * kvh * d].copy_from_slice(&k[j * kvh * d..(j + 1) * kvh * d]);
                vp[r * kvh * d..(r + 1) * kvh * d].copy_from_slice(&v[j * kvh * d..(j + 1) * kvh * d]);
            }
            let paged = |b: &dyn Backend| -> Result<Vec<f32>> {
                let rs: Vec<(&[u32], usize)> = lens.iter().map(|&l| (&table[..(l + block - 1) / block], l)).collect();
                let pages = qwen3_vl::Pages::new(b, block, slots, &rs)?;
                let (mut kc, mut vc) = (upload(b, &[slots, kvh, d], &vec![0.0; slots * kvh * d], DType::F16)?, upload(b, &[slots, kvh, d], &vec![0.0; slots * kvh * d], DType::F16)?);
                let mut sc = b.upload_f32(&[slots, kvh, 2], &vec![1.0; slots * kvh * 2])?;
                b.write_kv_rows(&mut kc, Some((&mut sc, 0)), 0, &b.upload_f32(&[slots, kvh, d], &kp)?)?;
                b.write_kv_rows(&mut vc, Some((&mut sc, 1)), 0, &b.upload_f32(&[slots, kvh, d], &vp)?)?;
                b.download_f32(&b.attention_paged(&b.upload_f32(&[rows, heads, d], &q)?, &kc, &vc, Some(&sc), &pages, 1.0 / (d as f32).sqrt())?)
            };
            let (ki, vi) = (cpu.upload_f32(&[n, kvh, d], &k).unwrap(), cpu.upload_f32(&[n, kvh, d], &v).unwrap());
            let mut want = Vec::new();
            for (i, &l) in lens.iter().enumerate() {
                let qi = cpu.upload_f32(&[1, heads, d], &q[i * heads * d..(i + 1) * heads * d]).unwrap();
                want.extend(cpu.download_f32(&cpu.attention(&qi, &ki, &vi, AttnParams { kv_len: l, q_pos0: 0, causal: false, scale: 1.0 / (d as f32).sqrt() }).unwrap()).unwrap());
            }
            let got = paged(&*g).unwrap();
            // row by row: each row's outputs against its own largest magnitude
            for (i, (gr, wr)) in got.chunks(heads * d).zip(want.chunks(heads * d)).enumerate() {
                close_to_max(&format!("paged scaled f16 on tensor cores, {} rows, case {}, row {} ({} keys), {}", rows, case, i, lens[i], g.describe()), gr, wr, tol);
            }
        }
    }
}

#[test]
fn block_tables_rewritten_in_place_give_fresh_tables_answers() {
    // a recorded step's tables are as wide as the cache and rewritten each step with only the
    // columns the rows use (`Pages::write`, `Backend::write_u32_cols`): the stale tail of a
    // wider earlier step must not matter, on every backend
    for b in backends("rewritten block tables") {
        let mut rng = Rng(0x7ab1e);
        let (heads, kvh, d, block) = (16usize, 8usize, 128usize, 16usize);
        let wide = [700usize, 40, 300];
        let narrow = [33usize, 17, 5];
        let (tables_w, slots) = paged_tables(&mut rng, &wide, block, 4);
        let (kp, vp, q) = (random(slots * kvh * d, 5), random(slots * kvh * d, 6), random(3 * heads * d, 7));
        let kv = b.default_kv_dtype();
        let (k, v) = (upload(&*b, &[slots, kvh, d], &kp, kv).unwrap(), upload(&*b, &[slots, kvh, d], &vp, kv).unwrap());
        let qt = b.upload_f32(&[3, heads, d], &q).unwrap();
        let stride = slots / block;
        let mut pages = qwen3_vl::Pages::with_capacity(&*b, block, slots, 3, stride).unwrap();
        let rows = |t: &[Vec<u32>], lens: &[usize]| -> Vec<(Vec<u32>, usize)> { t.iter().zip(lens).map(|(t, &l)| (t[..(l + block - 1) / block].to_vec(), l)).collect() };
        // the wide step, then a narrow one over the first blocks of each row
        for lens in [&wide[..], &narrow[..]] {
            let rs = rows(&tables_w, lens);
            let refs: Vec<(&[u32], usize)> = rs.iter().map(|(t, l)| (t.as_slice(), *l)).collect();
            pages.write(&*b, &refs).unwrap();
            let got = b.download_f32(&b.attention_paged(&qt, &k, &v, None, &pages, 0.1).unwrap()).unwrap();
            let fresh = qwen3_vl::Pages::new(&*b, block, slots, &refs).unwrap();
            let want = b.download_f32(&b.attention_paged(&qt, &k, &v, None, &fresh, 0.1).unwrap()).unwrap();
            assert_eq!(got, want, "{}: rewritten tables ({:?} keys) against fresh ones", b.describe(), lens);
        }
        // the column write itself, and its shape checks
        let mut t = b.upload_u32(&[3, 5], &(0..15).collect::<Vec<u32>>()).unwrap();
        b.write_u32_cols(&mut t, &[90, 91, 92, 93, 94, 95], 2).unwrap();
        assert_eq!(b.download_u32(&t).unwrap(), vec![90, 91, 2, 3, 4, 92, 93, 7, 8, 9, 94, 95, 12, 13, 14], "{}", b.describe());
        assert!(b.write_u32_cols(&mut t, &[1, 2, 3], 2).is_err());
        assert!(b.write_u32_cols(&mut t, &[0; 18], 6).is_err());
    }
}

#[test]
fn many_small_uploads_land_in_order() {
    // small uploads go through a ring of page-locked memory without waiting (CUDA): more of
    // them than the ring holds, each read back afterwards, and one tensor rewritten many times
    for b in backends("staged uploads") {
        let n = 40;
        let mut ts: Vec<Tensor> = Vec::new();
        for i in 0..n {
            let data: Vec<u32> = (0..(1 << 16) + i * 7).map(|j| (j as u32).wrapping_mul(2_654_435_761) ^ i as u32).collect();
            ts.push(b.upload_u32(&[data.len()], &data).unwrap());
        }
        let mut one = b.upload_u32(&[1000], &[0; 1000]).unwrap();
        for round in 0..500u32 {
            b.write_u32(&mut one, &(0..1000).map(|j| j ^ round).collect::<Vec<u32>>()).unwrap();
        }
        for (i, t) in ts.iter().enumerate() {
            let want: Vec<u32> = (0..(1 << 16) + i * 7).map(|j| (j as u32).wrapping_mul(2_654_435_761) ^ i as u32).collect();
            assert_eq!(b.download_u32(t).unwrap(), want, "{}: upload {}", b.describe(), i);
        }
        assert_eq!(b.download_u32(&one).unwrap(), (0..1000).map(|j| j ^ 499).collect::<Vec<u32>>(), "{}: the last write", b.describe());
    }
}
