//! Bad input gets a clear error naming the file, tensor or limit: never a panic or wrong output.

mod common;

use common::Scratch;
use qwen3_vl::generate::Session;
use qwen3_vl::model::Model;
use qwen3_vl::{select_device, Backend, DeviceRequest, Error};
use safetensors::tensor::{Dtype, TensorView};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

fn fixture() -> PathBuf {
    common::repo_root().join("tests/fixtures/text/tied_gqa")
}

/// An empty folder under the temp dir, removed when the test ends (pass or fail).
fn empty_scratch(name: &str) -> Scratch {
    Scratch::dir(&format!("qwen3-vl-bad-input-{}-{}", name, std::process::id()))
}

/// A scratch copy of the tied_gqa fixture (config.json + model.safetensors).
fn scratch(name: &str) -> Scratch {
    let dir = empty_scratch(name);
    for f in ["config.json", "model.safetensors"] {
        std::fs::copy(fixture().join(f), dir.join(f)).unwrap();
    }
    dir
}

/// Rewrites `dir/model.safetensors` after `edit` changes the (name -> (dtype, shape, bytes)) map.
fn rewrite(dir: &Path, edit: impl FnOnce(&mut BTreeMap<String, (Dtype, Vec<usize>, Vec<u8>)>)) {
    let bytes = std::fs::read(fixture().join("model.safetensors")).unwrap();
    let st = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    let mut map: BTreeMap<String, (Dtype, Vec<usize>, Vec<u8>)> =
        st.tensors().into_iter().map(|(n, v)| (n, (v.dtype(), v.shape().to_vec(), v.data().to_vec()))).collect();
    edit(&mut map);
    let views: Vec<(String, TensorView<'_>)> = map.iter().map(|(n, (d, s, b))| (n.clone(), TensorView::new(*d, s.clone(), b).unwrap())).collect();
    safetensors::serialize_to_file(views, None, &dir.join("model.safetensors")).unwrap();
}

fn cpu() -> std::sync::Arc<dyn Backend> {
    select_device(DeviceRequest::Cpu, Some(1)).unwrap().backend
}

fn load_err(dir: &Path) -> String {
    match Model::load(dir, &*cpu(), &mut |_, _| {}) {
        Ok(_) => panic!("loading {} should fail", dir.display()),
        Err(e) => e.to_string(),
    }
}

#[test]
fn truncated_safetensors_is_named() {
    let dir = scratch("truncated");
    let path = dir.join("model.safetensors");
    let len = std::fs::metadata(&path).unwrap().len();
    let f = std::fs::OpenOptions::new().write(true).open(&path).unwrap();
    f.set_len(len - 100).unwrap();
    let e = load_err(&dir);
    assert!(e.contains("model.safetensors") && e.contains("truncated") && e.contains(&format!("{} bytes", len - 100)), "{}", e);
    assert!(!e.contains("tensor ''") && !e.contains("MetadataIncompleteBuffer"), "{}", e);
    // garbage instead of a header
    std::fs::write(&path, b"this is not a safetensors file at all").unwrap();
    let e = load_err(&dir);
    assert!(e.contains("model.safetensors") && e.contains("not a valid safetensors file"), "{}", e);
}

#[test]
fn missing_tensor_is_named() {
    let dir = scratch("missing");
    rewrite(&dir, |m| {
        m.remove("model.language_model.layers.1.mlp.up_proj.weight");
    });
    let e = load_err(&dir);
    assert!(e.contains("model.language_model.layers.1.mlp.up_proj.weight") && e.contains("missing"), "{}", e);
}

#[test]
fn wrong_shape_is_named_with_both_shapes() {
    let dir = scratch("shape");
    rewrite(&dir, |m| {
        let t = m.get_mut("model.language_model.layers.0.self_attn.k_proj.weight").unwrap();
        t.1 = vec![64, 32];
        t.2.truncate(64 * 32 * 4);
    });
    let e = load_err(&dir);
    assert!(e.contains("self_attn.k_proj.weight") && e.contains("[64, 32]") && e.contains("[32, 64]"), "{}", e);
}

#[test]
fn unsupported_dtype_is_named() {
    let dir = scratch("dtype");
    rewrite(&dir, |m| {
        let t = m.get_mut("model.language_model.norm.weight").unwrap();
        t.0 = Dtype::I32;
    });
    let e = load_err(&dir);
    assert!(e.contains("model.language_model.norm.weight") && e.contains("I32") && e.contains("not supported"), "{}", e);
}

#[test]
fn unexpected_tensors_are_reported() {
    let dir = scratch("extra");
    rewrite(&dir, |m| {
        m.insert("model.language_model.layers.2.mlp.up_proj.weight".into(), (Dtype::F32, vec![2], vec![0; 8]));
    });
    let e = load_err(&dir);
    assert!(e.contains("layers.2.mlp.up_proj.weight") && e.contains("unexpected"), "{}", e);
}

#[test]
fn config_mismatch_names_the_tensor_and_missing_files_the_path() {
    let dir = scratch("config");
    let cfg = std::fs::read_to_string(dir.join("config.json")).unwrap().replace("\"intermediate_size\": 128", "\"intermediate_size\": 96");
    std::fs::write(dir.join("config.json"), cfg).unwrap();
    let e = load_err(&dir);
    assert!(e.contains("gate_proj.weight") && e.contains("[96, 64]"), "{}", e);
    std::fs::remove_file(dir.join("config.json")).unwrap();
    let e = load_err(&dir);
    assert!(e.contains("config.json") && e.contains("No such file"), "{}", e);
    let e = load_err(&dir.join("does-not-exist"));
    assert!(e.contains("does-not-exist") && e.contains("model directory") && e.contains("does not exist"), "{}", e);
}

/// A config.json whose sizes no checkpoint has (a billion layers once aborted the process on a
/// 440 GB allocation; 2^64 - 1 panicked) is refused by name, through the command line too.
#[test]
fn config_sizes_out_of_bounds_are_refused_before_allocating() {
    let dir = scratch("config-bounds");
    std::fs::copy(common::repo_root().join("tests/fixtures/tokenizer/tokenizer.json"), dir.join("tokenizer.json")).unwrap();
    let original = std::fs::read_to_string(dir.join("config.json")).unwrap();
    let layers = json_field(&original, "num_hidden_layers");
    for huge in ["1000000000", "18446744073709551615"] {
        let cfg = original.replace(&layers, &format!("\"num_hidden_layers\": {}", huge));
        std::fs::write(dir.join("config.json"), cfg).unwrap();
        let e = load_err(&dir);
        assert!(e.contains("config.json") && e.contains(&format!("text_config.num_hidden_layers = {} is out of range (1 to 1024)", huge)), "{}", e);
        let out = std::process::Command::new(common::server::bin()).args(["generate", "--device", "cpu", "-p", "hi", "-m"]).arg(&*dir).output().unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{}", stderr);
        assert!(stderr.contains("num_hidden_layers") && !stderr.contains("panicked"), "{}", stderr);
    }
}

/// The `"key": value` text of a numeric field in a JSON file.
fn json_field(json: &str, key: &str) -> String {
    let start = json.find(&format!("\"{}\"", key)).unwrap_or_else(|| panic!("no {} in the fixture", key));
    let end = start + json[start..].find(|c: char| c == ',' || c == '}').unwrap();
    json[start..end].to_string()
}

#[test]
fn missing_shard_is_named() {
    let dir = empty_scratch("shard");
    let src = common::repo_root().join("tests/fixtures/text/untied_mha");
    for f in std::fs::read_dir(&src).unwrap() {
        let f = f.unwrap().path();
        let name = f.file_name().unwrap().to_string_lossy().to_string();
        if name != "model-00003-of-00004.safetensors" {
            std::fs::copy(&f, dir.join(&name)).unwrap();
        }
    }
    let e = load_err(&dir);
    assert!(e.contains("model-00003-of-00004.safetensors"), "{}", e);
}

#[test]
fn prompts_longer_than_the_context_are_refused() {
    let b = cpu();
    let model = Model::load(&fixture(), &*b, &mut |_, _| {}).unwrap();
    let mut s = Session::new(&model, &*b, 4).unwrap();
    match s.feed(&[1, 2, 3, 4, 5]) {
        Err(Error::Context { tokens: 5, limit: 4, .. }) => {}
        other => panic!("expected a context error, got {:?}", other.map(|l| l.len())),
    }
    let too_big = model.config.text.max_position_embeddings + 1;
    assert!(matches!(Session::new(&model, &*b, too_big), Err(Error::Context { .. })));
    // out-of-vocabulary ids are refused, not read out of bounds
    let e = s.feed(&[5000]).unwrap_err().to_string();
    assert!(e.contains("5000") && e.contains("vocabulary"), "{}", e);
}
