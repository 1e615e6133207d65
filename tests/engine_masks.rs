//! Constrained decoding (a mask of allowed next tokens per sequence, as a grammar gives) with the
//! pick inside the step, on every backend (the CPU, and each GPU kernel module where there is
//! a GPU): constrained and free sequences share a batch; constrained tokens are always allowed;
//! the free ones draw what they draw alone; the device's masked picks (recorded decode steps
//! included) equal the host sampler's from the same logits; a constraint that gives no mask
//! ends its own sequence only; the session's decode step picks under the mask too.

mod common;

use qwen3_vl::engine::{Engine, EngineConfig, Event, Request, SeqId};
use qwen3_vl::generate::sampling::{mask_allows, mask_words, Constraint};
use qwen3_vl::generate::{Sampler, SamplingParams, Session, Stop};
use qwen3_vl::model::Model;
use qwen3_vl::Backend;
use std::collections::HashMap;

fn load(b: &dyn Backend) -> Model {
    Model::load(&common::repo_root().join("tests/fixtures/text/untied_mha"), b, &mut |_, _| {}).unwrap()
}

/// Allows only its ids (a grammar in miniature); with `fail_at`, its mask number `fail_at`
/// (from 0) fails instead.
struct Only {
    ids: Vec<u32>,
    masks: usize,
    fail_at: Option<usize>,
}

impl Constraint for Only {
    fn fill_mask(&mut self, words: &mut [u32]) -> qwen3_vl::Result<()> {
        if self.fail_at == Some(self.masks) {
            return Err(qwen3_vl::Error::Tokenizer { msg: "the test grammar breaks here".into() });
        }
        self.masks += 1;
        words.fill(0);
        for &t in &self.ids {
            words[t as usize / 32] |= 1 << (t % 32);
        }
        Ok(())
    }
    fn accept(&mut self, token: u32) -> qwen3_vl::Result<()> {
        if self.ids.contains(&token) {
            Ok(())
        } else {
            Err(qwen3_vl::Error::Tokenizer { msg: format!("token {} is not allowed", token) })
        }
    }
}

fn sampler(p: SamplingParams, allowed: Option<&[u32]>) -> Sampler {
    let s = Sampler::new(p);
    match allowed {
        Some(ids) => s.with_constraint(Box::new(Only { ids: ids.to_vec(), masks: 0, fail_at: None })),
        None => s,
    }
}

const GREEDY: SamplingParams = SamplingParams { temperature: 0.0, top_k: 0, top_p: 1.0, repetition_penalty: 1.0, seed: 0 };
const HOT: SamplingParams = SamplingParams { temperature: 1.2, top_k: 40, top_p: 0.95, repetition_penalty: 1.0, seed: 21 };
const WARM: SamplingParams = SamplingParams { temperature: 0.9, top_k: 40, top_p: 0.95, repetition_penalty: 1.0, seed: 22 };
const WILD: SamplingParams = SamplingParams { temperature: 2.0, top_k: 64, top_p: 1.0, repetition_penalty: 1.0, seed: 23 };

/// The batch: (settings, allowed ids or free). Ids in several mask words, one alone.
fn cases() -> Vec<(SamplingParams, Option<Vec<u32>>)> {
    vec![
        (GREEDY, Some(vec![3, 40, 77, 500, 1023])),
        (GREEDY, None),
        (HOT, Some(vec![1, 2, 64, 65, 700, 900])),
        (WARM, None),
        (WILD, Some(vec![999])),
    ]
}

fn prompt(i: usize, vocab: usize) -> Vec<u32> {
    let len = [5, 17, 9, 23, 3][i % 5];
    (0..len).map(|j| ((i * 7919 + j * 104_729 + 13) % (vocab - 1)) as u32).collect()
}

/// A request's tokens drawn on the host from a session's logits (`Session::feed`, the sampler's
/// own mask and draw, numbered by position as the engine numbers them), and how many come
/// first with a clear greedy margin: the top two allowed logits more than 1e-2 of the logits'
/// std apart (another path may pick differently only after those).
fn host_reference(model: &Model, b: &dyn Backend, prompt: &[u32], steps: usize, p: SamplingParams, allowed: Option<&[u32]>) -> (Vec<u32>, usize) {
    let n = model.sampled_vocab();
    let mut s = Session::with_kv_dtype(model, b, prompt.len() + steps, b.default_kv_dtype()).unwrap();
    let mut smp = sampler(p, allowed);
    let mut logits = s.feed(prompt).unwrap();
    let (mut tokens, mut clear, mut context) = (Vec::new(), None, prompt.to_vec());
    for step in 0..steps {
        logits.truncate(n);
        let mut words = vec![0u32; mask_words(n)];
        smp.fill_mask(&mut words).unwrap();
        let mut ranked: Vec<f32> = (0..n).filter(|&t| mask_allows(&words, t)).map(|t| logits[t]).collect();
        ranked.sort_by(|a, b| b.partial_cmp(a).unwrap());
        let mean = logits.iter().sum::<f32>() / n as f32;
        let std = (logits.iter().map(|v| (v - mean) * (v - mean)).sum::<f32>() / n as f32).sqrt();
        if clear.is_none() && ranked.len() > 1 && ranked[0] - ranked[1] < 1e-2 * std {
            clear = Some(step);
        }
        let t = smp.sample_at(&mut logits, &context, (s.len() - 1) as u64).unwrap();
        smp.accept(t).unwrap();
        tokens.push(t);
        context.push(t);
        if step + 1 < steps {
            logits = s.feed(&[t]).unwrap();
        }
    }
    (tokens, clear.unwrap_or(steps))
}

/// Runs the engine until it has no work; each sequence's tokens and how it ended.
fn run(e: &mut Engine<'_>) -> HashMap<SeqId, (Vec<u32>, Stop)> {
    let mut out: HashMap<SeqId, (Vec<u32>, Option<Stop>)> = HashMap::new();
    let mut steps = 0;
    while e.has_work() {
        for ev in e.step().unwrap() {
            let entry = out.entry(match &ev {
                Event::Token { id, .. } | Event::Finished { id, .. } => *id,
            }).or_default();
            assert!(entry.1.is_none(), "an event after the end: {:?}", ev);
            match ev {
                Event::Token { token, .. } => entry.0.push(token),
                Event::Finished { stop, generated, .. } => {
                    assert_eq!(generated, entry.0.len());
                    entry.1 = Some(stop);
                }
            }
        }
        steps += 1;
        assert!(steps < 1000, "the engine does not finish");
    }
    assert_eq!(e.stats().blocks_used, 0, "every block free at the end");
    out.into_iter().map(|(id, (t, s))| (id, (t, s.expect("every sequence finished")))).collect()
}

fn batch(model: &Model, b: &dyn Backend, record: bool, device_picks: bool, max_new: usize) -> (HashMap<SeqId, (Vec<u32>, Stop)>, usize, u64) {
    let mut cfg = EngineConfig::new(8, 1024, b.default_kv_dtype());
    cfg.block = 4;
    let mut e = Engine::new(model, b, cfg).unwrap();
    e.set_recording(record);
    e.set_device_picks(device_picks);
    for (i, (p, allowed)) in cases().into_iter().enumerate() {
        e.add(Request { prompt: prompt(i, model.config.text.vocab_size), images: None, max_new, sampler: sampler(p, allowed.as_deref()), stop_ids: vec![] }).unwrap();
    }
    let got = run(&mut e);
    (got, e.recorded_steps(), e.stats().host_samples)
}

/// Constrained (greedy, sampled, a single allowed id) and free (greedy, sampled) requests in one
/// batch: the constrained tokens are always allowed, every request draws what the host sampler
/// draws from the same logits (the device's masked picks against the CPU code: exact, recorded
/// decode steps and plain launches alike), and what it draws alone (exactly on the CPU; on a GPU
/// the greedy ones up to their first close call, the sampled ones the same batch again).
#[test]
fn constrained_and_free_requests_share_a_batch() {
    for b in common::backends("engine masked batch") {
        let model = load(&*b);
        let what = b.describe();
        let max_new = 10;
        let (got, recorded, host) = batch(&model, &*b, true, true, max_new);
        assert_eq!(host, 0, "{}: every row, masked or not, drawn in the step", what);
        if common::kernels_arch(&*b).is_some() {
            assert!(recorded > 0, "{}: no decode step was recorded", what);
        }
        for (i, (_, allowed)) in cases().iter().enumerate() {
            let (tokens, stop) = &got[&(i as u64)];
            assert_eq!((tokens.len(), *stop), (max_new, Stop::MaxTokens), "{}: request {}", what, i);
            if let Some(ids) = allowed {
                assert!(tokens.iter().all(|t| ids.contains(t)), "{}: request {} drew outside its mask: {:?}", what, i, tokens);
            }
        }
        assert_eq!(got[&4].0, vec![999; max_new], "{}: a single allowed id, even at temperature 2", what);
        // the host sampler from the same logits, and plain launches instead of recordings
        let (on_host, _, host) = batch(&model, &*b, true, false, max_new);
        assert_eq!(host as usize, cases().len() * max_new, "{}: the reference draws on the host", what);
        assert_eq!(got, on_host, "{}: masked picks in the step against the host sampler's", what);
        let (plain, recorded, _) = batch(&model, &*b, false, true, max_new);
        assert_eq!(recorded, 0);
        assert_eq!(got, plain, "{}: recorded and plain steps", what);
        // each alone, through a session's logits
        let cpu = b.kind() == qwen3_vl::DeviceKind::Cpu;
        for (i, (p, allowed)) in cases().into_iter().enumerate() {
            let (want, clear) = host_reference(&model, &*b, &prompt(i, model.config.text.vocab_size), max_new, p, allowed.as_deref());
            let tokens = &got[&(i as u64)].0;
            if cpu {
                assert_eq!(tokens, &want, "{}: request {} in a batch against alone", what, i);
            } else if p.temperature <= 0.0 {
                assert_eq!(tokens[..clear], want[..clear], "{}: request {}: tokens decided by a clear margin", what, i);
            }
        }
    }
}

/// A constraint that cannot give its mask ends its own sequence with `Stop::Constraint` (no
/// token for that step), whether it fails on the prompt's first pick (a prefill step) or in a
/// decode step, with the pick in the step or on the host; the other sequences go on as alone.
#[test]
fn a_constraint_without_a_mask_ends_only_its_sequence() {
    for b in common::backends("engine failing mask") {
        let model = load(&*b);
        let vocab = model.config.text.vocab_size;
        let free = host_reference(&model, &*b, &prompt(1, vocab), 8, GREEDY, None);
        for device_picks in [true, false] {
            for fail_at in [0usize, 3] {
                let what = format!("{} device picks {} failing at mask {}", b.describe(), device_picks, fail_at);
                let mut e = Engine::new(&model, &*b, EngineConfig::new(4, 512, b.default_kv_dtype())).unwrap();
                e.set_device_picks(device_picks);
                let broken = Sampler::new(GREEDY).with_constraint(Box::new(Only { ids: vec![5, 6, 7], masks: 0, fail_at: Some(fail_at) }));
                e.add(Request { prompt: prompt(0, vocab), images: None, max_new: 8, sampler: broken, stop_ids: vec![] }).unwrap();
                e.add(Request { prompt: prompt(1, vocab), images: None, max_new: 8, sampler: Sampler::new(GREEDY), stop_ids: vec![] }).unwrap();
                let got = run(&mut e);
                assert_eq!(got[&0].1, Stop::Constraint, "{}", what);
                assert_eq!(got[&0].0.len(), fail_at, "{}: the tokens before the failing mask", what);
                assert!(got[&0].0.iter().all(|t| [5, 6, 7].contains(t)), "{}", what);
                assert_eq!(got[&1].1, Stop::MaxTokens, "{}", what);
                assert_eq!(got[&1].0[..free.1], free.0[..free.1], "{}: the free sequence as alone", what);
            }
        }
    }
}

/// The session's decode step (what `bench` runs at batch 1) picks under the mask on the device:
/// the tokens are allowed, recorded and plain steps agree, and they are the host sampler's
/// (exactly on the CPU, greedy up to its first close call on a GPU).
#[test]
fn a_session_decodes_under_a_constraint_in_the_step() {
    for b in common::backends("session masked decode") {
        let model = load(&*b);
        let vocab = model.config.text.vocab_size;
        let cpu = b.kind() == qwen3_vl::DeviceKind::Cpu;
        for (i, (p, allowed)) in cases().into_iter().enumerate().filter(|(_, c)| c.1.is_some()) {
            let what = format!("{} request {}", b.describe(), i);
            let ids = allowed.clone().unwrap();
            let pr = prompt(i, vocab);
            let mut outs = Vec::new();
            for record in [true, false] {
                let mut s = Session::with_kv_dtype(&model, &*b, pr.len() + 12, b.default_kv_dtype()).unwrap();
                s.set_recording(record);
                let g = s.generate(&pr, 12, &mut sampler(p, Some(&ids)), &[], &mut |_| true).unwrap();
                assert_eq!((g.tokens.len(), g.stop), (12, Stop::MaxTokens), "{}", what);
                assert!(g.tokens.iter().all(|t| ids.contains(t)), "{}: drew outside the mask: {:?}", what, g.tokens);
                outs.push(g.tokens);
            }
            assert_eq!(outs[0], outs[1], "{}: recorded and plain steps", what);
            let (want, clear) = host_reference(&model, &*b, &pr, 12, p, Some(&ids));
            if cpu {
                assert_eq!(outs[0], want, "{}: against the host sampler", what);
            } else if p.temperature <= 0.0 {
                assert_eq!(outs[0][..clear], want[..clear], "{}: tokens decided by a clear margin", what);
            }
        }
    }
}
