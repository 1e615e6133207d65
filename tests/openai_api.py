"""The rest of what clients send, through the official `openai` Python client against
`qwen3-vl serve` (run by tests/openai_client.rs, `the_rest_of_what_clients_send`): `n`,
unseeded and seeded sampling, logprobs against the `logits` command, `/v1/completions` with
text and token-id prompts, `logit_bias`, `min_tokens`, `ignore_eos`, and unknown fields.

Environment: QWEN3_VL_BASE_URL (http://127.0.0.1:PORT/v1) and QWEN3_VL_FACTS, a JSON object:
  chat_prompt / raw_prompt: the prompts the logits files were made for (the chat one through the
    chat template, the raw one as is), chat_logits / raw_logits: those files (little-endian f32),
  vocab: the tokenizer's ids (the server draws from the first `vocab` logits),
  raw_ids: raw_prompt's token ids, eos: <|im_end|>'s id, token / token_text: an ordinary token.
Exits non-zero, naming the check, when anything differs.
"""

import array
import json
import math
import os
import sys

import openai

BASE = os.environ["QWEN3_VL_BASE_URL"]
FACTS = json.loads(os.environ["QWEN3_VL_FACTS"])
client = openai.OpenAI(base_url=BASE, api_key="unused", max_retries=0, timeout=120)
# logprobs: the engine's paged forward against the `logits` command's session, both f32 on the
# CPU: the same values to rounding
LOGPROB_TOLERANCE = 1e-3


def check(cond, what):
    if not cond:
        print("FAILED:", what, file=sys.stderr)
        sys.exit(1)
    print("ok:", what.split(":")[0])


def user(text):
    return [{"role": "user", "content": text}]


def log_softmax(path):
    vals = array.array("f")
    with open(path, "rb") as f:
        vals.frombytes(f.read())
    if sys.byteorder != "little":
        vals.byteswap()
    vals = vals[: FACTS["vocab"]]
    m = max(vals)
    lse = m + math.log(sum(math.exp(v - m) for v in vals))
    return [v - lse for v in vals]


def chat(**kw):
    return client.chat.completions.create(model="tiny", **kw)


# 1. n: one prefill, n choices; greedy choices agree, sampled ones differ; the usage counts the
# prompt once and every choice's tokens
one = chat(messages=user("Tell me a story."), max_tokens=5, temperature=0, extra_body={"ignore_eos": True})
two = chat(messages=user("Tell me a story."), max_tokens=5, temperature=0, n=2, extra_body={"ignore_eos": True})
check([c.index for c in two.choices] == [0, 1], f"n=2 gives 2 choices: {two.choices}")
check(two.choices[0].message.content == two.choices[1].message.content == one.choices[0].message.content, f"greedy choices agree: {two.choices}")
check(two.usage.prompt_tokens == one.usage.prompt_tokens and two.usage.completion_tokens == 10, f"n=2 usage: prompt once, both completions: {two.usage} vs {one.usage}")
sampled = chat(messages=user("Tell me a story."), max_tokens=8, temperature=2.0, n=2, seed=3)
check(sampled.choices[0].message.content != sampled.choices[1].message.content, f"sampled choices differ: {sampled.choices}")
again = chat(messages=user("Tell me a story."), max_tokens=8, temperature=2.0, n=2, seed=3)
check([c.message.content for c in again.choices] == [c.message.content for c in sampled.choices], "a seed reproduces every choice")
# streamed: chunks by index, reassembled equal to the whole reply
stream = chat(messages=user("Tell me a story."), max_tokens=8, temperature=2.0, n=2, seed=3, stream=True, stream_options={"include_usage": True})
texts, finishes, usage = {}, {}, None
for chunk in stream:
    usage = chunk.usage or usage
    for ch in chunk.choices:
        texts[ch.index] = texts.get(ch.index, "") + (ch.delta.content or "")
        if ch.finish_reason:
            finishes[ch.index] = ch.finish_reason
check([texts.get(0), texts.get(1)] == [c.message.content for c in sampled.choices], f"streamed n=2 by index: {texts}")
check(sorted(finishes) == [0, 1] and usage is not None and usage.completion_tokens == sampled.usage.completion_tokens, f"streamed finishes and usage: {finishes} {usage}")

# 2. unseeded sampling draws a fresh seed per request
unseeded = [chat(messages=user("Tell me a story."), max_tokens=8, temperature=2.0).choices[0].message.content for _ in range(4)]
check(len(set(unseeded)) == 4, f"4 unseeded requests at temperature 2 give 4 texts: {unseeded}")
seeded = [chat(messages=user("Tell me a story."), max_tokens=8, temperature=2.0, seed=99).choices[0].message.content for _ in range(2)]
check(seeded[0] == seeded[1], f"a seed reproduces: {seeded}")

# 3. logprobs: the log-softmax of the logits command's output for the first greedy token
ref = log_softmax(FACTS["chat_logits"])
best = sorted(range(len(ref)), key=lambda i: (-ref[i], i))
r = chat(messages=user(FACTS["chat_prompt"]), max_tokens=3, temperature=0, logprobs=True, top_logprobs=5)
content = r.choices[0].logprobs.content
first = content[0]
check(len(content) == r.usage.completion_tokens or len(content) == r.usage.completion_tokens - 1, f"a logprob per token: {len(content)} for {r.usage.completion_tokens}")
check(abs(first.logprob - ref[best[0]]) < LOGPROB_TOLERANCE, f"first token's logprob {first.logprob} vs the logits command's {ref[best[0]]}")
check(len(first.top_logprobs) == 5 and all(len(c.top_logprobs) == 5 for c in content), f"top_logprobs of the asked length: {[len(c.top_logprobs) for c in content]}")
check(all(a.logprob >= b.logprob for c in content for a, b in zip(c.top_logprobs, c.top_logprobs[1:])), "top_logprobs sorted")
for got, want in zip(first.top_logprobs, best[:5]):
    check(abs(got.logprob - ref[want]) < LOGPROB_TOLERANCE, f"top logprob {got.token!r} {got.logprob} vs {ref[want]}")
check(first.token == first.top_logprobs[0].token, f"greedy token is the top one: {first}")
check("\ufffd" in first.token or bytes(first.bytes).decode("utf-8") == first.token, f"a token's bytes are its text: {first}")
r20 = chat(messages=user(FACTS["chat_prompt"]), max_tokens=1, temperature=0, logprobs=True, top_logprobs=20)
check(len(r20.choices[0].logprobs.content[0].top_logprobs) == 20, "top_logprobs=20")
check(chat(messages=user("Hi"), max_tokens=2, temperature=0).choices[0].logprobs is None, "no logprobs unless asked")
# streamed logprobs come with the text they belong to
stream = chat(messages=user(FACTS["chat_prompt"]), max_tokens=3, temperature=0, logprobs=True, top_logprobs=2, stream=True)
streamed = [lp for chunk in stream for ch in chunk.choices if ch.logprobs and ch.logprobs.content for lp in ch.logprobs.content]
check([s.token for s in streamed] == [c.token for c in content] and abs(streamed[0].logprob - first.logprob) < 1e-6, f"streamed logprobs: {streamed}")

# 4. /v1/completions: a raw text prompt, the same as token ids; its logprobs against the logits
# command run with --raw
raw = log_softmax(FACTS["raw_logits"])
raw_best = sorted(range(len(raw)), key=lambda i: (-raw[i], i))
c = client.completions.create(model="tiny", prompt=FACTS["raw_prompt"], max_tokens=4, temperature=0, logprobs=3)
check(c.object == "text_completion" and c.id.startswith("cmpl-") and c.choices[0].index == 0, f"completion object: {c}")
lp = c.choices[0].logprobs
check(abs(lp.token_logprobs[0] - raw[raw_best[0]]) < LOGPROB_TOLERANCE, f"completions logprob {lp.token_logprobs[0]} vs {raw[raw_best[0]]}")
check(len(lp.tokens) == len(lp.token_logprobs) == len(lp.text_offset) == len(lp.top_logprobs) and lp.text_offset[0] == 0, f"legacy logprobs shape: {lp}")
# (tokens that split a character show U+FFFD: only whole ones add up to the text)
check(any("\ufffd" in t for t in lp.tokens) or "".join(lp.tokens) == c.choices[0].text, f"tokens add up to the text: {lp.tokens} {c.choices[0].text!r}")
by_ids = client.completions.create(model="tiny", prompt=FACTS["raw_ids"], max_tokens=4, temperature=0)
check(by_ids.choices[0].text == c.choices[0].text and by_ids.usage.prompt_tokens == len(FACTS["raw_ids"]), f"token-id prompt: {by_ids.choices[0].text!r} vs {c.choices[0].text!r}")
default = client.completions.create(model="tiny", prompt=FACTS["raw_prompt"], temperature=0, extra_body={"ignore_eos": True})
check(default.usage.completion_tokens == 16 and default.choices[0].finish_reason == "length", f"max_tokens defaults to 16: {default.usage}")
echo = client.completions.create(model="tiny", prompt=FACTS["raw_prompt"], max_tokens=4, temperature=0, echo=True)
check(echo.choices[0].text == FACTS["raw_prompt"] + c.choices[0].text, f"echo: {echo.choices[0].text!r}")
stream = client.completions.create(model="tiny", prompt=FACTS["raw_prompt"], max_tokens=4, temperature=0, n=2, stream=True, stream_options={"include_usage": True})
texts, usage = {}, None
for chunk in stream:
    usage = chunk.usage or usage
    for ch in chunk.choices:
        texts[ch.index] = texts.get(ch.index, "") + ch.text
check(texts == {0: c.choices[0].text, 1: c.choices[0].text} and usage.prompt_tokens == c.usage.prompt_tokens, f"streamed completions: {texts} {usage}")

# 5. logit_bias, min_tokens, ignore_eos
tok = str(FACTS["token"])
r = chat(messages=user("Hi"), max_tokens=3, temperature=0, logit_bias={tok: 100})
check(r.choices[0].message.content == FACTS["token_text"] * 3, f"logit_bias +100 forces token {tok}: {r.choices[0].message.content!r}")
eos = str(FACTS["eos"])
r = chat(messages=user("Hi"), max_tokens=8, temperature=0, logit_bias={eos: 100})
check(r.choices[0].finish_reason == "stop" and r.usage.completion_tokens == 1, f"a forced end of turn stops at once: {r.usage}")
r = chat(messages=user("Hi"), max_tokens=8, temperature=0, logit_bias={eos: 100}, extra_body={"min_tokens": 3})
check(r.choices[0].finish_reason == "stop" and r.usage.completion_tokens == 4, f"min_tokens=3 holds the end back: {r.usage}")
r = chat(messages=user("Hi"), max_tokens=5, temperature=0, logit_bias={eos: 100}, extra_body={"ignore_eos": True})
check(r.choices[0].finish_reason == "length" and r.usage.completion_tokens == 5, f"ignore_eos: {r.usage}")


# 6. what is not implemented is a 400 naming it
def expect_400(param, code, create=None, **kw):
    try:
        (create or client.chat.completions.create)(model="tiny", **kw)
    except openai.BadRequestError as e:
        check(e.param == param and (code is None or e.code == code), f"400 naming {param}: {e.code} {e.param} {e.message}")
        return
    check(False, f"400 naming {param}: no error raised")


expect_400("frobnicate", "unknown_parameter", messages=user("Hi"), extra_body={"frobnicate": 1})
expect_400("min_p", "unsupported_parameter", messages=user("Hi"), extra_body={"min_p": 0.1})
expect_400("logit_bias.999999999", "invalid_value", messages=user("Hi"), logit_bias={"999999999": 5})
expect_400("logit_bias.5", "invalid_value", messages=user("Hi"), logit_bias={"5": 101})
expect_400("n", "invalid_value", messages=user("Hi"), n=17)
expect_400("top_logprobs", "invalid_value", messages=user("Hi"), logprobs=True, top_logprobs=21)
expect_400("suffix", "unsupported_parameter", create=client.completions.create, prompt="Hi", suffix="there")
expect_400("best_of", "unsupported_value", create=client.completions.create, prompt="Hi", best_of=2)
expect_400("echo", "unsupported_value", create=client.completions.create, prompt="Hi", echo=True, logprobs=1)
expect_400("prompt", "unsupported_value", create=client.completions.create, prompt=["a", "b"])
print("all openai api checks passed")
