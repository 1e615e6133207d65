#!/usr/bin/env python3
"""Reference prompts for the chat template renderer (host/src/template), made with transformers.

    pip install transformers jinja2   # no torch needed
    python3 tools/template_reference.py

For each conversation below, transformers' `AutoTokenizer.from_pretrained(tests/fixtures/tokenizer)`
renders the template of that folder's tokenizer_config.json with
`apply_chat_template(messages, tools=..., add_generation_prompt=..., tokenize=False)` (the text)
and `tokenize=True` (the ids). The result goes to tests/fixtures/template/reference.json, read by
tests/chat_template.rs (our renderer must give the same text and ids) and by
tests/openai_tools.py (the server's /tokenize must give the same ids).

Each case holds the conversation twice:
* `messages`: as transformers takes it (a tool call's arguments as a dict, as vLLM passes them
  to the template after parsing the client's JSON string);
* `openai_messages`: the same conversation as an OpenAI client sends it (arguments as a JSON
  string, `content: null` beside tool calls), or null where it has no wire form here (the
  image placeholder case: an image goes as an image_url part, whose token count the image
  decides).
"""

import hashlib
import json
from pathlib import Path

import transformers
from transformers import AutoTokenizer

ROOT = Path(__file__).resolve().parent.parent
TOKENIZER = ROOT / "tests" / "fixtures" / "tokenizer"
OUT = ROOT / "tests" / "fixtures" / "template" / "reference.json"

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
OPTIONS = {"no_generation_prompt": (False, None), "thinking_off": (True, {"enable_thinking": False})}


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


def main():
    tok = AutoTokenizer.from_pretrained(str(TOKENIZER))
    template_source = json.loads((TOKENIZER / "tokenizer_config.json").read_text())["chat_template"]
    cases = []
    for name, messages, tools in CASES:
        gen, kwargs = OPTIONS.get(name, (True, None))
        kw = dict(tools=tools, add_generation_prompt=gen, **(kwargs or {}))
        text = tok.apply_chat_template(messages, tokenize=False, **kw)
        ids = tok.apply_chat_template(messages, tokenize=True, return_dict=False, **kw)
        if isinstance(ids, dict) or hasattr(ids, "keys"):
            ids = ids["input_ids"]
        ids = [int(i) for i in ids]
        assert tok.encode(text, add_special_tokens=False) == ids, name
        cases.append({
            "name": name,
            "messages": messages,
            "openai_messages": None if name == "image_placeholder" else openai_form(messages),
            "tools": tools,
            "add_generation_prompt": gen,
            "chat_template_kwargs": kwargs,
            "text": text,
            "ids": ids,
        })
        print(f"{name}: {len(ids)} ids")
    OUT.parent.mkdir(parents=True, exist_ok=True)
    doc = {
        "made_by": "tools/template_reference.py",
        "transformers": transformers.__version__,
        "tokenizer": "tests/fixtures/tokenizer (tokenizer.json, tokenizer_config.json)",
        "template_sha256": hashlib.sha256(template_source.encode()).hexdigest(),
        "cases": cases,
    }
    OUT.write_text(json.dumps(doc, ensure_ascii=False, indent=1) + "\n")
    print(f"wrote {OUT}")


if __name__ == "__main__":
    main()
