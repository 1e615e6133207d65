//! The fuzz driver of tests/fuzz_parsers.rs: a capped global allocator, seeded mutators for
//! bytes and JSON, and the loop that runs a target on inputs in a thread of its own, failing
//! on a panic, a slow input or a hang and saving the input.

use serde_json::{json, Value};
use std::alloc::{GlobalAlloc, Layout, System};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

// ---------------------------------------------------------------------------------------
// 1. allocation cap

/// The largest single allocation any parser may make here. The inputs are at most a few MB
/// (the real tokenizer.json is 11 MB) and the limits passed are small, so anything near this
/// was sized from the input itself.
pub const ALLOC_CAP: usize = 256 << 20;

/// Current input number of each target (for the allocation report; targets run in parallel).
pub static CURRENT: [AtomicU64; 16] = [
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
            let name = TARGET_NAMES[t].as_bytes();
            // SAFETY: a plain write of a valid buffer to fd 2.
            unsafe {
                libc::write(2, name.as_ptr() as *const libc::c_void, name.len());
            }
            report(b" is at input ", n - 1);
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
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1)
    }
    pub fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
    pub fn below(&mut self, n: usize) -> usize {
        if n == 0 {
            0
        } else {
            (self.next() % n as u64) as usize
        }
    }
    pub fn chance(&mut self, one_in: usize) -> bool {
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
pub fn mutate_bytes(seed: &[u8], rng: &mut Rng) -> Vec<u8> {
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
pub fn mutate_json(seed: &Value, rng: &mut Rng) -> Vec<u8> {
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

pub const TARGET_NAMES: [&str; 13] = [
    "safetensors", "shard-index", "config", "generation-config", "preprocessor-config", "tokenizer", "tokenizer-full", "images", "http", "chat-body", "stop-strings", "gguf", "videos",
];

/// Inputs per target in CI (`QWEN3_VL_FUZZ_INPUTS` overrides all).
pub fn inputs(default: u64) -> u64 {
    std::env::var("QWEN3_VL_FUZZ_INPUTS").ok().and_then(|v| v.parse().ok()).unwrap_or(default)
}

pub fn base_seed() -> u64 {
    std::env::var("QWEN3_VL_FUZZ_SEED").ok().and_then(|v| v.parse().ok()).unwrap_or(20_240_601)
}

/// Longest one input may take.
pub const SLOW: Duration = Duration::from_secs(10);

/// Panics per target, counted by a panic hook, including those caught inside the engine (the
/// image decoders run under `catch_unwind`: a decoder panic there becomes an error).
pub static PANICS: [AtomicU64; 16] = [
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
pub fn fuzz(target: usize, n: u64, make: impl Fn(&mut Rng) -> Vec<u8> + Send + Sync + 'static, check: impl Fn(&[u8]) + Send + Sync + 'static) {
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
