//! The command-line tool as a careless user meets it: wrong paths and options, inputs checked
//! before the weights load, prompts from stdin or files, logits to stdout, broken pipes, -q and
//! -v, and chat (images, commands, Ctrl-C, a context that fills up). Runs the `qwen3-vl`
//! binary on the tiny full-vocabulary checkpoint of tests/fixtures/vision.

mod common;

use common::server::{bin, cli, generate_greedy, image, tiny_model, tokenizer};
use common::Scratch;
use std::io::{Read, Write};
use std::path::Path;
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

fn run(mut c: Command) -> Output {
    c.stdin(Stdio::null()).output().expect("run qwen3-vl")
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

/// Asserts a failed run whose stderr contains every one of `words` and no sign that the
/// weights started loading.
fn fails_early(o: &Output, words: &[&str]) {
    let e = stderr(o);
    assert!(!o.status.success(), "should fail: {}", e);
    for w in words {
        assert!(e.contains(w), "{:?} not in stderr:\n{}", w, e);
    }
    assert!(!e.contains("loading weights") && !e.contains("loaded "), "the weights were loaded before the error:\n{}", e);
    assert!(!e.contains("panicked"), "{}", e);
}

/// A scratch copy of the tiny model directory, removed when dropped.
fn scratch_model(name: &str) -> Scratch {
    let dir = Scratch::dir(&format!("qwen3-vl-cli-{}-{}", name, std::process::id()));
    for f in ["config.json", "model.safetensors", "preprocessor_config.json"] {
        std::fs::copy(tiny_model().join(f), dir.join(f)).unwrap();
    }
    std::fs::copy(tokenizer(), dir.join("tokenizer.json")).unwrap();
    dir
}

fn on(dir: &Path, sub: &str, args: &[&str]) -> Command {
    let mut c = Command::new(bin());
    c.arg(sub).arg("-m").arg(dir).args(args);
    c
}

#[test]
fn a_missing_or_incomplete_model_directory_is_named() {
    let o = run(on(Path::new("/nonexistent/model"), "generate", &["-p", "hi"]));
    fails_early(&o, &["/nonexistent/model", "model directory does not exist"]);
    assert!(!stderr(&o).contains("tokenizer.json"));
    let dir = scratch_model("notok");
    std::fs::remove_file(dir.join("tokenizer.json")).unwrap();
    fails_early(&run(on(&dir, "generate", &["-p", "hi"])), &["has no tokenizer.json", "--tokenizer"]);
    // a truncated checkpoint names the file and says truncated, not `tensor ''`
    let dir = scratch_model("trunc");
    let f = std::fs::OpenOptions::new().write(true).open(dir.join("model.safetensors")).unwrap();
    f.set_len(f.metadata().unwrap().len() - 1000).unwrap();
    let o = run(on(&dir, "generate", &["-p", "hi"]));
    fails_early(&o, &["model.safetensors", "truncated"]);
    assert!(!stderr(&o).contains("tensor ''"), "{}", stderr(&o));
}

#[test]
fn out_of_range_options_name_the_option_and_the_range() {
    for (sub, args, words) in [
        ("generate", vec!["--threads", "0"], vec!["--threads", "from 1 to 1024"]),
        ("generate", vec!["--temperature", "-1"], vec!["--temperature", "from 0"]),
        ("generate", vec!["--top-p", "5"], vec!["--top-p", "at most 1"]),
        ("generate", vec!["--max-pixels", "1"], vec!["--max-pixels", "from 1024"]),
        ("generate", vec!["--max-tokens", "0"], vec!["--max-tokens", "from 1"]),
        ("generate", vec!["--repetition-penalty", "0"], vec!["--repetition-penalty", "above 0"]),
        ("chat", vec!["--context", "1"], vec!["--context", "from 16"]),
        ("serve", vec!["--port", "70000"], vec!["--port", "from 0 to 65535"]),
        ("serve", vec!["--queue", "0"], vec!["--queue", "from 1"]),
    ] {
        let mut c = cli(sub, &args);
        if sub == "generate" {
            c.args(["-p", "hi"]);
        }
        let o = run(c);
        assert_eq!(o.status.code(), Some(2), "{} {:?}: {}", sub, args, stderr(&o));
        for w in words {
            assert!(stderr(&o).contains(w), "{:?} not in {}", w, stderr(&o));
        }
    }
}

#[test]
fn inputs_are_checked_before_the_weights_load() {
    let bad_image = Scratch::path(&format!("qwen3-vl-cli-bad-{}.png", std::process::id()));
    std::fs::write(&bad_image, b"\x89PNG\r\n\x1a\nnot really").unwrap();
    fails_early(&run(cli("generate", &["-v", "-p", "hi", "-i", "/nonexistent/cat.png"])), &["/nonexistent/cat.png", "cannot read"]);
    fails_early(&run(cli("generate", &["-v", "-p", "hi", "-i", bad_image.to_str().unwrap()])), &[bad_image.to_str().unwrap(), "cannot decode"]);
    fails_early(&run(cli("chat", &["-v", "-i", "/nonexistent/cat.png"])), &["/nonexistent/cat.png"]);
    fails_early(&run(cli("logits", &["-v", "-p", "hi", "-o", "/nonexistent/dir/out.f32"])), &["/nonexistent/dir/out.f32"]);
    fails_early(&run(cli("generate", &["-v", "-p", "hi", "--max-tokens", "262144"])), &["--max-tokens 262144", "context of 262144"]);
    fails_early(&run(cli("generate", &["-v", "--prompt-file", "/nonexistent/prompt.txt"])), &["--prompt-file /nonexistent/prompt.txt"]);
    fails_early(&run(cli("chat", &["-v", "--context", "16", "--system", &"Be brief. ".repeat(20)])), &["raise --context"]);
    let o = run(cli("generate", &[]));
    assert!(stderr(&o).contains("--prompt"), "a missing prompt is named: {}", stderr(&o));
}

#[test]
fn a_bad_generation_config_is_an_error_and_bad_fields_are_warnings() {
    let dir = scratch_model("genconfig");
    std::fs::write(dir.join("generation_config.json"), "{\"do_sample\": tru").unwrap();
    fails_early(&run(on(&dir, "generate", &["-p", "hi"])), &["generation_config.json", "not valid JSON"]);
    std::fs::write(dir.join("generation_config.json"), r#"{"do_sample": true, "temperature": -1, "top_p": 5}"#).unwrap();
    let o = run(on(&dir, "generate", &["-p", "hi", "--max-tokens", "2"]));
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(stderr(&o).contains("ignoring temperature = -1") && stderr(&o).contains("ignoring top_p = 5"), "{}", stderr(&o));
}

#[test]
fn prompts_come_from_stdin_or_a_file() {
    let want = generate_greedy("Hello!", &[], 6);
    let mut c = cli("generate", &["-q", "--greedy", "--max-tokens", "6", "-p", "-"]);
    let mut child = c.stdin(Stdio::piped()).stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().unwrap();
    child.stdin.take().unwrap().write_all(b"Hello!\n").unwrap();
    let o = child.wait_with_output().unwrap();
    assert_eq!(String::from_utf8_lossy(&o.stdout).trim_end_matches('\n'), want, "{}", stderr(&o));
    let f = Scratch::path(&format!("qwen3-vl-cli-prompt-{}.txt", std::process::id()));
    std::fs::write(&f, "Hello!\n").unwrap();
    let o = run(cli("generate", &["-q", "--greedy", "--max-tokens", "6", "--prompt-file", f.to_str().unwrap()]));
    assert_eq!(String::from_utf8_lossy(&o.stdout).trim_end_matches('\n'), want, "{}", stderr(&o));
}

#[test]
fn logits_go_to_stdout_with_dash() {
    let o = run(cli("logits", &["-q", "-p", "Hello", "-o", "-"]));
    assert!(o.status.success(), "{}", stderr(&o));
    assert_eq!(o.stdout.len(), 151_936 * 4);
    let f = Scratch::path(&format!("qwen3-vl-cli-logits-{}.f32", std::process::id()));
    let o2 = run(cli("logits", &["-q", "-p", "Hello", "-o", f.to_str().unwrap()]));
    assert!(o2.status.success(), "{}", stderr(&o2));
    assert!(o2.stdout.is_empty(), "stdout holds only the logits, here none: {:?}", String::from_utf8_lossy(&o2.stdout));
    assert_eq!(std::fs::read(&f).unwrap(), o.stdout);
    assert!(!Path::new("-").exists(), "no file named '-' is created");
}

#[test]
fn broken_pipes_end_quietly() {
    for mut c in [Command::new(bin()), cli("generate", &["--max-tokens", "200", "-p", "Write a long story."])] {
        if c.get_args().count() == 0 {
            c.arg("info");
        }
        let mut child = c.stdin(Stdio::null()).stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().unwrap();
        drop(child.stdout.take()); // like `| head -0`
        let mut err = String::new();
        child.stderr.take().unwrap().read_to_string(&mut err).unwrap();
        let status = child.wait().unwrap();
        assert!(!err.contains("panicked") && !err.contains("Broken pipe"), "{:?}: {}", status, err);
    }
}

#[test]
fn quiet_prints_only_the_reply_and_verbose_adds_detail() {
    let o = run(cli("generate", &["-q", "--max-tokens", "4", "-p", "Hi"]));
    assert!(o.status.success() && o.stderr.is_empty(), "-q wrote to stderr: {}", stderr(&o));
    assert!(!o.stdout.is_empty());
    let o = run(cli("generate", &["--max-tokens", "4", "-p", "Hi"]));
    assert!(stderr(&o).contains("generated in") && !stderr(&o).contains("debug:"));
    let o = run(cli("generate", &["-v", "--max-tokens", "4", "-p", "Hi"]));
    let e = stderr(&o);
    // (on a GPU the memory line names the device's pool before the process's memory)
    for w in ["sampling: greedy", "placement: ", "timings: model files and tokenizer", "prefill", "memory after generation: ", "process resident"] {
        assert!(e.contains(w), "-v lacks {:?}:\n{}", w, e);
    }
    assert!(!e.contains("trace:"));
    let e = stderr(&run(cli("generate", &["-vv", "--max-tokens", "4", "-p", "Hi"])));
    assert!(e.contains("trace: token 1: id"), "-vv lacks per-token detail:\n{}", e);
    // without -v/-q the level comes from QWEN3_VL_LOG; -q wins over it
    let mut c = cli("generate", &["--max-tokens", "4", "-p", "Hi"]);
    c.env("QWEN3_VL_LOG", "debug");
    let e = stderr(&run(c));
    assert!(e.contains("debug: sampling: greedy") && !e.contains("trace:"), "QWEN3_VL_LOG=debug:\n{}", e);
    let mut c = cli("generate", &["-q", "--max-tokens", "4", "-p", "Hi"]);
    c.env("QWEN3_VL_LOG", "trace");
    let o = run(c);
    assert!(o.status.success() && o.stderr.is_empty(), "-q with QWEN3_VL_LOG=trace wrote to stderr: {}", stderr(&o));
    // a name that is not a level is said, and the default taken
    let mut c = cli("generate", &["--max-tokens", "4", "-p", "Hi"]);
    c.env("QWEN3_VL_LOG", "loud");
    let e = stderr(&run(c));
    assert!(e.contains("QWEN3_VL_LOG=\"loud\" is not a level") && e.contains("info: ") && !e.contains("debug:"), "QWEN3_VL_LOG=loud:\n{}", e);
}

/// Runs chat with `input` on stdin; returns (stdout, stderr, success).
fn chat_session(args: &[&str], input: &str) -> (String, String, bool) {
    let mut child = cli("chat", args).stdin(Stdio::piped()).stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().unwrap();
    child.stdin.take().unwrap().write_all(input.as_bytes()).unwrap();
    let o = child.wait_with_output().unwrap();
    (String::from_utf8_lossy(&o.stdout).into_owned(), stderr(&o), o.status.success())
}

#[test]
fn chat_takes_images_commands_and_empty_lines() {
    let img = image("a_64x96.png");
    let want = generate_greedy("What is this?", &[img.clone()], 4);
    let input = format!("\n/help\n/image {}\n\nWhat is this?\n/image /nonexistent.png\n/bogus\n/exit\n", img.display());
    let (out, err, ok) = chat_session(&["--greedy", "--max-tokens", "4"], &input);
    assert!(ok, "{}", err);
    assert!(err.contains("/image PATH") && err.contains("(attached") && err.contains("(not attached") && err.contains("unknown command /bogus"), "{}", err);
    assert_eq!(out.trim_end_matches('\n'), want, "the /image reply equals generate's");
    // -i attaches to the first message
    let (out, err, ok) = chat_session(&["--greedy", "--max-tokens", "4", "-i", img.to_str().unwrap()], "What is this?\n");
    assert!(ok, "{}", err);
    assert_eq!(out.trim_end_matches('\n'), want);
}

#[test]
fn chat_drops_the_oldest_turns_when_the_context_fills() {
    let input = "Tell me about cats.\n".repeat(8);
    let (out, err, ok) = chat_session(&["--greedy", "--max-tokens", "8", "--context", "64"], &input);
    assert!(ok, "{}", err);
    assert!(err.contains("(the context is full: dropped the"), "{}", err);
    assert_eq!(out.lines().filter(|l| !l.is_empty()).count() >= 8, true, "eight replies: {:?}", out);
    // turns with images are fed again with their images when older turns are dropped
    let input = format!("Hello there.\n/image {}\nWhat is this?\n{}", image("a_64x96.png").display(), "And then?\n".repeat(10));
    let (_, err, ok) = chat_session(&["--greedy", "--max-tokens", "8", "--context", "96"], &input);
    assert!(ok && err.matches("(the context is full: dropped the").count() >= 2, "{}", err);
    assert!(!err.contains("error"), "{}", err);
    // a message that cannot fit at all is refused with the numbers, and chat goes on
    let (_, err, ok) = chat_session(&["--max-tokens", "4", "--context", "16"], &format!("{}\nHi\n", "word ".repeat(40)));
    assert!(ok && err.contains("more than the context of 16 (--context)"), "{}", err);
}

#[test]
fn ctrl_c_stops_the_reply_and_keeps_the_conversation() {
    let mut child = cli("chat", &["--greedy", "--max-tokens", "20000", "--context", "50000"]).stdin(Stdio::piped()).stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().unwrap();
    let mut stdin = child.stdin.take().unwrap();
    let mut stdout = child.stdout.take().unwrap();
    let err = std::sync::Arc::new(std::sync::Mutex::new(String::new()));
    let sink = std::sync::Arc::clone(&err);
    let mut stderr_pipe = child.stderr.take().unwrap();
    let reader = std::thread::spawn(move || {
        let mut buf = [0u8; 256];
        while let Ok(n) = stderr_pipe.read(&mut buf) {
            if n == 0 {
                break;
            }
            sink.lock().unwrap().push_str(&String::from_utf8_lossy(&buf[..n]));
        }
    });
    let t0 = Instant::now();
    // two long replies, each interrupted once it has started: the second shows that the
    // conversation went on after the first Ctrl-C
    for (turn, line) in [&b"Tell me a very long story.\n"[..], &b"And another one.\n"[..]].iter().enumerate() {
        stdin.write_all(line).unwrap();
        let mut seen = 0;
        let mut buf = [0u8; 256];
        while seen < 20 {
            let n = stdout.read(&mut buf).unwrap();
            assert!(n > 0 && t0.elapsed() < Duration::from_secs(60), "no reply in turn {}", turn);
            seen += n;
        }
        // SAFETY: signalling our own child.
        unsafe {
            libc::kill(child.id() as i32, libc::SIGINT);
        }
        while err.lock().unwrap().matches("(stopped)").count() < turn + 1 {
            assert!(t0.elapsed() < Duration::from_secs(60), "the reply of turn {} was not stopped: {}", turn, err.lock().unwrap());
            std::thread::sleep(Duration::from_millis(20));
        }
    }
    stdin.write_all(b"/exit\n").unwrap();
    drop(stdin);
    let status = child.wait().unwrap();
    reader.join().unwrap();
    assert!(status.success(), "chat ended with {:?}: {}", status, err.lock().unwrap());
}

/// Seeds whose temperature-1 replies to "Hi" on the tiny model picked one of the LM head's
/// padding ids (151,669 and up, which the tokenizer lacks) within 500 tokens before sampling
/// was limited to the tokenizer's ids (`generate` then died with "unknown token id"): 3 at id
/// 151,685, 4 at 151,891. Measured with the mask taken out; now they must run to the end.
pub const PADDING_SEEDS: [&str; 2] = ["3", "4"];

#[test]
fn hot_sampling_never_picks_an_id_the_tokenizer_lacks() {
    for seed in PADDING_SEEDS {
        let o = run(cli("generate", &["--temperature", "1", "--seed", seed, "--max-tokens", "500", "-p", "Hi"]));
        assert!(o.status.success(), "seed {}: {}", seed, stderr(&o));
        assert!(!stderr(&o).contains("unknown token id"), "{}", stderr(&o));
        assert!(!o.stdout.is_empty());
    }
    // the same prompt in chat: the reply ends normally and the session goes on
    let (out, err, ok) = chat_session(&["--temperature", "1", "--seed", PADDING_SEEDS[1], "--max-tokens", "500"], "Hi\n/exit\n");
    assert!(ok && !err.contains("unknown token id") && !err.contains("error"), "{}", err);
    assert!(!out.is_empty());
}

#[test]
fn bench_json_is_one_json_document_on_stdout() {
    for quiet in [false, true] {
        let mut args = vec!["--json", "--runs", "1", "--prompt-tokens", "4", "--gen-tokens", "2", "--image-side", "64"];
        if quiet {
            args.push("-q");
        }
        let mut c = Command::new(bin());
        c.arg("bench").arg("-m").arg(tiny_model()).args(&args);
        let o = run(c);
        assert!(o.status.success(), "{}", stderr(&o));
        let j: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap_or_else(|e| panic!("stdout is not one JSON document ({}): {:?}", e, String::from_utf8_lossy(&o.stdout)));
        assert!(j["prefill_tokens_per_s"].as_f64().unwrap() > 0.0 && j["decode_tokens_per_s"].as_f64().unwrap() > 0.0, "{}", j);
        assert!(j["vision_encode_ms"].as_f64().is_some(), "{}", j);
        if !quiet {
            assert!(stderr(&o).contains("| backend |") && stderr(&o).contains("placement:"), "the tables go to stderr: {}", stderr(&o));
        }
    }
}

#[test]
fn a_folder_that_is_not_a_model_says_what_was_looked_for_and_what_is_there() {
    let dir = scratch_model("noconfig");
    std::fs::remove_file(dir.join("config.json")).unwrap();
    let o = run(on(&dir, "generate", &["-p", "hi"]));
    fails_early(&o, &["is not a model directory", "looked for config.json with *.safetensors", "GGUF", "model.safetensors", "tokenizer.json"]);
    let empty = Scratch::dir(&format!("qwen3-vl-cli-empty-{}", std::process::id()));
    fails_early(&run(on(&empty, "bench", &[])), &["looked for config.json", "it holds nothing"]);
}

#[test]
fn quantize_and_quant_report_the_mix_and_warn_about_rows_that_cannot_take_it() {
    // the tiny model's rows (16, 32, 64 values) are not whole 256-value K-quant blocks
    let out = Scratch::path(&format!("qwen3-vl-cli-quant-{}", std::process::id()));
    let dir = scratch_model("quant");
    let o = run({
        let mut c = Command::new(bin());
        c.arg("quantize").arg(&dir).arg(&out).args(["--type", "q4_k_m"]);
        c
    });
    let e = stderr(&o);
    assert!(o.status.success(), "{}", e);
    assert!(e.contains("text model: ") && e.contains("could not take the type asked for: rows of") && e.contains("256-value blocks of q"), "{}", e);
    assert!(e.contains("Q4_K_M.gguf (") && e.contains(" tensors), "), "the written file's mix by type: {}", e);
    // --quant says the same while loading, and that it is slow on every start
    let o = run(on(&dir, "generate", &["--quant", "q4_k_m", "--greedy", "--max-tokens", "2", "-p", "hi"]));
    let e = stderr(&o);
    assert!(o.status.success(), "{}", e);
    assert!(e.contains("--quant q4_k_m: quantizing while loading, on every start") && e.contains("qwen3-vl quantize"), "{}", e);
    assert!(e.contains("could not take the type asked for"), "{}", e);
}

#[test]
fn a_reply_cut_by_a_full_context_says_so() {
    // "Hi" with the template takes about 10 tokens: a 40-token context leaves fewer than the
    // 100 asked for
    let (out, err, ok) = chat_session(&["--greedy", "--max-tokens", "100", "--context", "40"], "Hi\n");
    assert!(ok, "{}", err);
    assert!(!out.is_empty());
    assert!(err.contains("tokens: the context of 40 tokens (--context) is full"), "{}", err);
}

/// The CUDA build opens the driver at run time: where there is none (here `QWEN3_VL_LIBCUDA`
/// names a library that does not exist, and the loader path is emptied), it still starts,
/// `info` says why it runs on the CPU, `--device auto` generates there and `--device cuda`
/// fails with the reason. CI also checks that the binary does not list libcuda as needed.
#[cfg(feature = "cuda")]
#[test]
fn the_cuda_build_starts_without_a_driver_and_says_why_it_runs_on_the_cpu() {
    let no_driver = |mut c: Command| {
        c.env("QWEN3_VL_LIBCUDA", "/nonexistent/libcuda.so.1").env("LD_LIBRARY_PATH", "");
        run(c)
    };
    let mut c = Command::new(bin());
    c.arg("info");
    let o = no_driver(c);
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(out.contains("backend: CPU"), "{}", out);
    assert!(out.contains("no NVIDIA driver library could be opened") && out.contains("/nonexistent/libcuda.so.1"), "{}", out);
    assert!(out.contains("driver:  none"), "{}", out);

    let o = no_driver(cli("generate", &["-p", "Hi", "--max-tokens", "3", "--greedy", "--device", "auto"]));
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(!o.stdout.is_empty(), "no reply");

    let o = no_driver(cli("generate", &["-p", "Hi", "--max-tokens", "3", "--device", "cuda"]));
    assert!(!o.status.success());
    assert!(stderr(&o).contains("no NVIDIA driver library could be opened"), "{}", stderr(&o));
    assert!(!stderr(&o).contains("panicked"), "{}", stderr(&o));
}
