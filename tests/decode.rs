//! The decode loop end to end: 32-token greedy continuations on the GPU (recorded graph replays
//! and plain launches, f32 and f16 caches) equal the CPU's wherever the CPU's logits are not
//! near-tied, sampled continuations agree between the device and host samplers, and a recorded
//! step allocates no device memory once it runs (GPU parts skipped without a GPU, failing
//! instead with QWEN3_VL_EXPECT_GPU=1); sampling on every backend never picks an id past the
//! model's sampling limit (the tokenizer's vocabulary).

mod common;

use qwen3_vl::generate::{Sampler, SamplingParams, Session};
use qwen3_vl::model::Model;
use qwen3_vl::{Backend, DType};
use serde_json::Value;

const STEPS: usize = 32;

fn load(case: &str, b: &dyn Backend) -> Model {
    Model::load(&common::repo_root().join("tests/fixtures/text").join(case), b, &mut |_, _| {}).unwrap()
}

fn prompts(case: &str) -> Vec<Vec<u32>> {
    let r: Value = serde_json::from_str(&std::fs::read_to_string(common::repo_root().join("tests/fixtures/text").join(case).join("reference.json")).unwrap()).unwrap();
    r["prompts"].as_array().unwrap().iter().map(|p| p["ids"].as_array().unwrap().iter().map(|x| x.as_u64().unwrap() as u32).collect()).collect()
}

/// The CPU's greedy continuation and how many of its steps are decided by a clear margin.
fn cpu_reference(model: &Model, prompt: &[u32]) -> (Vec<u32>, usize) {
    common::greedy_alone(model, &*common::cpu(), DType::F32, prompt, STEPS)
}

#[test]
fn greedy_32_token_continuations_match_the_cpu() {
    let g = match common::gpu("decode greedy") {
        Some(g) => g,
        None => return,
    };
    let cpu = common::cpu();
    let mut compared = 0;
    for case in ["tied_gqa", "untied_mha", "fullvocab"] {
        let (cpu_model, gpu_model) = (load(case, &*cpu), load(case, &*g));
        for (i, prompt) in prompts(case).iter().enumerate() {
            let (want, clear) = cpu_reference(&cpu_model, prompt);
            for kv in common::KV_DTYPES {
                for record in [true, false] {
                    let mut s = Session::with_kv_dtype(&gpu_model, &*g, prompt.len() + STEPS, kv).unwrap();
                    s.set_recording(record);
                    let got = s.generate(prompt, STEPS, &mut Sampler::new(SamplingParams::greedy()), &[], &mut |_| true).unwrap().tokens;
                    assert_eq!(&got[..clear], &want[..clear], "{} prompt {}: {} cache, recording {} (clear margin for {} steps)", case, i, kv, record, clear);
                    compared += clear;
                }
            }
        }
    }
    assert!(compared > 0, "no step had a clear margin: the test compared nothing");
}

#[test]
fn device_and_host_sampling_pick_the_same_tokens() {
    let g = match common::gpu("decode sampling") {
        Some(g) => g,
        None => return,
    };
    let model = load("fullvocab", &*g);
    let prompt = &prompts("fullvocab")[0];
    let p = SamplingParams { temperature: 0.8, top_k: 20, top_p: 0.9, repetition_penalty: 1.0, seed: 11 };
    // the same settings through the device sampler (recorded or not) agree with each other
    let run = |record: bool| {
        let mut s = Session::with_kv_dtype(&model, &*g, prompt.len() + STEPS, DType::F32).unwrap();
        s.set_recording(record);
        s.generate(prompt, STEPS, &mut Sampler::new(p), &[], &mut |_| true).unwrap().tokens
    };
    let (a, b) = (run(true), run(false));
    assert_eq!(a, b, "recorded and plain device-sampled steps differ");
    // and with the CPU, which samples on the host with the same draw, while the logits agree
    let cpu = common::cpu();
    let cpu_model = load("fullvocab", &*cpu);
    let mut s = Session::with_kv_dtype(&cpu_model, &*cpu, prompt.len() + STEPS, DType::F32).unwrap();
    let c = s.generate(prompt, STEPS, &mut Sampler::new(p), &[], &mut |_| true).unwrap().tokens;
    let same = a.iter().zip(&c).take_while(|(x, y)| x == y).count();
    assert!(same >= 8, "device and host samplers diverged after {} tokens: {:?} vs {:?}", same, a, c);
    assert!(a.iter().any(|&t| t != a[0]), "sampling should vary across steps: {:?}", a);
}

#[test]
fn recorded_steps_allocate_no_device_memory() {
    let g = match common::gpu("decode allocations") {
        Some(g) => g,
        None => return,
    };
    let model = load("untied_mha", &*g);
    let prompt = &prompts("untied_mha")[0];
    let mut s = Session::new(&model, &*g, prompt.len() + 64).unwrap();
    let mut sampler = Sampler::new(SamplingParams::greedy());
    let mut t = qwen3_vl::generate::sampling::argmax(&s.feed(prompt).unwrap());
    for _ in 0..4 {
        t = s.decode(t, &mut sampler).unwrap(); // the first step records the graph
    }
    let before = g.memory_stats();
    for _ in 0..40 {
        t = s.decode(t, &mut sampler).unwrap();
    }
    let after = g.memory_stats();
    assert_eq!(after.device_allocs, before.device_allocs, "decode steps allocated device memory: {:?} -> {:?}", before, after);
    assert_eq!(after.in_use, before.in_use, "decode steps changed the memory in use: {:?} -> {:?}", before, after);
}

#[test]
fn sampling_never_picks_ids_past_the_limit_on_any_backend() {
    // fullvocab's head has 151,936 rows; allowing only the first 1,000 ids makes nearly every
    // unmasked pick (greedy or sampled) fall outside, so a sampler that ignored the limit
    // fails at once. Host sampling (top_k 0), device sampling (top_k 40, on a GPU) and greedy.
    const LIMIT: usize = 1000;
    let prompt = &prompts("fullvocab")[0];
    let settings = [
        SamplingParams { temperature: 1.5, top_k: 0, top_p: 1.0, repetition_penalty: 1.0, seed: 3 },
        SamplingParams { temperature: 2.0, top_k: 40, top_p: 1.0, repetition_penalty: 1.0, seed: 4 },
        SamplingParams { temperature: 1.0, top_k: 40, top_p: 0.9, repetition_penalty: 1.1, seed: 5 },
        SamplingParams::greedy(),
    ];
    for b in common::backends("sampling limit") {
        let mut model = load("fullvocab", &*b);
        let unlimited = {
            let mut s = Session::with_kv_dtype(&model, &*b, prompt.len() + STEPS, DType::F32).unwrap();
            s.generate(prompt, STEPS, &mut Sampler::new(settings[1]), &[], &mut |_| true).unwrap().tokens
        };
        assert!(unlimited.iter().any(|&t| t as usize >= LIMIT), "{}: the test needs picks past {} without the limit: {:?}", b.describe(), LIMIT, unlimited);
        model.limit_sampling(LIMIT);
        assert_eq!(model.sampled_vocab(), LIMIT);
        for p in settings {
            for record in [true, false] {
                let mut s = Session::with_kv_dtype(&model, &*b, prompt.len() + STEPS, DType::F32).unwrap();
                s.set_recording(record);
                let got = s.generate(prompt, STEPS, &mut Sampler::new(p), &[], &mut |_| true).unwrap().tokens;
                assert_eq!(got.len(), STEPS);
                assert!(got.iter().all(|&t| (t as usize) < LIMIT), "{} {:?} recording {}: picked an id past {}: {:?}", b.describe(), p, record, LIMIT, got);
            }
        }
    }
}
