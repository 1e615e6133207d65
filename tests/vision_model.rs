//! The vision tower, multimodal positions and image prompts against transformers
//! (tests/fixtures/vision, made by tools/make_vision_fixtures.py). Every stage is compared so a
//! failure points at its stage: pixel patches → patch+position embeddings → tower output and
//! DeepStack features → 3-axis positions → logits → greedy continuation. Runs on the CPU, and
//! on the GPU when there is one (each kernel module in turn). Tolerance: max |diff| under 1e-3
//! of the reference's std with f32 arithmetic; the tensor-core module's f16 attention operands
//! take `common::tower_tolerance` and `common::logits_tolerance`.

mod common;

use qwen3_vl::generate::{Sampler, SamplingParams, Session};
use qwen3_vl::model::positions::multimodal_positions;
use qwen3_vl::model::{Images, Model};
use qwen3_vl::Backend;
use serde_json::Value;
use std::path::PathBuf;

const CASES: &[&str] = &["one_image_exact", "one_image_resized", "two_images"];

fn dir() -> PathBuf {
    common::repo_root().join("tests/fixtures/vision")
}

fn case(name: &str) -> Value {
    serde_json::from_str(&std::fs::read_to_string(dir().join(format!("{}.json", name))).unwrap()).unwrap()
}

fn tensor(v: &Value) -> Vec<f32> {
    let bytes = std::fs::read(dir().join(v["file"].as_str().unwrap())).unwrap();
    let n: u64 = v["shape"].as_array().unwrap().iter().map(|x| x.as_u64().unwrap()).product();
    assert_eq!(bytes.len() as u64, n * 4);
    bytes.chunks_exact(4).map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect()
}

fn u32s(v: &Value) -> Vec<u32> {
    v.as_array().unwrap().iter().map(|x| x.as_u64().unwrap() as u32).collect()
}

fn grids(c: &Value) -> Vec<[usize; 3]> {
    c["image_grid_thw"].as_array().unwrap().iter().map(|g| {
        let g = u32s(g);
        [g[0] as usize, g[1] as usize, g[2] as usize]
    }).collect()
}

fn load(b: &dyn Backend) -> Model {
    Model::load(&dir().join("tiny"), b, &mut |_, _| {}).unwrap()
}

#[test]
fn multimodal_positions_match_get_rope_index() {
    let model = load(&*common::cpu());
    for name in CASES {
        let c = case(name);
        let (pos, next) = multimodal_positions(&u32s(&c["input_ids"]), model.config.vision_tokens(), &grids(&c), 2, 0).unwrap();
        let want: Vec<Vec<u32>> = c["position_ids"].as_array().unwrap().iter().map(u32s).collect();
        for (i, p) in pos.iter().enumerate() {
            assert_eq!(*p, [want[0][i], want[1][i], want[2][i]], "{} token {}", name, i);
        }
        assert_eq!(next as u64, c["next_position"].as_u64().unwrap(), "{}", name);
    }
}

#[test]
fn vision_tower_stages_match_transformers() {
    for b in common::backends("vision tower") {
        let model = load(&*b);
        for name in CASES {
            let c = case(name);
            let px = tensor(&c["pixel_values"]);
            let n = px.len() / 1536;
            let x = b.upload_f32(&[n, 1536], &px).unwrap();
            let g = grids(&c);
            if let Some(input) = c.get("vision_block_input") {
                let got = b.download_f32(&model.vision.embed_patches(&*b, &x, &g).unwrap()).unwrap();
                common::assert_close_to_std(&format!("{} patch+position embedding on {}", name, b.describe()), &got, &tensor(input), 1e-4);
            }
            let out = model.vision.forward(&*b, &x, &g).unwrap();
            common::assert_close_to_std(&format!("{} image embeds on {}", name, b.describe()), &b.download_f32(&out.embeds).unwrap(), &tensor(&c["image_embeds"]), common::tower_tolerance(&*b));
            let ds = c["deepstack_embeds"].as_array().unwrap();
            assert_eq!(out.deepstack.len(), ds.len());
            for (k, (got, want)) in out.deepstack.iter().zip(ds).enumerate() {
                common::assert_close_to_std(&format!("{} deepstack {} on {}", name, k, b.describe()), &b.download_f32(got).unwrap(), &tensor(want), common::tower_tolerance(&*b));
            }
        }
    }
}

#[test]
fn image_prompts_logits_and_greedy_continuations_match_transformers() {
    for b in common::backends("image prompts") {
        let model = load(&*b);
        for name in CASES {
            let c = case(name);
            let (ids, px, g) = (u32s(&c["input_ids"]), tensor(&c["pixel_values"]), grids(&c));
            let images = Images { patches: &px, row_len: 1536, grids: &g };
            let greedy = u32s(&c["greedy"]["ids"]);
            for kv in common::KV_DTYPES {
                let mut s = Session::with_kv_dtype(&model, &*b, ids.len() + greedy.len(), kv).unwrap();
                let logits = s.feed_with_images(&ids, Some(&images)).unwrap();
                common::assert_close_to_std(&format!("{} last logits on {}, {} cache", name, b.describe(), kv), &logits, &tensor(&c["last_logits"]), common::logits_tolerance(&*b, kv));
                // greedy decoding continues from the multimodal position offset
                let mut s = Session::with_kv_dtype(&model, &*b, ids.len() + greedy.len(), kv).unwrap();
                let mut sampler = Sampler::new(SamplingParams::greedy());
                let out = s.generate_with_images(&ids, Some(&images), greedy.len(), &mut sampler, &[], &mut |_| true).unwrap();
                assert_eq!(out.tokens, greedy, "{} greedy on {}, {} cache", name, b.describe(), kv);
            }
        }
    }
}

#[test]
fn several_images_in_one_batched_pass_match_image_by_image() {
    use qwen3_vl::model::VisionOutput;
    for b in common::backends("batched images") {
        let model = load(&*b);
        let c = case("two_images");
        let (ids, px, g) = (u32s(&c["input_ids"]), tensor(&c["pixel_values"]), grids(&c));
        assert!(g.len() > 1);
        let row = 1536;
        // one pass through the tower with a diagonal block per image
        let all = model.vision.forward(&*b, &b.upload_f32(&[px.len() / row, row], &px).unwrap(), &g).unwrap();
        // each image alone, the outputs concatenated in image order
        let mut at = 0;
        let (mut embeds, mut deepstack) = (Vec::new(), vec![Vec::new(); all.deepstack.len()]);
        for grid in &g {
            let n = grid[0] * grid[1] * grid[2];
            let one = model.vision.forward(&*b, &b.upload_f32(&[n, row], &px[at * row..(at + n) * row]).unwrap(), &[*grid]).unwrap();
            embeds.extend(b.download_f32(&one.embeds).unwrap());
            for (k, f) in one.deepstack.iter().enumerate() {
                deepstack[k].extend(b.download_f32(f).unwrap());
            }
            at += n;
        }
        // the same function; only the order of f32 sums (and, on tensor cores, where the f16
        // probabilities are rounded relative to the running maxima) differs
        let tol = if common::tensor_cores(&*b) { 2e-3 } else { 1e-5 };
        let what = |x: &str| format!("{} batched vs one by one on {}", x, b.describe());
        common::assert_close_to_std(&what("embeds"), &b.download_f32(&all.embeds).unwrap(), &embeds, tol);
        for (k, f) in all.deepstack.iter().enumerate() {
            common::assert_close_to_std(&what(&format!("deepstack {}", k)), &b.download_f32(f).unwrap(), &deepstack[k], tol);
        }
        // and the prompt's logits from either
        let shape = all.embeds.shape().to_vec();
        let separate = VisionOutput {
            embeds: b.upload_f32(&shape, &embeds).unwrap(),
            deepstack: deepstack.iter().map(|f| b.upload_f32(&shape, f).unwrap()).collect(),
        };
        // (an f32 cache: with an f16 one, inputs a rounding apart can round to f16 neighbours)
        let mut s = Session::with_kv_dtype(&model, &*b, ids.len(), qwen3_vl::DType::F32).unwrap();
        let want = s.feed_with_images(&ids, Some(&Images { patches: &px, row_len: row, grids: &g })).unwrap();
        let mut s = Session::with_kv_dtype(&model, &*b, ids.len(), qwen3_vl::DType::F32).unwrap();
        let got = s.feed_encoded(&ids, &g, Some(&separate)).unwrap();
        common::assert_close_to_std(&what("last logits"), &got, &want, tol * 10.0);
    }
}

#[test]
fn image_placeholders_must_match_the_images() {
    let b = common::cpu();
    let model = load(&*b);
    let c = case("one_image_exact");
    let (ids, px, g) = (u32s(&c["input_ids"]), tensor(&c["pixel_values"]), grids(&c));
    let mut s = Session::new(&model, &*b, 64).unwrap();
    // placeholders without an image
    let e = s.feed(&ids).unwrap_err().to_string();
    assert!(e.contains("image"), "{}", e);
    // an image whose grid needs more placeholders than the prompt has
    let wrong = [[1, 6, 6]];
    let px2 = vec![0.0f32; 36 * 1536];
    let e = s.feed_with_images(&ids, Some(&Images { patches: &px2, row_len: 1536, grids: &wrong })).unwrap_err().to_string();
    assert!(e.contains("image 1 needs 9"), "{}", e);
    // patch rows that do not match the grid
    let e = s.feed_with_images(&ids, Some(&Images { patches: &px[..1536 * 10], row_len: 1536, grids: &g })).unwrap_err().to_string();
    assert!(e.contains("grids"), "{}", e);
}

#[test]
fn image_files_through_preprocessing_give_transformers_logits() {
    use qwen3_vl::image::{load_image, preprocess, PreprocessConfig};
    let b = common::cpu();
    let model = load(&*b);
    let cfg = PreprocessConfig::from_file(&dir().join("tiny/preprocessor_config.json")).unwrap();
    for name in CASES {
        let c = case(name);
        let (mut patches, mut grids_got) = (Vec::new(), Vec::new());
        let mut resampled = false;
        for im in c["images"].as_array().unwrap() {
            let p = preprocess(&load_image(&dir().join(im["file"].as_str().unwrap())).unwrap(), &cfg).unwrap();
            resampled |= im["resampled"].as_bool().unwrap();
            grids_got.push(p.grid_thw);
            patches.extend_from_slice(&p.patches);
        }
        assert_eq!(grids_got, grids(&c), "{}", name);
        // sides that are multiples of 32 are not resampled: agree like the text model;
        // resampled images within 1e-2 of the std
        let tol = if resampled { 1e-2 } else { 1e-3 };
        common::assert_close_to_std(&format!("{} pixel patches", name), &patches, &tensor(&c["pixel_values"]), tol);
        let ids = u32s(&c["input_ids"]);
        let mut s = Session::new(&model, &*b, ids.len()).unwrap();
        let logits = s.feed_with_images(&ids, Some(&Images { patches: &patches, row_len: 1536, grids: &grids_got })).unwrap();
        common::assert_close_to_std(&format!("{} logits from image files", name), &logits, &tensor(&c["last_logits"]), tol);
    }
}

#[test]
fn massive_vision_mlp_activations_give_the_f32_answer() {
    // block 0 of the tower: its second LayerNorm's bias at 100 and its fc1 weights ×1500, so the
    // fc1 output (the fc2 GEMM's input after GELU) passes 2·65504 in some channel at every patch
    // (bounded below from the weights: |normalized · weight| <= sqrt(dim) · max |weight|), and
    // the residual stream after it. f16 weights on every GPU module against the CPU (f32
    // arithmetic) on the same weights: image embeds, DeepStack features and the image prompt's
    // logits; the tower as Q8_0 too. (Attention values past f16's range in the tower: tests/gpu_attention.rs.)
    const N2B: &str = "model.visual.blocks.0.norm2.bias";
    const N2W: &str = "model.visual.blocks.0.norm2.weight";
    const FC1: &str = "model.visual.blocks.0.mlp.linear_fc1.weight";
    const FC1B: &str = "model.visual.blocks.0.mlp.linear_fc1.bias";
    let model_dir = common::f16_copy(&dir().join("tiny"), "vision-massive", &|name, v| match name {
        N2B => v.iter_mut().for_each(|x| *x = 100.0),
        FC1 => v.iter_mut().for_each(|x| *x *= 1500.0),
        _ => {}
    });
    // the lower bound on some fc1 channel's output, from the stored (f16) weights
    let bytes = std::fs::read(model_dir.join("model.safetensors")).unwrap();
    let st = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    let get = |n: &str| common::f16_tensor(&st, n);
    let ((s1, w1), (_, b1), (_, g), (_, nb)) = (get(FC1), get(FC1B), get(N2W), get(N2B));
    let (out_c, dim) = (s1[0], s1[1]);
    let g_max = g.iter().fold(0.0f32, |m, x| m.max(x.abs()));
    let bound = (0..out_c)
        .map(|c| {
            let row = &w1[c * dim..(c + 1) * dim];
            let shift: f32 = row.iter().zip(&nb).map(|(w, b)| w * b).sum();
            let spread: f32 = row.iter().map(|w| w.abs()).sum::<f32>() * (dim as f32).sqrt() * g_max;
            shift.abs() - spread - b1[c].abs()
        })
        .fold(0.0f32, f32::max);
    assert!(bound > 2.0 * 65504.0, "the fixture's fc1 outputs ({} at least) stay inside f16's range", bound);
    let cpu = common::cpu();
    let want_model = Model::load(&model_dir, &*cpu, &mut |_, _| {}).unwrap();
    let c = case("one_image_exact");
    let (ids, px, g) = (u32s(&c["input_ids"]), tensor(&c["pixel_values"]), grids(&c));
    let n = px.len() / 1536;
    let images = Images { patches: &px, row_len: 1536, grids: &g };
    let tower = |m: &Model, b: &dyn Backend| -> Vec<Vec<f32>> {
        let out = m.vision.forward(b, &b.upload_f32(&[n, 1536], &px).unwrap(), &g).unwrap();
        let mut v = vec![b.download_f32(&out.embeds).unwrap()];
        v.extend(out.deepstack.iter().map(|d| b.download_f32(d).unwrap()));
        v
    };
    let want_tower = tower(&want_model, &*cpu);
    let want_logits = Session::with_kv_dtype(&want_model, &*cpu, ids.len(), qwen3_vl::DType::F32).unwrap().feed_with_images(&ids, Some(&images)).unwrap();
    assert!(want_tower.iter().flatten().chain(&want_logits).all(|x| x.is_finite()));
    // the tower quantized to Q8_0 while loading (what a 2 GiB budget does to an F16 mmproj), on
    // the CPU and the GPUs alike: within the quantized bound of tests/gpu_quant.rs (0.15 of the
    // std), the CPU's activations being 8-bit where the GPU's are not
    let files = qwen3_vl::model::ModelFiles::Safetensors(model_dir.to_path_buf()).open().unwrap();
    let q8 = qwen3_vl::model::LoadQuant { mix: None, vision_q8: true };
    let want_q8_model = Model::load_placed(&files, q8, &*cpu, None, &mut |_, _| {}).unwrap();
    let want_q8 = tower(&want_q8_model, &*cpu);
    assert!(want_q8.iter().flatten().all(|x| x.is_finite()));
    for b in common::gpus("massive vision activations") {
        let model = Model::load(&model_dir, &*b, &mut |_, _| {}).unwrap();
        for (k, (got, want)) in tower(&model, &*b).iter().zip(&want_tower).enumerate() {
            common::assert_close_to_std(&format!("massive tower output {} on {}", k, b.describe()), got, want, common::tower_tolerance(&*b));
        }
        for kv in common::KV_DTYPES {
            let got = Session::with_kv_dtype(&model, &*b, ids.len(), kv).unwrap().feed_with_images(&ids, Some(&images)).unwrap();
            common::assert_close_to_std(&format!("massive vision, logits on {}, {} cache", b.describe(), kv), &got, &want_logits, common::logits_tolerance(&*b, kv));
        }
        let model = Model::load_placed(&files, q8, &*b, None, &mut |_, _| {}).unwrap();
        for (k, (got, want)) in tower(&model, &*b).iter().zip(&want_q8).enumerate() {
            common::assert_close_to_std(&format!("massive Q8_0 tower output {} on {}", k, b.describe()), got, want, 0.15);
        }
    }
}
