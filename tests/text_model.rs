//! The text decoder against transformers: tiny random-weight checkpoints of the real
//! architecture (tests/fixtures/text, made by tools/make_fixtures.py) with the logits and greedy
//! continuations transformers computed. Runs on the CPU, and on the GPU when there is one.
//! Tolerance: max |diff| of logits under 1e-3 of the reference logits' std with an f32 KV cache
//! (f32 arithmetic: the CPU and both kernel modules' GEMMs), 1e-2 with an f16 cache or on the
//! compute_80 module, whose tensor-core attention rounds its operands to f16 (see
//! `common::logits_tolerance`); both cache types run on every backend and kernel module, and
//! greedy continuations (the top-1 token at every step) must match with either.

mod common;

use qwen3_vl::generate::chat::{render, Message};
use qwen3_vl::generate::{Sampler, SamplingParams, Session};
use qwen3_vl::model::rope::text_positions;
use qwen3_vl::model::text::cursor;
use qwen3_vl::model::{KvCache, Mix, Model};
use qwen3_vl::{Backend, DType, Tokenizer};
use serde_json::Value;
use std::path::PathBuf;

const CASES: &[&str] = &["tied_gqa", "untied_mha", "fullvocab"];

fn case_dir(case: &str) -> PathBuf {
    common::repo_root().join("tests/fixtures/text").join(case)
}

fn reference(case: &str) -> Value {
    serde_json::from_str(&std::fs::read_to_string(case_dir(case).join("reference.json")).unwrap()).unwrap()
}

fn read_f32(case: &str, file: &str) -> Vec<f32> {
    std::fs::read(case_dir(case).join(file)).unwrap().chunks_exact(4).map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect()
}

fn ids(v: &Value) -> Vec<u32> {
    v.as_array().unwrap().iter().map(|x| x.as_u64().unwrap() as u32).collect()
}

fn assert_logits_close(what: &str, b: &dyn Backend, got: &[f32], want: &[f32]) {
    common::assert_close_to_std(what, got, want, common::logits_tolerance(b, DType::F32));
}

fn load(case: &str, b: &dyn Backend) -> Model {
    Model::load(&case_dir(case), b, &mut |_, _| {}).unwrap_or_else(|e| panic!("{}: {}", case, e))
}

#[test]
fn last_position_logits_match_transformers() {
    for b in common::backends("text logits") {
        for case in CASES {
            let (r, model) = (reference(case), load(case, &*b));
            for (i, p) in r["prompts"].as_array().unwrap().iter().enumerate() {
                let prompt = ids(&p["ids"]);
                let want = read_f32(case, p["last_logits_file"].as_str().unwrap());
                for kv in common::KV_DTYPES {
                    let mut s = Session::with_kv_dtype(&model, &*b, prompt.len(), kv).unwrap();
                    let got = s.feed(&prompt).unwrap();
                    common::assert_close_to_std(&format!("{} prompt {} on {}, {} cache", case, i, b.describe(), kv), &got, &want, common::logits_tolerance(&*b, kv));
                }
            }
        }
    }
}

#[test]
fn every_position_matches_transformers() {
    for b in common::backends("text all positions") {
        for case in ["tied_gqa", "untied_mha"] {
            let (r, model) = (reference(case), load(case, &*b));
            for p in r["prompts"].as_array().unwrap().iter().filter(|p| p.get("all_logits_file").is_some()) {
                let prompt = ids(&p["ids"]);
                let mut cache = KvCache::new(&*b, &model.config.text, prompt.len(), DType::F32).unwrap();
                let x = model.text.embed(&*b, &prompt).unwrap();
                let cur = cursor(&*b, &text_positions(0, prompt.len()), 0).unwrap();
                let h = model.text.forward(&*b, x, &cur, &mut cache, None).unwrap();
                let got = b.download_f32(&model.text.logits(&*b, &h).unwrap()).unwrap();
                let want = read_f32(case, p["all_logits_file"].as_str().unwrap());
                assert_logits_close(&format!("{} all positions on {}", case, b.describe()), &*b, &got, &want);
            }
        }
    }
}

#[test]
fn greedy_continuations_and_cached_step_logits_match_transformers() {
    for b in common::backends("text greedy") {
        for case in CASES {
            let (r, model) = (reference(case), load(case, &*b));
            for (i, p) in r["prompts"].as_array().unwrap().iter().enumerate() {
                let prompt = ids(&p["ids"]);
                let want = ids(&p["greedy_ids"]);
                for kv in common::KV_DTYPES {
                    // decode steps recorded and replayed where the backend can, and plain
                    for record in [true, false] {
                        let mut s = Session::with_kv_dtype(&model, &*b, prompt.len() + want.len(), kv).unwrap();
                        s.set_recording(record);
                        let mut sampler = Sampler::new(SamplingParams::greedy());
                        let g = s.generate(&prompt, want.len(), &mut sampler, &[], &mut |_| true).unwrap();
                        assert_eq!(g.tokens, want, "{} prompt {} on {}, {} cache, recording {}", case, i, b.describe(), kv, record);
                    }
                    if let Some(f) = p.get("step_logits_file") {
                        // replay with the KV cache: feed the prompt, then each greedy token
                        let steps = read_f32(case, f.as_str().unwrap());
                        let vocab = steps.len() / want.len();
                        let mut s = Session::with_kv_dtype(&model, &*b, prompt.len() + want.len(), kv).unwrap();
                        let mut logits = s.feed(&prompt).unwrap();
                        for (k, &t) in want.iter().enumerate() {
                            let what = format!("{} step {} on {}, {} cache", case, k, b.describe(), kv);
                            common::assert_close_to_std(&what, &logits, &steps[k * vocab..(k + 1) * vocab], common::logits_tolerance(&*b, kv));
                            if k + 1 < want.len() {
                                logits = s.feed(&[t]).unwrap();
                            }
                        }
                    }
                }
            }
        }
    }
}

#[test]
fn chat_prompts_tokenize_like_transformers() {
    let tok = Tokenizer::from_file(&common::repo_root().join("tests/fixtures/tokenizer/tokenizer.json")).unwrap();
    let r = reference("fullvocab");
    for p in r["prompts"].as_array().unwrap() {
        let text = render(&[Message::user(p["text"].as_str().unwrap())], true);
        assert_eq!(text, p["rendered"].as_str().unwrap());
        assert_eq!(tok.encode(&text), ids(&p["ids"]), "{}", text);
    }
}

#[test]
fn a_prompt_fed_in_pieces_gives_the_same_logits_as_in_one_go() {
    // multi-turn chat feeds each turn onto the cache of the previous ones
    for b in common::backends("text pieces") {
        let model = load("untied_mha", &*b);
        let prompt = ids(&reference("untied_mha")["prompts"][3]["ids"]);
        let mut whole = Session::new(&model, &*b, prompt.len()).unwrap();
        let want = whole.feed(&prompt).unwrap();
        let mut parts = Session::new(&model, &*b, prompt.len()).unwrap();
        parts.feed(&prompt[..7]).unwrap();
        parts.feed(&prompt[7..19]).unwrap();
        let got = parts.feed(&prompt[19..]).unwrap();
        assert_logits_close(&format!("pieces on {}", b.describe()), &*b, &got, &want);
    }
}

#[test]
fn an_f16_checkpoint_gives_the_reference_logits() {
    // the fixture's weights are bf16-representable, so converting them to f16 is exact for
    // all but vanishingly small values: the f16 path must reproduce the reference
    let dir = common::f16_copy(&case_dir("tied_gqa"), "f16", &|_, _| {});
    let r = reference("tied_gqa");
    for b in common::backends("f16 checkpoint") {
        let model = Model::load(&dir, &*b, &mut |_, _| {}).unwrap();
        for p in r["prompts"].as_array().unwrap() {
            let prompt = ids(&p["ids"]);
            for kv in common::KV_DTYPES {
                let got = Session::with_kv_dtype(&model, &*b, prompt.len(), kv).unwrap().feed(&prompt).unwrap();
                let what = format!("f16 tied_gqa on {}, {} cache", b.describe(), kv);
                common::assert_close_to_std(&what, &got, &read_f32("tied_gqa", p["last_logits_file"].as_str().unwrap()), common::logits_tolerance(&*b, kv));
            }
        }
    }
}

#[test]
fn massive_attention_values_give_the_f32_answer_through_f16_caches() {
    // layer 0's input norm ×1000 and its v_proj ×100: its values reach 10^5 and more, past
    // f16's 65504 (q and k are RMS-normed per head after their projections, so the scores are
    // those of the fixture). An f16 KV cache keeps them with row scales; the reference is the
    // CPU with an f32 cache. Prefill and a decode step (the last token fed alone), every
    // backend and module, both cache types, f16 weights and Q8_0 / Q4_K_M ones.
    const NORM: &str = "model.language_model.layers.0.input_layernorm.weight";
    const V: &str = "model.language_model.layers.0.self_attn.v_proj.weight";
    let edit = |name: &str, v: &mut [f32]| match name {
        NORM => v.iter_mut().for_each(|x| *x *= 1000.0),
        V => v.iter_mut().for_each(|x| *x *= 100.0),
        _ => {}
    };
    let dir = common::f16_copy(&case_dir("tied_gqa"), "massive-v", &edit);
    let r = reference("tied_gqa");
    // the values do pass f16's range: layer 0's v of the prompts' tokens, from the weights
    let bytes = std::fs::read(dir.join("model.safetensors")).unwrap();
    let st = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    let get = |n: &str| common::f16_tensor(&st, n);
    let ((es, emb), (_, g), (vs, wv)) = (get("model.language_model.embed_tokens.weight"), get(NORM), get(V));
    let hidden = es[1];
    let mut v_max = 0.0f32;
    for p in r["prompts"].as_array().unwrap() {
        for &id in &ids(&p["ids"]) {
            let x = &emb[id as usize * hidden..(id as usize + 1) * hidden];
            let rms = (x.iter().map(|v| v * v).sum::<f32>() / hidden as f32 + 1e-6).sqrt();
            for o in 0..vs[0] {
                let dot: f32 = (0..hidden).map(|i| x[i] / rms * g[i] * wv[o * hidden + i]).sum();
                v_max = v_max.max(dot.abs());
            }
        }
    }
    assert!(v_max > 65504.0 * 2.0, "the fixture's values ({}) stay inside f16's range", v_max);
    let cpu = common::cpu();
    let files = qwen3_vl::model::ModelFiles::Safetensors(dir.to_path_buf()).open().unwrap();
    // the weights as stored (f16), and quantized while loading: each against the CPU on the
    // same weights (quantized: within the quantized prefill bound of tests/gpu_quant.rs, 0.15
    // of the std)
    for mix in [None, Some(Mix::Q8_0), Some(Mix::Q4KM)] {
        let want_model = Model::load_opened(&files, mix, &*cpu, &mut |_, _| {}).unwrap();
        for b in common::backends("massive attention values") {
            let model = Model::load_opened(&files, mix, &*b, &mut |_, _| {}).unwrap();
            for p in r["prompts"].as_array().unwrap() {
                let prompt = ids(&p["ids"]);
                let n = prompt.len();
                let want = Session::with_kv_dtype(&want_model, &*cpu, n, DType::F32).unwrap().feed(&prompt).unwrap();
                assert!(want.iter().all(|v| v.is_finite()));
                for kv in common::KV_DTYPES {
                    let mut s = Session::with_kv_dtype(&model, &*b, n, kv).unwrap();
                    if n > 1 {
                        s.feed(&prompt[..n - 1]).unwrap();
                    }
                    let got = s.feed(&prompt[n - 1..]).unwrap();
                    let what = format!("massive values, {:?} weights on {}, {} cache, {} tokens", mix, b.describe(), kv, n);
                    // (quantized: the 8-bit activation grid of the CPU's path turns an f16
                    // cache's rounding into steps of max / 127, on the CPU too)
                    let tol = if mix.is_some() { 0.15 } else { common::logits_tolerance(&*b, kv) };
                    common::assert_close_to_std(&what, &got, &want, tol);
                }
            }
        }
    }
}

#[test]
fn massive_mlp_activations_in_every_weight_type_give_the_f32_answer() {
    // layer 0's post-attention norm scaled by 300: its MLP's down-projection input reaches
    // 2·10^5 to 5·10^5 at every token (as "massive activations" do in real LLMs), past f16's
    // 65504, which the f16 tensor-core GEMM's operand split and the dequantized-weight prefill
    // once overflowed. Both GPU modules against the CPU on the same weights: f16 and bf16 as
    // stored, and Q8_0 and Q4_K_M quantized while loading (the GPU's prefill dequantizes them to
    // f16 for its GEMM).
    let edit = |name: &str, v: &mut [f32]| {
        if name == "model.language_model.layers.0.post_attention_layernorm.weight" {
            v.iter_mut().for_each(|x| *x *= 300.0);
        }
    };
    let dir = common::f16_copy(&case_dir("tied_gqa"), "massive", &edit);
    let r = reference("tied_gqa");
    let cpu = common::cpu();
    let files = qwen3_vl::model::ModelFiles::Safetensors(dir.to_path_buf()).open().unwrap();
    let want_model = Model::load(&dir, &*cpu, &mut |_, _| {}).unwrap();
    let bf16_dir = common::half_copy(&case_dir("tied_gqa"), "massive-bf16", safetensors::Dtype::BF16, &edit);
    let want_bf16 = Model::load(&bf16_dir, &*cpu, &mut |_, _| {}).unwrap();
    let quant = [Mix::Q8_0, Mix::Q4KM];
    let want_q: Vec<Model> = quant.iter().map(|&m| Model::load_opened(&files, Some(m), &*cpu, &mut |_, _| {}).unwrap()).collect();
    let mut compared = 0;
    for b in common::gpus("massive activations, model") {
        let model = Model::load(&dir, &*b, &mut |_, _| {}).unwrap();
        let bf16 = Model::load(&bf16_dir, &*b, &mut |_, _| {}).unwrap();
        for p in r["prompts"].as_array().unwrap() {
            let prompt = ids(&p["ids"]);
            if prompt.len() <= 8 {
                continue; // decode-sized inputs take the GEMV paths, f32 activations throughout
            }
            let want = Session::with_kv_dtype(&want_model, &*cpu, prompt.len(), DType::F32).unwrap().feed(&prompt).unwrap();
            assert!(want.iter().all(|v| v.is_finite()));
            let got = Session::with_kv_dtype(&model, &*b, prompt.len(), DType::F32).unwrap().feed(&prompt).unwrap();
            common::assert_close_to_std(&format!("massive f16 on {}", b.describe()), &got, &want, common::logits_tolerance(&*b, DType::F32));
            let want = Session::with_kv_dtype(&want_bf16, &*cpu, prompt.len(), DType::F32).unwrap().feed(&prompt).unwrap();
            let got = Session::with_kv_dtype(&bf16, &*b, prompt.len(), DType::F32).unwrap().feed(&prompt).unwrap();
            common::assert_close_to_std(&format!("massive bf16 on {}", b.describe()), &got, &want, common::logits_tolerance(&*b, DType::F32));
            // the CPU's quantized path rounds activations to 8 bits per block: the quantized
            // prefill bound of tests/gpu_quant.rs (0.15 of the std; an overflow was 4.9)
            for (&mix, want_model) in quant.iter().zip(&want_q) {
                let q = Model::load_opened(&files, Some(mix), &*b, &mut |_, _| {}).unwrap();
                let want = Session::with_kv_dtype(want_model, &*cpu, prompt.len(), DType::F32).unwrap().feed(&prompt).unwrap();
                assert!(want.iter().all(|v| v.is_finite()));
                let got = Session::with_kv_dtype(&q, &*b, prompt.len(), DType::F32).unwrap().feed(&prompt).unwrap();
                common::assert_close_to_std(&format!("massive {:?} on {}", mix, b.describe()), &got, &want, 0.15);
            }
            compared += 1;
        }
    }
    if common::gpu("massive activations, count").is_some() {
        assert!(compared > 0, "no prompt was long enough for the GEMM path");
    }
}
