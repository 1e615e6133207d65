//! GGUF models against the same checkpoints with their weights dequantized to f32 and loaded
//! through the safetensors path ("ref"), on the CPU:
//!
//! * files written by the `gguf` package from PyPI (tests/gguf/make_gguf.py: the text fixtures
//!   in F32, F16, BF16 and Q8_0, llama.cpp's names, metadata and tokenizer layout), with the
//!   package's own dequantization as the reference;
//! * files written by `qwen3-vl quantize` (Q8_0 and the Q4_K / Q6_K mix of Q4_K_M, on a small
//!   checkpoint whose rows are whole 256-value super-blocks), dequantized by the package: our
//!   blocks must dequantize to the same bits there as here, and give the reference's logits.
//!
//! Tolerances (max |diff| of the last-position logits over the reference logits' std):
//! * F32 / F16 / BF16 weights: the same values in the same f32 arithmetic (the kernels widen
//!   them exactly), so only summation order may differ: [`FLOAT_TOL`].
//! * Q8_0 / Q4_K / Q6_K weights: the integer kernels also round every activation to 8 bits per
//!   block (error ≤ max|x| / 254 of the block, see `quant::act`), as llama.cpp does. That is
//!   the only difference from the reference (the kernels reproduce the integer math exactly:
//!   `cpu::qlinear`'s unit test holds them to 1e-4 relative), and it grows with the block: 32
//!   values against Q8_0 weights, 256 against the K-quants. On these tiny models (hidden 32 to
//!   256, where rounding noise barely averages out) the measured worst last-logit differences
//!   (QWEN3_VL_REPORT=1) are 4 to 6e-2 of std for Q8_0 on tied_gqa / untied_mha, 8.9e-2 on
//!   fullvocab (the worst of 152k logits of a 32-wide model), 8.7e-2 for the Q4_K_M mix (k256:
//!   one activation scale per 256-wide hidden state). [`INT8_TOL_Q8_0`] and [`INT8_TOL_K`]
//!   allow 0.15. The vision tower's outputs get the same bounds.

mod common;

use common::gguf::{fixture_with_tokenizer, make_gguf, python, python_fixtures, quantize, scratch};
use qwen3_vl::generate::Session;
use qwen3_vl::gguf::{names, Gguf};
use qwen3_vl::model::{Checkpoint, Mix, Model, ModelFiles};
use qwen3_vl::{Backend, DType, Tokenizer};
use serde_json::Value;
use std::path::{Path, PathBuf};

const FLOAT_TOL: f64 = 1e-4;
const INT8_TOL_Q8_0: f64 = 1.5e-1;
const INT8_TOL_K: f64 = 1.5e-1;

fn load_files(files: ModelFiles, quant: Option<Mix>, b: &dyn Backend) -> Model {
    let opened = files.open().unwrap_or_else(|e| panic!("{:?}: {}", files, e));
    Model::load_opened(&opened, quant, b, &mut |_, _| {}).unwrap_or_else(|e| panic!("{:?}: {}", files, e))
}

fn pair(text: &Path, mmproj: &Path) -> ModelFiles {
    ModelFiles::find(text, Some(mmproj)).unwrap()
}

fn logits(m: &Model, b: &dyn Backend, ids: &[u32]) -> Vec<f32> {
    Session::with_kv_dtype(m, b, ids.len(), DType::F32).unwrap().feed(ids).unwrap()
}

/// Token prompts of a text fixture.
fn prompts(case: &str) -> Vec<Vec<u32>> {
    let r: Value = serde_json::from_slice(&std::fs::read(common::repo_root().join("tests/fixtures/text").join(case).join("reference.json")).unwrap()).unwrap();
    r["prompts"].as_array().unwrap().iter().map(|p| p["ids"].as_array().unwrap().iter().map(|x| x.as_u64().unwrap() as u32).collect()).collect()
}

/// The text logits and the vision tower's outputs of `got` against `want`.
fn compare_models(what: &str, got: &Model, want: &Model, b: &dyn Backend, prompts: &[Vec<u32>], tol: f64) {
    for (i, p) in prompts.iter().enumerate() {
        common::assert_close_to_std(&format!("{} prompt {}", what, i), &logits(got, b, p), &logits(want, b, p), tol);
    }
    let v = &want.config.vision;
    let row = v.in_channels * v.temporal_patch_size * v.patch_size * v.patch_size;
    let grid = [1, 4, 4];
    let x = b.upload_f32(&[16, row], &common::random(16 * row, 7)).unwrap();
    let (g, w) = (got.vision.forward(b, &x, &[grid]).unwrap(), want.vision.forward(b, &x, &[grid]).unwrap());
    common::assert_close_to_std(&format!("{} image embeddings", what), &b.download_f32(&g.embeds).unwrap(), &b.download_f32(&w.embeds).unwrap(), tol);
    for (k, (a, c)) in g.deepstack.iter().zip(&w.deepstack).enumerate() {
        common::assert_close_to_std(&format!("{} deepstack {}", what, k), &b.download_f32(a).unwrap(), &b.download_f32(c).unwrap(), tol);
    }
}

#[test]
fn python_written_files_match_their_dequantized_checkpoints() {
    let dir = match python_fixtures("python_written_files") {
        Some(d) => d,
        None => return,
    };
    let b = common::cpu();
    for (case, ty) in [("tied_gqa", "F32"), ("tied_gqa", "F16"), ("tied_gqa", "Q8_0"), ("untied_mha", "BF16"), ("untied_mha", "Q8_0"), ("fullvocab", "F16"), ("fullvocab", "Q8_0")] {
        let d = dir.join(format!("{}-{}", case, ty));
        let got = load_files(pair(&d.join("model.gguf"), &d.join("mmproj.gguf")), None, &*b);
        let want = Model::load(&d.join("ref"), &*b, &mut |_, _| {}).unwrap();
        assert_eq!(got.config, want.config, "{}: the GGUF metadata gives the checkpoint's config", case);
        let tol = if ty == "Q8_0" { INT8_TOL_Q8_0 } else { FLOAT_TOL };
        compare_models(&format!("{} {}", case, ty), &got, &want, &*b, &prompts(case), tol);
    }
}

#[test]
fn python_q8_0_blocks_equal_ours() {
    let dir = match python_fixtures("python_q8_0_blocks") {
        Some(d) => d,
        None => return,
    };
    // tied_gqa is stored in f32: both quantizers see the same values
    let ck = Checkpoint::open(&common::repo_root().join("tests/fixtures/text/tied_gqa")).unwrap();
    let g = Gguf::open(&dir.join("tied_gqa-Q8_0/model.gguf")).unwrap();
    let mut checked = 0;
    for name in ck.names() {
        if let Some(t) = names::text_name(name).and_then(|n| g.tensor(&n)) {
            if t.dtype == DType::Q8_0 {
                let ours = qwen3_vl::quant::quantize_vec(DType::Q8_0, &ck.read_f32(name, &t.shape).unwrap()).unwrap();
                assert!(ours == g.bytes(t), "{}: our Q8_0 blocks differ from the gguf package's", t.name);
                checked += 1;
            }
        }
    }
    assert!(checked >= 10, "{} Q8_0 tensors compared", checked);
}

#[test]
fn tokenizer_in_gguf_matches_tokenizer_json() {
    let want = Tokenizer::from_file(&common::server::tokenizer()).unwrap();
    let texts = ["Hello, world! 你好，世界 🌍", "<|im_start|>user\n<|vision_start|><|image_pad|><|vision_end|>Describe.<|im_end|>\n", " \t\r\n  x  y", "'s'll'VE 123456 <think>ok</think>"];
    let mut files: Vec<PathBuf> = Vec::new();
    // ours: `quantize` exports the tokenizer.json of the directory
    let src = scratch("tok-src");
    fixture_with_tokenizer("fullvocab", &src);
    let out = scratch("tok-out");
    let ours = quantize(&src, &out, "f16").0;
    let template = Gguf::open(&ours).unwrap().get_str("tokenizer.chat_template").unwrap().map(str::to_string);
    let cfg: Value = serde_json::from_slice(&std::fs::read(common::repo_root().join("tests/fixtures/tokenizer/tokenizer_config.json")).unwrap()).unwrap();
    assert_eq!(template.as_deref(), cfg["chat_template"].as_str(), "quantize writes the chat template of tokenizer_config.json");
    files.push(ours);
    // the gguf package's, laid out as llama.cpp's converter does
    if let Some(d) = python_fixtures("tokenizer_in_gguf") {
        files.push(d.join("fullvocab-F16/model.gguf"));
    }
    for f in files {
        let got = Tokenizer::from_gguf(&Gguf::open(&f).unwrap()).unwrap();
        for t in texts {
            let ids = want.encode(t);
            assert_eq!(got.encode(t), ids, "{}: {:?}", f.display(), t);
            assert_eq!(got.decode(&ids, true).unwrap(), want.decode(&ids, true).unwrap());
            assert_eq!(got.decode(&ids, false).unwrap(), want.decode(&ids, false).unwrap());
        }
        for tok in ["<|im_end|>", "<|image_pad|>", "<think>"] {
            assert_eq!(got.token_to_id(tok), want.token_to_id(tok), "{}", tok);
            assert_eq!(got.is_special(want.token_to_id(tok).unwrap()), want.is_special(want.token_to_id(tok).unwrap()), "{}", tok);
        }
    }
}

/// Every tensor of our GGUF pair against the package's dequantization (bit for bit) and the
/// original f32 weights (within the type's error).
fn check_blocks(text: &Path, mmproj: &Path, reference: &Path, original: &Path) {
    let refck = Checkpoint::open(reference).unwrap();
    let orig = Checkpoint::open(original).unwrap();
    let cfg = qwen3_vl::model::Config::from_dir(original).unwrap();
    let (t, m) = (Gguf::open(text).unwrap(), Gguf::open(mmproj).unwrap());
    let mut seen = std::collections::HashSet::new();
    for name in refck.names() {
        let (g, gname) = match names::text_name(name) {
            Some(n) => (&t, n),
            None => match names::vision_name(name, &cfg.vision.deepstack_visual_indexes) {
                Some(n) => (&m, n),
                None => continue,
            },
        };
        let info = g.tensor(&gname).unwrap_or_else(|| panic!("{} missing", gname));
        let ours = qwen3_vl::quant::dequantize_vec(info.dtype, g.bytes(info), info.shape.iter().product()).unwrap();
        let theirs = refck.read_f32(name, &info.shape).unwrap();
        assert!(ours.iter().zip(&theirs).all(|(a, b)| a.to_bits() == b.to_bits()), "{} ({}): our dequantization differs from the gguf package's", gname, info.dtype);
        let x = orig.read_f32(name, &info.shape).unwrap();
        let (err, norm) = x.iter().zip(&ours).fold((0.0f64, 0.0f64), |(e, n), (a, b)| (e + ((a - b) as f64).powi(2), n + (*a as f64).powi(2)));
        let rel = (err / norm.max(1e-30)).sqrt();
        let bound = match info.dtype {
            DType::Q4K => 0.12,
            DType::Q6K => 0.03,
            DType::Q8_0 => 0.01,
            _ => 1e-3,
        };
        assert!(rel <= bound, "{} ({}): relative RMS error {:.4} over {}", gname, info.dtype, rel, bound);
        seen.insert(info.dtype);
    }
    eprintln!("checked {} + {}: types {:?}", text.display(), mmproj.display(), seen);
}

#[test]
fn our_quantizers_round_trip_through_the_package_and_give_the_reference_logits() {
    let dir = match python_fixtures("our_quantizers") {
        Some(d) => d,
        None => return,
    };
    let k256 = dir.join("k256");
    let b = common::cpu();
    let ids: Vec<Vec<u32>> = vec![vec![5, 17, 200, 33, 1000, 7], (0..40).map(|i| (i * 37 % 1000) as u32).collect()];
    for (ty, mix) in [("q4_k_m", Mix::Q4KM), ("q8_0", Mix::Q8_0)] {
        let out = scratch(&format!("ours-{}", ty));
        let (text, mmproj) = quantize(&k256, &out, ty);
        let reference = out.join("ref");
        make_gguf(python("our_quantizers").unwrap(), &["dequant".as_ref(), text.as_os_str(), mmproj.as_os_str(), k256.join("config.json").as_os_str(), reference.as_os_str()]);
        check_blocks(&text, &mmproj, &reference, &k256);
        let got = load_files(pair(&text, &mmproj), None, &*b);
        if mix == Mix::Q4KM {
            assert!(got.text.weights_summary().contains("q4_k") && got.text.weights_summary().contains("q6_k"), "{}", got.text.weights_summary());
        }
        let want = Model::load(&reference, &*b, &mut |_, _| {}).unwrap();
        compare_models(&format!("k256 {}", ty), &got, &want, &*b, &ids, if mix == Mix::Q8_0 { INT8_TOL_Q8_0 } else { INT8_TOL_K });
        // --quant at load gives the same weights as the files, so the same logits exactly
        let at_load = load_files(ModelFiles::Safetensors(k256.clone()), Some(mix), &*b);
        for p in &ids {
            assert_eq!(logits(&at_load, &*b, p), logits(&got, &*b, p), "--quant {} equals the {} files", ty, ty);
        }
    }
}

/// A Q8_0 GGUF pair written by `quantize` runs on CUDA (each kernel module) and gives the CPU's
/// logits within [`INT8_TOL_Q8_0`]: the GPU's prefill multiplies f32 activations with the
/// dequantized weights, the CPU's rounds them to 8 bits (tests/gpu_quant.rs has the kernel-level
/// bounds).
#[test]
fn quantized_gguf_on_cuda_matches_the_cpu() {
    let gpus = common::gpus("quantized gguf on cuda");
    if gpus.is_empty() {
        return;
    }
    let src = scratch("cuda-src");
    fixture_with_tokenizer("tied_gqa", &src);
    let out = scratch("cuda-out");
    let (text, mmproj) = quantize(&src, &out, "q8_0");
    let cpu = common::cpu();
    let ids: Vec<u32> = vec![5, 17, 200, 33, 100, 7];
    let want = logits(&load_files(pair(&text, &mmproj), None, &*cpu), &*cpu, &ids);
    for g in gpus {
        let got = logits(&load_files(pair(&text, &mmproj), None, &*g), &*g, &ids);
        common::assert_close_to_std(&format!("q8_0 gguf on {:?}", common::kernels_arch(&*g)), &got, &want, INT8_TOL_Q8_0);
    }
}
