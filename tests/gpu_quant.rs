//! Block-quantized weights (`Q8_0`, `Q4_K`, `Q6_K`) on the GPU against the CPU's int8 path (the
//! oracle, `cpu/qlinear.rs`), on every kernel module in turn, outputs NaN-poisoned.
//!
//! Tolerances (max |diff| over the std of the CPU's outputs; QWEN3_VL_REPORT=1 prints the
//! measured values):
//! * Decode path (m ≤ 8: `quantize_act_f32` + `mmvq_*`): the same arithmetic as the CPU — the
//!   same 8-bit activation blocks (32 against `Q8_0`, 256 against K-quants; the quantizer rounds
//!   with the CPU's bits) and exact integer block sums — so only the order of the f32 sums
//!   differs (~1e-6 of std). With the RMSNorm fused into the quantizer its sum of squares is
//!   reduced in another order, which can move an activation across a rounding boundary: one
//!   step of max|x|/127 times one weight, ~1e-3 of std at k = 256. [`DECODE_TOL`] = 2e-3
//!   (measured on the H100: at most 6.6e-6, no boundary was crossed).
//! * Prefill path (m > 8: weights dequantized to f16, the f16 GEMMs with f32 activations): more
//!   precise than the oracle, whose 8-bit activations move each product by up to max|x|/254 of
//!   its block. Against the CPU the difference is the oracle's rounding: measured on the H100
//!   up to 6.9e-2 of std (rms_norm_gate_up_silu, where silu(g)·u multiplies the errors of two
//!   products; plain linear ~2e-2) and 6.7e-2 on a fixture model's prompt logits — the size
//!   tests/gguf_model.rs measures between the CPU's int8 path and the exact dequantized model
//!   (up to 9e-2), so [`PREFILL_TOL`] = 0.15 as there. The GPU path's own precision is held to
//!   [`F16_TOL`] = 2e-3 against the f64 product of the dequantized weights (f16 rounding of the
//!   weights: 2^-11 relative each, a random walk of ~3e-4 of std; measured up to 7.3e-4).
//! * Embedding rows: the same f32 formulas as the CPU's dequantizer, 1e-6.

mod common;

use common::{cpu, gpus, random};
use qwen3_vl::model::{Mix, Model, ModelFiles};
use qwen3_vl::{Backend, Blocks, DType, Result, Tensor};

const DECODE_TOL: f64 = 2e-3;
const PREFILL_TOL: f64 = 0.15;
const F16_TOL: f64 = 2e-3;
const TYPES: [DType; 3] = [DType::Q8_0, DType::Q4K, DType::Q6K];
const ROWS: [usize; 8] = [1, 2, 7, 16, 17, 127, 128, 129];

fn report(what: &str, ratio: f64, tol: f64) {
    if std::env::var("QWEN3_VL_REPORT").map_or(false, |v| v == "1") {
        eprintln!("report: {}: max |diff| / std = {:.2e} (tolerance {:.0e})", what, ratio, tol);
    }
}

/// max |got - want| / std(want), after checking that every element was written.
fn diff_over_std(what: &str, got: &[f32], want: &[f64]) -> f64 {
    assert_eq!(got.len(), want.len(), "{}", what);
    assert!(got.iter().all(|v| !v.is_nan()), "{}: an element was not written (NaN poison left)", what);
    let mean = want.iter().sum::<f64>() / want.len() as f64;
    let std = (want.iter().map(|v| (v - mean).powi(2)).sum::<f64>() / want.len() as f64).sqrt().max(1e-30);
    got.iter().zip(want).map(|(g, w)| (*g as f64 - w).abs()).fold(0.0, f64::max) / std
}

/// Asserts `max |got - want| / std(want)` ([`diff_over_std`]) is within `tol` (printed with
/// `QWEN3_VL_REPORT=1`).
fn assert_within(what: &str, got: &[f32], want: &[f64], tol: f64) {
    let r = diff_over_std(what, got, want);
    report(what, r, tol);
    assert!(r <= tol, "{}: max |diff| = {:.3e} of std, tolerance {:.0e}", what, r, tol);
}

/// Weights with magnitudes varying by block (so block scales differ), quantized.
fn weights(n: usize, k: usize, seed: u32, dt: DType) -> (Vec<u8>, Vec<f32>) {
    let mut w = random(n * k, seed);
    for (i, v) in w.iter_mut().enumerate() {
        *v *= 0.2 + ((i / 32) % 7) as f32 * 0.3;
    }
    let q = qwen3_vl::quant::quantize_vec(dt, &w).unwrap();
    let deq = qwen3_vl::quant::dequantize_vec(dt, &q, n * k).unwrap();
    (q, deq)
}

fn upload_q(b: &dyn Backend, n: usize, k: usize, dt: DType, q: &[u8]) -> Result<Tensor> {
    b.upload_blocks(&[n, k], dt, Blocks::Owned(q.to_vec()))
}

/// Which fused op a case runs.
#[derive(Clone, Copy, Debug)]
enum Op {
    Linear { bias: bool },
    Residual,
    NormLinear,
    GateUp,
    NormGateUp,
}

/// Runs `op` on `b`: inputs `x [m, k]`, weights `[n, k]` (gate, and up for the SwiGLU ops).
#[allow(clippy::too_many_arguments)]
fn run(b: &dyn Backend, op: Op, dt: DType, (m, n, k): (usize, usize, usize), x: &[f32], w: &[u8], up: &[u8], extra: &[f32]) -> Result<Vec<f32>> {
    let xt = b.upload_f32(&[m, k], x)?;
    let wt = upload_q(b, n, k, dt, w)?;
    let out = match op {
        Op::Linear { bias } => {
            let bt = if bias { Some(b.upload_f32(&[n], &extra[..n])?) } else { None };
            b.linear(&xt, &wt, bt.as_ref())?
        }
        Op::Residual => b.linear_residual(&xt, &wt, None, &b.upload_f32(&[m, n], &extra[..m * n])?)?,
        Op::NormLinear => b.rms_norm_linear(&xt, &b.upload_f32(&[k], &extra[..k])?, 1e-6, &wt, None)?,
        Op::GateUp => b.gate_up_silu(&xt, &wt, &upload_q(b, n, k, dt, up)?)?,
        Op::NormGateUp => b.rms_norm_gate_up_silu(&xt, &b.upload_f32(&[k], &extra[..k])?, 1e-6, &wt, &upload_q(b, n, k, dt, up)?)?,
    };
    assert_eq!(out.device(), b.kind(), "{:?}: the result must come from the backend under test", op);
    assert_eq!(out.shape(), &[m, n]);
    b.download_f32(&out)
}

/// One case's inputs: quantized weights (and their dequantized values), the SwiGLU up
/// weights, activations `[m, k]` and the extra inputs (bias, residual, norm weights), from
/// seeds `seed`, `seed + 1`, ... (distinct per case and type).
struct Case {
    w: Vec<u8>,
    wd: Vec<f32>,
    up: Vec<u8>,
    x: Vec<f32>,
    extra: Vec<f32>,
}

impl Case {
    fn new(dt: DType, (m, n, k): (usize, usize, usize), seed: u32) -> Case {
        let (w, wd) = weights(n, k, seed, dt);
        let (up, _) = weights(n, k, seed + 1, dt);
        Case { w, wd, up, x: random(m * k, seed + 2), extra: random((m * n).max(k).max(n), seed + 3) }
    }

    /// Runs `op` on the GPU `g` and on `cpu` and asserts the largest difference is within
    /// `tol` of the CPU result's std.
    fn agrees(&self, what: &str, g: &dyn Backend, cpu: &dyn Backend, op: Op, dt: DType, shape: (usize, usize, usize), tol: f64) {
        let want: Vec<f64> = run(cpu, op, dt, shape, &self.x, &self.w, &self.up, &self.extra).unwrap().iter().map(|&v| v as f64).collect();
        let got = run(g, op, dt, shape, &self.x, &self.w, &self.up, &self.extra).unwrap_or_else(|e| panic!("{}: {}", what, e));
        assert_within(what, &got, &want, tol);
    }
}

/// Every GPU module, every quantized type and every `(m, n, k)` of `shapes` whose `k` the type's
/// blocks divide: `check(module, g, dt, shape, case)` with the case's inputs drawn from `seed`
/// (outputs NaN-poisoned).
fn sweep(name: &str, shapes: &[(usize, usize, usize)], seed: u32, check: impl Fn(&str, &dyn Backend, DType, (usize, usize, usize), &Case)) {
    for g in &gpus(name) {
        g.set_poison_outputs(true);
        let module = common::kernels_arch(&**g).unwrap().to_string();
        for (ti, &dt) in TYPES.iter().enumerate() {
            for (i, &shape) in shapes.iter().enumerate() {
                if shape.2 % dt.block_size() != 0 {
                    continue;
                }
                let case = Case::new(dt, shape, seed + 4 * i as u32 + 100 * ti as u32);
                check(&module, &**g, dt, shape, &case);
            }
        }
    }
}

#[test]
fn quantized_linear_and_fused_ops_agree_with_the_cpu_int8_path() {
    let cpu = cpu();
    // rows from a decode step to past a 128-row tile; odd indices narrow and deeper
    let shapes: Vec<(usize, usize, usize)> = ROWS.iter().enumerate().map(|(i, &m)| if i % 2 == 0 { (m, 301, 512) } else { (m, 37, 256 * (1 + i % 3)) }).collect();
    sweep("quantized linear", &shapes, 10, |module, g, dt, (m, n, k), case| {
        let ops = [Op::Linear { bias: n == 301 }, Op::Residual, Op::NormLinear, Op::GateUp, Op::NormGateUp];
        for op in ops {
            let what = format!("{} {:?} {} m={} n={} k={}", module, op, dt, m, n, k);
            case.agrees(&what, g, &*cpu, op, dt, (m, n, k), if m <= 8 { DECODE_TOL } else { PREFILL_TOL });
        }
        if m > 8 {
            // the prefill path against the exact product of the dequantized weights
            let what = format!("{} f64 reference {} m={} n={} k={}", module, dt, m, n, k);
            let (x, wd) = (&case.x, &case.wd);
            let want: Vec<f64> = (0..m * n).map(|e| (0..k).map(|i| x[(e / n) * k + i] as f64 * wd[(e % n) * k + i] as f64).sum()).collect();
            let got = run(g, Op::Linear { bias: false }, dt, (m, n, k), &case.x, &case.w, &case.up, &case.extra).unwrap();
            assert_within(&what, &got, &want, F16_TOL);
        }
    });
}

/// Decode rows at the model's depths and beyond the other cases': a 6,144-deep down
/// projection, three rows of one row group, four and one rows 10,240 deep (the activation
/// quantizer's grid spans several blocks), and, for `Q8_0`, rows of 96 values (whole blocks of
/// 32, not of 256: lanes past a row's end in the quantizer).
#[test]
fn quantized_gemvs_at_decode_depths_agree_with_the_cpu() {
    let cpu = cpu();
    let shapes = [(1, 64, 6144), (3, 40, 2048), (4, 37, 10240), (1, 37, 10240), (2, 33, 96)];
    sweep("quantized GEMV depths", &shapes, 50, |module, g, dt, (m, n, k), case| {
        for op in [Op::Linear { bias: true }, Op::Residual, Op::NormLinear, Op::NormGateUp] {
            let what = format!("{} {:?} {} m={} n={} k={}", module, op, dt, m, n, k);
            case.agrees(&what, g, &*cpu, op, dt, (m, n, k), DECODE_TOL);
        }
    });
}

/// Batched-decode sizes whose dequantized product splits `k` (the few-row kernel on compute_80
/// when its column blocks leave multiprocessors idle; the SIMT tiles on compute_61): 16 and 32
/// rows of a narrow, deep layer, as a batch-16 step's down projection is.
#[test]
fn quantized_products_that_split_k_agree_with_the_cpu() {
    let cpu = cpu();
    sweep("quantized split-K", &[(16, 256, 2048), (32, 300, 1024)], 90, |module, g, dt, (m, n, k), case| {
        for op in [Op::Linear { bias: true }, Op::NormGateUp] {
            let what = format!("{} {:?} {} m={} n={} k={}", module, op, dt, m, n, k);
            case.agrees(&what, g, &*cpu, op, dt, (m, n, k), PREFILL_TOL);
        }
    });
}

#[test]
fn quantized_embedding_rows_equal_the_cpu_dequantization() {
    let cpu = cpu();
    for g in gpus("quantized embedding") {
        g.set_poison_outputs(true);
        for (ti, &dt) in TYPES.iter().enumerate() {
            let (vocab, hidden) = (301, 512);
            let (w, _) = weights(vocab, hidden, 50 + ti as u32, dt);
            let ids: Vec<u32> = vec![0, 300, 7, 7, 150, 299];
            let run = |b: &dyn Backend| -> Result<Vec<f32>> {
                let t = upload_q(b, vocab, hidden, dt, &w)?;
                let out = b.embedding_gather(&t, &b.upload_u32(&[ids.len()], &ids)?)?;
                assert_eq!(out.device(), b.kind());
                b.download_f32(&out)
            };
            let (want, got) = (run(&*cpu).unwrap(), run(&*g).unwrap());
            for (i, (a, b)) in got.iter().zip(&want).enumerate() {
                assert!((a - b).abs() <= 1e-6 * (1.0 + b.abs()), "{} embedding element {}: {} vs {}", dt, i, a, b);
            }
        }
    }
}

#[test]
fn bad_quantized_shapes_fail_before_launch() {
    for g in gpus("quantized bad shapes") {
        // a Q8_0 weight whose rows are not whole blocks cannot even be uploaded
        assert!(g.upload_blocks(&[2, 48], DType::Q8_0, Blocks::Owned(vec![0; 2 * 51])).is_err());
        let (w, _) = weights(4, 256, 1, DType::Q4K);
        let wt = upload_q(&*g, 4, 256, DType::Q4K, &w).unwrap();
        let x = g.upload_f32(&[1, 512], &random(512, 2)).unwrap();
        let e = g.linear(&x, &wt, None).err().expect("k mismatch must fail").to_string();
        assert!(e.contains("features"), "{}", e);
    }
}

/// Quantized text models (load-time `--quant q8_0` / `q4_k_m` of the fixtures) on each kernel
/// module against the same model on the CPU: the prompt's last logits within [`PREFILL_TOL`]
/// of their std (the GPU's prefill uses f32 activations, the CPU's 8-bit ones: the measured
/// worst is reported), and greedy continuations (recorded decode steps, where both run the
/// same int8 arithmetic) equal wherever the CPU's top two logits are not near-tied.
#[test]
fn quantized_models_on_cuda_match_the_cpu() {
    use qwen3_vl::generate::{Sampler, SamplingParams, Session};
    const STEPS: usize = 16;
    let gs = gpus("quantized models");
    if gs.is_empty() {
        return;
    }
    let cpu = cpu();
    let mut compared = 0;
    for case in ["tied_gqa", "untied_mha"] {
        let dir = common::repo_root().join("tests/fixtures/text").join(case);
        let load = |b: &dyn Backend, mix: Mix| -> Model {
            let opened = ModelFiles::Safetensors(dir.clone()).open().unwrap();
            Model::load_opened(&opened, Some(mix), b, &mut |_, _| {}).unwrap()
        };
        let prompt: Vec<u32> = (0..20).map(|i| (i * 37 % 200) as u32 + 3).collect();
        for mix in [Mix::Q8_0, Mix::Q4KM] {
            let cm = load(&*cpu, mix);
            let mut s = Session::with_kv_dtype(&cm, &*cpu, prompt.len() + STEPS, DType::F32).unwrap();
            let want_logits = s.feed(&prompt).unwrap();
            // the CPU's greedy continuation and its clear-margin prefix
            let (mut want, mut clear, mut logits) = (Vec::new(), None, want_logits.clone());
            for step in 0..STEPS {
                if clear.is_none() && common::top_two_within(&logits, 2e-2) {
                    clear = Some(step);
                }
                let t = qwen3_vl::generate::sampling::argmax(&logits);
                want.push(t);
                if step + 1 < STEPS {
                    logits = s.feed(&[t]).unwrap();
                }
            }
            let clear = clear.unwrap_or(STEPS);
            for g in &gs {
                let module = common::kernels_arch(&**g).unwrap();
                let gm = load(&**g, mix);
                let what = format!("{} {:?} on {}", case, mix, module);
                let mut s = Session::with_kv_dtype(&gm, &**g, prompt.len() + STEPS, DType::F16).unwrap();
                let got_logits = s.feed(&prompt).unwrap();
                assert_within(&format!("{} prompt logits", what), &got_logits, &want_logits.iter().map(|&v| v as f64).collect::<Vec<_>>(), PREFILL_TOL);
                let mut s = Session::with_kv_dtype(&gm, &**g, prompt.len() + STEPS, DType::F16).unwrap();
                s.set_recording(true);
                let got = s.generate(&prompt, STEPS, &mut Sampler::new(SamplingParams::greedy()), &[], &mut |_| true).unwrap().tokens;
                eprintln!("{}: greedy {:?} vs cpu {:?} (clear margin for {} steps)", what, got, want, clear);
                assert_eq!(&got[..clear], &want[..clear], "{}: greedy tokens", what);
                compared += clear;
                eprintln!("{}: weights {}", what, gm.text.weights_summary());
            }
        }
    }
    assert!(compared > 0, "no step had a clear margin");
}
