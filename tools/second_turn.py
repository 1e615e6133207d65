#!/usr/bin/env python3
"""Time to the first token of a chat's second turn against the first (cold) one, through
`qwen3-vl serve`: turn 1 sends a long history (about --history tokens of user text), turn 2
sends it again with the assistant's reply and a new question, as OpenAI clients do. Prints
both times, their ratio and the usage's cached_tokens: as the client sees them (to the first
content chunk, on a new connection) and as the server's time-to-first-token histogram records
them (request received to first token).

    python3 tools/second_turn.py --url http://127.0.0.1:8090 --history 2000 [--image photo.png]

With --image the first user message carries the image too (as a data: URL), in both turns.
"""
import argparse
import base64
import json
import random
import sys
import urllib.request

from load_test import one_request


def ask(url, messages, max_tokens):
    """Time to the first content chunk, the reply and the usage of one streamed request."""
    body = {"model": "m", "messages": messages, "max_tokens": max_tokens, "temperature": 0,
            "stream": True, "stream_options": {"include_usage": True}}
    r = one_request(url, body, 600)
    if r.error:
        sys.exit("request failed: %s" % r.error)
    return r.ttft, r.text, r.usage


def server_ttft(url):
    """(sum, count) of the server's time-to-first-token histogram."""
    text = urllib.request.urlopen(url + "/metrics", timeout=30).read().decode()
    v = {}
    for line in text.splitlines():
        for k in ("qwen3vl_time_to_first_token_seconds_sum", "qwen3vl_time_to_first_token_seconds_count"):
            if line.startswith(k + " "):
                v[k] = float(line.split()[1])
    return v["qwen3vl_time_to_first_token_seconds_sum"], v["qwen3vl_time_to_first_token_seconds_count"]


def timed(url, messages, max_tokens):
    s0, c0 = server_ttft(url)
    first, text, usage = ask(url, messages, max_tokens)
    s1, c1 = server_ttft(url)
    return first, (s1 - s0) / max(c1 - c0, 1), text, usage


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--url", default="http://127.0.0.1:8090")
    ap.add_argument("--history", type=int, default=2000, help="words of history (about as many tokens)")
    ap.add_argument("--max-tokens", type=int, default=32)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--image", help="a PNG the first user message carries")
    a = ap.parse_args()
    image = None
    if a.image:
        image = {"type": "image_url", "image_url": {"url": "data:image/png;base64," + base64.b64encode(open(a.image, "rb").read()).decode()}}
    words = ["river", "stone", "garden", "window", "music", "paper", "light", "forest", "number", "winter"]
    for run in range(a.runs):
        rng = random.Random(run)
        history = " ".join(rng.choice(words) for _ in range(a.history))
        text = {"type": "text", "text": "Remember this text: " + history}
        # the image after the history, so a later run's turn 1 (another history) is cold again
        msgs = [{"role": "user", "content": [text, image] if image else [text]}]
        t1, s1, reply, u1 = timed(a.url, msgs, a.max_tokens)
        msgs += [{"role": "assistant", "content": reply}, {"role": "user", "content": "Which word came first?"}]
        t2, s2, _, u2 = timed(a.url, msgs, a.max_tokens)
        print(json.dumps({"run": run, "client_cold_ttft_s": round(t1, 4), "client_second_turn_ttft_s": round(t2, 4), "client_ratio": round(t2 / t1, 3),
                          "server_cold_ttft_s": round(s1, 4), "server_second_turn_ttft_s": round(s2, 4), "server_ratio": round(s2 / s1, 3),
                          "turn1_prompt_tokens": u1["prompt_tokens"], "turn2_prompt_tokens": u2["prompt_tokens"],
                          "turn2_cached_tokens": u2.get("prompt_tokens_details", {}).get("cached_tokens")}))


if __name__ == "__main__":
    main()
