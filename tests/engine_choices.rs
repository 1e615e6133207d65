//! What the engine does for the rest of OpenAI's request fields, on every backend: siblings on
//! one prompt (`n`) compute the prompt once and each draws as it would alone; tokens carry
//! their log-probabilities (the log-softmax of the session's logits for a greedy draw); a logit
//! bias moves the draw; `min_tokens` holds the stop token back.

mod common;

use qwen3_vl::engine::{Engine, EngineConfig, Event, Request, SeqId};
use qwen3_vl::generate::min_tokens::MinTokens;
use qwen3_vl::generate::{Sampler, SamplingParams, Session, Stop};
use qwen3_vl::model::Model;
use std::collections::HashMap;

fn load(b: &dyn qwen3_vl::Backend) -> Model {
    Model::load(&common::repo_root().join("tests/fixtures/text/tied_gqa"), b, &mut |_, _| {}).unwrap()
}

/// A 40-token prompt over the fixture's vocabulary.
fn prompt(vocab: usize) -> Vec<u32> {
    (0..40).map(|j| ((j * 104_729 + 13) % (vocab - 1)) as u32).collect()
}

fn sampled(seed: u64) -> Sampler {
    Sampler::new(SamplingParams { temperature: 1.5, top_k: 0, top_p: 1.0, repetition_penalty: 1.0, seed })
}

/// Every event until the engine is idle: each sequence's tokens, log-probabilities and stop.
#[allow(clippy::type_complexity)]
fn run(e: &mut Engine<'_>) -> (HashMap<SeqId, Vec<u32>>, HashMap<SeqId, Vec<qwen3_vl::generate::logprobs::TokenLogprobs>>, HashMap<SeqId, Stop>) {
    let (mut toks, mut lps, mut stops) = (HashMap::new(), HashMap::new(), HashMap::new());
    let mut steps = 0;
    while e.has_work() {
        for ev in e.step().unwrap() {
            match ev {
                Event::Token { id, token, logprobs } => {
                    toks.entry(id).or_insert_with(Vec::new).push(token);
                    if let Some(l) = logprobs {
                        lps.entry(id).or_insert_with(Vec::new).push(*l);
                    }
                }
                Event::Finished { id, stop, .. } => {
                    stops.insert(id, stop);
                }
            }
        }
        steps += 1;
        assert!(steps < 1000, "the engine does not finish");
    }
    (toks, lps, stops)
}

fn req(prompt: &[u32], max_new: usize, sampler: Sampler, stop_ids: Vec<u32>) -> Request {
    Request { prompt: prompt.to_vec(), images: None, max_new, sampler, stop_ids }
}

#[test]
fn siblings_compute_the_prompt_once_and_draw_as_alone() {
    for b in common::backends("engine siblings") {
        let model = load(&*b);
        let p = prompt(model.config.text.vocab_size);
        let mut cfg = EngineConfig::new(8, 1024, b.default_kv_dtype());
        cfg.block = 16;
        // 1. each sampler alone: the reference
        let alone = |s: Sampler| {
            let mut e = Engine::new(&model, &*b, cfg.clone()).unwrap();
            let id = e.add(req(&p, 8, s, vec![])).unwrap();
            run(&mut e).0.remove(&id).unwrap()
        };
        let greedy = alone(Sampler::new(SamplingParams::greedy()));
        let seeds = [11u64, 12, 13];
        let each: Vec<Vec<u32>> = seeds.iter().map(|&s| alone(sampled(s))).collect();
        assert!(each[0] != each[1] || each[1] != each[2], "different seeds should draw differently on {}", b.describe());
        // 2. siblings: greedy ones equal, sampled ones as alone; the prompt computed once
        for (what, samplers, want) in [
            ("greedy", (0..3).map(|_| Sampler::new(SamplingParams::greedy())).collect::<Vec<_>>(), vec![greedy.clone(); 3]),
            ("sampled", seeds.iter().map(|&s| sampled(s)).collect(), each.clone()),
        ] {
            let mut e = Engine::new(&model, &*b, cfg.clone()).unwrap();
            let mut samplers = samplers.into_iter();
            let lead = e.add(req(&p, 8, samplers.next().unwrap(), vec![])).unwrap();
            let ids: Vec<SeqId> = std::iter::once(lead).chain(e.add_siblings(lead, samplers.collect()).unwrap()).collect();
            let (toks, _, _) = run(&mut e);
            for (i, id) in ids.iter().enumerate() {
                assert_eq!(toks[id], want[i], "{} sibling {} on {}", what, i, b.describe());
            }
            let st = e.stats();
            // 40 prompt rows once, then per sibling the 8 rows past its 2 whole cached blocks
            assert_eq!((st.prompt_tokens, st.prefix_hit_tokens, st.prefill_rows), (120, 64, 40 + 8 + 8), "{} on {}", what, b.describe());
            assert_eq!(st.blocks_used, 0);
        }
        assert!(Engine::new(&model, &*b, cfg.clone()).unwrap().add_siblings(5, vec![sampled(1)]).is_err(), "no such sequence");
    }
}

#[test]
fn tokens_carry_logprobs_and_bias_and_min_tokens_steer_the_draw() {
    for b in common::backends("engine logprobs") {
        let model = load(&*b);
        let kv = b.default_kv_dtype();
        let p = prompt(model.config.text.vocab_size);
        let n = model.sampled_vocab();
        // 1. the session's logits after the prompt: their log-softmax is the reference
        let mut session = Session::with_kv_dtype(&model, &*b, 64, kv).unwrap();
        let logits = session.feed_with_images(&p, None).unwrap();
        let logits = &logits[..n];
        let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max) as f64;
        let lse = max + logits.iter().map(|&l| (l as f64 - max).exp()).sum::<f64>().ln();
        let mut e = Engine::new(&model, &*b, EngineConfig::new(4, 512, kv)).unwrap();
        let id = e.add(req(&p, 3, Sampler::new(SamplingParams::greedy()).with_logprobs(5), vec![])).unwrap();
        let (toks, lps, _) = run(&mut e);
        let first = &lps[&id][0];
        assert_eq!(lps[&id].len(), 3);
        assert_eq!((first.token, first.top[0].0, first.top.len()), (toks[&id][0], toks[&id][0], 5));
        // the engine's paged forward against the session's contiguous one: f32 rounding on the
        // CPU, the kernels' tolerance (relative to the logits' spread) on a GPU, twice (the
        // logit and the normalizer)
        let mean = logits.iter().map(|&l| l as f64).sum::<f64>() / n as f64;
        let std = (logits.iter().map(|&l| (l as f64 - mean).powi(2)).sum::<f64>() / n as f64).sqrt();
        let tol = 1e-4 + 2.0 * common::logits_tolerance(&*b, kv) * std;
        for &(t, lp) in &first.top {
            assert!((lp as f64 - (logits[t as usize] as f64 - lse)).abs() < tol, "token {}: {} vs {} on {}", t, lp, logits[t as usize] as f64 - lse, b.describe());
        }
        assert!(first.top.windows(2).all(|w| w[0].1 >= w[1].1), "sorted");
        let greedy0 = toks[&id][0];
        // 2. a +100 bias makes greedy take the least likely token
        let least = (0..n).min_by(|&a, &c| logits[a].partial_cmp(&logits[c]).unwrap()).unwrap() as u32;
        let id = e.add(req(&p, 1, Sampler::new(SamplingParams::greedy()).with_logit_bias(vec![(least, 100.0)]), vec![])).unwrap();
        assert_eq!(run(&mut e).0[&id], [least]);
        // 3. greedy's first token as the stop id: it stops at once, unless min_tokens holds it back
        let id = e.add(req(&p, 6, Sampler::new(SamplingParams::greedy()), vec![greedy0])).unwrap();
        let (t, _, s) = run(&mut e);
        assert_eq!((t[&id].clone(), s[&id]), (vec![greedy0], Stop::StopToken(greedy0)));
        let held = Sampler::new(SamplingParams::greedy()).with_constraint(Box::new(MinTokens::new(4, vec![greedy0])));
        let id = e.add(req(&p, 6, held, vec![greedy0])).unwrap();
        let (t, _, _) = run(&mut e);
        assert!(t[&id].len() >= 5 && !t[&id][..4].contains(&greedy0), "min_tokens 4: {:?} on {}", t[&id], b.describe());
    }
}
