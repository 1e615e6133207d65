"""Tools, tool calls and /tokenize with the official `openai` Python client against
`qwen3-vl serve` on the tiny random-weight model (run by tests/openai_client.rs).

Environment: QWEN3_VL_BASE_URL (http://127.0.0.1:PORT/v1), QWEN3_VL_TEMPLATE_REFERENCE (the
transformers references of the template the server runs with: tests/fixtures/template/
qwen3_vl_reference.json for the tiny model's own, reference.json for the Qwen3 text template),
QWEN3_VL_IMAGE (an image file, sent in place of the references' image parts).
Exits non-zero, naming the check, when anything differs.
"""

import base64
import json
import os
import sys
import urllib.error
import urllib.request

import openai

BASE = os.environ["QWEN3_VL_BASE_URL"]
ROOT_URL = BASE.rsplit("/v1", 1)[0]
with open(os.environ["QWEN3_VL_TEMPLATE_REFERENCE"], encoding="utf-8") as f:
    REFERENCE = json.load(f)
CASES = {c["name"]: c for c in REFERENCE["cases"]}
client = openai.OpenAI(base_url=BASE, api_key="unused", max_retries=0, timeout=120)


def check(cond, what):
    if not cond:
        print("FAILED:", what, file=sys.stderr)
        sys.exit(1)
    print("ok:", what.split(":")[0])


def post(path, body):
    """POST JSON to the server's root; (status, parsed body)."""
    req = urllib.request.Request(ROOT_URL + path, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=120) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


# 1. /tokenize gives transformers' ids for every conversation, tools, tool calls and results
#    included, sent as an OpenAI client sends them (arguments as JSON strings, content null)
n = 0
for name, c in CASES.items():
    if c["openai_messages"] is None:
        continue
    body = {"model": "tiny", "messages": c["openai_messages"], "add_generation_prompt": c["add_generation_prompt"]}
    if c["tools"]:
        body["tools"] = c["tools"]
    if c["chat_template_kwargs"]:
        body["chat_template_kwargs"] = c["chat_template_kwargs"]
    status, r = post("/tokenize", body)
    check(status == 200, f"/tokenize {name}: {status} {r}")
    check(r["tokens"] == c["ids"] and r["count"] == len(c["ids"]) and r["max_model_len"] > 0, f"/tokenize {name} equals transformers' ids: {r['tokens'][:40]} vs {c['ids'][:40]}")
    status, d = post("/detokenize", {"model": "tiny", "tokens": r["tokens"]})
    check(status == 200 and d["prompt"] == c["text"], f"/detokenize {name} gives the rendered text back: {d}")
    n += 1
check(n >= 8, f"/tokenize cases checked: {n}")

# 1b. conversations with images (user messages only): sent as image_url parts, /tokenize gives
#     transformers' ids once each image's run of <|image_pad|> is taken back to the one the
#     template wrote; every run is as long as the image's token count
IMAGE_PAD = 151655
with open(os.environ["QWEN3_VL_IMAGE"], "rb") as f:
    IMAGE_URL = "data:image/png;base64," + base64.b64encode(f.read()).decode()


def with_images(messages):
    """The conversation with its image parts as image_url parts; None when it has no images or
    holds what a client cannot send here (videos, images outside user messages)."""
    out, images = [], 0
    for m in openai_ready(messages):
        if isinstance(m.get("content"), list):
            parts = []
            for p in m["content"]:
                if p["type"] == "image":
                    if m["role"] != "user":
                        return None
                    parts.append({"type": "image_url", "image_url": {"url": IMAGE_URL}})
                    images += 1
                elif p["type"] == "video":
                    return None
                else:
                    parts.append(p)
            m = dict(m, content=parts)
        out.append(m)
    return out if images else None


def openai_ready(messages):
    out = []
    for m in messages:
        m = json.loads(json.dumps(m))
        for c in m.get("tool_calls", []):
            c["function"]["arguments"] = json.dumps(c["function"]["arguments"], ensure_ascii=False)
        if "tool_calls" in m and m.get("content") == "":
            m["content"] = None
        out.append(m)
    return out


def collapse_pads(ids):
    out, runs = [], []
    for i in ids:
        if i == IMAGE_PAD and out and out[-1] == IMAGE_PAD:
            runs[-1] += 1
            continue
        if i == IMAGE_PAD:
            runs.append(1)
        out.append(i)
    return out, runs


m = 0
for name, c in CASES.items():
    messages = with_images(c["messages"]) if c["openai_messages"] is None and name != "image_placeholder" else None
    if messages is None:
        continue
    body = {"model": "tiny", "messages": messages, "add_generation_prompt": c["add_generation_prompt"]}
    if c["tools"]:
        body["tools"] = c["tools"]
    if c["chat_template_kwargs"]:
        body["chat_template_kwargs"] = c["chat_template_kwargs"]
    status, r = post("/tokenize", body)
    check(status == 200, f"/tokenize {name} with images: {status} {r}")
    ids, runs = collapse_pads(r["tokens"])
    check(ids == c["ids"] and len(set(runs)) == 1 and runs[0] > 1, f"/tokenize {name} with images equals transformers' ids, pads expanded: runs {runs}")
    m += 1
if REFERENCE["template"].startswith("Qwen3-VL"):
    check(m >= 3, f"/tokenize cases with images checked: {m}")
status, r = post("/tokenize", {"model": "tiny", "prompt": "Hello world", "return_token_strs": True})
check(status == 200 and r["tokens"] == [9707, 1879] and r["token_strs"] == ["Hello", "Ġworld"], f"/tokenize of a prompt: {r}")
status, r = post("/tokenize", {"model": "tiny", "messages": [{"role": "tool", "content": "x"}]})
check(status == 400 and r["error"]["param"] == "messages[0].tool_call_id", f"/tokenize names a bad message field: {r}")

# 2. the ids /tokenize gives are the ones a chat request runs: its prompt_tokens
case = CASES["parallel_tool_calls"]
r = client.chat.completions.create(model="tiny", messages=case["openai_messages"], tools=case["tools"], tool_choice="none", max_tokens=8, temperature=0)
check(r.usage.prompt_tokens == len(case["ids"]), f"a history of parallel tool calls and results is accepted, prompt_tokens {r.usage.prompt_tokens} == {len(case['ids'])}")
choice = r.choices[0]
check(choice.finish_reason in ("stop", "length") and isinstance(choice.message.content, str) and not choice.message.tool_calls, f"tool_choice none: a text reply: {choice}")
case = CASES["tool_call_and_result"]
r = client.chat.completions.create(model="tiny", messages=case["openai_messages"], tools=case["tools"], max_tokens=8, temperature=0)
check(r.usage.prompt_tokens == len(case["ids"]), f"a tool result in the history, tool_choice auto: prompt_tokens {r.usage.prompt_tokens} == {len(case['ids'])}")
choice = r.choices[0]
check(choice.finish_reason in ("stop", "length", "tool_calls") and (choice.message.content is not None or choice.message.tool_calls), f"reply shape: {choice}")

# 3. the same history, streamed; the stream helper reassembles the reply
with client.chat.completions.stream(model="tiny", messages=CASES["tool_call_and_result"]["openai_messages"], tools=CASES["tool_call_and_result"]["tools"], max_tokens=8, temperature=0) as s:
    for _ in s:
        pass
    final = s.current_completion_snapshot
check(final.choices[0].finish_reason in ("stop", "length", "tool_calls") and final.usage is None, f"streamed history reply: {final.choices[0]}")

# 4. tool fields are checked: errors name the field
def bad(kwargs, param, what):
    try:
        client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "hi"}], max_tokens=2, **kwargs)
    except openai.BadRequestError as e:
        check(e.body.get("param") == param, f"{what}: param {e.body.get('param')!r} == {param!r} ({e.body.get('message')})")
        return
    check(False, f"{what}: expected a 400")


weather = CASES["tools"]["tools"][0]
bad({"tools": [weather], "tool_choice": {"type": "function", "function": {"name": "nope"}}}, "tool_choice.function.name", "a tool_choice naming no tool")
bad({"tools": [{"type": "function", "function": {"name": "has space"}}]}, "tools[0].function.name", "a bad function name")
bad({"tools": [{"type": "custom", "custom": {"name": "x"}}]}, "tools[0].type", "a custom tool")
bad({"functions": [weather["function"]]}, "functions", "the deprecated functions field")
try:
    client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "hi"}, {"role": "assistant", "content": None, "tool_calls": [{"id": "c", "type": "function", "function": {"name": "get_weather", "arguments": "{oops"}}]}], max_tokens=2)
    check(False, "bad arguments in the history: expected a 400")
except openai.BadRequestError as e:
    check(e.body.get("param") == "messages[1].tool_calls[0].function.arguments", f"bad arguments in the history: {e.body}")

print("all openai tool checks passed")
