//! The batching engine end to end on every backend (the CPU, and each GPU kernel module where
//! there is a GPU): a greedy request gives the tokens it gives alone (a session of its own)
//! when it runs among others of mixed lengths, arriving together or one by one, read in small
//! prefill chunks, through small KV blocks, with preemption when the blocks run out and with a
//! request cancelled mid-batch; image requests among text ones give transformers' tokens; and
//! afterwards every KV block is free again.

mod common;

use qwen3_vl::engine::{Engine, EngineConfig, Event, ImageInput, Request, SeqId};
use qwen3_vl::generate::{Sampler, SamplingParams, Session};
use qwen3_vl::model::{Images, Model};
use qwen3_vl::{Backend, DType};
use serde_json::Value;
use std::collections::HashMap;

fn load(case: &str, b: &dyn Backend) -> Model {
    Model::load(&common::repo_root().join("tests/fixtures/text").join(case), b, &mut |_, _| {}).unwrap()
}

/// Prompts of mixed lengths (1 to 40 tokens) over the fixture's vocabulary.
fn prompts(vocab: usize, n: usize) -> Vec<Vec<u32>> {
    (0..n).map(|i| {
        let len = [1, 5, 17, 40, 8, 3, 29, 12][i % 8];
        (0..len).map(|j| ((i * 7919 + j * 104_729 + 13) % (vocab - 1)) as u32).collect()
    }).collect()
}

/// A request's greedy tokens alone and how many are decided by a clear margin.
fn alone(model: &Model, b: &dyn Backend, kv: DType, prompt: &[u32], max_new: usize) -> (Vec<u32>, usize) {
    common::greedy_alone(model, b, kv, prompt, max_new)
}

fn greedy(prompt: Vec<u32>, max_new: usize) -> Request {
    Request { prompt, images: None, max_new, sampler: Sampler::new(SamplingParams::greedy()), stop_ids: vec![], }
}

/// Runs the engine until it has no work, adding `late` requests one per step; returns each
/// sequence's tokens and checks the events: tokens then one `Finished`, nothing after it.
fn run(e: &mut Engine<'_>, late: Vec<Request>, cancel_at: Option<(usize, SeqId)>) -> HashMap<SeqId, Vec<u32>> {
    let mut out: HashMap<SeqId, Vec<u32>> = HashMap::new();
    let mut finished: HashMap<SeqId, usize> = HashMap::new();
    let mut late = late.into_iter();
    let mut steps = 0;
    while e.has_work() || late.len() > 0 {
        if let Some(r) = late.next() {
            let id = e.add(r).unwrap();
            out.insert(id, Vec::new());
        }
        if let Some((at, id)) = cancel_at {
            if steps == at {
                assert!(e.cancel(id), "sequence {} still runs at step {}", id, at);
                out.remove(&id);
            }
        }
        for ev in e.step().unwrap() {
            match ev {
                Event::Token { id, token, .. } => {
                    assert!(!finished.contains_key(&id), "a token after the end of {}", id);
                    out.entry(id).or_default().push(token);
                }
                Event::Finished { id, generated, .. } => {
                    assert_eq!(generated, out[&id].len(), "sequence {}", id);
                    finished.insert(id, generated);
                }
            }
        }
        steps += 1;
        assert!(steps < 10_000, "the engine does not finish");
    }
    let s = e.stats();
    assert_eq!((s.blocks_used, s.running, s.waiting), (0, 0, 0), "every block free at the end");
    assert_eq!(finished.len(), out.len(), "every sequence finished");
    out
}

fn check(what: &str, got: &[u32], want: &(Vec<u32>, usize)) {
    let clear = want.1;
    assert_eq!(got.len(), want.0.len(), "{}: length", what);
    assert_eq!(&got[..clear], &want.0[..clear], "{}: tokens decided by a clear margin", what);
}

#[test]
fn a_batch_gives_each_request_its_tokens_alone() {
    for b in common::backends("engine batch") {
        for case in ["tied_gqa", "untied_mha"] {
            let model = load(case, &*b);
            let kv = b.default_kv_dtype();
            let ps = prompts(model.config.text.vocab_size, 12);
            let news: Vec<usize> = (0..ps.len()).map(|i| 4 + (i * 5) % 19).collect();
            let want: Vec<_> = ps.iter().zip(&news).map(|(p, &n)| alone(&model, &*b, kv, p, n)).collect();
            for (block, chunk, together) in [(16, 2048, true), (4, 7, true), (4, 5, false)] {
                let mut cfg = EngineConfig::new(16, 4096, kv);
                cfg.block = block;
                cfg.max_prefill_tokens = chunk;
                let mut e = Engine::new(&model, &*b, cfg).unwrap();
                let reqs: Vec<Request> = ps.iter().zip(&news).map(|(p, &n)| greedy(p.clone(), n)).collect();
                let got = if together {
                    let ids: Vec<SeqId> = reqs.into_iter().map(|r| e.add(r).unwrap()).collect();
                    assert_eq!(ids, (0..ps.len() as u64).collect::<Vec<_>>());
                    run(&mut e, vec![], None)
                } else {
                    let got = run(&mut e, reqs, None);
            assert_eq!(e.stats().host_samples, 0, "every row drawn in the step on {}", b.describe());
            got
                };
                for (i, w) in want.iter().enumerate() {
                    check(&format!("{} on {}, request {}, blocks of {}, chunks of {}", case, b.describe(), i, block, chunk), &got[&(i as u64)], w);
                }
            }
        }
    }
}

#[test]
fn recorded_decode_steps_give_the_plain_launches_tokens() {
    // decode-only steps are recorded once per batch size and replayed (CUDA graphs) with their
    // inputs rewritten in place; sequences finishing at different steps change the batch size.
    // untied_mha's heads of 32 take the split-KV kernels, which record; tied_gqa's heads of 16
    // take the composite attention, whose uploads no recording can hold: its steps fall back to
    // plain launches (logged), with the same tokens
    for (b, case) in common::backends("engine recorded decode steps").into_iter().flat_map(|b| [(b.clone(), "untied_mha"), (b, "tied_gqa")]) {
        let model = load(case, &*b);
        let kv = b.default_kv_dtype();
        let ps = prompts(model.config.text.vocab_size, 6);
        for seeded in [false, true] {
            let sampler = |i: usize| {
                let mut p = SamplingParams::greedy();
                if seeded {
                    p = SamplingParams { temperature: 0.9, top_k: 20, seed: 7 + i as u64, ..p };
                }
                Sampler::new(p)
            };
            let mut outs = Vec::new();
            for record in [true, false] {
                let mut e = Engine::new(&model, &*b, EngineConfig::new(8, 2048, kv)).unwrap();
                e.set_recording(record);
                for (i, p) in ps.iter().enumerate() {
                    e.add(Request { prompt: p.clone(), images: None, max_new: 6 + 3 * i, sampler: sampler(i), stop_ids: vec![] }).unwrap();
                }
                let got = run(&mut e, vec![], None);
                if record && case == "untied_mha" && common::kernels_arch(&*b).is_some() {
                    assert!(e.recorded_steps() > 0, "{}: no decode step was recorded", b.describe());
                    // six sequences ending one after another run at 6, 5, ..., 1 rows, padded to
                    // 8, 8, 4, 4, 2, 1: four recordings, not six
                    let st = e.stats();
                    assert!(st.decode_recordings <= 4, "{}: {} recordings for batches padded to 4 sizes", b.describe(), st.decode_recordings);
                    assert!(st.decode_steps > st.decode_recordings);
                }
                if !record {
                    assert_eq!(e.recorded_steps(), 0);
                }
                outs.push(got);
            }
            assert_eq!(outs[0], outs[1], "{} on {}, seeded sampling {}: recorded and plain steps", case, b.describe(), seeded);
        }
    }
}

#[test]
fn preemption_and_cancellation_keep_the_answers_and_free_the_blocks() {
    for b in common::backends("engine preemption") {
        let model = load("untied_mha", &*b);
        let kv = b.default_kv_dtype();
        let ps = prompts(model.config.text.vocab_size, 8);
        let want: Vec<_> = ps.iter().map(|p| alone(&model, &*b, kv, p, 24)).collect();
        // 96 cache rows: room for about two of these sequences at once
        let mut cfg = EngineConfig::new(8, 96, kv);
        cfg.block = 8;
        let mut e = Engine::new(&model, &*b, cfg).unwrap();
        for p in &ps {
            e.add(greedy(p.clone(), 24)).unwrap();
        }
        let got = run(&mut e, vec![], Some((3, 5)));
        assert!(e.stats().preemptions > 0, "the small cache should have forced preemption");
        assert!(!got.contains_key(&5));
        for (i, w) in want.iter().enumerate().filter(|(i, _)| *i != 5) {
            check(&format!("request {} on {} with preemption", i, b.describe()), &got[&(i as u64)], w);
        }
        // a request larger than the whole cache is refused at once
        let e2 = e.add(greedy(vec![1; 90], 10)).unwrap_err().to_string();
        assert!(e2.contains("KV cache 96 tokens"), "{}", e2);
    }
}

#[test]
fn stop_tokens_end_a_sequence_and_free_its_blocks() {
    let b = common::cpu();
    let model = load("tied_gqa", &*b);
    let p = prompts(model.config.text.vocab_size, 3);
    let (tokens, _) = alone(&model, &*b, DType::F32, &p[2], 12);
    let stop = tokens[4];
    let first = tokens.iter().position(|&t| t == stop).unwrap();
    let mut e = Engine::new(&model, &*b, EngineConfig::new(4, 512, DType::F32)).unwrap();
    let mut r = greedy(p[2].clone(), 12);
    r.stop_ids = vec![stop];
    let id = e.add(r).unwrap();
    e.add(greedy(p[1].clone(), 12)).unwrap();
    let mut ended = None;
    while e.has_work() {
        for ev in e.step().unwrap() {
            if let Event::Finished { id: i, stop: s, generated, .. } = ev {
                if i == id {
                    ended = Some((s, generated));
                }
            }
        }
    }
    assert_eq!(ended, Some((qwen3_vl::generate::Stop::StopToken(stop), first + 1)));
    assert_eq!(e.stats().blocks_used, 0);
}

fn vision_case(name: &str) -> (Vec<u32>, Vec<f32>, Vec<[usize; 3]>, Vec<u32>) {
    let dir = common::repo_root().join("tests/fixtures/vision");
    let c: Value = serde_json::from_str(&std::fs::read_to_string(dir.join(format!("{}.json", name))).unwrap()).unwrap();
    let u32s = |v: &Value| -> Vec<u32> { v.as_array().unwrap().iter().map(|x| x.as_u64().unwrap() as u32).collect() };
    let bytes = std::fs::read(dir.join(c["pixel_values"]["file"].as_str().unwrap())).unwrap();
    let px = bytes.chunks_exact(4).map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect();
    let grids = c["image_grid_thw"].as_array().unwrap().iter().map(|g| {
        let g = u32s(g);
        [g[0] as usize, g[1] as usize, g[2] as usize]
    }).collect();
    (u32s(&c["input_ids"]), px, grids, u32s(&c["greedy"]["ids"]))
}

#[test]
fn image_requests_among_text_ones_give_transformers_tokens() {
    for b in common::backends("engine images") {
        let model = Model::load(&common::repo_root().join("tests/fixtures/vision/tiny"), &*b, &mut |_, _| {}).unwrap();
        let kv = b.default_kv_dtype();
        let mut cfg = EngineConfig::new(8, 2048, kv);
        cfg.max_prefill_tokens = 16;
        let mut e = Engine::new(&model, &*b, cfg).unwrap();
        let mut want: Vec<(SeqId, (Vec<u32>, usize), String)> = Vec::new();
        for (k, name) in ["one_image_exact", "one_image_resized", "two_images"].iter().enumerate() {
            // a text request before each image one
            let text: Vec<u32> = (0..20 + 3 * k as u32).map(|j| 100 + j * 7).collect();
            let tid = e.add(greedy(text.clone(), 6)).unwrap();
            want.push((tid, alone(&model, &*b, kv, &text, 6), format!("text before {}", name)));
            let (ids, px, grids, greedy_ids) = vision_case(name);
            // the image prompt alone, through a session, as a check of the reference
            let mut s = Session::with_kv_dtype(&model, &*b, ids.len() + greedy_ids.len(), kv).unwrap();
            let mut sampler = Sampler::new(SamplingParams::greedy());
            let alone_img = s.generate_with_images(&ids, Some(&Images { patches: &px, row_len: 1536, grids: &grids }), greedy_ids.len(), &mut sampler, &[], &mut |_| true).unwrap();
            assert_eq!(alone_img.tokens, greedy_ids, "{} alone on {}", name, b.describe());
            let r = Request { prompt: ids, images: Some(ImageInput::flat(px, 1536, grids)), max_new: greedy_ids.len(), sampler: Sampler::new(SamplingParams::greedy()), stop_ids: vec![] };
            let n = greedy_ids.len();
            want.push((e.add(r).unwrap(), (greedy_ids, n), name.to_string()));
        }
        let got = run(&mut e, vec![], None);
        for (id, w, what) in want {
            check(&format!("{} in a batch on {}", what, b.describe()), &got[&id], &w);
        }
    }
}

/// Image prompts added together: their images go through one tower run (an image in two
/// prompts once), several image prompts are read in one step (their DeepStack rows side by
/// side), and each answer is still transformers'. Then the same image after another question
/// takes its embeddings from the image-embedding cache (the prefix cache has none of its
/// blocks), and answers as the prompt alone does; without the cache the tower runs again.
#[test]
fn image_prompts_share_tower_runs_and_cached_embeddings() {
    for b in common::backends("engine image batches and embedding cache") {
        let model = Model::load(&common::repo_root().join("tests/fixtures/vision/tiny"), &*b, &mut |_, _| {}).unwrap();
        let kv = b.default_kv_dtype();
        let req = |ids: &[u32], px: &[f32], grids: &[[usize; 3]], n: usize| Request { prompt: ids.to_vec(), images: Some(ImageInput::flat(px.to_vec(), 1536, grids.to_vec())), max_new: n, sampler: Sampler::new(SamplingParams::greedy()), stop_ids: vec![] };
        for cache in [1 << 20, 0] {
            let mut cfg = EngineConfig::new(8, 2048, kv);
            cfg.block = 4;
            cfg.vision_cache_bytes = cache;
            let mut e = Engine::new(&model, &*b, cfg).unwrap();
            // 1. three image prompts at once: one tower run over the distinct images
            let cases: Vec<_> = ["one_image_exact", "one_image_resized", "two_images"].iter().map(|n| (n, vision_case(n))).collect();
            let mut distinct: Vec<Vec<f32>> = Vec::new();
            for (_, (_, px, grids, _)) in &cases {
                let mut r0 = 0;
                for g in grids {
                    let img = px[r0 * 1536..(r0 + g[0] * g[1] * g[2]) * 1536].to_vec();
                    r0 += g[0] * g[1] * g[2];
                    if !distinct.contains(&img) {
                        distinct.push(img);
                    }
                }
            }
            let want: Vec<(SeqId, Vec<u32>, &str)> = cases.iter().map(|(name, (ids, px, grids, greedy_ids))| (e.add(req(ids, px, grids, greedy_ids.len())).unwrap(), greedy_ids.clone(), **name)).collect();
            let got = run(&mut e, vec![], None);
            for (id, w, name) in &want {
                assert_eq!(&got[id], w, "{} beside the others on {}", name, b.describe());
            }
            let st = e.stats();
            assert_eq!((st.vision_runs, st.vision_images, st.vision_cache_hits), (1, distinct.len() as u64, 0), "one run over {} distinct images on {}", distinct.len(), b.describe());
            // 2. the first image after another question: no block of it in the prefix cache
            let (ids, px, grids, _) = &cases[0].1;
            let mut other = ids.clone();
            other[2] = 271; // a token before the image
            let mut s = Session::with_kv_dtype(&model, &*b, other.len() + 8, kv).unwrap();
            let alone_ids = s.generate_with_images(&other, Some(&Images { patches: px, row_len: 1536, grids }), 8, &mut Sampler::new(SamplingParams::greedy()), &[], &mut |_| true).unwrap().tokens;
            let (got, cached) = run_one(&mut e, req(&other, px, grids, 8));
            assert_eq!(cached, 0);
            assert_eq!(got[..3], alone_ids[..3], "another question about the same image on {} (cache {})", b.describe(), cache);
            let st2 = e.stats();
            if cache > 0 {
                assert_eq!((st2.vision_images, st2.vision_cache_hits), (st.vision_images, 1), "the tower did not run again");
                assert!(st2.vision_cache_bytes > 0);
            } else {
                assert_eq!((st2.vision_images, st2.vision_cache_hits), (st.vision_images + 1, 0), "no cache: the tower ran again");
            }
        }
    }
}

/// Adds `req`, runs the engine until it has no work and returns the tokens and the prompt
/// tokens it took from the prefix cache.
fn run_one(e: &mut Engine<'_>, req: Request) -> (Vec<u32>, usize) {
    let id = e.add(req).unwrap();
    let (mut tokens, mut cached) = (Vec::new(), None);
    while e.has_work() {
        for ev in e.step().unwrap() {
            match ev {
                Event::Token { id: i, token, .. } if i == id => tokens.push(token),
                Event::Finished { id: i, cached_tokens, .. } if i == id => cached = Some(cached_tokens),
                _ => {}
            }
        }
    }
    (tokens, cached.expect("finished"))
}

#[test]
fn the_prefix_cache_reuses_whole_blocks_and_keeps_the_answers() {
    for b in common::backends("engine prefix cache") {
        let model = load("tied_gqa", &*b);
        let kv = b.default_kv_dtype();
        let vocab = model.config.text.vocab_size;
        let prefix: Vec<u32> = (0..37).map(|j| ((j * 104_729 + 7) % (vocab - 1)) as u32).collect();
        let with = |tail: &[u32]| -> Vec<u32> { prefix.iter().chain(tail).copied().collect() };
        let mut cfg = EngineConfig::new(4, 4096, kv);
        cfg.block = 4;
        let mut e = Engine::new(&model, &*b, cfg).unwrap();
        // 1. cold: nothing to reuse
        let a = with(&[3, 5]);
        let (got, cached) = run_one(&mut e, greedy(a.clone(), 12));
        check(&format!("cold on {}", b.describe()), &got, &alone(&model, &*b, kv, &a, 12));
        assert_eq!(cached, 0);
        assert!(e.stats().blocks_cached > 0, "the finished sequence's blocks stay cached");
        // 2. the same prefix, another tail: its 9 whole blocks (36 tokens) come from the cache
        let bq = with(&[9, 9, 9, 1]);
        let (got, cached) = run_one(&mut e, greedy(bq.clone(), 12));
        check(&format!("shared prefix on {}", b.describe()), &got, &alone(&model, &*b, kv, &bq, 12));
        assert_eq!(cached, 36);
        // 3. a chat's second turn: the first turn's prompt and reply, then more
        let mut turn2 = a.clone();
        turn2.extend(&run_one(&mut e, greedy(a.clone(), 12)).0);
        turn2.extend([11, 12, 13]);
        let (got, cached) = run_one(&mut e, greedy(turn2.clone(), 8));
        check(&format!("second turn on {}", b.describe()), &got, &alone(&model, &*b, kv, &turn2, 8));
        // the first turn's 39 prompt tokens and its first 11 generated ones were written (the
        // last generated token never was): 50 tokens, 12 whole blocks
        assert_eq!(cached, 48, "{} tokens in the second turn", turn2.len());
        // 4. a prompt that is exactly cached blocks still computes its last token
        let exact = prefix[..36].to_vec();
        let (got, cached) = run_one(&mut e, greedy(exact.clone(), 6));
        check(&format!("whole-block prompt on {}", b.describe()), &got, &alone(&model, &*b, kv, &exact, 6));
        assert_eq!(cached, 32);
        let s = e.stats();
        assert!(s.prefix_hit_tokens == 36 + 36 + 48 + 32 && s.prompt_tokens > s.prefix_hit_tokens, "{:?}", s);
        // 5. a cache too small to keep them: blocks are evicted for new rows, answers unchanged
        let mut cfg = EngineConfig::new(4, 64, kv);
        cfg.block = 4;
        let mut small = Engine::new(&model, &*b, cfg).unwrap();
        run_one(&mut small, greedy(a.clone(), 12));
        let other: Vec<u32> = (0..50).map(|j| ((j * 7919 + 3) % (vocab - 1)) as u32).collect();
        run_one(&mut small, greedy(other, 8));
        let (got, cached) = run_one(&mut small, greedy(bq.clone(), 12));
        check(&format!("after eviction on {}", b.describe()), &got, &alone(&model, &*b, kv, &bq, 12));
        assert!(cached < 36, "the blocks of the first prompt were evicted for the second ({} reused)", cached);
    }
}

#[test]
fn image_prompts_reuse_cached_blocks_keyed_by_the_image() {
    for b in common::backends("engine prefix cache, images") {
        let model = Model::load(&common::repo_root().join("tests/fixtures/vision/tiny"), &*b, &mut |_, _| {}).unwrap();
        let kv = b.default_kv_dtype();
        let image_id = model.config.image_token_id;
        let mut cfg = EngineConfig::new(4, 2048, kv);
        cfg.block = 4;
        let mut e = Engine::new(&model, &*b, cfg).unwrap();
        let (ids, px, grids, greedy_ids) = vision_case("one_image_exact");
        let first = ids.iter().position(|&t| t == image_id).unwrap();
        let end = ids.iter().rposition(|&t| t == image_id).unwrap() + 1;
        let req = |ids: &[u32], px: &[f32], n: usize| Request { prompt: ids.to_vec(), images: Some(ImageInput::flat(px.to_vec(), 1536, grids.clone())), max_new: n, sampler: Sampler::new(SamplingParams::greedy()), stop_ids: vec![] };
        let alone = |ids: &[u32], px: &[f32], n: usize| -> Vec<u32> {
            let mut s = Session::with_kv_dtype(&model, &*b, ids.len() + n, kv).unwrap();
            s.generate_with_images(ids, Some(&Images { patches: px, row_len: 1536, grids: &grids }), n, &mut Sampler::new(SamplingParams::greedy()), &[], &mut |_| true).unwrap().tokens
        };
        let n = greedy_ids.len();
        // 1. cold, then the same prompt and image: every whole block but the last token's from
        //    the cache, past the image tokens, so the tower does not run again
        let (got, cached) = run_one(&mut e, req(&ids, &px, n));
        assert_eq!((got.as_slice(), cached), (greedy_ids.as_slice(), 0), "cold on {}", b.describe());
        let (got, cached) = run_one(&mut e, req(&ids, &px, n));
        assert_eq!(got, greedy_ids, "the repeat on {}", b.describe());
        assert_eq!(cached, (ids.len() - 1) / 4 * 4);
        assert!(cached >= end, "the cached prefix ({}) covers the image tokens ({}..{})", cached, first, end);
        assert_eq!(e.stats().vision_runs, 1, "the repeat skipped the tower");
        // 2. the same tokens with another image: only the blocks before the first image token
        let mut other = px.clone();
        other.iter_mut().step_by(7).for_each(|v| *v = -*v);
        let (got, cached) = run_one(&mut e, req(&ids, &other, n));
        assert_eq!(cached, first / 4 * 4, "blocks before the image token at {}", first);
        // (the first tokens only: this image's margins are not known to be clear on every GPU)
        assert_eq!(got[..3], alone(&ids, &other, n)[..3], "another image on {}", b.describe());
        assert_eq!(e.stats().vision_runs, 2);
        // 3. a second turn after the first image's reply: the history from the cache
        let mut turn2 = ids.clone();
        turn2.extend(&greedy_ids);
        turn2.extend([100, 107, 114, 121, 128]);
        let (got, cached) = run_one(&mut e, req(&turn2, &px, 6));
        assert!(cached >= (ids.len() + n - 1) / 4 * 4 - 4, "{} of {} tokens cached", cached, turn2.len());
        assert_eq!(got[..3], alone(&turn2, &px, 6)[..3], "second turn on {}", b.describe());
        assert_eq!(e.stats().vision_runs, 2, "the second turn skipped the tower");
        assert_eq!(e.stats().blocks_used, 0);
    }
}

/// A lone request through [`Engine::generate`] (what `generate` and `chat` run) with sampling:
/// on the CPU it draws exactly the session's tokens, whether the draws run in the sampling step
/// (temperature, top-k, top-p: the settings the device takes) or on the host (a repetition
/// penalty); on a GPU it repeats itself exactly (the draws are numbered by the sequence
/// position, not by the cache row a block lands in). A chat's next turn then finds the first
/// turn in the prefix cache, and a generation ended by its callback frees its blocks.
#[test]
fn a_lone_request_samples_as_a_session_does() {
    for b in common::backends("engine generate, sampling") {
        let model = load("untied_mha", &*b);
        let kv = b.default_kv_dtype();
        let vocab = model.config.text.vocab_size;
        let prompt: Vec<u32> = (0..23).map(|j| ((j * 7919 + 11) % (vocab - 1)) as u32).collect();
        let on_device = SamplingParams { temperature: 0.9, top_k: 40, top_p: 0.95, repetition_penalty: 1.0, seed: 1234 };
        let on_host = SamplingParams { repetition_penalty: 1.2, ..on_device };
        assert!(Sampler::new(on_device).device_sampling(b.max_device_top_k()).is_some());
        assert!(Sampler::new(on_host).device_sampling(b.max_device_top_k()).is_none());
        let cpu = b.kind() == qwen3_vl::DeviceKind::Cpu;
        for params in [on_device, on_host] {
            let what = format!("{:?} on {}", params, b.describe());
            let req = |p: &[u32], n: usize| Request { prompt: p.to_vec(), images: None, max_new: n, sampler: Sampler::new(params), stop_ids: vec![] };
            let mut e = Engine::new(&model, &*b, EngineConfig::new(1, 256, kv)).unwrap();
            let g = e.generate(req(&prompt, 24), &mut |_| true).unwrap();
            assert_eq!((g.tokens.len(), g.prompt_tokens), (24, prompt.len()), "{}", what);
            if cpu {
                let mut s = Session::with_kv_dtype(&model, &*b, prompt.len() + 24, kv).unwrap();
                let want = s.generate(&prompt, 24, &mut Sampler::new(params), &[], &mut |_| true).unwrap();
                assert_eq!(g.tokens, want.tokens, "{}: the engine against the session", what);
            }
            // again, in a fresh engine whose blocks are taken in another order
            let mut e2 = Engine::new(&model, &*b, EngineConfig::new(1, 256, kv)).unwrap();
            e2.generate(req(&[1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18], 30), &mut |_| true).unwrap();
            let other: Vec<u32> = (0..40).map(|j| ((j * 31 + 5) % (vocab - 1)) as u32).collect();
            e2.add(req(&other, 1)).unwrap();
            assert!(e2.generate(req(&prompt, 24), &mut |_| true).is_err(), "generate refuses to run beside another sequence");
            e2.abort_all();
            let again = e2.generate(req(&prompt, 24), &mut |_| true).unwrap();
            assert_eq!(again.tokens, g.tokens, "{}: the same draws again", what);
            // a second turn: the first turn's prompt and all but its last token are cached
            let mut turn2 = prompt.clone();
            turn2.extend(&g.tokens[..23]);
            turn2.extend([7, 8, 9]);
            let before = e.stats().prefix_hit_tokens;
            let g2 = e.generate(req(&turn2, 5), &mut |_| true).unwrap();
            assert_eq!(e.stats().prefix_hit_tokens - before, 32, "{}: 46 written tokens, two whole blocks of 16", what);
            assert_eq!((g2.tokens.len(), g2.cached_tokens, g.cached_tokens), (5, 32, 0));
            // ended by the callback after 3 tokens: cancelled, its blocks free
            let mut n = 0;
            let g3 = e.generate(req(&prompt, 24), &mut |_| {
                n += 1;
                n < 3
            }).unwrap();
            assert_eq!(g3.tokens.len(), 3, "{}", what);
            if cpu {
                assert_eq!(&g3.tokens[..], &g.tokens[..3], "{}: the prefix cache's answer is the same", what);
            }
            let s = e.stats();
            assert_eq!((s.blocks_used, s.running, s.waiting), (0, 0, 0), "{}: every block free", what);
        }
    }
}

/// Requests that sample differently (greedy, and temperature / top-k / top-p with their own
/// seeds) share steps: the device samples every row with its own settings. On the CPU each
/// request draws exactly the tokens it draws alone in a session; on a GPU each draws what it
/// draws in a batch of the same requests run again (the draws follow sequence positions).
#[test]
fn requests_that_sample_differently_share_a_batch() {
    for b in common::backends("engine mixed sampling") {
        let model = load("untied_mha", &*b);
        let kv = b.default_kv_dtype();
        let vocab = model.config.text.vocab_size;
        let settings = [
            SamplingParams::greedy(),
            SamplingParams { temperature: 0.9, top_k: 40, top_p: 0.95, repetition_penalty: 1.0, seed: 11 },
            SamplingParams { temperature: 0.9, top_k: 40, top_p: 0.95, repetition_penalty: 1.0, seed: 12 },
            SamplingParams { temperature: 1.4, top_k: 5, top_p: 1.0, repetition_penalty: 1.0, seed: 13 },
            SamplingParams { temperature: 0.6, top_k: 64, top_p: 0.7, repetition_penalty: 1.0, seed: u64::MAX },
        ];
        let ps = prompts(vocab, settings.len());
        let cpu = b.kind() == qwen3_vl::DeviceKind::Cpu;
        let batch = || {
            let mut cfg = EngineConfig::new(8, 1024, kv);
            cfg.block = 4;
            let mut e = Engine::new(&model, &*b, cfg).unwrap();
            let reqs = ps.iter().zip(&settings).map(|(p, s)| Request { prompt: p.clone(), images: None, max_new: 12, sampler: Sampler::new(*s), stop_ids: vec![] }).collect();
            let got = run(&mut e, reqs, None);
            assert_eq!(e.stats().host_samples, 0, "every row drawn in the step on {}", b.describe());
            got
        };
        let got = batch();
        for (i, (p, s)) in ps.iter().zip(&settings).enumerate() {
            let what = format!("request {} ({:?}) on {}", i, s, b.describe());
            assert_eq!(got[&(i as u64)].len(), 12, "{}", what);
            if cpu {
                let mut sess = Session::with_kv_dtype(&model, &*b, p.len() + 12, kv).unwrap();
                let want = sess.generate(p, 12, &mut Sampler::new(*s), &[], &mut |_| true).unwrap();
                assert_eq!(got[&(i as u64)], want.tokens, "{}: in a batch against alone", what);
            }
        }
        assert_eq!(batch(), got, "the same batch again on {}", b.describe());
    }
}

/// Short prefill chunks after a long history (a chat's next turn; a long prompt read in small
/// chunks) attend through the block tables instead of gathering the history: the tokens stay
/// those of the request alone.
#[test]
fn short_chunks_after_a_long_history_keep_the_answers() {
    for b in common::backends("engine short chunks, long history") {
        for case in ["tied_gqa", "untied_mha"] {
            let model = load(case, &*b);
            let kv = b.default_kv_dtype();
            let long: Vec<u32> = (0..400).map(|j| ((j * 7919 + 101) % 1000 + 10) as u32).collect();
            // 1. a long prompt in chunks of 24: the chunks past 256 keys take the tables
            let mut cfg = EngineConfig::new(2, 2048, kv);
            cfg.max_prefill_tokens = 24;
            let mut e = Engine::new(&model, &*b, cfg).unwrap();
            let want = alone(&model, &*b, kv, &long, 6);
            let (got, _) = run_one(&mut e, greedy(long.clone(), 6));
            check(&format!("{} in chunks of 24 on {}", case, b.describe()), &got, &want);
            // 2. the next turn: a few new tokens after the cached history
            let mut turn2 = long.clone();
            turn2.extend(&got[..5]);
            turn2.extend([7, 8, 9]);
            let want2 = alone(&model, &*b, kv, &turn2, 6);
            let (got2, cached) = run_one(&mut e, greedy(turn2.clone(), 6));
            assert!(cached >= 400 && turn2.len() - cached <= qwen3_vl::engine::paged::CHUNK_PAGED_ROWS, "{} cached of {}", cached, turn2.len());
            check(&format!("{} next turn on {}", case, b.describe()), &got2, &want2);
        }
    }
}
