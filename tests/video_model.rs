//! Video prompts against transformers (tests/fixtures/video, made by
//! tools/make_video_fixtures.py on the tiny checkpoint of tests/fixtures/vision): frame
//! sampling, `video_grid_thw`, pixel values, the rendered prompt and its ids, the rotary
//! positions and the last logits, from the clip files through our decoders (GIF and animated
//! WebP natively, the Matroska and MP4 clips through ffmpeg). Logits within 1e-3 of the std (times the backend's
//! tolerance, as for images) where no resize happens and the decode is lossless; within 1e-2
//! where the processor resizes (transformers resizes with torchvision, we as Pillow does) or the
//! codec is lossy (OpenCV's and ffmpeg's YUV to RGB conversions round differently).
//!
//! The ffmpeg clips need `ffmpeg` and `ffprobe`: `.ci/run` installs them. Where they are
//! missing those cases are skipped with a message, except under CI (`CI` set), where that fails.

mod common;

use qwen3_vl::generate::chat::{render, Media, Message, VideoPrompt};
use qwen3_vl::generate::Session;
use qwen3_vl::model::positions::multimodal_positions;
use qwen3_vl::model::{Images, Model};
use qwen3_vl::video::{load_video, VideoConfig, VideoLimits};
use qwen3_vl::{DType, Error, Tokenizer};
use serde_json::Value;
use std::path::PathBuf;

/// (case, exact: no resize and a lossless decode)
const CASES: &[(&str, bool)] = &[("gif_exact", true), ("gif_resized", false), ("gif_three", true), ("webp_lossless", true), ("mkv_lossless", true), ("mp4_h264", false)];

fn dir() -> PathBuf {
    common::repo_root().join("tests/fixtures/video")
}

fn case(name: &str) -> Value {
    serde_json::from_str(&std::fs::read_to_string(dir().join(format!("{}.json", name))).unwrap()).unwrap()
}

fn tensor(v: &Value) -> Vec<f32> {
    let bytes = std::fs::read(dir().join(v["file"].as_str().unwrap())).unwrap();
    bytes.chunks_exact(4).map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect()
}

fn u32s(v: &Value) -> Vec<u32> {
    v.as_array().unwrap().iter().map(|x| x.as_u64().unwrap() as u32).collect()
}

fn config() -> VideoConfig {
    VideoConfig::from_file(&dir().join("video_preprocessor_config.json")).unwrap()
}

fn needs_ffmpeg(file: &str) -> bool {
    !file.ends_with(".gif") && !file.ends_with(".webp")
}

/// Whether the ffmpeg cases can run here (false: skip, with a message; under CI: fail).
fn ffmpeg_available() -> bool {
    let ok = qwen3_vl::video::find_ffmpeg(None).map_or(false, |p| p.is_file());
    if !ok {
        assert!(std::env::var_os("CI").is_none(), "ffmpeg is not installed: .ci/run installs it for the video tests");
        eprintln!("skipping the ffmpeg video cases: no ffmpeg on PATH");
    }
    ok
}

/// The cases this machine can decode, with their reference and our decode of the clip.
fn decoded() -> Vec<(&'static str, bool, Value, qwen3_vl::video::Video)> {
    let ff = ffmpeg_available();
    let cfg = config();
    let mut out = Vec::new();
    for &(name, exact) in CASES {
        let c = case(name);
        let file = c["file"].as_str().unwrap().to_string();
        if needs_ffmpeg(&file) && !ff {
            continue;
        }
        let v = load_video(&dir().join(&file), &cfg, &VideoLimits::default()).unwrap_or_else(|e| panic!("{}: {}", name, e));
        out.push((name, exact, c, v));
    }
    out
}

fn prompt_ids(tok: &Tokenizer, c: &Value, v: &qwen3_vl::video::Video) -> Vec<u32> {
    let text = c["rendered"].as_str().unwrap();
    let question = text.rsplit("<|vision_end|>").next().unwrap().split("<|im_end|>").next().unwrap();
    let mut user = Message::user(question);
    user.media = vec![Media::Video(VideoPrompt { timestamps: v.patches.timestamps.clone(), tokens_per_frame: v.patches.tokens_per_frame(2) })];
    let rendered = render(&[user], true);
    assert_eq!(rendered, text, "{}: rendered prompt", c["case"]);
    tok.encode(&rendered)
}

#[test]
fn video_clips_sample_patch_and_prompt_like_transformers() {
    let tok = Tokenizer::from_file(&common::repo_root().join("tests/fixtures/tokenizer/tokenizer.json")).unwrap();
    let model = Model::load(&common::repo_root().join("tests/fixtures/vision/tiny"), &*common::cpu(), &mut |_, _| {}).unwrap();
    for (name, exact, c, v) in decoded() {
        assert_eq!(v.info.frames as u64, c["frames"].as_u64().unwrap(), "{}: frames", name);
        assert!((v.info.fps - c["fps"].as_f64().unwrap()).abs() < 1e-9, "{}: fps {} vs {}", name, v.info.fps, c["fps"]);
        let want_idx: Vec<usize> = c["frames_indices"].as_array().unwrap().iter().map(|x| x.as_u64().unwrap() as usize).collect();
        assert_eq!(v.indices, want_idx, "{}: sampled frames", name);
        let g = &c["video_grid_thw"][0];
        assert_eq!(v.patches.grid_thw.to_vec(), u32s(g).iter().map(|&x| x as usize).collect::<Vec<_>>(), "{}: video_grid_thw", name);
        let want = tensor(&c["pixel_values"]);
        assert_eq!(v.patches.patches.len(), want.len(), "{}: pixel values", name);
        let worst = v.patches.patches.iter().zip(&want).map(|(a, b)| (a - b).abs()).fold(0f32, f32::max);
        let mean = v.patches.patches.iter().zip(&want).map(|(a, b)| (a - b).abs() as f64).sum::<f64>() / want.len() as f64;
        eprintln!("{}: pixel values max |diff| {:.3e}, mean {:.3e}", name, worst, mean);
        if exact {
            assert!(worst <= 1e-6, "{}: pixel values differ by {}", name, worst);
        } else {
            // another resampler or YUV conversion: values in [-1, 1] a few 8-bit steps apart
            assert!(worst <= 0.25 && mean <= 0.02, "{}: pixel values differ by {} (mean {})", name, worst, mean);
        }
        let ids = prompt_ids(&tok, &c, &v);
        assert_eq!(ids, u32s(&c["input_ids"]), "{}: input ids", name);
        let (pos, next) = multimodal_positions(&ids, model.config.vision_tokens(), &[v.patches.grid_thw], 2, 0).unwrap();
        let want_pos: Vec<Vec<u32>> = c["position_ids"].as_array().unwrap().iter().map(u32s).collect();
        for (i, p) in pos.iter().enumerate() {
            assert_eq!(*p, [want_pos[0][i], want_pos[1][i], want_pos[2][i]], "{} position {}", name, i);
        }
        assert_eq!(next as u64, c["next_position"].as_u64().unwrap(), "{}: next position", name);
    }
}

#[test]
fn video_prompt_logits_match_transformers() {
    let tok = Tokenizer::from_file(&common::repo_root().join("tests/fixtures/tokenizer/tokenizer.json")).unwrap();
    let clips = decoded();
    for b in common::backends("video prompts") {
        let model = Model::load(&common::repo_root().join("tests/fixtures/vision/tiny"), &*b, &mut |_, _| {}).unwrap();
        for (name, exact, c, v) in &clips {
            let ids = prompt_ids(&tok, c, v);
            let grids = [v.patches.grid_thw];
            let want = tensor(&c["last_logits"]);
            let base = common::logits_tolerance(&*b, DType::F32);
            // the reference's own pixels: the model path alone, at the strict bound
            let px = tensor(&c["pixel_values"]);
            let mut s = Session::with_kv_dtype(&model, &*b, ids.len(), DType::F32).unwrap();
            let logits = s.feed_with_images(&ids, Some(&Images { patches: &px, row_len: v.patches.row_len, grids: &grids })).unwrap();
            common::assert_close_to_std(&format!("{} logits from the reference pixels on {}", name, b.describe()), &logits, &want, base);
            // our decode and processing end to end
            let mut s = Session::with_kv_dtype(&model, &*b, ids.len(), DType::F32).unwrap();
            let logits = s.feed_with_images(&ids, Some(&Images { patches: &v.patches.patches, row_len: v.patches.row_len, grids: &grids })).unwrap();
            let tol = if *exact { base } else { base.max(1e-2) };
            common::assert_close_to_std(&format!("{} logits from the clip on {}", name, b.describe()), &logits, &want, tol);
        }
    }
}

#[test]
fn the_tower_in_slices_of_frames_gives_the_whole_pass() {
    let clips = decoded();
    for b in common::backends("video tower slices") {
        let model = Model::load(&common::repo_root().join("tests/fixtures/vision/tiny"), &*b, &mut |_, _| {}).unwrap();
        for (name, _, _, v) in &clips {
            let p = &v.patches;
            // a second video after the first: slices cut inside and across the two (the
            // kernels and their blocking differ with the row count: agreement within the tower's
            // tolerance, measured 4.3e-4 of the std on tensor cores and 3e-6 elsewhere; a slice
            // out of place would be off by the std itself)
            let tol = common::tower_tolerance(&*b) * 0.2;
            let mut px = p.patches.clone();
            px.extend_from_slice(&p.patches);
            let grids = [p.grid_thw, p.grid_thw];
            let whole = model.vision.encode_in_slices(&*b, &px, p.row_len, &grids, usize::MAX).unwrap();
            let per_frame = p.tokens_per_frame(2);
            for max in [per_frame, 3 * per_frame - 1] {
                let sliced = model.vision.encode_in_slices(&*b, &px, p.row_len, &grids, max).unwrap();
                let (w, s) = (b.download_f32(&whole.embeds).unwrap(), b.download_f32(&sliced.embeds).unwrap());
                common::assert_close_to_std(&format!("{} embeds in slices of {} tokens on {}", name, max, b.describe()), &s, &w, tol);
                for (dw, ds) in whole.deepstack.iter().zip(&sliced.deepstack) {
                    common::assert_close_to_std(&format!("{} deepstack in slices on {}", name, b.describe()), &b.download_f32(ds).unwrap(), &b.download_f32(dw).unwrap(), tol);
                }
            }
        }
    }
    assert_eq!(qwen3_vl::model::vision::tower_tokens(&[[30, 22, 40]], 2), 4096);
    assert_eq!(qwen3_vl::model::vision::tower_tokens(&[[2, 4, 6]], 2), 12);
    assert_eq!(qwen3_vl::model::vision::tower_tokens(&[[1, 200, 200]], 2), 10000); // one frame: whole
}

#[test]
fn bad_videos_are_clear_errors() {
    let cfg = config();
    let lim = VideoLimits::default();
    let tmp = common::Scratch::dir(&format!("qwen3-vl-video-test-{}", std::process::id()));
    let gif = std::fs::read(dir().join("gif_exact_12x64x96.gif")).unwrap();
    let expect = |path: &std::path::Path, needle: &str| match load_video(path, &cfg, &lim) {
        Err(Error::Video { file, msg }) => assert!(file.contains(path.file_name().unwrap().to_str().unwrap()) && msg.contains(needle), "{}: {}", file, msg),
        Err(e) => panic!("{}: another error: {}", path.display(), e),
        Ok(_) => panic!("{}: decoded", path.display()),
    };
    // missing, empty
    expect(&tmp.join("missing.gif"), "cannot read");
    let empty = tmp.join("empty.mp4");
    std::fs::write(&empty, b"").unwrap();
    expect(&empty, "empty");
    // a GIF cut inside its header
    let cut = tmp.join("cut.gif");
    std::fs::write(&cut, &gif[..10]).unwrap();
    expect(&cut, "GIF");
    // a truncated GIF keeps the frames before the cut (a warning), or fails on the first
    let trunc = tmp.join("trunc.gif");
    std::fs::write(&trunc, &gif[..gif.len() / 2]).unwrap();
    match load_video(&trunc, &cfg, &lim) {
        Ok(v) => assert!(v.info.frames < 12 && v.info.frames > 0),
        Err(e) => assert!(matches!(e, Error::Video { .. }), "{}", e),
    }
    // over the limits
    let small = VideoLimits { max_bytes: 100, ..VideoLimits::default() };
    match load_video(&dir().join("gif_exact_12x64x96.gif"), &cfg, &small) {
        Err(Error::Video { msg, .. }) => assert!(msg.contains("exceed the limit"), "{}", msg),
        other => panic!("{:?}", other.map(|v| v.indices)),
    }
    let short = VideoLimits { max_duration: 1.0, ..VideoLimits::default() };
    match load_video(&dir().join("gif_exact_12x64x96.gif"), &cfg, &short) {
        Err(Error::Video { msg, .. }) => assert!(msg.contains("1.2 s of video exceed"), "{}", msg),
        other => panic!("{:?}", other.map(|v| v.indices)),
    }
    // a GIF with a header and no frames; one declaring an absurd canvas
    let noframes = tmp.join("noframes.gif");
    let mut b = gif[..13].to_vec();
    b[10] = 0; // no global colour table
    b.push(0x3B);
    std::fs::write(&noframes, &b).unwrap();
    expect(&noframes, "no frames");
    let huge = tmp.join("huge.gif");
    let mut b = gif.clone();
    b[6..10].copy_from_slice(&[0xFF, 0xFF, 0xFF, 0xFF]);
    std::fs::write(&huge, &b).unwrap();
    expect(&huge, "65535x65535 canvas");
    // a still WebP is an image, not a video
    let still = root_image("exif_o8_20x30.webp");
    match load_video(&still, &cfg, &lim) {
        Err(Error::Video { msg, .. }) => assert!(msg.contains("still WebP"), "{}", msg),
        other => panic!("{:?}", other.map(|v| v.indices)),
    }
    // ffmpeg missing: the error names the tool and how to give it
    let text = tmp.join("notes.mp4");
    std::fs::write(&text, b"this is not a video at all\n").unwrap();
    let nowhere = VideoLimits { ffmpeg: Some(tmp.join("no-such-ffmpeg")), ..VideoLimits::default() };
    expect_with(&text, &cfg, &nowhere, "ffmpeg not found");
    if ffmpeg_available() {
        // a text file named .mp4, and a truncated MP4
        expect(&text, "ffprobe cannot read it");
        // past the time limit ffprobe / ffmpeg are killed and the error says so
        let hurry = VideoLimits { timeout: std::time::Duration::from_millis(1), ..VideoLimits::default() };
        expect_with(&dir().join("h264_30x64x96.mp4"), &cfg, &hurry, "did not finish within");
        let mp4 = std::fs::read(dir().join("h264_30x64x96.mp4")).unwrap();
        let t = tmp.join("trunc.mp4");
        std::fs::write(&t, &mp4[..mp4.len() / 3]).unwrap();
        match load_video(&t, &cfg, &lim) {
            Ok(v) => assert!(!v.indices.is_empty()),
            Err(e) => assert!(matches!(e, Error::Video { .. }), "{}", e),
        }
    }
}

fn expect_with(path: &std::path::Path, cfg: &VideoConfig, lim: &VideoLimits, needle: &str) {
    match load_video(path, cfg, lim) {
        Err(Error::Video { msg, .. }) => assert!(msg.contains(needle), "{}", msg),
        Err(e) => panic!("another error: {}", e),
        Ok(_) => panic!("decoded"),
    }
}

#[test]
fn an_image_then_a_video_in_one_turn_match_transformers() {
    use qwen3_vl::image::{load_image, preprocess, PreprocessConfig};
    let c = case("image_and_video");
    let tok = Tokenizer::from_file(&common::repo_root().join("tests/fixtures/tokenizer/tokenizer.json")).unwrap();
    let root = common::repo_root();
    let icfg = PreprocessConfig::from_file(&root.join("tests/fixtures/vision/tiny/preprocessor_config.json")).unwrap();
    let img = preprocess(&load_image(&root.join(c["image"].as_str().unwrap())).unwrap(), &icfg).unwrap();
    let v = load_video(&dir().join(c["file"].as_str().unwrap()), &config(), &VideoLimits::default()).unwrap();
    let text = c["rendered"].as_str().unwrap();
    let question = text.rsplit("<|vision_end|>").next().unwrap().split("<|im_end|>").next().unwrap();
    let mut user = Message::user(question);
    user.media = vec![Media::Image(img.num_tokens(2)), Media::Video(VideoPrompt { timestamps: v.patches.timestamps.clone(), tokens_per_frame: v.patches.tokens_per_frame(2) })];
    let rendered = render(&[user], true);
    assert_eq!(rendered, text);
    let ids = tok.encode(&rendered);
    assert_eq!(ids, u32s(&c["input_ids"]));
    let mut px = img.patches.clone();
    px.extend_from_slice(&v.patches.patches);
    let grids = [img.grid_thw, v.patches.grid_thw];
    let want = tensor(&c["last_logits"]);
    for b in common::backends("image and video prompt") {
        let model = Model::load(&root.join("tests/fixtures/vision/tiny"), &*b, &mut |_, _| {}).unwrap();
        let mut s = Session::with_kv_dtype(&model, &*b, ids.len(), DType::F32).unwrap();
        let logits = s.feed_with_images(&ids, Some(&Images { patches: &px, row_len: img.row_len, grids: &grids })).unwrap();
        common::assert_close_to_std(&format!("image and video logits on {}", b.describe()), &logits, &want, common::logits_tolerance(&*b, DType::F32));
    }
}

fn root_image(name: &str) -> PathBuf {
    common::repo_root().join("tests/fixtures/images").join(name)
}
