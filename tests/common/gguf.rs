//! GGUF test files: small pairs written by the engine's `quantize` command, and the Python
//! `gguf` package (tests/gguf/make_gguf.py) when it is installed.

use super::{repo_root, Scratch};
use serde_json::Value;
use std::path::{Path, PathBuf};
use std::process::Command;

/// A fresh scratch directory for this process and `name`, removed when dropped.
pub fn scratch(name: &str) -> Scratch {
    Scratch::dir(&format!("qwen3-vl-gguf-{}-{}", std::process::id(), name))
}

/// Qwen's tokenizer.json cut to the 256 byte tokens and its added tokens shifted down by
/// 150643 (the 1024-token fixtures' layout: image 1012, vision start 1009, ...), no merges.
pub fn small_tokenizer_json(vocab: u64) -> Value {
    let mut t: Value = serde_json::from_slice(&std::fs::read(super::server::tokenizer()).unwrap()).unwrap();
    let vocab_map: serde_json::Map<String, Value> = t["model"]["vocab"].as_object().unwrap().iter().filter(|(k, _)| k.chars().count() == 1).filter(|(_, v)| v.as_u64().unwrap() < 256).map(|(k, v)| (k.clone(), v.clone())).collect();
    assert_eq!(vocab_map.len(), 256, "the byte tokens are ids 0..255");
    t["model"]["vocab"] = Value::Object(vocab_map);
    t["model"]["merges"] = Value::Array(vec![]);
    let added: Vec<Value> = t["added_tokens"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|a| {
            let id = a["id"].as_u64()? - 150_643;
            let mut a = a.clone();
            a["id"] = id.into();
            if id < vocab {
                Some(a)
            } else {
                None
            }
        })
        .collect();
    t["added_tokens"] = Value::Array(added);
    t
}

/// A copy of fixture checkpoint `case` (tests/fixtures/text/...) with a tokenizer.json: the real
/// one for `fullvocab`, else [`small_tokenizer_json`].
pub fn fixture_with_tokenizer(case: &str, dir: &Path) {
    let src = repo_root().join("tests/fixtures/text").join(case);
    for e in std::fs::read_dir(&src).unwrap() {
        let p = e.unwrap().path();
        let name = p.file_name().unwrap().to_string_lossy().into_owned();
        if name.ends_with(".safetensors") || name.ends_with(".json") && name != "reference.json" {
            std::fs::copy(&p, dir.join(&name)).unwrap();
        }
    }
    if case == "fullvocab" {
        std::fs::copy(super::server::tokenizer(), dir.join("tokenizer.json")).unwrap();
        std::fs::copy(repo_root().join("tests/fixtures/tokenizer/tokenizer_config.json"), dir.join("tokenizer_config.json")).unwrap();
    } else {
        std::fs::write(dir.join("tokenizer.json"), small_tokenizer_json(1024).to_string()).unwrap();
    }
}

/// Runs `qwen3-vl quantize IN OUT --type T`; returns (text, mmproj) paths.
pub fn quantize(input: &Path, out: &Path, ty: &str) -> (PathBuf, PathBuf) {
    let o = Command::new(super::server::bin()).args(["quantize"]).arg(input).arg(out).args(["--type", ty]).output().unwrap();
    assert!(o.status.success(), "quantize failed: {}", String::from_utf8_lossy(&o.stderr));
    let mut text = None;
    let mut mmproj = None;
    for e in std::fs::read_dir(out).unwrap() {
        let p = e.unwrap().path();
        let n = p.file_name().unwrap().to_string_lossy().into_owned();
        if n.starts_with("mmproj-") {
            mmproj = Some(p);
        } else if n.ends_with(".gguf") {
            text = Some(p);
        }
    }
    (text.unwrap(), mmproj.unwrap())
}

/// `python3` with the `gguf` package (`QWEN3_VL_GGUF_PYTHONPATH` as its PYTHONPATH when set),
/// or `None` (with a note) when it cannot import it; with `QWEN3_VL_EXPECT_GGUF=1` (CI) that
/// fails the test instead.
pub fn python(test: &str) -> Option<Command> {
    let python = std::env::var("QWEN3_VL_PYTHON").unwrap_or_else(|_| "python3".into());
    let mk = || {
        let mut c = Command::new(&python);
        if let Some(p) = std::env::var_os("QWEN3_VL_GGUF_PYTHONPATH") {
            c.env("PYTHONPATH", p);
        }
        c
    };
    let probe = mk().args(["-c", "import gguf, numpy"]).output();
    if !probe.as_ref().map_or(false, |o| o.status.success()) {
        let why = probe.map(|o| String::from_utf8_lossy(&o.stderr).into_owned()).unwrap_or_else(|e| e.to_string());
        assert!(std::env::var("QWEN3_VL_EXPECT_GGUF").map_or(true, |v| v != "1"), "{}: QWEN3_VL_EXPECT_GGUF=1 but {} cannot import gguf: {}", test, python, why);
        eprintln!("{}: skipped: {} has no gguf package (pip install gguf)", test, python);
        return None;
    }
    Some(mk())
}

/// Runs tests/gguf/make_gguf.py with `args`.
pub fn make_gguf(mut py: Command, args: &[&std::ffi::OsStr]) {
    let o = py.arg(repo_root().join("tests/gguf/make_gguf.py")).args(args).output().unwrap();
    assert!(o.status.success(), "make_gguf.py {:?} failed: {}", args, String::from_utf8_lossy(&o.stderr));
}

static FIXTURES: std::sync::Once = std::sync::Once::new();

fn python_fixtures_dir() -> PathBuf {
    std::env::temp_dir().join(format!("qwen3-vl-gguf-{}-python-fixtures", std::process::id()))
}

/// Removes [`python_fixtures_dir`] as the process exits: the test harness ends through `exit()`
/// whether its tests passed or not.
extern "C" fn remove_python_fixtures() {
    let _ = std::fs::remove_dir_all(python_fixtures_dir());
}

/// The Python-written fixture GGUFs (made once per test binary and shared by its tests, so
/// removed when the process exits, not when a test ends), or `None` without the package.
pub fn python_fixtures(test: &str) -> Option<PathBuf> {
    let py = python(test)?;
    let d = python_fixtures_dir();
    FIXTURES.call_once(|| {
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        unsafe { libc::atexit(remove_python_fixtures) };
        make_gguf(py, &["fixtures".as_ref(), d.as_os_str()]);
    });
    assert!(d.join("k256").exists(), "the Python fixtures were not made (see the first failure)");
    Some(d)
}
