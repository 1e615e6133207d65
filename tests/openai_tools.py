"""Tools, tool calls and /tokenize with the official `openai` Python client against
`qwen3-vl serve` on the tiny random-weight model (run by tests/openai_client.rs).

Environment: QWEN3_VL_BASE_URL (http://127.0.0.1:PORT/v1), QWEN3_VL_TEMPLATE_REFERENCE (the
transformers references of the template the server runs with: tests/fixtures/template/
qwen3_vl_reference.json for the tiny model's own, reference.json for the Qwen3 text template),
QWEN3_VL_IMAGE (an image file, sent in place of the references' image parts).
Constrained calls (tool_choice required or a named function, strict tools through
`pydantic_function_tool` and `parse()`) are checked whole and streamed, greedy and sampled:
their arguments validate with `jsonschema` against the tool's parameters.
Exits non-zero, naming the check, when anything differs.
"""

import base64
import json
import os
import sys
import urllib.error
import urllib.request

import jsonschema
import openai
import pydantic

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

# 5. constrained calls: tool_choice required or a named function gives calls whose arguments
#    validate against the tool's parameters, on the random-weight model, whole and streamed
#    (reassembled by the client's stream helper), greedy and sampled
WEATHER = {"type": "function", "function": {"name": "get_weather", "description": "The weather in a city", "parameters": {
    "type": "object",
    "properties": {"city": {"type": "string", "maxLength": 16}, "unit": {"enum": ["celsius", "fahrenheit"]}, "days": {"type": "integer", "minimum": 1, "maximum": 7}},
    "required": ["city", "unit"],
    "additionalProperties": False,
}}}
SEARCH = {"type": "function", "function": {"name": "search", "parameters": {
    "type": "object",
    "properties": {"query": {"type": "string", "maxLength": 12}, "top": {"type": "boolean"}, "tags": {"type": "array", "maxItems": 2, "items": {"type": "string", "maxLength": 6}}},
    "required": ["query"],
    "additionalProperties": False,
}}}
SCHEMAS = {t["function"]["name"]: t["function"]["parameters"] for t in (WEATHER, SEARCH)}
ASK = [{"role": "user", "content": "What is the weather in Paris, and what is new there?"}]


def calls_of(kwargs, stream):
    """The reply to a chat request with these arguments: whole, or streamed and reassembled."""
    args = dict(model="tiny", messages=ASK, max_tokens=400, **kwargs)
    if not stream:
        return client.chat.completions.create(**args)
    with client.chat.completions.stream(**args) as s:
        for _ in s:
            pass
        try:
            return s.get_final_completion()
        except openai.LengthFinishReasonError:
            return s.current_completion_snapshot  # as reassembled, without the helper's parse


def check_calls(r, names, what, one=False, may_run_out=False):
    """The reply's calls: of `names`, arguments valid, no content. With `may_run_out` (parallel
    calls sampled from a random model, which may go on calling until max_tokens), a reply cut
    by the length holds complete calls, and the open one as content."""
    choice = r.choices[0]
    calls = choice.message.tool_calls or []
    content = choice.message.content
    if may_run_out and choice.finish_reason == "length":
        check(calls and (not content or content.startswith("<tool_call>") or "<tool_call>".startswith(content)), f"{what}: cut by the length, complete calls and the open one as content: {choice}")
    else:
        check(choice.finish_reason == "tool_calls" and calls and not content, f"{what}: finish_reason tool_calls, calls and no content: {choice}")
    check(not one or len(calls) == 1, f"{what}: one call: {calls}")
    for c in calls:
        check(c.type == "function" and c.id.startswith("call_") and c.function.name in names, f"{what}: a call of {names}: {c}")
        try:
            jsonschema.validate(json.loads(c.function.arguments), SCHEMAS[c.function.name])
        except (ValueError, jsonschema.ValidationError) as e:
            check(False, f"{what}: arguments {c.function.arguments!r} validate: {e}")
    check(len({c.id for c in calls}) == len(calls), f"{what}: distinct call ids")
    return calls


most = 0
for stream in (False, True):
    mode = "streamed" if stream else "whole"
    for sampling in [dict(temperature=0)] + [dict(temperature=1.0, seed=s) for s in (1, 2, 3)]:
        how = f"{mode}, {'greedy' if sampling['temperature'] == 0 else 'seed %d' % sampling['seed']}"
        named = {"type": "function", "function": {"name": "search"}}
        check_calls(calls_of(dict(tools=[WEATHER, SEARCH], tool_choice=named, **sampling), stream), {"search"}, f"named call ({how})", one=True)
        calls = check_calls(calls_of(dict(tools=[WEATHER, SEARCH], tool_choice="required", **sampling), stream), {"get_weather", "search"}, f"required ({how})", may_run_out=sampling["temperature"] > 0)
        most = max(most, len(calls))
        check_calls(calls_of(dict(tools=[WEATHER, SEARCH], tool_choice="required", parallel_tool_calls=False, **sampling), stream), {"get_weather", "search"}, f"required, no parallel calls ({how})", one=True)
check(most > 1, f"required with parallel_tool_calls: several calls in one reply ({most})")

# the same request (greedy) gives the same calls whole and streamed
whole = calls_of(dict(tools=[WEATHER, SEARCH], tool_choice="required", temperature=0), False).choices[0].message.tool_calls
streamed = calls_of(dict(tools=[WEATHER, SEARCH], tool_choice="required", temperature=0), True).choices[0].message.tool_calls
check([(c.function.name, c.function.arguments) for c in whole] == [(c.function.name, c.function.arguments) for c in streamed], f"greedy calls whole == streamed: {whole} vs {streamed}")

# a constrained call, sent back in the history, is what the template renders
back = ASK + [{"role": "assistant", "content": None, "tool_calls": [c.model_dump(exclude_none=True) for c in whole]}] + [{"role": "tool", "tool_call_id": c.id, "content": "ok"} for c in whole]
r = client.chat.completions.create(model="tiny", messages=back, tools=[WEATHER, SEARCH], tool_choice="none", max_tokens=4, temperature=0)
check(r.choices[0].finish_reason in ("stop", "length"), f"the calls go back into the history: {r.choices[0]}")


# 6. strict tools from Pydantic models, parsed by the client (tool_choice required)
class Unit(str, __import__("enum").Enum):
    celsius = "celsius"
    fahrenheit = "fahrenheit"


class GetWeather(pydantic.BaseModel):
    city: str = pydantic.Field(max_length=16)
    unit: Unit
    days: int = pydantic.Field(ge=1, le=7)


for sampling in (dict(temperature=0), dict(temperature=1.0, seed=7)):
    r = client.chat.completions.parse(model="tiny", messages=ASK, tools=[openai.pydantic_function_tool(GetWeather)], tool_choice="required", parallel_tool_calls=False, max_tokens=400, **sampling)
    calls = r.choices[0].message.tool_calls or []
    check(r.choices[0].finish_reason == "tool_calls" and calls and all(isinstance(c.function.parsed_arguments, GetWeather) for c in calls), f"parse() with a pydantic tool ({sampling}): {r.choices[0]}")

# strict tools under auto: the reply may be text (free), but what follows "<tool_call>" is a
# call: the token pushed by logit_bias opens one, and the grammar makes the rest valid
r = client.chat.completions.create(model="tiny", messages=ASK, tools=[openai.pydantic_function_tool(GetWeather)], max_tokens=8, temperature=0)
check(r.choices[0].finish_reason in ("stop", "length") and r.choices[0].message.content, f"a strict tool under auto: text is free: {r.choices[0]}")
TOOL_CALL = 151657  # "<tool_call>", a plain-text added token
for sampling in (dict(temperature=0), dict(temperature=1.0, seed=3)):
    r = client.chat.completions.parse(model="tiny", messages=ASK, tools=[openai.pydantic_function_tool(GetWeather)], parallel_tool_calls=False, logit_bias={str(TOOL_CALL): 100}, max_tokens=400, **sampling)
    calls = r.choices[0].message.tool_calls or []
    check(r.choices[0].finish_reason == "tool_calls" and len(calls) == 1 and isinstance(calls[0].function.parsed_arguments, GetWeather), f"a strict tool under auto: an opened call is valid, parse() reads it ({sampling}): {r.choices[0]}")

# 7. what cannot be combined is refused, naming the field
bad({"tools": [WEATHER], "tool_choice": "required", "response_format": {"type": "json_object"}}, "response_format", "response_format with tool_choice required")
bad({"tools": [WEATHER], "tool_choice": {"type": "function", "function": {"name": "get_weather"}}, "extra_body": {"structured_outputs": {"regex": "a"}}}, "structured_outputs", "structured_outputs with a named tool_choice")
bad({"tools": [WEATHER], "tool_choice": "required", "extra_body": {"min_tokens": 3}}, "min_tokens", "min_tokens with tool_choice required")

print("all openai tool checks passed")
