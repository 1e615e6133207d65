//! A model split over a device and the host (`--gpu-memory`, `--gpu-layers`): the split runs
//! the same ops as the whole model, the hidden state crossing between backends, so on two CPU
//! backends a split run equals the unsplit one exactly, for every placement. The size estimate
//! the plan is made from equals the bytes the loaded parts take. On a GPU (skipped without
//! one): a budget below the smallest placement fails with the bytes; a budget that forces a
//! split gives the unsplit run's greedy tokens and logits within the GPU/CPU tolerance, and the
//! pool's peak stays under the budget; an allocation past the pool's cap fails clearly.

mod common;

use qwen3_vl::engine::{Engine, EngineConfig, ImageInput, Request};
use qwen3_vl::generate::{Sampler, SamplingParams, Session};
use qwen3_vl::model::{Images, LoadQuant, Mix, Model, ModelFiles, Offload, Placement, Sizes};
use qwen3_vl::{Backend, DType, Error};
use serde_json::Value;
use std::path::PathBuf;
use std::sync::Arc;

fn text_dir(case: &str) -> PathBuf {
    common::repo_root().join("tests/fixtures/text").join(case)
}

fn vision_dir() -> PathBuf {
    common::repo_root().join("tests/fixtures/vision")
}

fn load(dir: &PathBuf, device: &dyn Backend, host: &Arc<dyn Backend>, place: Option<&Placement>) -> Model {
    let opened = ModelFiles::Safetensors(dir.clone()).open().unwrap();
    let offload = place.map(|p| Offload { host, placement: p });
    Model::load_placed(&opened, LoadQuant::default(), device, offload, &mut |_, _| {}).unwrap_or_else(|e| panic!("{}: {}", dir.display(), e))
}

/// Placements worth trying on a model of `n` layers: each layer boundary, head or vision or
/// embedding alone on the host.
fn placements(n: usize) -> Vec<Placement> {
    let mut v = Vec::new();
    for g in 0..n {
        let mut p = Placement::all_on_device(n);
        p.device_layers = g;
        p.head_on_device = g % 2 == 0;
        p.embed_on_device = g % 2 == 0;
        p.vision_on_device = g % 2 == 1;
        v.push(p);
    }
    let mut head = Placement::all_on_device(n);
    head.head_on_device = false;
    head.embed_on_device = false;
    v.push(head);
    let mut vision = Placement::all_on_device(n);
    vision.vision_on_device = false;
    v.push(vision);
    // host layers streamed through the device (every forward, so decode steps too)
    for g in [0, n / 2] {
        let mut p = Placement::all_on_device(n);
        p.device_layers = g;
        p.stream_rows = Some(1);
        v.push(p);
    }
    v
}

/// Prompt logits and a greedy continuation (a session's; the engine's, run alone as `generate`
/// runs it, in blocks of 4 and prefill chunks of 5 rows, must give the same tokens).
fn run(model: &Model, b: &dyn Backend, prompt: &[u32], images: Option<&Images<'_>>, kv: DType, steps: usize) -> (Vec<f32>, Vec<u32>) {
    let mut s = Session::with_kv_dtype(model, b, prompt.len() + steps, kv).unwrap();
    let logits = s.feed_with_images(prompt, images).unwrap();
    s.reset();
    let g = s.generate_with_images(prompt, images, steps, &mut Sampler::new(SamplingParams::greedy()), &[], &mut |_| true).unwrap();
    drop(s); // one cache at a time (the GPU tests hold a budget)
    let mut cfg = EngineConfig::new(1, prompt.len() + steps, kv);
    cfg.block = 4;
    cfg.max_prefill_tokens = 5;
    let mut e = Engine::new(model, b, cfg).unwrap();
    let input = images.map(|im| ImageInput::flat(im.patches.to_vec(), im.row_len, im.grids.to_vec()));
    let req = Request { prompt: prompt.to_vec(), images: input, max_new: steps, sampler: Sampler::new(SamplingParams::greedy()), stop_ids: vec![] };
    assert_eq!(e.generate(req, &mut |_| true).unwrap().tokens, g.tokens, "the engine against the session");
    (logits, g.tokens)
}

/// Greedy tokens of two requests through one engine, the second added after the first's
/// prefill, so that steps mix a decode row with a prefill chunk.
fn two_at_once(model: &Model, b: &dyn Backend, kv: DType, prompts: [&[u32]; 2], steps: usize) -> Vec<Vec<u32>> {
    let mut cfg = EngineConfig::new(2, 256, kv);
    cfg.block = 4;
    cfg.max_prefill_tokens = 5;
    let mut e = Engine::new(model, b, cfg).unwrap();
    let req = |p: &[u32]| Request { prompt: p.to_vec(), images: None, max_new: steps, sampler: Sampler::new(SamplingParams::greedy()), stop_ids: vec![] };
    let mut out = vec![Vec::new(), Vec::new()];
    e.add(req(prompts[0])).unwrap();
    let mut added = false;
    while e.has_work() {
        for ev in e.step().unwrap() {
            if let qwen3_vl::engine::Event::Token { id, token, .. } = ev {
                out[id as usize].push(token);
            }
        }
        if !added {
            e.add(req(prompts[1])).unwrap();
            added = true;
        }
    }
    out
}

/// The tiny vision fixture's model files, opened.
fn tiny_vision() -> qwen3_vl::model::Opened {
    ModelFiles::Safetensors(vision_dir().join("tiny")).open().unwrap()
}

fn vision_case() -> (Vec<u32>, Vec<f32>, usize, Vec<[usize; 3]>) {
    let c: Value = serde_json::from_str(&std::fs::read_to_string(vision_dir().join("one_image_exact.json")).unwrap()).unwrap();
    let ids: Vec<u32> = c["input_ids"].as_array().unwrap().iter().map(|x| x.as_u64().unwrap() as u32).collect();
    let px: Vec<f32> = std::fs::read(vision_dir().join(c["pixel_values"]["file"].as_str().unwrap())).unwrap().chunks_exact(4).map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]])).collect();
    let grids: Vec<[usize; 3]> = c["image_grid_thw"].as_array().unwrap().iter().map(|g| {
        let g: Vec<usize> = g.as_array().unwrap().iter().map(|x| x.as_u64().unwrap() as usize).collect();
        [g[0], g[1], g[2]]
    }).collect();
    let patches: usize = grids.iter().map(|g| g[0] * g[1] * g[2]).sum();
    let row = px.len() / patches;
    (ids, px, row, grids)
}

#[test]
fn split_on_two_cpu_backends_equals_the_whole_model() {
    let (device, host) = (common::cpu(), common::cpu());
    for case in ["tied_gqa", "untied_mha"] {
        let dir = text_dir(case);
        let whole = load(&dir, &*device, &host, None);
        let prompt: Vec<u32> = (0..9).map(|i| (i * 37 + 5) % whole.config.text.vocab_size as u32).collect();
        for kv in [DType::F32, DType::F16] {
            let want = run(&whole, &*device, &prompt, None, kv, 6);
            for p in placements(whole.config.text.num_hidden_layers) {
                let split = load(&dir, &*device, &host, Some(&p));
                assert!(split.is_split());
                assert_eq!(run(&split, &*device, &prompt, None, kv, 6), want, "{} {} cache, {}", case, kv, p.describe());
                let other: Vec<u32> = prompt.iter().rev().copied().collect();
                let want2 = run(&whole, &*device, &other, None, kv, 6).1;
                assert_eq!(two_at_once(&split, &*device, kv, [&prompt, &other], 6), vec![want.1.clone(), want2], "two at once, {} {} cache, {}", case, kv, p.describe());
                assert_eq!(split.text.streamed_layers() > 0, p.stream_rows.is_some(), "{}", p.describe());
            }
        }
    }
    // image + text: the vision tower and DeepStack features cross too
    let (ids, px, row, grids) = vision_case();
    let images = Images { patches: &px, row_len: row, grids: &grids };
    let whole = load(&vision_dir().join("tiny"), &*device, &host, None);
    let want = run(&whole, &*device, &ids, Some(&images), DType::F32, 4);
    for p in placements(whole.config.text.num_hidden_layers) {
        let split = load(&vision_dir().join("tiny"), &*device, &host, Some(&p));
        assert_eq!(run(&split, &*device, &ids, Some(&images), DType::F32, 4), want, "image prompt, {}", p.describe());
        assert_eq!(split.text.streamed_layers() > 0, p.stream_rows.is_some(), "{}", p.describe());
    }
}

#[test]
fn size_estimate_equals_the_loaded_bytes() {
    let (device, host) = (common::cpu(), common::cpu());
    for dir in [text_dir("tied_gqa"), text_dir("untied_mha"), vision_dir().join("tiny")] {
        let opened = ModelFiles::Safetensors(dir.clone()).open().unwrap();
        let s = Sizes::estimate(&*opened.source, &opened.config, 16, 16, DType::F32, &|n| n, &|n| n);
        let n = opened.config.text.num_hidden_layers;
        // everything on the host but layer 0 and the head: each side's bytes are the estimate's
        let mut p = Placement::all_on_device(n);
        p.device_layers = 1;
        p.vision_on_device = false;
        if !s.tied {
            p.embed_on_device = false;
        }
        let m = load(&dir, &*device, &host, Some(&p));
        let (dev, off) = m.placed_bytes(&*device);
        let embed_off = if s.tied { 0 } else { s.embed };
        assert_eq!(dev, s.layers[0] + s.head, "{}", dir.display());
        assert_eq!(off, s.layers[1..].iter().sum::<usize>() + s.vision + embed_off, "{}", dir.display());
    }
    // quantized while loading: the estimate follows the types the mix gives
    let dir = text_dir("untied_mha");
    let opened = ModelFiles::Safetensors(dir.clone()).open().unwrap();
    let s = Model::sizes(&opened, LoadQuant::mix(Some(Mix::Q8_0)), &*device, 16, 16, DType::F32);
    let n = opened.config.text.num_hidden_layers;
    let mut p = Placement::all_on_device(n);
    p.device_layers = 1;
    let m = Model::load_placed(&opened, LoadQuant::mix(Some(Mix::Q8_0)), &*device, Some(Offload { host: &host, placement: &p }), &mut |_, _| {}).unwrap();
    assert!(m.text.weights_summary().contains("q8_0"), "{}", m.text.weights_summary());
    let (dev, off) = m.placed_bytes(&*device);
    assert_eq!((dev, off), (s.layers[0] + s.head + s.embed + s.vision, s.layers[1..].iter().sum::<usize>()));
}

#[test]
fn budget_errors_name_the_bytes() {
    let opened = ModelFiles::Safetensors(text_dir("tied_gqa")).open().unwrap();
    let s = Sizes::estimate(&*opened.source, &opened.config, 64, 64, DType::F16, &|n| n, &|n| n);
    let e = Placement::plan(&s, Some(s.text_work), None, false).unwrap_err();
    let msg = e.to_string();
    assert!(matches!(e, Error::Budget { .. }) && msg.contains(&s.text_work.to_string()) && msg.contains("smallest placement"), "{}", msg);
    let e = Placement::plan(&s, Some(s.text_work + s.layers[0] + s.kv_layer), Some(2), false).unwrap_err();
    assert!(e.to_string().contains("2 text layers"), "{}", e);
    // exactly one layer's worth: the layer gives way to the slot that streams every layer
    // through the device for prefills; nothing else fits
    let p = Placement::plan(&s, Some(s.text_work + s.layers[0] + s.kv_layer), None, false).unwrap();
    assert_eq!((p.device_layers, p.head_on_device, p.vision_on_device, p.stream_rows), (0, false, false, Some(qwen3_vl::model::STREAM_MIN_ROWS)));
}

/// The 2B's GPU checks on the vision fixture's model (text layers, tower, image prompt).
#[test]
fn gpu_budget_split_matches_unsplit_and_stays_under_budget() {
    let gpu = match common::gpu("gpu offload") {
        Some(g) => g,
        None => return,
    };
    let host = common::cpu();
    let (ids, px, row, grids) = vision_case();
    let images = Images { patches: &px, row_len: row, grids: &grids };
    let opened = tiny_vision();
    let ctx = ids.len() + 4;
    let s = Sizes::estimate(&*opened.source, &opened.config, ctx, ctx, DType::F32, &|n| gpu.alloc_size(n), &|n| gpu.weight_alloc_size(n));
    // 1. a budget under the smallest placement: a clear error before loading
    let e = Placement::plan(&s, Some(s.text_work), None, false).unwrap_err();
    assert!(e.to_string().contains("smallest placement"), "{}", e);
    // 2. the unsplit run, then one whose budget holds only the first layer
    let whole = Model::load_opened(&opened, None, &*gpu, &mut |_, _| {}).unwrap();
    let want = run(&whole, &*gpu, &ids, Some(&images), DType::F32, 4);
    drop(whole);
    // room for the first layer, the slot that streams the others, and half a layer more
    let slot = s.layers[1..].iter().copied().max().unwrap();
    let budget = s.text_work + s.layers[0] + s.kv_layer + slot + s.layers[1] / 2;
    let mut p = Placement::plan(&s, Some(budget), None, false).unwrap();
    assert_eq!((p.device_layers, p.stream_rows), (1, Some(qwen3_vl::model::STREAM_MIN_ROWS)), "{}", p.describe());
    p.stream_rows = Some(ids.len().min(qwen3_vl::model::STREAM_MIN_ROWS)); // the fixture's prompt is short
    let gpu2 = common::gpu("gpu offload").unwrap(); // a fresh pool, so its peak is this run's
    gpu2.set_memory_cap(Some(budget)).unwrap();
    let opened = tiny_vision();
    let split = Model::load_placed(&opened, LoadQuant::default(), &*gpu2, Some(Offload { host: &host, placement: &p }), &mut |_, _| {}).unwrap();
    let got = run(&split, &*gpu2, &ids, Some(&images), DType::F32, 4);
    assert!(split.text.streamed_layers() > 0, "the prompt streamed the host layers through the GPU");
    assert_eq!(got.1, want.1, "greedy tokens, split against whole");
    common::assert_close_to_std("split logits", &got.0, &want.0, common::logits_tolerance(&*gpu2, DType::F32));
    let peak = gpu2.memory_stats().peak;
    eprintln!("report: split peak {} bytes, budget {} bytes, placement {}", peak, budget, p.describe());
    assert!(peak <= budget, "peak {} over the budget {}", peak, budget);
}

#[test]
fn gpu_pool_cap_refuses_clearly() {
    let gpu = match common::gpu("gpu pool cap") {
        Some(g) => g,
        None => return,
    };
    gpu.set_memory_cap(Some(64 << 20)).unwrap();
    let e = gpu.zeros(&[32 << 20]).unwrap_err(); // 128 MiB
    let msg = e.to_string();
    assert!(matches!(e, Error::OutOfMemory { .. }) && msg.contains("budget") && msg.contains(&(64usize << 20).to_string()), "{}", msg);
    assert!(gpu.zeros(&[1 << 20]).is_ok(), "a small allocation under the cap");
}

/// The vision tower loaded as Q8_0 (what a budget may choose): only the tower's weights change
/// type, the size estimate follows, and the image prompt's logits stay within Q8_0's error of
/// the stored weights'.
#[test]
fn the_vision_tower_alone_loads_as_q8_0() {
    let cpu = common::cpu();
    let opened = tiny_vision();
    let (ids, px, row, grids) = vision_case();
    let images = Images { patches: &px, row_len: row, grids: &grids };
    let q8 = LoadQuant { mix: None, vision_q8: true };
    let plain = Model::sizes(&opened, LoadQuant::default(), &*cpu, 64, 64, DType::F32);
    let s8 = Model::sizes(&opened, q8, &*cpu, 64, 64, DType::F32);
    // (on the tiny tower the f32 norms and biases weigh more than on the 2B: 436 against 813 MB)
    assert!(s8.vision < plain.vision * 3 / 4, "tower {} as Q8_0 against {} stored", s8.vision, plain.vision);
    assert_eq!((s8.layers.clone(), s8.head), (plain.layers.clone(), plain.head), "the text model is untouched");
    let whole = Model::load_opened(&opened, None, &*cpu, &mut |_, _| {}).unwrap();
    let want = run(&whole, &*cpu, &ids, Some(&images), DType::F32, 4);
    let m = Model::load_placed(&opened, q8, &*cpu, None, &mut |_, _| {}).unwrap();
    assert!(!m.text.weights_summary().contains("q8_0"), "{}", m.text.weights_summary());
    assert_eq!(m.placed_bytes(&*cpu).0, s8.total() - s8.text_work.max(s8.vision_work) - s8.layers.len() * s8.kv_layer);
    let got = run(&m, &*cpu, &ids, Some(&images), DType::F32, 4);
    assert_ne!(got.0, want.0, "the tower's weights did not change");
    // measured: 6.2% of the std on this random tiny tower (one Q8_0 block per 32-wide row)
    common::assert_close_to_std("vision Q8_0 logits", &got.0, &want.0, 1e-1);
}

/// Image prompts under a budget that cannot hold everything: the vision tower goes first (as
/// Q8_0), text layers take the rest, the split run matches the same weights unsplit on the
/// CPU, and the device's peak stays under the budget (the tower's and the text's workspaces
/// share it).
#[test]
fn gpu_image_prompts_get_the_vision_tower_first_under_a_budget() {
    let gpu = match common::gpu("gpu image placement") {
        Some(g) => g,
        None => return,
    };
    let host = common::cpu();
    let (ids, px, row, grids) = vision_case();
    let images = Images { patches: &px, row_len: row, grids: &grids };
    let opened = tiny_vision();
    let ctx = ids.len() + 4;
    let image_tokens = grids.iter().map(|g| g[0] * g[1] * g[2] / 4).sum::<usize>();
    let q8 = LoadQuant { mix: None, vision_q8: true };
    let s = Model::sizes(&opened, q8, &*gpu, ctx, image_tokens, DType::F32);
    // room for the workspace, the tower and one text layer, not two
    let slot = s.layers[1..].iter().copied().max().unwrap();
    let budget = s.text_work.max(s.vision_work) + s.vision + s.layers[0] + s.kv_layer + slot + s.layers[1] / 2;
    let text_first = Placement::plan(&s, Some(budget), None, false).unwrap();
    assert!(!text_first.vision_on_device, "{}", text_first.describe());
    let mut p = Placement::plan(&s, Some(budget), None, true).unwrap();
    assert!(p.vision_first && p.vision_on_device && p.device_layers == 1 && !p.head_on_device && p.stream_rows.is_some(), "{}", p.describe());
    assert!(p.better_than(&text_first));
    p.vision_q8 = true;
    p.stream_rows = Some(ids.len().min(qwen3_vl::model::STREAM_MIN_ROWS));
    let want = run(&Model::load_placed(&opened, q8, &*host, None, &mut |_, _| {}).unwrap(), &*host, &ids, Some(&images), DType::F32, 4);
    let gpu2 = common::gpu("gpu image placement").unwrap(); // a fresh pool, so its peak is this run's
    gpu2.set_memory_cap(Some(budget)).unwrap();
    let split = Model::load_placed(&opened, q8, &*gpu2, Some(Offload { host: &host, placement: &p }), &mut |_, _| {}).unwrap();
    assert!(!split.vision.on_host());
    let got = run(&split, &*gpu2, &ids, Some(&images), DType::F32, 4);
    assert!(split.text.streamed_layers() > 0, "the prompt streamed the host layers through the GPU");
    // the CPU's Q8_0 path rounds activations to 8 bits per block, the GPU's prefill does not:
    // the quantized bound of tests/gpu_quant.rs (0.15 of the std; measured 0.053 on the H100)
    common::assert_close_to_std("vision-first split logits", &got.0, &want.0, 0.15);
    let peak = gpu2.memory_stats().peak;
    eprintln!("report: vision-first peak {} bytes, budget {} bytes, placement {}", peak, budget, p.describe());
    assert!(peak <= budget, "peak {} over the budget {}", peak, budget);
}
