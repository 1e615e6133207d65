//! The chat template renderer against transformers: every conversation of
//! tests/fixtures/template/reference.json (plain, system, multi-turn, tools, tool calls one and
//! parallel, tool results, an image placeholder; made by tools/template_reference.py with
//! `apply_chat_template` on the fixture tokenizer's template) renders to the same text and ids.
//! The placeholders then expand to what Qwen3-VL's processor wrote for the image and video
//! fixtures.

mod common;

use common::repo_root;
use qwen3_vl::generate::chat::{Media, VideoPrompt};
use qwen3_vl::template::{files, media, Content, Conversation, Piece, PromptFormat, ToolCall, Turn};
use qwen3_vl::Tokenizer;
use serde_json::Value;

fn reference() -> Value {
    let p = repo_root().join("tests/fixtures/template/reference.json");
    serde_json::from_str(&std::fs::read_to_string(&p).expect("reference.json")).expect("valid JSON")
}

fn tokenizer() -> Tokenizer {
    Tokenizer::from_file(&repo_root().join("tests/fixtures/tokenizer/tokenizer.json")).unwrap()
}

fn fixture_format() -> PromptFormat {
    PromptFormat::find(None, &[&repo_root().join("tests/fixtures/tokenizer")], None).unwrap()
}

/// A transformers-form message as a [`Turn`].
fn turn(m: &Value) -> Turn {
    let content = match &m["content"] {
        Value::String(s) => Content::Text(s.clone()),
        _ => Content::Null,
    };
    let tool_calls = m["tool_calls"]
        .as_array()
        .map(|calls| {
            calls.iter().map(|c| ToolCall { id: c["id"].as_str().map(String::from), name: c["function"]["name"].as_str().unwrap().into(), arguments: c["function"]["arguments"].clone() }).collect()
        })
        .unwrap_or_default();
    Turn { role: m["role"].as_str().unwrap().into(), content, tool_calls, tool_call_id: m["tool_call_id"].as_str().map(String::from), name: None, reasoning_content: None }
}

#[test]
fn conversations_render_as_transformers_renders_them() {
    let r = reference();
    let tok = tokenizer();
    let format = fixture_format();
    assert!(format.is_template(), "{}", format.describe());
    let cases = r["cases"].as_array().unwrap();
    assert!(cases.len() >= 10);
    for c in cases {
        let name = c["name"].as_str().unwrap();
        let turns: Vec<Turn> = c["messages"].as_array().unwrap().iter().map(turn).collect();
        let tools: Option<Vec<Value>> = c["tools"].as_array().cloned();
        let conv = Conversation { turns: &turns, tools: tools.as_deref(), add_generation_prompt: c["add_generation_prompt"].as_bool().unwrap(), kwargs: c["chat_template_kwargs"].as_object() };
        let text = format.render(&conv).unwrap_or_else(|e| panic!("{}: {}", name, e));
        assert_eq!(text, c["text"].as_str().unwrap(), "{}: text", name);
        let want: Vec<u32> = c["ids"].as_array().unwrap().iter().map(|i| i.as_u64().unwrap() as u32).collect();
        assert_eq!(tok.encode(&text), want, "{}: ids", name);
    }
}

#[test]
fn image_parts_render_as_their_placeholder_and_expand_as_the_processor_does() {
    let format = fixture_format();
    let tok = tokenizer();
    // the placeholder case: an image part renders as the text transformers was given
    let r = reference();
    let case = r["cases"].as_array().unwrap().iter().find(|c| c["name"] == "image_placeholder").unwrap();
    let turns = [Turn::parts("user", vec![Piece::Image, Piece::Text("What is in this picture?".into())])];
    assert_eq!(format.render(&Conversation::new(&turns)).unwrap(), case["text"].as_str().unwrap());
    // two images, expanded: the processor's prompt of the vision fixture
    let v: Value = serde_json::from_str(&std::fs::read_to_string(repo_root().join("tests/fixtures/vision/two_images.json")).unwrap()).unwrap();
    let counts: Vec<usize> = v["images"].as_array().unwrap().iter().map(|i| i["n_image_tokens"].as_u64().unwrap() as usize).collect();
    let turns = [Turn::parts("user", vec![Piece::Image, Piece::Image, Piece::Text(v["text"].as_str().unwrap().into())])];
    let text = format.render(&Conversation::new(&turns)).unwrap();
    let expanded = media::expand(&text, &counts.iter().map(|&n| Media::Image(n)).collect::<Vec<_>>()).unwrap();
    assert_eq!(expanded, v["rendered"].as_str().unwrap());
    let ids: Vec<u32> = v["input_ids"].as_array().unwrap().iter().map(|i| i.as_u64().unwrap() as u32).collect();
    assert_eq!(tok.encode(&expanded), ids);
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
    assert_eq!(expanded, want);
}

#[test]
fn a_template_error_names_the_template_and_the_message() {
    let dir = std::env::temp_dir().join(format!("tpl-raise-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("chat_template.jinja"), "{% if messages[0].role != 'user' %}{{ raise_exception('Conversations must start with a user message') }}{% endif %}ok").unwrap();
    let f = files::in_dir(&dir).unwrap().unwrap();
    let turns = [Turn::text("assistant", "hi")];
    let e = f.render(&Conversation::new(&turns)).unwrap_err().to_string();
    assert!(e.contains("chat_template.jinja") && e.contains("must start with a user message"), "{}", e);
    std::fs::remove_dir_all(&dir).unwrap();
}
