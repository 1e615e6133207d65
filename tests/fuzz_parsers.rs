//! Hostile input for every parser that reads outside data: safetensors headers and shard
//! indexes, config.json, generation_config.json, preprocessor_config.json, tokenizer.json,
//! the image decoders, HTTP request framing and chat-completions JSON bodies (images
//! included), and stop strings.
//!
//! Each target mutates real seed files (bit flips, interesting bytes and integers, inserted
//! tokens, cut and duplicated ranges, and, for JSON, values replaced by hostile ones: huge or
//! negative numbers, wrong types, deep nesting, long strings) and checks that the parser
//! returns (Ok or Err) without panicking, within a time limit, and without any single
//! allocation above `ALLOC_CAP`: this binary's global allocator refuses larger ones, printing
//! the size and each target's current input number (the process then aborts, so a size taken
//! from unchecked input cannot pass unnoticed).
//!
//! CI runs a bounded number of inputs per target (see `default_inputs`); set
//! `QWEN3_VL_FUZZ_INPUTS=N` for a longer run and `QWEN3_VL_FUZZ_SEED` for other inputs. A
//! failing input is written under `target/fuzz-failures/` and the message says how to replay.

mod common;

use qwen3_vl::generation_config::GenerationDefaults;
use qwen3_vl::image::{decode_image_limited, preprocess, PreprocessConfig};
use qwen3_vl::model::{Checkpoint, Config};
use qwen3_vl::server::http::{Connection, Limits};
use qwen3_vl::server::images::ImagePolicy;
use qwen3_vl::server::openai::{parse_chat_request, ParseLimits};
use qwen3_vl::server::prompt::{self, TokenLimits};
use qwen3_vl::server::stop::StopMatcher;
use qwen3_vl::Tokenizer;
use serde_json::{json, Value};
use std::alloc::{GlobalAlloc, Layout, System};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

// ---------------------------------------------------------------------------------------
// 1. allocation cap

/// The largest single allocation any parser may make here. The inputs are at most a few MB
/// (the real tokenizer.json is 11 MB) and the limits passed are small, so anything near this
/// was sized from the input itself.
const ALLOC_CAP: usize = 256 << 20;

/// Current input number of each target (for the allocation report; targets run in parallel).
static CURRENT: [AtomicU64; 16] = [
    AtomicU64::new(0), AtomicU64::new(0), AtomicU64::new(0), AtomicU64::new(0),
    AtomicU64::new(0), AtomicU64::new(0), AtomicU64::new(0), AtomicU64::new(0),
    AtomicU64::new(0), AtomicU64::new(0), AtomicU64::new(0), AtomicU64::new(0),
    AtomicU64::new(0), AtomicU64::new(0), AtomicU64::new(0), AtomicU64::new(0),
];

struct Capped;

/// Writes `msg` and a number to stderr without allocating.
fn report(msg: &[u8], n: u64) {
    let mut buf = [0u8; 24];
    let mut i = buf.len();
    let mut v = n;
    loop {
        i -= 1;
        buf[i] = b'0' + (v % 10) as u8;
        v /= 10;
        if v == 0 {
            break;
        }
    }
    // SAFETY: plain writes of valid buffers to fd 2.
    unsafe {
        libc::write(2, msg.as_ptr() as *const libc::c_void, msg.len());
        libc::write(2, buf[i..].as_ptr() as *const libc::c_void, buf.len() - i);
        libc::write(2, b"\n".as_ptr() as *const libc::c_void, 1);
    }
}

fn refuse(size: usize) {
    report(b"fuzz: refused an allocation of bytes: ", size as u64);
    for (t, c) in CURRENT.iter().enumerate() {
        let n = c.load(Ordering::Relaxed);
        if n > 0 {
            report(TARGET_NAMES[t].as_bytes(), n - 1);
        }
    }
}

unsafe impl GlobalAlloc for Capped {
    unsafe fn alloc(&self, l: Layout) -> *mut u8 {
        if l.size() > ALLOC_CAP {
            refuse(l.size());
            return std::ptr::null_mut();
        }
        System.alloc(l)
    }
    unsafe fn alloc_zeroed(&self, l: Layout) -> *mut u8 {
        if l.size() > ALLOC_CAP {
            refuse(l.size());
            return std::ptr::null_mut();
        }
        System.alloc_zeroed(l)
    }
    unsafe fn dealloc(&self, p: *mut u8, l: Layout) {
        System.dealloc(p, l)
    }
    unsafe fn realloc(&self, p: *mut u8, l: Layout, new_size: usize) -> *mut u8 {
        if new_size > ALLOC_CAP {
            refuse(new_size);
            return std::ptr::null_mut();
        }
        System.realloc(p, l, new_size)
    }
}

#[global_allocator]
static ALLOC: Capped = Capped;

// ---------------------------------------------------------------------------------------
// 2. inputs

/// xorshift64*: deterministic inputs from a seed.
struct Rng(u64);

impl Rng {
    fn new(seed: u64) -> Rng {
        Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1)
    }
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
    fn below(&mut self, n: usize) -> usize {
        if n == 0 {
            0
        } else {
            (self.next() % n as u64) as usize
        }
    }
    fn chance(&mut self, one_in: usize) -> bool {
        self.below(one_in) == 0
    }
}

/// Integers that break size arithmetic.
const INTERESTING: [u64; 14] = [0, 1, 2, 7, 8, 255, 256, 65535, 65536, 0x7fff_ffff, 0xffff_ffff, 1 << 32, 0x7fff_ffff_ffff_ffff, u64::MAX];

/// Text tokens worth inserting into textual formats.
const TOKENS: [&str; 24] = [
    "-1", "0", "1e309", "-1e309", "18446744073709551616", "4294967296", "9007199254740993", "NaN", "null", "true", "[]", "{}", "\"\"", "\"a\":",
    ",", "\\u0000", "\\ud800", "\r\n", "\r\n\r\n", "Content-Length: 99999999999\r\n", "Transfer-Encoding: chunked\r\n", "ffffffffffffffff\r\n", "data:image/png;base64,", "<|image_pad|>",
];

/// A few byte-level changes of `seed`.
fn mutate_bytes(seed: &[u8], rng: &mut Rng) -> Vec<u8> {
    let mut b = seed.to_vec();
    for _ in 0..1 + rng.below(4) {
        let len = b.len();
        match rng.below(8) {
            0 if len > 0 => {
                let i = rng.below(len);
                b[i] ^= 1 << rng.below(8);
            }
            1 if len > 0 => {
                let i = rng.below(len);
                b[i] = [0u8, 0xff, 0x7f, 0x80, b'0', b'9', b'"', b'{', b'}', b'[', b']', b',', b':', b'\n'][rng.below(14)];
            }
            2 => {
                let i = rng.below(len + 1);
                let t = TOKENS[rng.below(TOKENS.len())].as_bytes();
                b.splice(i..i, t.iter().copied());
            }
            3 if len > 0 => {
                let i = rng.below(len);
                let n = 1 + rng.below((len - i).min(64));
                b.drain(i..i + n);
            }
            4 if len > 0 => {
                let i = rng.below(len);
                let n = 1 + rng.below((len - i).min(256));
                let copy = b[i..i + n].to_vec();
                let at = rng.below(len + 1);
                b.splice(at..at, copy);
            }
            5 if len > 0 => b.truncate(rng.below(len)),
            6 if len >= 8 => {
                // an interesting integer, little- or big-endian, 1 to 8 bytes wide
                let w = [1, 2, 4, 8][rng.below(4)];
                let i = rng.below(len - w + 1);
                let v = INTERESTING[rng.below(INTERESTING.len())];
                let bytes = if rng.chance(2) { v.to_le_bytes() } else { v.to_be_bytes() };
                b[i..i + w].copy_from_slice(&bytes[..w]);
            }
            _ if len > 0 => {
                let i = rng.below(len);
                b[i] = rng.next() as u8;
            }
            _ => b.push(rng.next() as u8),
        }
    }
    b
}

/// A hostile JSON value.
fn hostile_value(rng: &mut Rng) -> Value {
    match rng.below(16) {
        0 => json!(-1),
        1 => json!(0),
        2 => json!(u64::MAX),
        3 => json!(i64::MIN),
        4 => json!(1e308),
        5 => json!(-1e308),
        6 => json!(0.5),
        7 => json!(4_294_967_296u64),
        8 => Value::Null,
        9 => json!(true),
        10 => json!(""),
        11 => json!("x".repeat(1 + rng.below(70_000))),
        12 => json!([]),
        13 => json!({}),
        14 => {
            let mut v = json!(1);
            for _ in 0..rng.below(300) {
                v = json!([v]);
            }
            v
        }
        _ => json!([1_000_000_000u64, 1_000_000_000u64, 1_000_000_000u64]),
    }
}

/// Every node of a JSON value, as a path of object keys and array indexes.
fn paths(v: &Value, at: &mut Vec<Value>, out: &mut Vec<Vec<Value>>) {
    out.push(at.clone());
    match v {
        Value::Object(o) => {
            for (k, c) in o {
                at.push(json!(k));
                paths(c, at, out);
                at.pop();
            }
        }
        Value::Array(a) => {
            for (i, c) in a.iter().enumerate().take(64) {
                at.push(json!(i));
                paths(c, at, out);
                at.pop();
            }
        }
        _ => {}
    }
}

fn node_mut<'a>(v: &'a mut Value, path: &[Value]) -> &'a mut Value {
    path.iter().fold(v, |v, k| match k {
        Value::String(k) => &mut v[k.as_str()],
        k => &mut v[k.as_u64().unwrap() as usize],
    })
}

/// A JSON seed with one to three nodes replaced by hostile values (or removed, or duplicated).
fn mutate_json(seed: &Value, rng: &mut Rng) -> Vec<u8> {
    let mut v = seed.clone();
    for _ in 0..1 + rng.below(3) {
        let mut all = Vec::new();
        paths(&v, &mut Vec::new(), &mut all);
        let path = all[rng.below(all.len())].clone();
        if rng.chance(6) && !path.is_empty() {
            // remove the node from its parent
            let (last, parent) = path.split_last().unwrap();
            match (node_mut(&mut v, parent), last) {
                (Value::Object(o), Value::String(k)) => {
                    o.remove(k);
                }
                (Value::Array(a), k) => {
                    let i = k.as_u64().unwrap() as usize;
                    if i < a.len() {
                        a.remove(i);
                    }
                }
                _ => {}
            }
        } else if rng.chance(6) {
            // duplicate an array's element many times
            if let Value::Array(a) = node_mut(&mut v, &path) {
                if let Some(x) = a.first().cloned() {
                    for _ in 0..rng.below(50) {
                        a.push(x.clone());
                    }
                }
            }
        } else {
            *node_mut(&mut v, &path) = hostile_value(rng);
        }
    }
    serde_json::to_vec(&v).unwrap()
}

// ---------------------------------------------------------------------------------------
// 3. the driver

const TARGET_NAMES: [&str; 12] = [
    "safetensors", "shard-index", "config", "generation-config", "preprocessor-config", "tokenizer", "tokenizer-full", "images", "http", "chat-body", "stop-strings", "unused",
];

/// Inputs per target in CI (`QWEN3_VL_FUZZ_INPUTS` overrides all).
fn inputs(default: u64) -> u64 {
    std::env::var("QWEN3_VL_FUZZ_INPUTS").ok().and_then(|v| v.parse().ok()).unwrap_or(default)
}

fn base_seed() -> u64 {
    std::env::var("QWEN3_VL_FUZZ_SEED").ok().and_then(|v| v.parse().ok()).unwrap_or(20_240_601)
}

/// Longest one input may take.
const SLOW: Duration = Duration::from_secs(10);

/// Panics per target, counted by a panic hook, including those caught inside the engine (the
/// image decoders run under `catch_unwind`: a decoder panic there becomes an error).
static PANICS: [AtomicU64; 16] = [
    AtomicU64::new(0), AtomicU64::new(0), AtomicU64::new(0), AtomicU64::new(0),
    AtomicU64::new(0), AtomicU64::new(0), AtomicU64::new(0), AtomicU64::new(0),
    AtomicU64::new(0), AtomicU64::new(0), AtomicU64::new(0), AtomicU64::new(0),
    AtomicU64::new(0), AtomicU64::new(0), AtomicU64::new(0), AtomicU64::new(0),
];

fn count_panics() {
    static HOOK: std::sync::Once = std::sync::Once::new();
    HOOK.call_once(|| {
        let default = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            let name = std::thread::current().name().unwrap_or("").to_string();
            if let Some(t) = TARGET_NAMES.iter().position(|n| name == format!("fuzz-{}", n)) {
                PANICS[t].fetch_add(1, Ordering::Relaxed);
            }
            default(info);
        }));
    });
}

/// Runs `check` on `n` inputs from `make` in a thread of its own; fails on a panic that
/// reaches it, a slow input or a hang, saving the input.
fn fuzz(target: usize, n: u64, make: impl Fn(&mut Rng) -> Vec<u8> + Send + Sync + 'static, check: impl Fn(&[u8]) + Send + Sync + 'static) {
    count_panics();
    let name = TARGET_NAMES[target];
    let seed = base_seed() ^ (target as u64) << 40;
    let last = Arc::new(std::sync::Mutex::new(Vec::new()));
    let (tx, rx) = std::sync::mpsc::channel();
    let keep = Arc::clone(&last);
    let t0 = Instant::now();
    std::thread::Builder::new()
        .name(format!("fuzz-{}", name))
        .spawn(move || {
            let mut rng = Rng::new(seed);
            let mut slowest = Duration::ZERO;
            for i in 0..n {
                CURRENT[target].store(i + 1, Ordering::Relaxed);
                let input = make(&mut rng);
                *keep.lock().unwrap() = input.clone();
                let t = Instant::now();
                let r = catch_unwind(AssertUnwindSafe(|| check(&input)));
                let took = t.elapsed();
                slowest = slowest.max(took);
                if r.is_err() || took > SLOW {
                    let _ = tx.send(Err((i, if r.is_err() { "panicked".to_string() } else { format!("took {:?}", took) })));
                    return;
                }
            }
            CURRENT[target].store(0, Ordering::Relaxed);
            let _ = tx.send(Ok(slowest));
        })
        .unwrap();
    let failure = |i: u64, what: String| {
        let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("fuzz-failures");
        let _ = std::fs::create_dir_all(&dir);
        let file = dir.join(format!("{}-{}.bin", name, i));
        let _ = std::fs::write(&file, &*last.lock().unwrap_or_else(|p| p.into_inner()));
        panic!("fuzz {}: input {} {} (saved to {}; replay with QWEN3_VL_FUZZ_SEED={} and at least {} inputs)", name, i, what, file.display(), base_seed(), i + 1);
    };
    // a hang shows as no answer long after the inputs should have been done
    match rx.recv_timeout(SLOW * 3 + Duration::from_millis(n * 20)) {
        Ok(Ok(slowest)) => eprintln!(
            "fuzz {}: {} inputs in {:.1} s, slowest {:.1} ms; no escaped panic, hang or oversized allocation; {} panics caught inside a dependency and returned as errors",
            name,
            n,
            t0.elapsed().as_secs_f64(),
            slowest.as_secs_f64() * 1e3,
            PANICS[target].load(Ordering::Relaxed)
        ),
        Ok(Err((i, what))) => failure(i, what),
        Err(_) => failure(CURRENT[target].load(Ordering::Relaxed).saturating_sub(1), "hung".into()),
    }
}

fn root() -> PathBuf {
    common::repo_root()
}

fn read_json(path: &Path) -> Value {
    serde_json::from_slice(&std::fs::read(path).unwrap()).unwrap()
}

/// A scratch file path for this process and `name`.
fn scratch(name: &str) -> PathBuf {
    std::env::temp_dir().join(format!("qwen3-vl-fuzz-{}-{}", std::process::id(), name))
}

// ---------------------------------------------------------------------------------------
// 4. the targets

#[test]
fn fuzz_safetensors_headers() {
    // the tied_gqa checkpoint; mutations mostly hit its header (8-byte length + JSON)
    let file = std::fs::read(root().join("tests/fixtures/text/tied_gqa/model.safetensors")).unwrap();
    let header_end = 8 + u64::from_le_bytes(file[..8].try_into().unwrap()) as usize;
    let path = scratch("model.safetensors");
    let header: Value = serde_json::from_slice(&file[8..header_end]).unwrap();
    let file = Arc::new(file);
    let f2 = Arc::clone(&file);
    fuzz(
        0,
        inputs(1500),
        move |rng| {
            let data = &f2[header_end..];
            let head = match rng.below(3) {
                0 => mutate_bytes(&f2[..header_end], rng),
                1 => {
                    let h = mutate_json(&header, rng);
                    let mut out = (h.len() as u64).to_le_bytes().to_vec();
                    out.extend_from_slice(&h);
                    out
                }
                _ => return mutate_bytes(&f2, rng), // whole-file changes: truncation mostly
            };
            [head, data.to_vec()].concat()
        },
        move |bytes| {
            std::fs::write(&path, bytes).unwrap();
            if let Ok(ck) = Checkpoint::from_files(&[path.clone()]) {
                let _ = ck.total_bytes();
                for name in ck.names().take(3).map(String::from).collect::<Vec<_>>() {
                    let _ = ck.read_f32(&name, &[4, 4]);
                }
            }
        },
    );
}

#[test]
fn fuzz_shard_index() {
    let src = root().join("tests/fixtures/text/untied_mha");
    let dir = scratch("shards");
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    for e in std::fs::read_dir(&src).unwrap() {
        let p = e.unwrap().path();
        if p.extension().map_or(false, |x| x == "safetensors") {
            std::fs::copy(&p, dir.join(p.file_name().unwrap())).unwrap();
        }
    }
    let index = read_json(&src.join("model.safetensors.index.json"));
    fuzz(
        1,
        inputs(1000),
        move |rng| if rng.chance(3) { mutate_bytes(&serde_json::to_vec(&index).unwrap(), rng) } else { mutate_json(&index, rng) },
        move |bytes| {
            std::fs::write(dir.join("model.safetensors.index.json"), bytes).unwrap();
            let _ = Checkpoint::open(&dir);
        },
    );
}

#[test]
fn fuzz_config_json() {
    let seeds: Vec<Value> = ["text/tied_gqa", "text/untied_mha", "text/fullvocab", "vision/tiny"].iter().map(|d| read_json(&root().join("tests/fixtures").join(d).join("config.json"))).collect();
    fuzz(
        2,
        inputs(3000),
        move |rng| {
            let s = &seeds[rng.below(seeds.len())];
            if rng.chance(3) {
                mutate_bytes(&serde_json::to_vec_pretty(s).unwrap(), rng)
            } else {
                mutate_json(s, rng)
            }
        },
        |bytes| {
            let _ = Config::from_json(&String::from_utf8_lossy(bytes), "config.json");
        },
    );
}

#[test]
fn fuzz_generation_config_json() {
    let seed = json!({"bos_token_id": 151643, "do_sample": true, "eos_token_id": [151645, 151643], "pad_token_id": 151643, "temperature": 0.7, "top_k": 20, "top_p": 0.8, "repetition_penalty": 1.0, "transformers_version": "4.57.0"});
    fuzz(
        3,
        inputs(3000),
        move |rng| if rng.chance(3) { mutate_bytes(&serde_json::to_vec(&seed).unwrap(), rng) } else { mutate_json(&seed, rng) },
        |bytes| {
            if let Ok(g) = GenerationDefaults::from_json(&String::from_utf8_lossy(bytes), "generation_config.json") {
                assert!(g.params.temperature.is_finite() && g.params.top_p > 0.0 && g.params.top_p <= 1.0 && g.params.repetition_penalty > 0.0, "{:?}", g.params);
            }
        },
    );
}

#[test]
fn fuzz_preprocessor_config_and_preprocessing() {
    let seed = read_json(&root().join("tests/fixtures/vision/tiny/preprocessor_config.json"));
    let img = qwen3_vl::image::load_image(&root().join("tests/fixtures/vision/b_50x70.png")).unwrap();
    fuzz(
        4,
        inputs(2000),
        move |rng| if rng.chance(3) { mutate_bytes(&serde_json::to_vec(&seed).unwrap(), rng) } else { mutate_json(&seed, rng) },
        move |bytes| {
            if let Ok(mut cfg) = PreprocessConfig::from_json_str(&String::from_utf8_lossy(bytes), "preprocessor_config.json") {
                // as the server and --max-pixels cap it
                cfg.max_pixels = cfg.max_pixels.min(1 << 20);
                cfg.min_pixels = cfg.min_pixels.min(cfg.max_pixels);
                let _ = preprocess(&img, &cfg);
            }
        },
    );
}

/// A small tokenizer.json cut from the real one: the first 1000 vocabulary entries, the
/// merges among them, and all added tokens.
fn small_tokenizer_json() -> Value {
    let mut t = read_json(&common::server::tokenizer());
    let vocab: serde_json::Map<String, Value> = t["model"]["vocab"].as_object().unwrap().iter().filter(|(_, id)| id.as_u64().unwrap() < 1000).map(|(k, v)| (k.clone(), v.clone())).collect();
    let merges: Vec<Value> = t["model"]["merges"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|m| {
            let (a, b) = (m[0].as_str().unwrap(), m[1].as_str().unwrap());
            vocab.contains_key(a) && vocab.contains_key(b) && vocab.contains_key(&format!("{}{}", a, b))
        })
        .cloned()
        .collect();
    t["model"]["vocab"] = Value::Object(vocab);
    t["model"]["merges"] = Value::Array(merges);
    t
}

#[test]
fn fuzz_tokenizer_json() {
    let seed = small_tokenizer_json();
    assert!(Tokenizer::from_json_str(&seed.to_string()).is_ok(), "the small seed tokenizer loads");
    fuzz(
        5,
        inputs(1500),
        move |rng| if rng.chance(3) { mutate_bytes(&serde_json::to_vec(&seed).unwrap(), rng) } else { mutate_json(&seed, rng) },
        |bytes| {
            if let Ok(t) = Tokenizer::from_json_str(&String::from_utf8_lossy(bytes)) {
                for text in ["Hello, world! 你好 🌍", "<|im_start|>user\n<|image_pad|><|im_end|>", " \t\r\n  x", "'s'll'VE 123456"] {
                    let ids = t.encode(text);
                    let _ = t.decode(&ids, false);
                    let mut d = t.stream_decoder(true);
                    for id in ids.iter().chain([u32::MAX, 5_000_000].iter()) {
                        let _ = d.push(*id);
                    }
                    let _ = d.finish();
                }
            }
        },
    );
}

#[test]
fn fuzz_tokenizer_json_full_size() {
    // the real 11 MB file, byte-mutated: few inputs (each parse builds 151k entries)
    let seed = std::fs::read(common::server::tokenizer()).unwrap();
    fuzz(
        6,
        inputs(12).min(200),
        move |rng| mutate_bytes(&seed, rng),
        |bytes| {
            if let Ok(t) = Tokenizer::from_json_str(&String::from_utf8_lossy(bytes)) {
                let _ = t.decode(&t.encode("Hello <|im_end|> world"), false);
            }
        },
    );
}

#[test]
fn fuzz_image_decoders() {
    let dir = root().join("tests/fixtures/images");
    let mut seeds: Vec<Vec<u8>> = Vec::new();
    for e in std::fs::read_dir(&dir).unwrap() {
        let p = e.unwrap().path();
        if matches!(p.extension().and_then(|x| x.to_str()), Some("png" | "jpg" | "webp")) && std::fs::metadata(&p).unwrap().len() < 200_000 {
            seeds.push(std::fs::read(&p).unwrap());
        }
    }
    seeds.sort();
    assert!(seeds.len() >= 20);
    let cfg = PreprocessConfig { max_pixels: 64 * 64, min_pixels: 32 * 32, ..PreprocessConfig::qwen3_vl_default() };
    fuzz(
        7,
        inputs(3000),
        move |rng| mutate_bytes(&seeds[rng.below(seeds.len())], rng),
        move |bytes| {
            if let Ok(img) = decode_image_limited(bytes, "fuzz", 1 << 20) {
                assert!(img.width * img.height <= 1 << 20 && img.data.len() == img.width * img.height * 3);
                let _ = preprocess(&img, &cfg);
            }
        },
    );
}

#[test]
fn fuzz_http_requests() {
    let body = json!({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}).to_string();
    let seeds: Vec<Vec<u8>> = vec![
        format!("POST /v1/chat/completions HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{}", body.len(), body).into_bytes(),
        format!("POST /v1/chat/completions HTTP/1.1\r\nTransfer-Encoding: chunked\r\nExpect: 100-continue\r\n\r\n5\r\n{}\r\n{:x};x=y\r\n{}\r\n0\r\nTrailer: 1\r\n\r\n", &body[..5], body.len() - 5, &body[5..]).into_bytes(),
        b"GET /health HTTP/1.1\r\n\r\nGET /v1/models HTTP/1.0\r\nConnection: keep-alive\r\n\r\nGET /metrics HTTP/1.1\r\nConnection: close\r\n\r\n".to_vec(),
    ];
    let limits = Limits { max_head: 4096, max_body: 64 * 1024, max_headers: 32 };
    fuzz(
        8,
        inputs(5000),
        move |rng| mutate_bytes(&seeds[rng.below(seeds.len())], rng),
        move |bytes| {
            let mut c = Connection::new(bytes);
            for _ in 0..16 {
                match c.read_request(&limits, &mut |_| true, &mut || Ok(())) {
                    Ok(r) => assert!(r.body.len() <= limits.max_body),
                    Err(_) => break,
                }
            }
        },
    );
}

#[test]
fn fuzz_chat_completion_bodies() {
    let tok = Arc::new(Tokenizer::from_json_str(&small_tokenizer_json().to_string()).unwrap());
    let image_token = tok.token_to_id("<|image_pad|>").unwrap();
    let png = common::server::data_url(&root().join("tests/fixtures/images/gray_30x45.png"), "image/png");
    let seed = json!({
        "model": "m", "stream": true, "stream_options": {"include_usage": true}, "max_tokens": 5, "max_completion_tokens": 6,
        "temperature": 0.7, "top_p": 0.9, "top_k": 20, "seed": 3, "stop": ["a", "b"], "presence_penalty": 0.5, "frequency_penalty": 0.1, "n": 1,
        "messages": [
            {"role": "system", "content": "Be brief."},
            {"role": "user", "content": [{"type": "text", "text": "What is"}, {"type": "image_url", "image_url": {"url": png, "detail": "auto"}}, {"type": "text", "text": "this?"}]},
            {"role": "assistant", "content": "A gradient."},
            {"role": "user", "content": "Sure?"}
        ]
    });
    let policy = ImagePolicy { allowed_dir: None, max_source_pixels: 1 << 16, max_file_bytes: 1 << 20, preprocess: PreprocessConfig { max_pixels: 64 * 64, min_pixels: 32 * 32, ..PreprocessConfig::qwen3_vl_default() } };
    let limits = TokenLimits { max_prompt: 4096, max_output: 64, context: 8192 };
    fuzz(
        9,
        inputs(3000),
        move |rng| if rng.chance(4) { mutate_bytes(&serde_json::to_vec(&seed).unwrap(), rng) } else { mutate_json(&seed, rng) },
        move |bytes| {
            if let Ok(req) = parse_chat_request(bytes, &ParseLimits::default()) {
                if let Ok(p) = prompt::build(&req, &tok, image_token, &policy, &limits, None) {
                    assert!(p.max_tokens >= 1 && p.max_tokens <= 64 && p.ids.len() <= 4096);
                }
            }
        },
    );
}

#[test]
fn fuzz_stop_strings() {
    // random stop strings over random text in random pieces: the released text is the input
    // up to the first stop string, never more
    fuzz(
        10,
        inputs(3000),
        |rng| {
            let alphabet = ["a", "b", "é", "🌍", "\n", "ab"];
            let text: String = (0..rng.below(60)).map(|_| alphabet[rng.below(alphabet.len())]).collect();
            let stops: Vec<String> = (0..rng.below(4)).map(|_| (0..1 + rng.below(3)).map(|_| alphabet[rng.below(alphabet.len())]).collect()).collect();
            serde_json::to_vec(&json!({"text": text, "stops": stops, "cuts": (0..8).map(|_| rng.below(64)).collect::<Vec<_>>()})).unwrap()
        },
        |bytes| {
            let v: Value = serde_json::from_slice(bytes).unwrap();
            let text = v["text"].as_str().unwrap();
            let stops: Vec<String> = v["stops"].as_array().unwrap().iter().map(|s| s.as_str().unwrap().to_string()).collect();
            // the pieces, as generation would deliver them
            let mut pieces = Vec::new();
            let mut rest = text;
            for c in v["cuts"].as_array().unwrap() {
                let mut at = (c.as_u64().unwrap() as usize).min(rest.len());
                while !rest.is_char_boundary(at) {
                    at -= 1;
                }
                let (piece, r) = rest.split_at(at);
                pieces.push(piece);
                rest = r;
            }
            pieces.push(rest);
            // expected: at the first piece after which a stop string appears, the text up to
            // the earliest one then present; else all of it
            let mut expected = (text.to_string(), false);
            let mut upto = 0;
            for p in &pieces {
                upto += p.len();
                if let Some(at) = stops.iter().filter(|s| !s.is_empty()).filter_map(|s| text[..upto].find(s.as_str())).min() {
                    expected = (text[..at].to_string(), true);
                    break;
                }
            }
            let mut m = StopMatcher::new(stops.clone());
            let (mut out, mut stopped) = (String::new(), false);
            for p in &pieces {
                let (t, s) = m.push(p);
                out.push_str(&t);
                if s {
                    stopped = true;
                    break;
                }
            }
            if !stopped {
                out.push_str(&m.finish());
            }
            assert_eq!((out, stopped), expected, "text {:?}, stops {:?}, pieces {:?}", text, stops, pieces);
        },
    );
}
