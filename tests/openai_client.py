"""The official `openai` Python client against `qwen3-vl serve` (run by tests/openai_client.rs).

Environment: QWEN3_VL_BASE_URL (http://127.0.0.1:PORT/v1), QWEN3_VL_EXPECTED (JSON: the greedy
replies of `qwen3-vl generate` for the prompts below), QWEN3_VL_IMAGE (a PNG file).
Exits non-zero, naming the check, when anything differs.
"""

import asyncio
import base64
import json
import os
import sys

import openai

BASE = os.environ["QWEN3_VL_BASE_URL"]
EXPECTED = json.loads(os.environ["QWEN3_VL_EXPECTED"])
with open(os.environ["QWEN3_VL_IMAGE"], "rb") as f:
    IMAGE_URL = "data:image/png;base64," + base64.b64encode(f.read()).decode()

with open(os.environ["QWEN3_VL_VIDEO"], "rb") as f:
    VIDEO_URL = "data:image/gif;base64," + base64.b64encode(f.read()).decode()

TEXT_PROMPT = "Describe a cat in one sentence."
IMAGE_PROMPT = "What is in this picture?"
client = openai.OpenAI(base_url=BASE, api_key="unused", max_retries=0, timeout=120)


def check(cond, what):
    if not cond:
        print("FAILED:", what, file=sys.stderr)
        sys.exit(1)
    print("ok:", what.split(":")[0])


def text_messages():
    return [{"role": "user", "content": TEXT_PROMPT}]


def image_messages():
    return [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": IMAGE_URL}}, {"type": "text", "text": IMAGE_PROMPT}]}]


# 1. models
models = client.models.list()
check([m.id for m in models.data] == ["tiny"], f"models.list: {models}")
check(client.models.retrieve("tiny").id == "tiny", "models.retrieve")

# 2. a greedy reply, whole: the same as `qwen3-vl generate`
r = client.chat.completions.create(model="tiny", messages=text_messages(), max_tokens=12, temperature=0)
c = r.choices[0]
check(c.message.content == EXPECTED["text"], f"greedy text reply: {c.message.content!r} != {EXPECTED['text']!r}")
check(c.message.role == "assistant" and c.finish_reason in ("stop", "length"), f"role and finish_reason: {c}")
u = r.usage
check(u.prompt_tokens > 5 and u.total_tokens == u.prompt_tokens + u.completion_tokens and 1 <= u.completion_tokens <= 12, f"usage: {u}")
check(r.object == "chat.completion" and r.model == "tiny" and r.id.startswith("chatcmpl-"), f"response fields: {r}")

# 3. the same, streamed, with the usage chunk
stream = client.chat.completions.create(model="tiny", messages=text_messages(), max_tokens=12, temperature=0, stream=True, stream_options={"include_usage": True})
parts, finish, usage = [], None, None
for chunk in stream:
    if chunk.usage is not None:
        usage = chunk.usage
    for ch in chunk.choices:
        parts.append(ch.delta.content or "")
        finish = ch.finish_reason or finish
check("".join(parts) == EXPECTED["text"], f"streamed text: {''.join(parts)!r}")
check(finish == c.finish_reason and usage is not None and usage.completion_tokens == u.completion_tokens, f"stream finish and usage: {finish} {usage}")

# 4. an image as a data: URL
r = client.chat.completions.create(model="tiny", messages=image_messages(), max_completion_tokens=12, temperature=0)
check(r.choices[0].message.content == EXPECTED["image"], f"image reply: {r.choices[0].message.content!r} != {EXPECTED['image']!r}")
check(r.usage.prompt_tokens > u.prompt_tokens, f"image tokens counted: {r.usage}")

# 4b. a video as a video_url part (the client sends content parts as given)
r = client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": [{"type": "video_url", "video_url": {"url": VIDEO_URL}}, {"type": "text", "text": "What happens in this video?"}]}], max_tokens=12, temperature=0)
check(r.choices[0].message.content == EXPECTED["video"], f"video reply: {r.choices[0].message.content!r} != {EXPECTED['video']!r}")

# 5. max_tokens, stop, seed
r = client.chat.completions.create(model="tiny", messages=text_messages(), max_tokens=2, temperature=0)
check(r.choices[0].finish_reason == "length" and r.usage.completion_tokens == 2, f"max_tokens=2: {r}")
text = EXPECTED["text"]
stop = text[3:5]
r = client.chat.completions.create(model="tiny", messages=text_messages(), max_tokens=12, temperature=0, stop=[stop])
check(r.choices[0].message.content == text[: text.find(stop)] and r.choices[0].finish_reason == "stop", f"stop {stop!r}: {r.choices[0]}")
a = client.chat.completions.create(model="tiny", messages=text_messages(), max_tokens=8, temperature=1.0, top_p=0.9, seed=11)
b = client.chat.completions.create(model="tiny", messages=text_messages(), max_tokens=8, temperature=1.0, top_p=0.9, seed=11)
check(a.choices[0].message.content == b.choices[0].message.content, "seeded sampling repeats")

# 6. errors arrive as the client's exceptions, with the OpenAI error fields
def expect_error(kind, code, param, **kw):
    try:
        client.chat.completions.create(model="tiny", **kw)
    except kind as e:
        check(e.code == code and (param is None or e.param == param) and e.message, f"{kind.__name__} {code}: {e.code} {e.param} {e.message}")
        return
    check(False, f"{kind.__name__} {code}: no error raised")


expect_error(openai.BadRequestError, "invalid_value", "temperature", messages=text_messages(), temperature=5)
expect_error(openai.BadRequestError, "invalid_value", "n", messages=text_messages(), n=17)
expect_error(openai.BadRequestError, "invalid_value", "messages", messages=[])
expect_error(openai.BadRequestError, "unsupported_image_url", None, messages=[{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "https://example.com/cat.png"}}]}])
expect_error(openai.BadRequestError, "invalid_base64", None, messages=[{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "data:image/png;base64,@@@"}}]}])
try:
    client.models.retrieve("gpt-4")
    check(False, "unknown model: no error")
except openai.NotFoundError as e:
    check(e.code == "model_not_found", f"unknown model: {e}")


# 7. concurrent requests from the async client, on pooled keep-alive connections
async def concurrent():
    aclient = openai.AsyncOpenAI(base_url=BASE, api_key="unused", max_retries=0, timeout=120)
    jobs = [aclient.chat.completions.create(model="tiny", messages=image_messages() if i % 2 else text_messages(), max_tokens=12, temperature=0) for i in range(8)]
    results = await asyncio.gather(*jobs)
    await aclient.close()
    return [r.choices[0].message.content for r in results]


got = asyncio.run(concurrent())
check(got == [EXPECTED["image"] if i % 2 else EXPECTED["text"] for i in range(8)], f"8 concurrent requests: {got}")
print("all openai client checks passed")
