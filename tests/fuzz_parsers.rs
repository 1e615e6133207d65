//! Hostile input for every parser that reads outside data: safetensors headers and shard
//! indexes, config.json, generation_config.json, preprocessor_config.json, tokenizer.json,
//! the image decoders, the native video decoders (GIF, animated WebP), HTTP requests (sent to a
//! live `serve`) and chat-completions JSON bodies (images included), stop strings, and GGUF model
//! files (header, metadata, tokenizer, tensor infos, then loading and running the model).
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

use common::Scratch;
use qwen3_vl::generation_config::GenerationDefaults;
use qwen3_vl::image::{decode_image_limited, preprocess, PreprocessConfig};
use qwen3_vl::model::{Checkpoint, Config};
use qwen3_vl::server::images::ImagePolicy;
use qwen3_vl::server::openai::{parse_chat_request, ParseLimits};
use qwen3_vl::server::prompt::{self, TokenLimits};
use qwen3_vl::server::stop::StopMatcher;
use qwen3_vl::Tokenizer;
use serde_json::{json, Value};
use std::path::{Path, PathBuf};
use std::sync::Arc;

#[path = "fuzz/harness.rs"]
mod harness;
use harness::{fuzz, inputs, mutate_bytes, mutate_json};

fn root() -> PathBuf {
    common::repo_root()
}

fn read_json(path: &Path) -> Value {
    serde_json::from_slice(&std::fs::read(path).unwrap()).unwrap()
}

/// The scratch name for this process and `name` (under the temporary folder, see
/// [`Scratch`]).
fn scratch(name: &str) -> String {
    format!("qwen3-vl-fuzz-{}-{}", std::process::id(), name)
}

// ---------------------------------------------------------------------------------------
// the targets

#[test]
fn fuzz_safetensors_headers() {
    // the tied_gqa checkpoint; mutations mostly hit its header (8-byte length + JSON)
    let file = std::fs::read(root().join("tests/fixtures/text/tied_gqa/model.safetensors")).unwrap();
    let header_end = 8 + u64::from_le_bytes(file[..8].try_into().unwrap()) as usize;
    let scratch_file = Scratch::path(&scratch("model.safetensors"));
    let path = scratch_file.to_path_buf();
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
    let scratch_dir = Scratch::dir(&scratch("shards"));
    let dir = scratch_dir.to_path_buf();
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

/// The contents of the files in `dir` (under the repository root) with one of `extensions` and
/// fewer than `max_bytes` bytes, sorted (the same seeds in the same order on every machine).
fn seed_files(dir: &str, extensions: &[&str], max_bytes: u64) -> Vec<Vec<u8>> {
    let mut seeds = Vec::new();
    for e in std::fs::read_dir(root().join(dir)).unwrap() {
        let p = e.unwrap().path();
        let wanted = p.extension().and_then(|x| x.to_str()).map_or(false, |x| extensions.contains(&x));
        if wanted && std::fs::metadata(&p).unwrap().len() < max_bytes {
            seeds.push(std::fs::read(&p).unwrap());
        }
    }
    seeds.sort();
    seeds
}

#[test]
fn fuzz_image_decoders() {
    let seeds = seed_files("tests/fixtures/images", &["png", "jpg", "webp"], 200_000);
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

/// GIF and animated WebP clips (decoded natively, not by ffmpeg), mutated: errors, never a
/// panic or a frame over the limits.
#[test]
fn fuzz_native_video_decoders() {
    use qwen3_vl::video::{decode_video, VideoConfig, VideoLimits};
    let seeds = seed_files("tests/fixtures/video", &["gif", "webp"], u64::MAX);
    assert!(seeds.len() >= 4);
    let cfg = VideoConfig { max_pixels: 64 * 64, min_pixels: 32 * 32, ..VideoConfig::qwen3_vl_default() };
    let limits = VideoLimits { max_frame_pixels: 1 << 16, max_source_frames: 64, ..VideoLimits::default() };
    fuzz(
        12,
        inputs(1500),
        move |rng| mutate_bytes(&seeds[rng.below(seeds.len())], rng),
        move |bytes| {
            // only the native decoders: anything else would go to ffmpeg
            let native = bytes.starts_with(b"GIF8") || (bytes.len() >= 12 && &bytes[..4] == b"RIFF" && &bytes[8..12] == b"WEBP");
            if native {
                if let Ok(v) = decode_video(bytes, "fuzz", &cfg, &limits) {
                    assert!(v.info.width * v.info.height <= 1 << 16 && !v.indices.is_empty());
                }
            }
        },
    );
}

#[test]
fn fuzz_http_requests() {
    // hostile requests on loopback to a live server (its HTTP layer is hyper's, with our limits,
    // time limits and error answers around it): each gets an answer or a close within the
    // harness's time limit, and the server stays well
    let server = common::server::Server::start(&["--max-body-mib", "1", "--read-timeout", "2", "--max-output-tokens", "4"]);
    let port = server.port;
    let body = json!({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}).to_string();
    let seeds: Vec<Vec<u8>> = vec![
        format!("POST /v1/chat/completions HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{}", body.len(), body).into_bytes(),
        format!("POST /v1/chat/completions HTTP/1.1\r\nTransfer-Encoding: chunked\r\nExpect: 100-continue\r\n\r\n5\r\n{}\r\n{:x};x=y\r\n{}\r\n0\r\nTrailer: 1\r\n\r\n", &body[..5], body.len() - 5, &body[5..]).into_bytes(),
        b"GET /health HTTP/1.1\r\n\r\nGET /v1/models HTTP/1.0\r\nConnection: keep-alive\r\n\r\nGET /metrics HTTP/1.1\r\nConnection: close\r\n\r\n".to_vec(),
    ];
    fuzz(
        8,
        inputs(300),
        move |rng| mutate_bytes(&seeds[rng.below(seeds.len())], rng),
        move |bytes| {
            use std::io::{Read, Write};
            let mut c = std::net::TcpStream::connect(("127.0.0.1", port)).expect("the server accepts");
            c.set_read_timeout(Some(std::time::Duration::from_secs(8))).unwrap();
            let _ = c.write_all(bytes);
            let _ = c.shutdown(std::net::Shutdown::Write);
            let mut answer = Vec::new();
            let _ = c.read_to_end(&mut answer);
            // whatever came back is HTTP responses (or nothing, for a request cut off)
            assert!(answer.is_empty() || answer.starts_with(b"HTTP/1."), "{:?}", String::from_utf8_lossy(&answer[..answer.len().min(200)]));
        },
    );
    assert_eq!(common::server::get(port, "/health").status, 200);
    server.assert_no_panic();
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
            {"role": "user", "content": "Sure?"},
            {"role": "assistant", "content": null, "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "look", "arguments": "{\"at\": [1, 2.5, \"x\"]}"}}]},
            {"role": "tool", "tool_call_id": "c1", "content": "nothing"}
        ],
        "tools": [{"type": "function", "function": {"name": "look", "description": "Look.", "parameters": {"type": "object", "properties": {"at": {"type": "array"}}}}}],
        "tool_choice": "auto", "parallel_tool_calls": false, "chat_template_kwargs": {"enable_thinking": false}
    });
    // both chat templates of the fixtures (tools, tool calls and results): the Qwen3 text one
    // (content as a string) and the tiny model's own Qwen3-VL one (content as parts)
    let formats: Vec<qwen3_vl::template::PromptFormat> =
        ["tests/fixtures/tokenizer", "tests/fixtures/vision/tiny"].iter().map(|d| qwen3_vl::template::PromptFormat::find(None, &[&root().join(d)], None).unwrap()).collect();
    let policy = ImagePolicy::new(PreprocessConfig { max_pixels: 64 * 64, min_pixels: 32 * 32, ..PreprocessConfig::qwen3_vl_default() }, qwen3_vl::video::VideoConfig::qwen3_vl_default(), None, 1 << 16, 1 << 20);
    let limits = TokenLimits { max_prompt: 4096, max_output: 64, context: 8192 };
    let unmutated = parse_chat_request(&serde_json::to_vec(&seed).unwrap(), &ParseLimits::default()).unwrap();
    for format in &formats {
        prompt::build(&unmutated, &tok, image_token, format, &policy, &limits, None, None).expect("the seed itself builds");
    }
    fuzz(
        9,
        inputs(3000),
        move |rng| if rng.chance(4) { mutate_bytes(&serde_json::to_vec(&seed).unwrap(), rng) } else { mutate_json(&seed, rng) },
        move |bytes| {
            if let Ok(req) = parse_chat_request(bytes, &ParseLimits::default()) {
                for format in &formats {
                    if let Ok(p) = prompt::build(&req, &tok, image_token, format, &policy, &limits, None, None) {
                        assert!(p.max_tokens >= 1 && p.max_tokens <= 64 && p.ids.len() <= 4096);
                    }
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

#[test]
fn fuzz_gguf_models() {
    // a valid Q8_0 pair of the tied_gqa fixture (written by `qwen3-vl quantize`); mutations hit
    // the text file's header, metadata and tensor infos mostly, sometimes the mmproj's
    let src = Scratch::dir(&scratch("gguf-src"));
    common::gguf::fixture_with_tokenizer("tied_gqa", &src);
    let out = Scratch::dir(&scratch("gguf-out"));
    let (text, mmproj) = common::gguf::quantize(&src, &out, "q8_0");
    let seeds = Arc::new([std::fs::read(&text).unwrap(), std::fs::read(&mmproj).unwrap()]);
    let head = |b: &[u8]| qwen3_vl::gguf::Gguf::open(&text).map(|g| g.tensors().iter().map(|t| t.start).min().unwrap_or(b.len())).unwrap_or(b.len());
    let heads = [head(&seeds[0]), qwen3_vl::gguf::Gguf::open(&mmproj).unwrap().tensors().iter().map(|t| t.start).min().unwrap()];
    let s2 = Arc::clone(&seeds);
    let scratch_files = [Scratch::path(&scratch("fuzz-text.gguf")), Scratch::path(&scratch("fuzz-mmproj.gguf"))];
    let (tp, mp) = (scratch_files[0].to_path_buf(), scratch_files[1].to_path_buf());
    let cpu = common::cpu();
    fuzz(
        11,
        inputs(1500),
        move |rng| {
            // which file (0 text, 1 mmproj), then the file: its header region mutated, the rest kept
            let which = if rng.chance(5) { 1 } else { 0 };
            let seed = &s2[which];
            let cut = if rng.chance(4) { seed.len() } else { heads[which] };
            let mut m = mutate_bytes(&seed[..cut], rng);
            m.extend_from_slice(&seed[cut..]);
            let mut out = vec![which as u8];
            out.extend(m);
            out
        },
        move |bytes| {
            let (which, file) = (bytes[0], &bytes[1..]);
            std::fs::write(&tp, if which == 0 { file } else { &seeds[0] }).unwrap();
            std::fs::write(&mp, if which == 1 { file } else { &seeds[1] }).unwrap();
            let files = qwen3_vl::model::ModelFiles::Gguf { text: tp.clone(), mmproj: mp.clone() };
            if let Ok(o) = files.open() {
                if let Ok(m) = qwen3_vl::model::Model::load_opened(&o, None, &*cpu, &mut |_, _| {}) {
                    let mut s = qwen3_vl::generate::Session::new(&m, &*cpu, 4).unwrap();
                    let _ = s.feed(&[1, 2, 3]);
                }
            }
        },
    );
}
