//! Image input against transformers: decoding (Pillow via `transformers.image_utils.load_image`)
//! and preprocessing (the slow, Pillow-based `Qwen2VLImageProcessorPil` with Qwen3-VL's
//! settings), on the images and reference data in tests/fixtures/images made by
//! tools/image_reference.py; plus smart_resize, config files and errors.
//!
//! Run with `-- --nocapture` to see the measured differences per image.

mod common;

use qwen3_vl::image::{decode_image, load_image, preprocess, resize_bicubic, smart_resize, ImagePatches, PreprocessConfig, RgbImage};
use qwen3_vl::Error;
use serde_json::Value;
use std::path::PathBuf;

fn fixture(name: &str) -> PathBuf {
    common::repo_root().join("tests/fixtures/images").join(name)
}

fn manifest() -> Value {
    let text = std::fs::read_to_string(fixture("reference.json")).expect("reference.json is readable");
    serde_json::from_str(&text).expect("reference.json is JSON")
}

fn images(m: &Value) -> &Vec<Value> {
    m["images"].as_array().expect("images")
}

fn config(m: &Value, name: &str) -> PreprocessConfig {
    let c = &m["configs"][name];
    PreprocessConfig {
        min_pixels: c["min_pixels"].as_u64().unwrap() as usize,
        max_pixels: c["max_pixels"].as_u64().unwrap() as usize,
        ..PreprocessConfig::qwen3_vl_default()
    }
}

/// Pillow's RGB of an image entry, if stored.
fn pillow_rgb(e: &Value) -> Option<RgbImage> {
    let data = std::fs::read(fixture(e["rgb"].as_str()?)).expect("rgb fixture");
    let (w, h) = (e["width"].as_u64().unwrap() as usize, e["height"].as_u64().unwrap() as usize);
    Some(RgbImage::new(w, h, data).expect("rgb fixture size"))
}

fn max_diff_u8(a: &[u8], b: &[u8]) -> u8 {
    a.iter().zip(b).map(|(&x, &y)| if x > y { x - y } else { y - x }).max().unwrap_or(0)
}

/// How far our decode may be from Pillow's, in 8-bit levels, by file: lossless formats and
/// WebP (image-webp decodes VP8 and converts YUV to RGB as libwebp does) must agree exactly;
/// JPEG decoders differ in IDCT, upsampling and color conversion rounding.
fn decode_tolerance(file: &str) -> u8 {
    if file.ends_with(".jpg") {
        3
    } else {
        0
    }
}

/// Compares our patches with one reference config of an entry; returns the max abs diff.
fn compare(e: &Value, cfg_name: &str, ours: &ImagePatches) -> f32 {
    let r = &e["configs"][cfg_name];
    let file = e["file"].as_str().unwrap();
    let grid: Vec<usize> = r["grid_thw"].as_array().unwrap().iter().map(|v| v.as_u64().unwrap() as usize).collect();
    assert_eq!(ours.grid_thw.to_vec(), grid, "{} [{}]: grid_thw", file, cfg_name);
    assert_eq!(ours.row_len, r["row_len"].as_u64().unwrap() as usize, "{} [{}]: row_len", file, cfg_name);
    assert_eq!(ours.patches.len(), ours.rows() * ours.row_len);
    // a NaN would hide from the maxima below
    assert!(ours.patches.iter().all(|v| v.is_finite()), "{} [{}]: a patch value is not finite", file, cfg_name);
    if let Some(path) = r["patches"].as_str() {
        let bytes = std::fs::read(fixture(path)).expect("patch fixture");
        let reference: Vec<f32> = bytes.chunks_exact(4).map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]])).collect();
        assert_eq!(reference.len(), ours.patches.len(), "{} [{}]: patch count", file, cfg_name);
        reference.iter().zip(&ours.patches).map(|(a, b)| (a - b).abs()).fold(0.0, f32::max)
    } else {
        let stride = r["stride"].as_u64().unwrap() as usize;
        let samples = r["samples"].as_array().unwrap();
        let ours_sampled: Vec<f32> = ours.patches.iter().step_by(stride).copied().collect();
        assert_eq!(ours_sampled.len(), samples.len(), "{} [{}]: sample count", file, cfg_name);
        let sum: f64 = ours.patches.iter().map(|&v| f64::from(v)).sum();
        let ref_sum = r["sum"].as_f64().unwrap();
        let sample_diff = samples.iter().zip(&ours_sampled).map(|(a, &b)| (a.as_f64().unwrap() as f32 - b).abs()).fold(0.0, f32::max);
        // The sum bounds the mean difference over all values.
        let mean_diff = ((sum - ref_sum).abs() / ours.patches.len() as f64) as f32;
        sample_diff.max(mean_diff)
    }
}

#[test]
fn decode_matches_pillow() {
    let m = manifest();
    for e in images(&m) {
        let file = e["file"].as_str().unwrap();
        let ours = load_image(&fixture(file)).unwrap_or_else(|err| panic!("{}: {}", file, err));
        let (w, h) = (e["width"].as_u64().unwrap() as usize, e["height"].as_u64().unwrap() as usize);
        assert_eq!((ours.width, ours.height), (w, h), "{}: size after EXIF orientation", file);
        if let Some(reference) = pillow_rgb(e) {
            let d = max_diff_u8(&ours.data, &reference.data);
            let total: f64 = ours.data.iter().zip(&reference.data).map(|(&a, &b)| (a as f64 - b as f64).abs()).sum();
            let mean = total / ours.data.len() as f64;
            println!("decode {:24} {:>3}x{:<3} max |diff| {:2} levels, mean {:.3}", file, w, h, d, mean);
            assert!(d <= decode_tolerance(file), "{}: decoded RGB differs from Pillow's by {} levels", file, d);
        }
    }
}

/// Preprocessing Pillow's own RGB isolates resize + normalize + patchify: exact.
#[test]
fn patches_match_transformers_on_pillow_rgb() {
    let m = manifest();
    for e in images(&m) {
        let file = e["file"].as_str().unwrap();
        let img = pillow_rgb(e).unwrap_or_else(|| load_image(&fixture(file)).unwrap()); // the big PNG: lossless decode
        for (cfg_name, _) in e["configs"].as_object().unwrap() {
            let ours = preprocess(&img, &config(&m, cfg_name)).unwrap();
            let d = compare(e, cfg_name, &ours);
            println!("patches(Pillow RGB) {:24} [{:6}] grid {:?} max |diff| {:e}", file, cfg_name, ours.grid_thw, d);
            assert!(d <= 1e-6, "{} [{}]: patches differ by {}", file, cfg_name, d);
        }
    }
}

/// The whole path, our decoder included: exact for PNG and WebP; for JPEG the decoder
/// differences pass through resize and normalization (1 level = 2/255 after it).
#[test]
fn patches_match_transformers_end_to_end() {
    let m = manifest();
    for e in images(&m) {
        let file = e["file"].as_str().unwrap();
        let img = load_image(&fixture(file)).unwrap();
        for (cfg_name, _) in e["configs"].as_object().unwrap() {
            let ours = preprocess(&img, &config(&m, cfg_name)).unwrap();
            let d = compare(e, cfg_name, &ours);
            println!("patches(ours)       {:24} [{:6}] max |diff| {:.6} ({:.2} levels)", file, cfg_name, d, d * 255.0 / 2.0);
            let bound = f32::from(decode_tolerance(file)) * 2.0 / 255.0 + 1e-6;
            assert!(d <= bound, "{} [{}]: patches differ by {} (bound {})", file, cfg_name, d, bound);
        }
    }
}

/// Our bicubic against Pillow's `Image.resize(size, BICUBIC)` at many sizes: bit for bit.
#[test]
fn resize_matches_pillow_bit_for_bit() {
    let m = manifest();
    let sweep = &m["resize_sweep"];
    let src = load_image(&fixture(sweep["source"].as_str().unwrap())).unwrap();
    let data = std::fs::read(fixture(sweep["data"].as_str().unwrap())).unwrap();
    let mut offset = 0;
    for wh in sweep["sizes_wh"].as_array().unwrap() {
        let (w, h) = (wh[0].as_u64().unwrap() as usize, wh[1].as_u64().unwrap() as usize);
        let ours = resize_bicubic(&src, w, h);
        let reference = &data[offset..offset + w * h * 3];
        offset += w * h * 3;
        assert_eq!((ours.width, ours.height), (w, h));
        let diff = max_diff_u8(&ours.data, reference);
        assert!(diff == 0, "{}x{} -> {}x{}: differs from Pillow by {} levels", src.width, src.height, w, h, diff);
    }
    assert_eq!(offset, data.len());
}

#[test]
fn exif_orientation_sizes() {
    let cases = [
        ("exif_o6_32x48.jpg", 32, 48),
        ("exif_o3_32x48.jpg", 48, 32),
        ("exif_o8_20x30.webp", 20, 30),
        ("exif_o5_6x10.png", 6, 10),
        ("exif_o2_6x10.png", 10, 6),
    ];
    for (file, w, h) in cases {
        let img = load_image(&fixture(file)).unwrap();
        assert_eq!((img.width, img.height), (w, h), "{}", file);
    }
}

#[test]
fn smart_resize_matches_transformers() {
    // (h, w, factor, min, max) -> transformers 5.23 smart_resize
    let cases: &[((usize, usize, usize, usize, usize), (usize, usize))] = &[
        ((64, 96, 32, 65536, 16777216), (224, 320)),    // min branch
        ((64, 96, 32, 4096, 16777216), (64, 96)),       // already fine
        ((48, 80, 32, 4096, 16777216), (64, 64)),       // 1.5 -> 2 and 2.5 -> 2: ties to even
        ((80, 48, 32, 4096, 16777216), (64, 64)),
        ((112, 144, 32, 0, 16777216), (128, 128)),      // 3.5 -> 4 and 4.5 -> 4
        ((1, 1, 32, 65536, 16777216), (256, 256)),
        ((300, 200, 32, 65536, 20480), (160, 96)),      // max branch
        ((200, 300, 32, 65536, 20480), (96, 160)),
        ((4000, 3000, 32, 65536, 16777216), (4000, 3008)),
        ((8192, 8192, 32, 65536, 16777216), (4096, 4096)),
        ((10000, 50, 32, 65536, 16777216), (9984, 64)),
        ((1080, 1920, 32, 65536, 16777216), (1088, 1920)),
        ((1080, 1920, 28, 3136, 12845056), (1092, 1932)), // Qwen2-VL settings
        ((2, 400, 32, 65536, 16777216), (32, 3648)),    // aspect exactly 200 is allowed
        ((7, 1400, 32, 65536, 1000000), (32, 3648)),    // min branch may exceed max_pixels
        ((16, 33, 32, 1024, 1024), (32, 64)),
        ((100000, 1000, 32, 65536, 16777216), (40960, 384)), // floored, at least factor
        ((1024, 1024, 32, 65536, 16777216), (1024, 1024)),
    ];
    for &((h, w, f, lo, hi), want) in cases {
        assert_eq!(smart_resize(h, w, f, lo, hi).unwrap(), want, "smart_resize({}, {}, {}, {}, {})", h, w, f, lo, hi);
    }
    // transformers raises for these (ValueError, ZeroDivisionError) or would resize to 0 pixels.
    let failing = [(201, 1, 65536, 16777216), (1, 201, 4, 100), (0, 5, 1, 1), (16, 16, 0, 16777216), (15, 40, 0, 16777216), (5, 5, 1, 0)];
    for &(h, w, lo, hi) in &failing {
        match smart_resize(h, w, 32, lo, hi) {
            Err(Error::Limit { op, .. }) => assert_eq!(op, "smart_resize"),
            other => panic!("smart_resize({}, {}) = {:?}", h, w, other),
        }
    }
}

#[test]
fn patch_layout_and_token_count() {
    // A 64x32 image whose pixel values encode (x, y, channel); no resize, no normalization.
    let (w, h) = (64, 32);
    let data = (0..h).flat_map(|y| (0..w).flat_map(move |x| [x as u8, y as u8, 200])).collect();
    let img = RgbImage::new(w, h, data).unwrap();
    let cfg = PreprocessConfig { min_pixels: 0, do_rescale: false, do_normalize: false, ..PreprocessConfig::qwen3_vl_default() };
    let out = preprocess(&img, &cfg).unwrap();
    assert_eq!((out.grid_thw, out.row_len, out.num_tokens(2)), ([1, 2, 4], 3 * 2 * 16 * 16, 2));
    // Row 5 = merge window 1 (x 32..64), position (0, 1) inside it: x0 = 48, y0 = 0.
    let row = out.row(5);
    assert_eq!((row[0], row[1], row[16]), (48.0, 49.0, 48.0)); // channel 0 = x
    assert_eq!(row[256], 48.0); // second temporal copy
    assert_eq!((row[512 + 16 * 3], row[1024]), (3.0, 200.0)); // channel 1 = y, channel 2
}

#[test]
fn config_files() {
    let dir = scratch("config");
    let qwen3 = dir.join("preprocessor_config.json");
    std::fs::write(&qwen3, r#"{"size": {"longest_edge": 16777216, "shortest_edge": 65536}, "patch_size": 16,
        "temporal_patch_size": 2, "merge_size": 2, "image_mean": [0.5, 0.5, 0.5], "image_std": [0.5, 0.5, 0.5],
        "processor_class": "Qwen3VLProcessor", "image_processor_type": "Qwen2VLImageProcessorFast"}"#).unwrap();
    assert_eq!(PreprocessConfig::from_file(&qwen3).unwrap(), PreprocessConfig::qwen3_vl_default());
    let qwen2 = dir.join("qwen2.json");
    std::fs::write(&qwen2, r#"{"min_pixels": 3136, "max_pixels": 12845056, "patch_size": 14, "resample": 3,
        "image_std": [0.26862954, 0.26130258, 0.27577711], "rescale_factor": 0.00392156862745098}"#).unwrap();
    let c = PreprocessConfig::from_file(&qwen2).unwrap();
    assert_eq!((c.min_pixels, c.max_pixels, c.patch_size, c.image_std[2]), (3136, 12845056, 14, 0.27577711));
    let bad = dir.join("bad.json");
    std::fs::write(&bad, r#"{"merge_size": "two"}"#).unwrap();
    match PreprocessConfig::from_file(&bad) {
        Err(Error::Config { file, msg }) => assert!(file.ends_with("bad.json") && msg.contains("merge_size"), "{}", msg),
        other => panic!("{:?}", other),
    }
}

#[test]
fn unreadable_files_are_image_errors_naming_the_file() {
    let dir = scratch("errors");
    let png = std::fs::read(fixture("gradient_64x96.png")).unwrap();
    let cases: Vec<(&str, Option<Vec<u8>>)> = vec![
        ("missing.png", None),
        ("empty.png", Some(Vec::new())),
        ("truncated.png", Some(png[..png.len() / 2].to_vec())),
        ("header_only.png", Some(png[..40].to_vec())),
        ("text.jpg", Some(b"this is not a JPEG\n".to_vec())),
        ("fake.jpg", Some(vec![0xFF, 0xD8, 0xFF, 0xE0, 0, 16, b'J', b'F', b'I', b'F', 0])),
        ("fake.webp", Some(b"RIFF\x10\0\0\0WEBPVP8 \x04\0\0\0abcd".to_vec())),
    ];
    for (name, content) in cases {
        let path = dir.join(name);
        if let Some(bytes) = &content {
            std::fs::write(&path, bytes).unwrap();
        }
        match load_image(&path) {
            Err(e @ Error::Image { .. }) => {
                let text = e.to_string();
                assert!(text.contains(name), "{}: {}", name, text);
                println!("{}", text);
            }
            other => panic!("{}: expected Error::Image, got {:?}", name, other.map(|i| (i.width, i.height))),
        }
    }
    assert!(matches!(decode_image(&png[..100], "in-memory"), Err(Error::Image { file, .. }) if file == "in-memory"));
}

/// Speed of decode + resize + patchify; run with
/// `QWEN3_VL_BENCH_IMAGE=some.jpg cargo test --release --test image_preprocess -- --ignored --nocapture`.
#[test]
#[ignore]
fn preprocess_speed() {
    let path = match std::env::var("QWEN3_VL_BENCH_IMAGE") {
        Ok(p) => PathBuf::from(p),
        Err(_) => return println!("set QWEN3_VL_BENCH_IMAGE to an image file"),
    };
    let bytes = std::fs::read(&path).unwrap();
    let cfg = PreprocessConfig::qwen3_vl_default();
    for round in 0..5 {
        let t0 = std::time::Instant::now();
        let img = decode_image(&bytes, "bench").unwrap();
        let t1 = std::time::Instant::now();
        let out = preprocess(&img, &cfg).unwrap();
        let t2 = std::time::Instant::now();
        println!("round {}: {}x{} -> grid {:?}: decode {:.1} ms, preprocess {:.1} ms", round, img.width, img.height, out.grid_thw,
            (t1 - t0).as_secs_f64() * 1e3, (t2 - t1).as_secs_f64() * 1e3);
    }
}

/// A fresh scratch folder, removed when dropped.
fn scratch(tag: &str) -> common::Scratch {
    common::Scratch::dir(&format!("qwen3-vl-image-test-{}-{}", tag, std::process::id()))
}
