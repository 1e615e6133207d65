//! Corrupt and hostile GGUF files: truncated anywhere, offsets and sizes past the end, absurd
//! dimensions and counts, unknown or unsupported types, overlapping or misaligned tensors, rows
//! that are not whole blocks, missing tensors, metadata of the wrong type. Every one must give
//! an error naming the file (and the tensor or key), never a panic; sizes are checked before
//! anything is allocated (tests/fuzz_parsers.rs runs the reader under an allocation cap).

mod common;

use common::gguf::{fixture_with_tokenizer, quantize, scratch};
use common::Scratch;
use qwen3_vl::gguf::{Gguf, Value, Writer};
use qwen3_vl::model::{Model, ModelFiles};
use std::path::{Path, PathBuf};

/// A GGUF file byte by byte: header, key/values (key, type, payload), tensor infos (name,
/// dims innermost first, type, offset), padding to 32, then `data` zero bytes.
struct Raw {
    version: u32,
    n_tensors: Option<u64>,
    n_kv: Option<u64>,
    kv: Vec<(String, u32, Vec<u8>)>,
    tensors: Vec<(String, Vec<u64>, u32, u64)>,
    data: usize,
}

fn s(x: &str) -> Vec<u8> {
    let mut v = (x.len() as u64).to_le_bytes().to_vec();
    v.extend_from_slice(x.as_bytes());
    v
}

impl Raw {
    fn new() -> Raw {
        Raw { version: 3, n_tensors: None, n_kv: None, kv: vec![], tensors: vec![("t".into(), vec![64, 2], 0, 0)], data: 512 }
    }
    fn bytes(&self) -> Vec<u8> {
        let mut b = b"GGUF".to_vec();
        b.extend_from_slice(&self.version.to_le_bytes());
        b.extend_from_slice(&self.n_tensors.unwrap_or(self.tensors.len() as u64).to_le_bytes());
        b.extend_from_slice(&self.n_kv.unwrap_or(self.kv.len() as u64).to_le_bytes());
        for (k, t, p) in &self.kv {
            b.extend(s(k));
            b.extend_from_slice(&t.to_le_bytes());
            b.extend_from_slice(p);
        }
        for (n, dims, t, off) in &self.tensors {
            b.extend(s(n));
            b.extend_from_slice(&(dims.len() as u32).to_le_bytes());
            for d in dims {
                b.extend_from_slice(&d.to_le_bytes());
            }
            b.extend_from_slice(&t.to_le_bytes());
            b.extend_from_slice(&off.to_le_bytes());
        }
        b.resize((b.len() + 31) / 32 * 32 + self.data, 0);
        b
    }
}

/// A file under the temporary folder holding `bytes`, removed when dropped (the test passing or not).
fn temp_file(name: &str, bytes: &[u8]) -> Scratch {
    let p = Scratch::path(&format!("qwen3-vl-hostile-{}-{}.gguf", std::process::id(), name));
    std::fs::write(&p, bytes).unwrap();
    p
}

/// Opens `bytes` as a file; returns the error text (the file must not parse).
fn open_err(name: &str, bytes: &[u8]) -> (String, String) {
    let p = temp_file(name, bytes);
    let e = match Gguf::open(&p) {
        Ok(_) => panic!("{}: a hostile file parsed", name),
        Err(e) => e.to_string(),
    };
    assert!(e.contains(&p.display().to_string()), "{}: the error names the file: {}", name, e);
    (e, p.display().to_string())
}

#[test]
fn the_valid_base_file_parses() {
    let f = temp_file("base", &Raw::new().bytes());
    let g = Gguf::open(&f).unwrap();
    assert_eq!(g.tensor("t").unwrap().shape, vec![2, 64]);
}

#[test]
fn every_truncation_is_an_error() {
    let mut r = Raw::new();
    r.kv.push(("general.architecture".into(), 8, s("qwen3vl")));
    r.kv.push(("a.arr".into(), 9, [&6u32.to_le_bytes()[..], &2u64.to_le_bytes(), &1f32.to_le_bytes(), &2f32.to_le_bytes()].concat()));
    let full = r.bytes();
    for cut in 0..full.len() - r.data + 1 {
        let (e, _) = open_err("cut", &full[..cut]);
        assert!(e.contains("truncated") || e.contains("not a GGUF") || e.contains("past the end") || e.contains("cannot fit"), "cut at {}: {}", cut, e);
    }
}

#[test]
fn hostile_headers_are_refused_clearly() {
    let cases: Vec<(&str, Box<dyn Fn(&mut Raw)>, &str)> = vec![
        ("version", Box::new(|r| r.version = 1), "version 1"),
        ("tensor count", Box::new(|r| r.n_tensors = Some(1 << 60)), "cannot fit"),
        ("kv count", Box::new(|r| r.n_kv = Some(u64::MAX)), "cannot fit"),
        ("string length", Box::new(|r| r.kv.push(("k".into(), 8, u64::MAX.to_le_bytes().to_vec()))), "limit"),
        ("array count", Box::new(|r| r.kv.push(("k".into(), 9, [&4u32.to_le_bytes()[..], &(1u64 << 62).to_le_bytes()].concat()))), "cannot fit"),
        ("nested array", Box::new(|r| r.kv.push(("k".into(), 9, [&9u32.to_le_bytes()[..], &1u64.to_le_bytes()].concat()))), "arrays of arrays"),
        ("value type", Box::new(|r| r.kv.push(("k".into(), 77, vec![]))), "unknown value type 77"),
        ("bool", Box::new(|r| r.kv.push(("k".into(), 7, vec![2]))), "neither 0 nor 1"),
        ("duplicate key", Box::new(|r| r.kv.extend([("k".into(), 4, vec![0; 4]), ("k".into(), 4, vec![0; 4])])), "appears twice"),
        ("alignment", Box::new(|r| r.kv.push(("general.alignment".into(), 4, 3u32.to_le_bytes().to_vec()))), "power of two"),
        ("dims", Box::new(|r| r.tensors[0].1 = vec![1; 5]), "5 dimensions"),
        ("absurd dims", Box::new(|r| r.tensors[0].1 = vec![1 << 40, 1 << 40]), "too large"),
        ("huge dim", Box::new(|r| r.tensors[0].1 = vec![64, u64::MAX]), "too large"),
        ("unknown type", Box::new(|r| r.tensors[0].2 = 99), "unknown tensor type 99"),
        ("unsupported type", Box::new(|r| r.tensors[0].2 = 2), "Q4_0"),
        ("partial blocks", Box::new(|r| r.tensors[0] = ("t".into(), vec![100, 2], 12, 0)), "whole q4_k blocks"),
        ("offset past the end", Box::new(|r| r.tensors[0].3 = 1 << 20), "past the end"),
        ("offset overflow", Box::new(|r| r.tensors[0].3 = u64::MAX - 31), "offset"),
        ("misaligned", Box::new(|r| r.tensors[0].3 = 8), "alignment"),
        ("overlap", Box::new(|r| r.tensors.push(("u".into(), vec![64], 0, 0))), "overlaps"),
        ("duplicate tensor", Box::new(|r| r.tensors.push(("t".into(), vec![64], 0, 256))), "twice"),
    ];
    for (name, f, want) in cases {
        let mut r = Raw::new();
        f(&mut r);
        let (e, _) = open_err(name, &r.bytes());
        assert!(e.contains(want), "{}: expected '{}' in: {}", name, want, e);
        if ["unknown type", "unsupported type", "partial blocks", "offset past the end", "misaligned", "overlap"].contains(&name) {
            assert!(e.contains("tensor '"), "{}: the error names the tensor: {}", name, e);
        }
    }
    let (e, _) = open_err("magic", b"GGML\x03\0\0\0");
    assert!(e.contains("not a GGUF file"), "{}", e);
}

/// A valid Q8_0 pair of the tied_gqa fixture, by `qwen3-vl quantize`, and the scratch folders
/// holding it (the pair is removed with them).
fn valid_pair(tag: &str) -> (PathBuf, PathBuf, [Scratch; 2]) {
    let src = scratch(&format!("{}-src", tag));
    fixture_with_tokenizer("tied_gqa", &src);
    let out = scratch(&format!("{}-out", tag));
    let (text, mmproj) = quantize(&src, &out, "q8_0");
    (text, mmproj, [src, out])
}

/// `src` rewritten: metadata changed by `kv`, tensors kept when `keep` says so.
fn rewrite(src: &Path, dst: &Path, kv: &dyn Fn(&mut Writer), keep: &dyn Fn(&str) -> bool) {
    let g = Gguf::open(src).unwrap();
    let mut w = Writer::new();
    for (k, v) in g.metadata() {
        w.set(k, v.clone());
    }
    kv(&mut w);
    let kept: Vec<_> = g.tensors().iter().filter(|t| keep(&t.name)).cloned().collect();
    for t in &kept {
        w.add_tensor(&t.name, &t.shape, t.dtype).unwrap();
    }
    w.write(dst, |i| Ok(g.bytes(&kept[i]).to_vec())).unwrap();
}

fn load_err(text: &Path, mmproj: &Path) -> String {
    let b = common::cpu();
    let r = ModelFiles::find(text, Some(mmproj)).and_then(|f| f.open()).and_then(|o| Model::load_opened(&o, None, &*b, &mut |_, _| {}));
    match r {
        Ok(_) => panic!("{} loaded", text.display()),
        Err(e) => e.to_string(),
    }
}

#[test]
fn missing_tensors_and_wrong_metadata_are_named() {
    let (text, mmproj, _dirs) = valid_pair("model");
    let dir = scratch("model-bad");
    let bad = dir.join("bad.gguf");
    // a missing weight
    rewrite(&text, &bad, &|_| {}, &|n| n != "blk.1.ffn_up.weight");
    let e = load_err(&bad, &mmproj);
    assert!(e.contains("blk.1.ffn_up.weight") && e.contains("missing") && e.contains(&bad.display().to_string()), "{}", e);
    // a missing vision tensor
    let badv = dir.join("badv.gguf");
    rewrite(&mmproj, &badv, &|_| {}, &|n| n != "v.blk.0.attn_qkv.weight");
    let e = load_err(&text, &badv);
    assert!(e.contains("v.blk.0.attn_qkv.weight") && e.contains(&badv.display().to_string()), "{}", e);
    // metadata of the wrong type, and missing
    for (key, v, want) in [
        ("qwen3vl.block_count", Value::String("2".into()), "is a string, expected a non-negative integer"),
        ("qwen3vl.attention.head_count", Value::F32(4.0), "is a f32"),
        ("qwen3vl.rope.dimension_sections", Value::U32(4), "is a u32, expected an array"),
        ("tokenizer.ggml.tokens", Value::U32(4), "'tokenizer.ggml.tokens' is a u32, expected an array"),
        ("general.architecture", Value::String("llama".into()), "'llama', expected 'qwen3vl'"),
        ("qwen3vl.attention.head_count_kv", Value::U32(3), "must divide"),
    ] {
        rewrite(&text, &bad, &|w| w.set(key, v.clone()), &|_| true);
        let e = load_err(&bad, &mmproj);
        assert!(e.contains(want) && e.contains(&bad.display().to_string()), "{}: expected '{}' in: {}", key, want, e);
    }
    // a wrong shape
    rewrite(&text, &bad, &|w| w.set("qwen3vl.feed_forward_length", Value::U32(96)), &|_| true);
    let e = load_err(&bad, &mmproj);
    assert!(e.contains("ffn_gate.weight") && e.contains("shape"), "{}", e);
    // the mmproj given as the text model and the other way round
    let e = load_err(&mmproj, &text);
    assert!(e.contains("'clip', expected 'qwen3vl'"), "{}", e);
    // a tensor nobody asked for
    let g = Gguf::open(&text).unwrap();
    let extra = g.tensor("blk.0.ffn_up.weight").unwrap().clone();
    let mut w = Writer::new();
    for (k, v) in g.metadata() {
        w.set(k, v.clone());
    }
    let all: Vec<_> = g.tensors().to_vec();
    for t in &all {
        w.add_tensor(&t.name, &t.shape, t.dtype).unwrap();
    }
    w.add_tensor("blk.9.ffn_up.weight", &extra.shape, extra.dtype).unwrap();
    w.write(&bad, |i| Ok(g.bytes(if i < all.len() { &all[i] } else { &extra }).to_vec())).unwrap();
    let e = load_err(&bad, &mmproj);
    assert!(e.contains("blk.9.ffn_up.weight") && e.contains("unexpected"), "{}", e);
}
