//! Several GPUs in one process (`--device cuda:N`, `serve --data-parallel`): the tiny model
//! loaded on cuda:0 and cuda:1 and run from two threads at once gives the same greedy tokens
//! on both; one thread using both backends in turn (each call makes its own device's context
//! current) gives them too. Skipped on machines with fewer than two CUDA devices.

mod common;

use qwen3_vl::model::Model;
use qwen3_vl::{Backend, DType};
use std::sync::{Arc, Barrier};

const STEPS: usize = 24;
const PROMPT: &[u32] = &[9707, 11, 1879, 0, 3555, 374, 279, 6722, 315, 9625, 30];

fn tiny() -> std::path::PathBuf {
    common::repo_root().join("tests/fixtures/vision/tiny")
}

fn load(b: &dyn Backend) -> Model {
    Model::load(&tiny(), b, &mut |_, _| {}).expect("the tiny fixture loads")
}

/// The greedy tokens of `PROMPT` and how many lead by a clear margin.
fn greedy(model: &Model, b: &dyn Backend) -> (Vec<u32>, usize) {
    common::greedy_alone(model, b, DType::F16, PROMPT, STEPS)
}

/// Both runs agree wherever both decided by a clear margin (same kernels on the same kind of
/// GPU: in practice everywhere).
fn assert_same(what: &str, a: &(Vec<u32>, usize), b: &(Vec<u32>, usize)) {
    let clear = a.1.min(b.1);
    assert!(clear >= 4, "{}: only {} clearly decided tokens; the test shows nothing", what, clear);
    assert_eq!(a.0[..clear], b.0[..clear], "{}: cuda:0 {:?} vs cuda:1 {:?}", what, a.0, b.0);
}

#[test]
fn two_devices_from_two_threads_give_the_same_greedy_tokens() {
    let Some(gpus) = common::gpus_at_least("two devices", 2) else { return };
    #[cfg(feature = "cuda")]
    for (i, g) in gpus.iter().enumerate() {
        let c = g.as_any().downcast_ref::<qwen3_vl::cuda::CudaBackend>().expect("a CUDA backend");
        assert_eq!(c.ordinal(), i, "{}", g.describe());
    }
    // 1. each device loads and runs on a thread of its own, both at once, three rounds
    let start = Arc::new(Barrier::new(gpus.len()));
    let runs: Vec<Vec<(Vec<u32>, usize)>> = std::thread::scope(|s| {
        let handles: Vec<_> = gpus
            .iter()
            .map(|g| {
                let start = Arc::clone(&start);
                s.spawn(move || {
                    let model = load(&**g);
                    start.wait();
                    (0..3).map(|_| greedy(&model, &**g)).collect::<Vec<_>>()
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().expect("a device thread panicked")).collect()
    });
    for round in 0..3 {
        assert_same(&format!("concurrent round {}", round), &runs[0][round], &runs[1][round]);
    }
    // 2. one thread, both devices in turn: the models live on their own devices
    let models: Vec<Model> = gpus.iter().map(|g| load(&**g)).collect();
    for _ in 0..2 {
        let a = greedy(&models[0], &*gpus[0]);
        let b = greedy(&models[1], &*gpus[1]);
        assert_same("alternating on one thread", &a, &b);
        assert_same("alternating against the concurrent run", &a, &runs[0][0]);
    }
    // 3. each device's pool holds its own model: both in use, neither empty
    for g in &gpus {
        assert!(g.memory_stats().in_use > 0, "{}: nothing allocated", g.describe());
    }
}

#[test]
fn an_ordinal_past_the_visible_devices_is_refused_with_the_count() {
    let Some(_first) = common::gpu("ordinal past the devices") else { return };
    let count = qwen3_vl::cuda_device_count().expect("a device opened, so they can be counted");
    let e = qwen3_vl::select_device(qwen3_vl::DeviceRequest::Cuda(count), None).err().expect("past the last device");
    assert!(e.to_string().contains(&format!("no CUDA device {}", count)) && e.to_string().contains(&format!("sees {}", count)), "{}", e);
}
