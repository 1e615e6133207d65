//! Device selection: `auto` falls back to the CPU with the reason logged; `cuda` fails with a
//! reason instead of falling back; each embedded PTX module declares exactly its part of the
//! typed kernel list; `--kernels` forces a module (on a GPU machine: both load and run).

mod common;

use qwen3_vl::kernels::{ptx_entries, Arch, Kernel, KernelsRequest};
use qwen3_vl::{select_device, select_device_with, DeviceKind, DeviceRequest};
use std::sync::Mutex;

struct Capture(Mutex<Vec<String>>);

impl log::Log for Capture {
    fn enabled(&self, _: &log::Metadata) -> bool {
        true
    }
    fn log(&self, r: &log::Record) {
        self.0.lock().unwrap().push(format!("{}", r.args()));
    }
    fn flush(&self) {}
}


#[test]
fn auto_selects_a_backend_and_logs_why() {
    let logs: &'static Capture = Box::leak(Box::new(Capture(Mutex::new(Vec::new()))));
    log::set_logger(logs).expect("only this test installs a logger");
    // the pure-Rust build says its choice at debug level (there is nothing to fall back from)
    log::set_max_level(if qwen3_vl::PTX.is_empty() { log::LevelFilter::Debug } else { log::LevelFilter::Info });
    let sel = select_device(DeviceRequest::Auto, Some(2)).expect("auto always yields a backend");
    let logged = logs.0.lock().unwrap().clone();
    assert!(logged.iter().any(|l| l == &sel.reason), "reason {:?} not in log {:?}", sel.reason, logged);
    match sel.backend.kind() {
        DeviceKind::Cpu => {
            assert!(!common::expect_gpu(), "a GPU was expected but auto chose the CPU: {}", sel.reason);
            // our machines without a GPU: libcuda is present and reports no device
            if !qwen3_vl::PTX.is_empty() {
                assert!(sel.reason.contains("falling back from CUDA: "), "{}", sel.reason);
                assert!(sel.reason.contains("CUDA device"), "{}", sel.reason);
            } else {
                assert!(!sel.reason.contains("falling back"), "{}", sel.reason);
                assert!(sel.reason.contains("--features cuda"), "{}", sel.reason);
            }
            assert!(sel.reason.contains("2 threads"), "{}", sel.reason);
        }
        DeviceKind::Cuda => assert!(sel.reason.contains("CUDA ("), "{}", sel.reason),
    }
}

#[test]
fn explicit_cuda_request_fails_with_a_reason_instead_of_falling_back() {
    match select_device(DeviceRequest::Cuda(0), None) {
        Ok(sel) => assert_eq!(sel.backend.kind(), DeviceKind::Cuda),
        Err(e) => {
            assert!(!common::expect_gpu(), "{}", e);
            assert!(e.to_string().starts_with("CUDA backend unavailable: "), "{}", e);
        }
    }
    assert_eq!(select_device(DeviceRequest::Cpu, Some(1)).unwrap().backend.kind(), DeviceKind::Cpu);
    assert!("tpu".parse::<DeviceRequest>().is_err());
}

#[test]
fn each_ptx_module_declares_exactly_its_kernels() {
    if qwen3_vl::PTX.is_empty() {
        eprintln!("built without the cuda feature: no PTX to check");
        return;
    }
    let archs: Vec<Arch> = qwen3_vl::PTX.iter().map(|p| p.arch).collect();
    assert_eq!(archs, Arch::ALL.to_vec(), "one module per architecture");
    for ptx in qwen3_vl::PTX {
        assert!(ptx.text.contains(&format!(".target {}", ptx.arch.ptx_target())), "{} PTX must target {}", ptx.arch, ptx.arch.ptx_target());
        let mut entries = ptx_entries(ptx.text);
        entries.sort_unstable();
        let mut names: Vec<_> = Kernel::in_module(ptx.arch).map(|k| k.name()).collect();
        names.sort_unstable();
        assert_eq!(entries, names, "{}", ptx.arch);
    }
    // On a GPU machine every module the device supports must load with all its kernels, and
    // the forced choice must be the one loaded.
    if let Some(g) = common::gpu("ptx load") {
        assert!(g.describe().starts_with("CUDA"));
        for arch in Arch::ALL {
            let sel = select_device_with(DeviceRequest::Cuda(0), KernelsRequest::Force(arch), None).unwrap_or_else(|e| panic!("{}: {}", arch, e));
            assert!(sel.backend.describe().contains(arch.name()), "{} vs {}", sel.backend.describe(), arch);
        }
    }
}
