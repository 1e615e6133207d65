#!/usr/bin/env python3
"""Reference prompts for the chat template renderer (host/src/template), made with transformers.

    pip install transformers jinja2   # no torch needed
    python3 tools/template_reference.py

Two templates, each rendered by transformers' tokenizer (`AutoTokenizer.from_pretrained(
tests/fixtures/tokenizer)`) with `apply_chat_template(messages, chat_template=..., tools=...,
add_generation_prompt=..., **chat_template_kwargs)`, as text (`tokenize=False`) and as ids:

* the Qwen3 text template of tests/fixtures/tokenizer/tokenizer_config.json, over the text
  conversations, into tests/fixtures/template/reference.json;
* Qwen3-VL-2B-Instruct's own template (tests/fixtures/vision/tiny/chat_template.json, what the
  tiny model serves with), over the same conversations and the vision-language ones (content as
  lists of text / image / video parts, a system prompt as a list, `add_vision_id`, tool results
  as parts), into tests/fixtures/template/qwen3_vl_reference.json.

They are read by tests/chat_template.rs (our renderer must give the same text and ids) and by
tests/openai_tools.py (the server's /tokenize must give the same ids).

Each case holds the conversation twice:
* `messages`: as transformers takes it (a tool call's arguments as a dict, as vLLM passes them
  to the template after parsing the client's JSON string; an image or video as
  `{"type": "image"}` / `{"type": "video"}`);
* `openai_messages`: the same conversation as an OpenAI client sends it (arguments as a JSON
  string, `content: null` beside tool calls), or null where it has no wire form here (images
  and videos go as image_url / video_url parts, whose token counts the media decide).
"""

import hashlib
import json
from pathlib import Path

import transformers
from transformers import AutoTokenizer

ROOT = Path(__file__).resolve().parent.parent
TOKENIZER = ROOT / "tests" / "fixtures" / "tokenizer"
VL_TEMPLATE = ROOT / "tests" / "fixtures" / "vision" / "tiny" / "chat_template.json"
OUT_DIR = ROOT / "tests" / "fixtures" / "template"

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Get the current weather in a city.",
        "parameters": {
            "type": "object",
            "properties": {
                "city": {"type": "string", "description": "The city, e.g. Zürich"},
                "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
            },
            "required": ["city"],
        },
    },
}

SEARCH = {
    "type": "function",
    "function": {
        "name": "search",
        "description": "Search the web.\nReturns \"snippets\" & links <b>.",
        "parameters": {
            "type": "object",
            "properties": {
                "query": {"type": "string"},
                "limit": {"type": "integer", "minimum": 1, "maximum": 10, "default": 3},
                "score": {"type": "number", "minimum": 0.5, "exclusiveMaximum": 1e-05},
                "filters": {"type": "array", "items": {"type": "string"}},
                "safe": {"type": "boolean"},
            },
            "required": ["query"],
        },
        "strict": True,
    },
}


def call(id_, name, args):
    return {"id": id_, "type": "function", "function": {"name": name, "arguments": args}}


CASES = [
    ("plain", [{"role": "user", "content": "Hello!"}], None),
    ("system", [{"role": "system", "content": "You are concise."}, {"role": "user", "content": "What is 2+2?"}], None),
    (
        "multi_turn",
        [
            {"role": "system", "content": "Be brief."},
            {"role": "user", "content": "Hi"},
            {"role": "assistant", "content": "Hello! How can I help?"},
            {"role": "user", "content": "Tell me a joke.\nA short one."},
        ],
        None,
    ),
    ("tools", [{"role": "user", "content": "What's the weather in Paris?"}], [WEATHER, SEARCH]),
    ("tools_system", [{"role": "system", "content": "Use tools when useful."}, {"role": "user", "content": "Weather in Zürich, in °F?"}], [WEATHER]),
    (
        "tool_call_and_result",
        [
            {"role": "user", "content": "What's the weather in Paris?"},
            {"role": "assistant", "content": "", "tool_calls": [call("call_1", "get_weather", {"city": "Paris", "unit": "celsius"})]},
            {"role": "tool", "tool_call_id": "call_1", "content": "{\"temperature\": 21.5, \"sky\": \"clear\"}"},
        ],
        [WEATHER],
    ),
    (
        "parallel_tool_calls",
        [
            {"role": "system", "content": "You are a helpful assistant."},
            {"role": "user", "content": "Weather in Paris and in Tokyo, and search for news."},
            {
                "role": "assistant",
                "content": "",
                "tool_calls": [
                    call("call_a", "get_weather", {"city": "Paris"}),
                    call("call_b", "get_weather", {"city": "東京", "unit": "celsius"}),
                    call("call_c", "search", {"query": "news \"today\"", "limit": 2, "score": 0.75, "filters": ["a", "b"], "safe": False}),
                ],
            },
            {"role": "tool", "tool_call_id": "call_a", "content": "18 C"},
            {"role": "tool", "tool_call_id": "call_b", "content": "25 C"},
            {"role": "tool", "tool_call_id": "call_c", "content": "[]"},
            {"role": "assistant", "content": "Paris: 18 °C. Tokyo: 25 °C. No news."},
            {"role": "user", "content": "Thanks!"},
        ],
        [WEATHER, SEARCH],
    ),
    (
        "text_and_tool_call",
        [
            {"role": "user", "content": "Find cats."},
            {"role": "assistant", "content": "Let me search.", "tool_calls": [call("call_9", "search", {"query": "cats", "filters": []})]},
            {"role": "tool", "tool_call_id": "call_9", "content": "cats are great"},
        ],
        [SEARCH],
    ),
    (
        "image_placeholder",
        [{"role": "user", "content": "<|vision_start|><|image_pad|><|vision_end|>What is in this picture?"}],
        None,
    ),
    ("no_generation_prompt", [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello."}], None),
    ("thinking_off", [{"role": "user", "content": "Quick: 3*7?"}], None),
]

# per case: (add_generation_prompt, chat_template_kwargs)
OPTIONS = {
    "no_generation_prompt": (False, None),
    "thinking_off": (True, {"enable_thinking": False}),
    "vision_ids": (True, {"add_vision_id": True}),
    "parts_no_generation_prompt": (False, None),
}


def text(t):
    return {"type": "text", "text": t}


IMAGE = {"type": "image"}
VIDEO = {"type": "video"}

# Qwen3-VL's conversations: content as lists of parts, images and videos among them
VL_CASES = [
    ("image_and_text", [{"role": "user", "content": [IMAGE, text("What is in this picture?")]}], None),
    (
        "images_and_video",
        [{"role": "user", "content": [text("Compare "), IMAGE, text(" and "), IMAGE, text(", then the clip: "), VIDEO, text("\nBriefly.")]}],
        None,
    ),
    ("system_parts", [{"role": "system", "content": [text("You are "), text("concise.")]}, {"role": "user", "content": [text("Hi")]}], None),
    (
        "system_parts_tools",
        [{"role": "system", "content": [text("Use tools "), text("when useful.")]}, {"role": "user", "content": [IMAGE, text("Weather where this was taken?")]}],
        [WEATHER],
    ),
    (
        "vision_ids",
        [
            {"role": "user", "content": [IMAGE, text("What is this?")]},
            {"role": "assistant", "content": "A cat."},
            {"role": "user", "content": [IMAGE, VIDEO, text("And these?"), IMAGE]},
        ],
        None,
    ),
    (
        "multi_turn_images",
        [
            {"role": "system", "content": "Be brief."},
            {"role": "user", "content": [IMAGE, text("Describe.")]},
            {"role": "assistant", "content": [text("A red "), text("square.")]},
            {"role": "user", "content": "Sure?"},
        ],
        None,
    ),
    (
        "parts_tool_call_and_result",
        [
            {"role": "user", "content": [text("What's the weather "), text("in Paris?")]},
            {"role": "assistant", "content": [text("Checking.")], "tool_calls": [call("call_1", "get_weather", {"city": "Paris", "unit": "celsius"})]},
            {"role": "tool", "tool_call_id": "call_1", "content": [text("{\"temperature\": 21.5}"), text(" (cached)")]},
        ],
        [WEATHER],
    ),
    (
        "parallel_calls_after_image",
        [
            {"role": "user", "content": [IMAGE, text("Which two cities are on this map? Get both weathers.")]},
            {"role": "assistant", "content": "", "tool_calls": [call("call_a", "get_weather", {"city": "Paris"}), call("call_b", "get_weather", {"city": "東京", "unit": "celsius"})]},
            {"role": "tool", "tool_call_id": "call_a", "content": "18 C"},
            {"role": "tool", "tool_call_id": "call_b", "content": "25 C"},
        ],
        [WEATHER, SEARCH],
    ),
    (
        "tool_result_with_image",
        [
            {"role": "user", "content": "Take a screenshot."},
            {"role": "assistant", "content": "", "tool_calls": [call("call_s", "search", {"query": "screenshot"})]},
            {"role": "tool", "tool_call_id": "call_s", "content": [text("Here it is: "), IMAGE]},
        ],
        [SEARCH],
    ),
    ("parts_no_generation_prompt", [{"role": "user", "content": [IMAGE, text("Hi")]}, {"role": "assistant", "content": [text("Hello.")]}], None),
]

# the conversations each template is checked on
TEMPLATES = [
    ("reference.json", "the Qwen3 text template of tests/fixtures/tokenizer/tokenizer_config.json", CASES),
    ("qwen3_vl_reference.json", "Qwen3-VL-2B-Instruct's template, tests/fixtures/vision/tiny/chat_template.json", CASES + VL_CASES),
]


def has_media(messages):
    return any(isinstance(m.get("content"), list) and any(p.get("type") in ("image", "video") for p in m["content"]) for m in messages)


def openai_form(messages):
    """The conversation as an OpenAI client sends it."""
    out = []
    for m in messages:
        m = json.loads(json.dumps(m))
        if "tool_calls" in m:
            for c in m["tool_calls"]:
                c["function"]["arguments"] = json.dumps(c["function"]["arguments"], ensure_ascii=False)
            if m.get("content") == "":
                m["content"] = None
        out.append(m)
    return out


def references(tok, source, cases):
    out = []
    for name, messages, tools in cases:
        gen, kwargs = OPTIONS.get(name, (True, None))
        kw = dict(chat_template=source, tools=tools, add_generation_prompt=gen, **(kwargs or {}))
        text = tok.apply_chat_template(messages, tokenize=False, **kw)
        ids = tok.apply_chat_template(messages, tokenize=True, return_dict=False, **kw)
        if isinstance(ids, dict) or hasattr(ids, "keys"):
            ids = ids["input_ids"]
        ids = [int(i) for i in ids]
        assert tok.encode(text, add_special_tokens=False) == ids, name
        wire = name != "image_placeholder" and not has_media(messages)
        out.append({
            "name": name,
            "messages": messages,
            "openai_messages": openai_form(messages) if wire else None,
            "tools": tools,
            "add_generation_prompt": gen,
            "chat_template_kwargs": kwargs,
            "text": text,
            "ids": ids,
        })
        print(f"  {name}: {len(ids)} ids")
    return out


def main():
    tok = AutoTokenizer.from_pretrained(str(TOKENIZER))
    sources = {
        "reference.json": json.loads((TOKENIZER / "tokenizer_config.json").read_text())["chat_template"],
        "qwen3_vl_reference.json": json.loads(VL_TEMPLATE.read_text())["chat_template"],
    }
    OUT_DIR.mkdir(parents=True, exist_ok=True)
    for file, template, cases in TEMPLATES:
        source = sources[file]
        print(f"{file}: {template}")
        doc = {
            "made_by": "tools/template_reference.py",
            "transformers": transformers.__version__,
            "tokenizer": "tests/fixtures/tokenizer (tokenizer.json, tokenizer_config.json)",
            "template": template,
            "template_sha256": hashlib.sha256(source.encode()).hexdigest(),
            "cases": references(tok, source, cases),
        }
        out = OUT_DIR / file
        out.write_text(json.dumps(doc, ensure_ascii=False, indent=1) + "\n")
        print(f"wrote {out}")


if __name__ == "__main__":
    main()
