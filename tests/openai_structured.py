"""Structured output through the official `openai` client against `qwen3-vl serve` on the tiny
random-weight model (run by tests/openai_client.rs). The model writes junk, but under the
grammar it must still be valid: every JSON reply is checked with the `jsonschema` package.

Environment: QWEN3_VL_BASE_URL (http://127.0.0.1:PORT/v1). Exits non-zero, naming the check,
when anything differs.
"""

import json
import os
import re
import sys
from typing import List, Literal

import jsonschema
import openai
from pydantic import BaseModel, Field

client = openai.OpenAI(base_url=os.environ["QWEN3_VL_BASE_URL"], api_key="unused", max_retries=0, timeout=120)
MESSAGES = [{"role": "user", "content": "Describe a person as JSON."}]


def check(cond, what):
    if not cond:
        print("FAILED:", what, file=sys.stderr)
        sys.exit(1)
    print("ok:", what.split(":")[0])


class Address(BaseModel):
    city: str = Field(max_length=10)
    zip: str = Field(pattern=r"^[0-9]{5}$")


class Person(BaseModel):
    name: str = Field(max_length=12)
    age: int = Field(ge=0, le=130)
    address: Address
    tags: List[Literal["red", "green", "blue"]] = Field(max_length=3)


# 1. parse() with a Pydantic model (strict json_schema; the reply parsed back into the model)
r = client.chat.completions.parse(model="tiny", messages=MESSAGES, response_format=Person, max_tokens=300, temperature=0)
p = r.choices[0].message.parsed
check(isinstance(p, Person) and r.choices[0].finish_reason == "stop", f"parse() with a Pydantic model: {r}")
jsonschema.validate(json.loads(r.choices[0].message.content), Person.model_json_schema())
print("  parsed:", p)

# 2. json_schema replies validate: greedy, and sampled at temperature 1 with several seeds,
#    whole and streamed
SCHEMA = {
    "type": "object",
    "properties": {
        "title": {"type": "string", "maxLength": 16},
        "pages": {"type": "integer", "minimum": 1, "maximum": 5000},
        "rating": {"type": "number", "minimum": 0, "maximum": 5},
        "available": {"type": "boolean"},
        "authors": {
            "type": "array",
            "maxItems": 3,
            "items": {
                "type": "object",
                "properties": {"name": {"type": "string", "maxLength": 12}, "role": {"enum": ["writer", "editor"]}},
                "required": ["name", "role"],
                "additionalProperties": False,
            },
        },
        "isbn": {"anyOf": [{"type": "string", "pattern": "^[0-9]{13}$"}, {"type": "null"}]},
    },
    "required": ["title", "pages", "rating", "available", "authors", "isbn"],
    "additionalProperties": False,
}
FORMAT = {"type": "json_schema", "json_schema": {"name": "book", "schema": SCHEMA, "strict": True}}
texts = set()
for temperature, seed in [(0, None), (1, 1), (1, 2), (1, 3), (1, 4)]:
    r = client.chat.completions.create(model="tiny", messages=MESSAGES, response_format=FORMAT, max_tokens=400, temperature=temperature, seed=seed)
    text = r.choices[0].message.content
    check(r.choices[0].finish_reason == "stop", f"json_schema reply ends (temperature {temperature}, seed {seed}): {r}")
    try:
        jsonschema.validate(json.loads(text), SCHEMA)
    except Exception as e:  # noqa: BLE001 - any failure names the reply
        check(False, f"json_schema reply validates (temperature {temperature}, seed {seed}): {text!r}: {e}")
    print(f"ok: json_schema reply validates (temperature {temperature}, seed {seed}): {text}")
    texts.add(text)
check(len(texts) >= 3, f"sampled replies differ by seed: {texts}")
stream = client.chat.completions.create(model="tiny", messages=MESSAGES, response_format=FORMAT, max_tokens=400, temperature=1, seed=9, stream=True)
text = "".join(c.choices[0].delta.content or "" for c in stream if c.choices)
jsonschema.validate(json.loads(text), SCHEMA)
print("ok: a streamed json_schema reply validates once reassembled:", text)

# 3. json_object: a JSON object. Objects are open-ended, and on random weights most run to
#    max_tokens (their text then starts one); of 8 seeds some finish, each an object
finished = 0
for seed in range(1, 9):
    r = client.chat.completions.create(model="tiny", messages=MESSAGES, response_format={"type": "json_object"}, max_tokens=300, temperature=1, seed=seed)
    text = r.choices[0].message.content
    if r.choices[0].finish_reason == "stop":
        check(isinstance(json.loads(text), dict), f"json_object gives a JSON object: {text!r}")
        finished += 1
    else:
        check(r.choices[0].finish_reason == "length" and text.startswith("{"), f"json_object starts an object: {text!r}")
check(finished > 0, "json_object: some of 8 sampled objects finish within 300 tokens")

# 4. vLLM's structured_outputs: regex, choice, grammar (Lark), json
r = client.chat.completions.create(model="tiny", messages=MESSAGES, max_tokens=50, temperature=1, seed=3, extra_body={"structured_outputs": {"regex": r"[A-Z][a-z]{2,6} [0-9]{2}"}})
check(re.fullmatch(r"[A-Z][a-z]{2,6} [0-9]{2}", r.choices[0].message.content), f"structured_outputs.regex: {r.choices[0].message.content!r}")
for seed in (1, 2, 3):
    r = client.chat.completions.create(model="tiny", messages=MESSAGES, max_tokens=20, temperature=1, seed=seed, extra_body={"structured_outputs": {"choice": ["positive", "negative", "neutral"]}})
    check(r.choices[0].message.content in ("positive", "negative", "neutral"), f"structured_outputs.choice: {r.choices[0].message.content!r}")
GRAMMAR = 'start: "SELECT " COLUMN (", " COLUMN)* " FROM " TABLE\nCOLUMN: /[a-z]{1,8}/\nTABLE: "users" | "orders"\n'
r = client.chat.completions.create(model="tiny", messages=MESSAGES, max_tokens=100, temperature=1, seed=4, extra_body={"structured_outputs": {"grammar": GRAMMAR}})
check(re.fullmatch(r"SELECT [a-z]{1,8}(, [a-z]{1,8})* FROM (users|orders)", r.choices[0].message.content), f"structured_outputs.grammar: {r.choices[0].message.content!r}")
r = client.chat.completions.create(model="tiny", messages=MESSAGES, max_tokens=400, temperature=0, extra_body={"structured_outputs": {"json": json.dumps(SCHEMA)}})
jsonschema.validate(json.loads(r.choices[0].message.content), SCHEMA)
print("ok: structured_outputs.json (schema text) validates")


# 5. refusals: the removed guided_* names, two structured outputs at once, bad schemas
def expect_400(what, needle, **kw):
    try:
        client.chat.completions.create(model="tiny", messages=MESSAGES, max_tokens=5, **kw)
    except openai.BadRequestError as e:
        msg = e.body.get("message", "") if isinstance(e.body, dict) else str(e)
        check(needle in msg, f"{what}: 400 naming {needle!r}: {msg!r}")
        return
    check(False, f"{what}: expected a 400")


expect_400("guided_json", "structured_outputs", extra_body={"guided_json": SCHEMA})
expect_400("guided_regex", "structured_outputs", extra_body={"guided_regex": "a+"})
expect_400("two structured outputs", "not both", response_format={"type": "json_object"}, extra_body={"structured_outputs": {"regex": "a"}})
expect_400("a bad schema", "strin", response_format={"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "object", "properties": {"a": {"type": "strin"}}}}})
expect_400("a bad regex", "regex", extra_body={"structured_outputs": {"regex": "(unclosed"}})
expect_400("a bad grammar", "grammar", extra_body={"structured_outputs": {"grammar": "start: missing_rule"}})
print("all structured output checks passed")
