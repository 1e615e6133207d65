//! The chat template renderer against transformers, for both templates the fixtures hold:
//! every conversation of tests/fixtures/template/reference.json (the Qwen3 text template of
//! tests/fixtures/tokenizer/tokenizer_config.json) and of qwen3_vl_reference.json
//! (Qwen3-VL-2B-Instruct's own template, tests/fixtures/vision/tiny/chat_template.json: content
//! as lists of text, image and video parts, system prompts as lists, `add_vision_id`, tool
//! results as parts), made by tools/template_reference.py with `apply_chat_template`, renders
//! to the same text and ids: plain, system, multi-turn, tools, tool calls one and parallel,
//! tool results. The placeholders then expand to what Qwen3-VL's processor wrote for the image
//! and video fixtures.

mod common;

use common::repo_root;
use qwen3_vl::generate::chat::{Media, VideoPrompt};
use qwen3_vl::template::{files, media, Content, ContentFormat, Conversation, Piece, PromptFormat, ToolCall, Turn};
use qwen3_vl::Tokenizer;
use serde_json::Value;

fn reference(file: &str) -> Value {
    let p = repo_root().join("tests/fixtures/template").join(file);
    serde_json::from_str(&std::fs::read_to_string(&p).expect("reference file")).expect("valid JSON")
}

fn tokenizer() -> Tokenizer {
    Tokenizer::from_file(&repo_root().join("tests/fixtures/tokenizer/tokenizer.json")).unwrap()
}

/// The Qwen3 text template (tokenizer_config.json of the tokenizer fixture).
fn text_format() -> PromptFormat {
    PromptFormat::find(None, &[&repo_root().join("tests/fixtures/tokenizer")], None).unwrap()
}

/// What `serve` and `generate` find for the tiny model (`-m tiny --tokenizer
/// tests/fixtures/tokenizer/tokenizer.json`): the model directory's chat_template.json comes
/// before the tokenizer directory's tokenizer_config.json.
fn vl_format() -> PromptFormat {
    PromptFormat::find(None, &[&repo_root().join("tests/fixtures/vision/tiny"), &repo_root().join("tests/fixtures/tokenizer")], None).unwrap()
}

/// The two templates with their references.
fn templates() -> Vec<(PromptFormat, Value)> {
    vec![(text_format(), reference("reference.json")), (vl_format(), reference("qwen3_vl_reference.json"))]
}

/// A transformers-form message content: a string, or a list of text / image / video parts.
fn content(v: &Value) -> Content {
    match v {
        Value::String(s) => Content::Text(s.clone()),
        Value::Array(parts) => Content::Parts(
            parts
                .iter()
                .map(|p| match p["type"].as_str().unwrap() {
                    "text" => Piece::Text(p["text"].as_str().unwrap().into()),
                    "image" => Piece::Image,
                    "video" => Piece::Video,
                    other => panic!("part type {}", other),
                })
                .collect(),
        ),
        _ => Content::Null,
    }
}

/// A transformers-form message as a [`Turn`].
fn turn(m: &Value) -> Turn {
    let tool_calls = m["tool_calls"]
        .as_array()
        .map(|calls| {
            calls.iter().map(|c| ToolCall { id: c["id"].as_str().map(String::from), name: c["function"]["name"].as_str().unwrap().into(), arguments: c["function"]["arguments"].clone() }).collect()
        })
        .unwrap_or_default();
    Turn { role: m["role"].as_str().unwrap().into(), content: content(&m["content"]), tool_calls, tool_call_id: m["tool_call_id"].as_str().map(String::from), name: None, reasoning_content: None }
}

#[test]
fn the_tiny_model_uses_qwen3_vl_instruct_template() {
    let format = vl_format();
    assert!(format.describe().ends_with("tests/fixtures/vision/tiny/chat_template.json"), "{}", format.describe());
    // it loops over message content: it is given content parts as sent, as vLLM gives them
    let PromptFormat::Template(t) = &format else { panic!("{}", format.describe()) };
    assert_eq!(t.content, ContentFormat::Parts);
    let PromptFormat::Template(t) = text_format() else { panic!("the text template") };
    assert_eq!(t.content, ContentFormat::String);
    let r = reference("qwen3_vl_reference.json");
    // the Instruct template (not the Thinking one), as Qwen3-VL-2B-Instruct ships it
    assert_eq!(r["template_sha256"], "3636d0f0bd6bef02654cdffdc447b79cb2cef8ab02cc75267345946291a489e4");
    let src: Value = serde_json::from_str(&std::fs::read_to_string(repo_root().join("tests/fixtures/vision/tiny/chat_template.json")).unwrap()).unwrap();
    let src = src["chat_template"].as_str().unwrap();
    assert!(src.ends_with("{{- '<|im_start|>assistant\\n' }}\n{%- endif %}\n") && !src.contains("<think>"));
}

#[test]
fn conversations_render_as_transformers_renders_them() {
    let tok = tokenizer();
    for (format, r) in templates() {
        assert!(format.is_template(), "{}", format.describe());
        let cases = r["cases"].as_array().unwrap();
        assert!(cases.len() >= 10);
        for c in cases {
            let name = format!("{} {}", r["template"].as_str().unwrap(), c["name"].as_str().unwrap());
            let turns: Vec<Turn> = c["messages"].as_array().unwrap().iter().map(turn).collect();
            let tools: Option<Vec<Value>> = c["tools"].as_array().cloned();
            let conv = Conversation { turns: &turns, tools: tools.as_deref(), add_generation_prompt: c["add_generation_prompt"].as_bool().unwrap(), kwargs: c["chat_template_kwargs"].as_object() };
            let text = format.render(&conv).unwrap_or_else(|e| panic!("{}: {}", name, e));
            assert_eq!(text, c["text"].as_str().unwrap(), "{}: text", name);
            let want: Vec<u32> = c["ids"].as_array().unwrap().iter().map(|i| i.as_u64().unwrap() as u32).collect();
            assert_eq!(tok.encode(&text), want, "{}: ids", name);
        }
    }
}

#[test]
fn image_parts_render_as_their_placeholder_and_expand_as_the_processor_does() {
    let tok = tokenizer();
    for (format, r) in templates() {
        let what = r["template"].as_str().unwrap();
        // the placeholder case: an image part renders as the text transformers was given
        let case = r["cases"].as_array().unwrap().iter().find(|c| c["name"] == "image_placeholder").unwrap();
        let turns = [Turn::parts("user", vec![Piece::Image, Piece::Text("What is in this picture?".into())])];
        assert_eq!(format.render(&Conversation::new(&turns)).unwrap(), case["text"].as_str().unwrap(), "{}", what);
        // two images, expanded: the processor's prompt of the vision fixture
        let v: Value = serde_json::from_str(&std::fs::read_to_string(repo_root().join("tests/fixtures/vision/two_images.json")).unwrap()).unwrap();
        let counts: Vec<usize> = v["images"].as_array().unwrap().iter().map(|i| i["n_image_tokens"].as_u64().unwrap() as usize).collect();
        let turns = [Turn::parts("user", vec![Piece::Image, Piece::Image, Piece::Text(v["text"].as_str().unwrap().into())])];
        let text = format.render(&Conversation::new(&turns)).unwrap();
        let expanded = media::expand(&text, &counts.iter().map(|&n| Media::Image(n)).collect::<Vec<_>>()).unwrap();
        assert_eq!(expanded, v["rendered"].as_str().unwrap(), "{}", what);
        let ids: Vec<u32> = v["input_ids"].as_array().unwrap().iter().map(|i| i.as_u64().unwrap() as u32).collect();
        assert_eq!(tok.encode(&expanded), ids, "{}", what);
        // a video: its timestamps and pads as the processor wrote them
        let c: Value = serde_json::from_str(&std::fs::read_to_string(repo_root().join("tests/fixtures/video/gif_three.json")).unwrap()).unwrap();
        let want = c["rendered"].as_str().unwrap();
        let timestamps: Vec<f64> = want.split("<").filter_map(|s| s.split_once(" seconds>")).map(|(t, _)| t.parse().unwrap()).collect();
        let first = want.split("seconds><|vision_start|>").nth(1).unwrap();
        let per_frame = first.split("<|vision_end|>").next().unwrap().matches(media::VIDEO_PAD).count();
        let question = want.rsplit("<|vision_end|>").next().unwrap().split("<|im_end|>").next().unwrap();
        let turns = [Turn::parts("user", vec![Piece::Video, Piece::Text(question.into())])];
        let text = format.render(&Conversation::new(&turns)).unwrap();
        let expanded = media::expand(&text, &[Media::Video(VideoPrompt { timestamps, tokens_per_frame: per_frame })]).unwrap();
        assert_eq!(expanded, want, "{}", what);
    }
}

#[test]
fn vision_ids_and_media_in_several_messages_expand_in_order() {
    // Qwen3-VL's template numbers images and videos over the whole conversation when
    // `add_vision_id` is set; the expansion still finds every placeholder, in order
    let format = vl_format();
    let r = reference("qwen3_vl_reference.json");
    let case = r["cases"].as_array().unwrap().iter().find(|c| c["name"] == "vision_ids").unwrap();
    let turns: Vec<Turn> = case["messages"].as_array().unwrap().iter().map(turn).collect();
    let conv = Conversation { kwargs: case["chat_template_kwargs"].as_object(), ..Conversation::new(&turns) };
    let text = format.render(&conv).unwrap();
    assert_eq!(text, case["text"].as_str().unwrap());
    let video = VideoPrompt { timestamps: vec![0.5, 1.5], tokens_per_frame: 2 };
    let expanded = media::expand(&text, &[Media::Image(3), Media::Image(1), Media::Video(video), Media::Image(2)]).unwrap();
    let want = format!(
        "<|im_start|>user\nPicture 1: <|vision_start|>{}<|vision_end|>What is this?<|im_end|>\n<|im_start|>assistant\nA cat.<|im_end|>\n<|im_start|>user\nPicture 2: <|vision_start|>{}<|vision_end|>Video 1: <|vision_start|><0.5 seconds><|vision_start|>{v}<|vision_end|><1.5 seconds><|vision_start|>{v}<|vision_end|><|vision_end|>And these?Picture 3: <|vision_start|>{}<|vision_end|><|im_end|>\n<|im_start|>assistant\n",
        media::IMAGE_PAD.repeat(3),
        media::IMAGE_PAD,
        media::IMAGE_PAD.repeat(2),
        v = media::VIDEO_PAD.repeat(2)
    );
    assert_eq!(expanded, want);
}

#[test]
fn a_template_error_names_the_template_and_the_message() {
    let dir = common::Scratch::dir(&format!("tpl-raise-{}", std::process::id()));
    std::fs::write(dir.join("chat_template.jinja"), "{% if messages[0].role != 'user' %}{{ raise_exception('Conversations must start with a user message') }}{% endif %}ok").unwrap();
    let f = files::in_dir(&dir).unwrap().unwrap();
    let turns = [Turn::text("assistant", "hi")];
    let e = f.render(&Conversation::new(&turns)).unwrap_err().to_string();
    assert!(e.contains("chat_template.jinja") && e.contains("must start with a user message"), "{}", e);
}
