//! `qwen3-vl serve` driven by the official `openai` Python package (tests/openai_client.py):
//! models, whole and streamed greedy replies equal to `generate`'s, an image, max_tokens,
//! stop, seeds, errors as the client's exceptions, and concurrent async requests.
//!
//! The Python is `QWEN3_VL_PYTHON` (default `python3`), with `QWEN3_VL_PYTHONPATH` as its
//! PYTHONPATH when set (CI installs the package there with `pip install --target`). Without
//! the `openai` package the test is skipped with a note, unless `QWEN3_VL_EXPECT_OPENAI=1`
//! (set by CI): then it fails.

mod common;

use common::server::{generate_greedy, image, Server};
use std::process::Command;

#[test]
fn the_official_openai_client_works() {
    let python = std::env::var("QWEN3_VL_PYTHON").unwrap_or_else(|_| "python3".into());
    let expect = std::env::var("QWEN3_VL_EXPECT_OPENAI").map_or(false, |v| v == "1");
    let py = || {
        let mut c = Command::new(&python);
        if let Some(p) = std::env::var_os("QWEN3_VL_PYTHONPATH") {
            c.env("PYTHONPATH", p);
        }
        c
    };
    let probe = py().args(["-c", "import openai"]).output();
    if !probe.as_ref().map_or(false, |o| o.status.success()) {
        let why = probe.map(|o| String::from_utf8_lossy(&o.stderr).into_owned()).unwrap_or_else(|e| e.to_string());
        assert!(!expect, "QWEN3_VL_EXPECT_OPENAI=1 but {} cannot import openai: {}", python, why);
        eprintln!("the_official_openai_client_works: skipped: {} has no openai package (pip install openai)", python);
        return;
    }
    let img = image("a_64x96.png");
    let video = common::repo_root().join("tests/fixtures/video/gif_exact_12x64x96.gif");
    let out = common::server::cli("generate", &["-q", "--greedy", "--max-tokens", "12", "-p", "What happens in this video?"]).arg("--video").arg(&video).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let expected = serde_json::json!({
        "text": generate_greedy("Describe a cat in one sentence.", &[], 12),
        "image": generate_greedy("What is in this picture?", &[img.clone()], 12),
        "video": String::from_utf8(out.stdout).unwrap().trim_end_matches('\n'),
    });
    let s = Server::start(&[]);
    let out = py()
        .arg(common::repo_root().join("tests/openai_client.py"))
        .env("QWEN3_VL_BASE_URL", format!("http://127.0.0.1:{}/v1", s.port))
        .env("QWEN3_VL_EXPECTED", expected.to_string())
        .env("QWEN3_VL_IMAGE", &img)
        .env("QWEN3_VL_VIDEO", &video)
        .output()
        .expect("run the openai client script");
    let (stdout, stderr) = (String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    eprintln!("{}", stdout);
    assert!(out.status.success(), "openai client checks failed:\n{}\n{}\nserver log:\n{}", stdout, stderr, s.log());
    assert!(stdout.contains("all openai client checks passed"));
    s.assert_no_panic();
}

/// The Python for the official client's scripts, with the `openai` package importable (`None`:
/// skipped with a note, unless `QWEN3_VL_EXPECT_OPENAI=1`, which fails instead).
fn openai_python(test: &str) -> Option<Command> {
    openai_python_with(test, "openai")
}

/// [`openai_python`] for a script that imports `modules` too (`"openai, jsonschema, pydantic"`).
fn openai_python_with(test: &str, modules: &str) -> Option<Command> {
    let python = std::env::var("QWEN3_VL_PYTHON").unwrap_or_else(|_| "python3".into());
    let expect = std::env::var("QWEN3_VL_EXPECT_OPENAI").map_or(false, |v| v == "1");
    let py = || {
        let mut c = Command::new(&python);
        if let Some(p) = std::env::var_os("QWEN3_VL_PYTHONPATH") {
            c.env("PYTHONPATH", p);
        }
        c
    };
    let probe = py().args(["-c", &format!("import {}", modules)]).output();
    if !probe.as_ref().map_or(false, |o| o.status.success()) {
        let why = probe.map(|o| String::from_utf8_lossy(&o.stderr).into_owned()).unwrap_or_else(|e| e.to_string());
        assert!(!expect, "QWEN3_VL_EXPECT_OPENAI=1 but {} cannot import {}: {}", python, modules, why);
        eprintln!("{}: skipped: {} cannot import {} (pip install {})", test, python, modules, modules.replace(',', ""));
        return None;
    }
    Some(py())
}

/// `n`, unseeded sampling, logprobs against `qwen3-vl logits`, `/v1/completions`, logit_bias,
/// min_tokens, ignore_eos and unknown fields through the official client (tests/openai_api.py).
#[test]
fn the_rest_of_what_clients_send() {
    let Some(mut py) = openai_python("the_rest_of_what_clients_send") else { return };
    let dir = common::Scratch::dir(&format!("qwen3-vl-openai-api-{}", std::process::id()));
    // 1. the logits command's output for the prompts the script asks about
    let (chat_prompt, raw_prompt) = ("Name three colors.", "The quick brown fox");
    let logits = |args: &[&str], name: &str| {
        let path = dir.join(name);
        let out = common::server::cli("logits", args).arg("-o").arg(&path).output().unwrap();
        assert!(out.status.success(), "logits: {}", String::from_utf8_lossy(&out.stderr));
        path
    };
    let chat_logits = logits(&["-p", chat_prompt], "chat.f32");
    let raw_logits = logits(&["--raw", "-p", raw_prompt], "raw.f32");
    let tok = qwen3_vl::Tokenizer::from_file(&common::server::tokenizer()).unwrap();
    let cat = tok.encode(" cat");
    assert_eq!(cat.len(), 1, "' cat' is one token");
    let facts = serde_json::json!({
        "chat_prompt": chat_prompt,
        "raw_prompt": raw_prompt,
        "chat_logits": chat_logits,
        "raw_logits": raw_logits,
        "vocab": tok.vocab_size(),
        "raw_ids": tok.encode(raw_prompt),
        "eos": tok.token_to_id("<|im_end|>").unwrap(),
        "token": cat[0],
        "token_text": tok.decode(&cat, false).unwrap(),
    });
    // 2. the script against a server
    let s = Server::start(&[]);
    let out = py
        .arg(common::repo_root().join("tests/openai_api.py"))
        .env("QWEN3_VL_BASE_URL", format!("http://127.0.0.1:{}/v1", s.port))
        .env("QWEN3_VL_FACTS", facts.to_string())
        .output()
        .expect("run the openai api script");
    let (stdout, stderr) = (String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    eprintln!("{}", stdout);
    assert!(out.status.success(), "openai api checks failed:\n{}\n{}\nserver log:\n{}", stdout, stderr, s.log());
    assert!(stdout.contains("all openai api checks passed"));
    s.assert_no_panic();
}

/// tests/openai_tools.py, for both templates: the tiny model's own (Qwen3-VL-2B-Instruct's
/// chat_template.json, what `serve` finds in the model directory) and the Qwen3 text template
/// (`--chat-template tests/fixtures/tokenizer/tokenizer_config.json`). A history with tool calls
/// and tool results is accepted (whole and streamed), tool fields are checked, and `/tokenize`
/// gives transformers' ids for the conversations of that template's references
/// (tests/fixtures/template/qwen3_vl_reference.json, reference.json): tools, tool calls,
/// results, content as parts, images sent as image_url parts. Constrained calls (tool_choice
/// required, a named function, strict Pydantic tools with `parse()`), whole and streamed, greedy
/// and sampled, have arguments that validate against their parameters (`jsonschema`).
#[test]
fn the_official_client_sends_tools_and_tokenize_matches_transformers() {
    let test = "the_official_client_sends_tools_and_tokenize_matches_transformers";
    if openai_python_with(test, "openai, jsonschema, pydantic").is_none() {
        return;
    }
    let root = common::repo_root();
    let text_template = root.join("tests/fixtures/tokenizer/tokenizer_config.json");
    let runs: [(&[&str], &str); 2] = [(&[], "qwen3_vl_reference.json"), (&["--chat-template", text_template.to_str().unwrap()], "reference.json")];
    for (args, reference) in runs {
        let Some(mut py) = openai_python("the_official_client_sends_tools_and_tokenize_matches_transformers") else { return };
        let s = Server::start(args);
        let out = py
            .arg(root.join("tests/openai_tools.py"))
            .env("QWEN3_VL_BASE_URL", format!("http://127.0.0.1:{}/v1", s.port))
            .env("QWEN3_VL_TEMPLATE_REFERENCE", root.join("tests/fixtures/template").join(reference))
            .env("QWEN3_VL_IMAGE", image("a_64x96.png"))
            .output()
            .expect("run the openai tools script");
        let (stdout, stderr) = (String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
        eprintln!("{}: {}", reference, stdout);
        assert!(out.status.success(), "openai tool checks against {} failed:\n{}\n{}\nserver log:\n{}", reference, stdout, stderr, s.log());
        assert!(stdout.contains("all openai tool checks passed"));
        s.assert_no_panic();
    }
}

/// Structured output with the official client (tests/openai_structured.py): `parse()` with a
/// Pydantic model, json_schema replies that validate with the `jsonschema` package (greedy,
/// sampled, streamed), json_object, vLLM's `structured_outputs` (regex, choice, Lark grammar,
/// json), and the refusals (the removed `guided_*` names, a bad schema). Skipped as above
/// without the packages (`openai`, `jsonschema`), unless `QWEN3_VL_EXPECT_OPENAI=1`.
#[test]
fn structured_output_with_the_official_client() {
    let test = "structured_output_with_the_official_client";
    if openai_python_with(test, "openai, jsonschema, pydantic").is_none() {
        return;
    }
    let Some(mut py) = openai_python(test) else { return };
    let s = Server::start(&[]);
    let out = py
        .arg(common::repo_root().join("tests/openai_structured.py"))
        .env("QWEN3_VL_BASE_URL", format!("http://127.0.0.1:{}/v1", s.port))
        .output()
        .expect("run the structured output script");
    let (stdout, stderr) = (String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    eprintln!("{}", stdout);
    assert!(out.status.success(), "structured output checks failed:\n{}\n{}\nserver log:\n{}", stdout, stderr, s.log());
    assert!(stdout.contains("all structured output checks passed"));
    s.assert_no_panic();
}
