#!/usr/bin/env python3
"""Load generator for `qwen3-vl serve`: C concurrent clients, each sending R streamed OpenAI chat
completions (random prompt lengths, optional images), one after another over one keep-alive
connection (as the OpenAI clients' connection pools do). Reports aggregate
completion tok/s over the wall time, time to first token and request latency (p50 / p90),
images/s when requests carry images, and what failed, as one JSON object on stdout. Standard
library only.

  text:   python3 tools/load_test.py --url http://127.0.0.1:8080 --clients 64 --requests 3 \
              --prompt-words 150:170 --max-tokens 128 [--seed 1]
  images: python3 tools/load_test.py --clients 16 --requests 4 --image-side 1024 --max-tokens 64
              (every request its own random S x S image and "Describe this image.";
              --same-image: each client asks its requests about one image, with other questions)
  one file: --image photo.png sends it with every other request
"""
import argparse
import base64
import http.client
import json
import random
import statistics
import sys
import threading
import time
import urllib.parse
import zlib
from collections import namedtuple

WORDS = ("time person year way day thing man world life hand part child eye woman place work week case point "
         "government company number group problem fact river mountain light music garden window paper story").split()


def pct(v, p):
    if not v:
        return None
    v = sorted(v)
    return v[min(len(v) - 1, int(round(p / 100 * (len(v) - 1))))]


# What one streamed request gave: time to the first content chunk and in all (seconds), the
# usage's completion and prompt tokens, an error (None when it succeeded), the reply's text and
# the whole usage object.
Result = namedtuple("Result", "ttft latency completion prompt error text usage", defaults=(None, None, 0, 0, None, "", None))


def png(side, seed):
    """A side x side RGB PNG of random pixels (noise: the tower's cost depends on the size only)."""
    rng = random.Random(seed)
    raw = b"".join(b"\x00" + rng.randbytes(side * 3) for _ in range(side))

    def chunk(kind, data):
        return len(data).to_bytes(4, "big") + kind + data + zlib.crc32(kind + data).to_bytes(4, "big")
    head = side.to_bytes(4, "big") * 2 + bytes([8, 2, 0, 0, 0])
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", head) + chunk(b"IDAT", zlib.compress(raw, 1)) + chunk(b"IEND", b"")


QUESTIONS = ("Describe this image.", "What colours are in this image?", "What is in the top left corner?",
             "Is there any text in this picture?", "Describe the texture of this image.")


# What a kept-alive connection the server has closed since its last reply raises on the next
# request, before any response comes.
STALE = (http.client.RemoteDisconnected, ConnectionResetError, BrokenPipeError)


def send(conn, body):
    """Sends one request over `conn` and returns the response. A connection that already served
    a request may have been closed by the server without saying so (llama-server closes each
    one after a streamed reply); as the OpenAI clients' pools do, such a request is sent again
    once on a fresh connection. A new connection's failure is the request's."""
    fresh = conn.sock is None
    payload, headers = json.dumps(body), {"Content-Type": "application/json"}
    try:
        conn.request("POST", "/v1/chat/completions", body=payload, headers=headers)
        return conn.getresponse()
    except STALE:
        if fresh:
            raise
        conn.close()
        conn.request("POST", "/v1/chat/completions", body=payload, headers=headers)
        return conn.getresponse()


def one_request(conn, body):
    """Streams one completion over `conn` (a client's keep-alive connection, as the OpenAI
    clients keep theirs; reopened by http.client after the server closes it); returns a Result."""
    t0 = time.monotonic()
    ttft, usage, text = None, None, ""
    ok = False
    try:
        r = send(conn, body)
        if r.status != 200:
            return Result(error="HTTP %d: %s" % (r.status, r.read()[:200]))
        done = False
        for raw in r:
            line = raw.decode("utf-8", "replace").strip()
            if not line.startswith("data:"):
                continue
            data = line[5:].strip()
            if data == "[DONE]":
                done = True
                break
            chunk = json.loads(data)
            if chunk.get("usage"):
                usage = chunk["usage"]
            for c in chunk.get("choices", []):
                piece = c.get("delta", {}).get("content")
                if piece:
                    if ttft is None:
                        ttft = time.monotonic() - t0
                    text += piece
        if not done:
            return Result(error="the stream ended without [DONE]")
        if usage is None:
            return Result(error="no usage in the stream")
        elapsed = time.monotonic() - t0
        r.read()  # the end of the chunked body, so the connection can take the next request
        ok = not r.will_close
        return Result(ttft, elapsed, usage["completion_tokens"], usage["prompt_tokens"], None, text, usage)
    except Exception as e:  # noqa: BLE001 (a load test counts every failure)
        return Result(error=repr(e))
    finally:
        if not ok:
            conn.close()


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--url", default="http://127.0.0.1:8080")
    ap.add_argument("--clients", type=int, default=16)
    ap.add_argument("--requests", type=int, default=4, help="requests per client")
    ap.add_argument("--prompt-words", default="150:170", help="MIN:MAX words per prompt")
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--image", help="an image file to send with every other request")
    ap.add_argument("--image-side", type=int, help="every request its own random SIDE x SIDE image and a short question "
                    "(--prompt-words is then unused)")
    ap.add_argument("--same-image", action="store_true", help="with --image-side: one image per client, a new question each request")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--sampling", choices=("greedy", "shared", "mixed"), default="greedy",
                    help="greedy: temperature 0; shared: temperature 0.8, top-p 0.95, top-k 20 for all, the "
                    "server's seed; mixed: each request its own temperature (0.5-1.0), top-p, top-k and seed")
    ap.add_argument("--timeout", type=float, default=600)
    a = ap.parse_args()
    lo, hi = (int(x) for x in a.prompt_words.split(":"))
    img = None
    if a.image:
        with open(a.image, "rb") as f:
            img = "data:image/png;base64," + base64.b64encode(f.read()).decode()
    if a.image_side:
        # made before the clock starts: one per request, or one per client
        n = a.clients if a.same_image else a.clients * a.requests
        sides = [png(a.image_side, a.seed * 100_003 + i) for i in range(n)]
        urls = ["data:image/png;base64," + base64.b64encode(b).decode() for b in sides]
    results, lock = [], threading.Lock()

    u = urllib.parse.urlparse(a.url)

    def client(ci):
        rng = random.Random(a.seed * 1000 + ci)
        conn = http.client.HTTPConnection(u.hostname, u.port or 80, timeout=a.timeout)
        for ri in range(a.requests):
            text = " ".join(rng.choice(WORDS) for _ in range(rng.randint(lo, hi)))
            content = text
            if img and (ci + ri) % 2 == 1:
                content = [{"type": "image_url", "image_url": {"url": img}}, {"type": "text", "text": text}]
            if a.image_side:
                url = urls[ci] if a.same_image else urls[ci * a.requests + ri]
                question = QUESTIONS[ri % len(QUESTIONS)] if a.same_image else QUESTIONS[0]
                content = [{"type": "image_url", "image_url": {"url": url}}, {"type": "text", "text": question}]
            body = {"model": "m", "messages": [{"role": "user", "content": content}], "max_tokens": a.max_tokens,
                    "temperature": 0, "stream": True, "stream_options": {"include_usage": True}}
            if a.sampling == "shared":
                body.update(temperature=0.8, top_p=0.95, top_k=20)
            elif a.sampling == "mixed":
                body.update(temperature=round(rng.uniform(0.5, 1.0), 2), top_p=rng.choice((0.8, 0.9, 1.0)), top_k=rng.choice((20, 40)), seed=rng.randrange(1 << 31))
            r = one_request(conn, body)
            with lock:
                results.append(r)
        conn.close()

    t0 = time.monotonic()
    threads = [threading.Thread(target=client, args=(i,)) for i in range(a.clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.monotonic() - t0
    ok = [r for r in results if r[4] is None]
    errors = [r[4] for r in results if r[4] is not None]
    tokens = sum(r[2] for r in ok)
    out = {
        "clients": a.clients,
        "requests": len(results),
        "ok": len(ok),
        "failed": len(errors),
        "errors": errors[:5],
        "wall_s": wall,
        "completion_tokens": tokens,
        "prompt_tokens_mean": statistics.mean(r[3] for r in ok) if ok else None,
        "aggregate_tokens_per_s": tokens / wall if wall > 0 else None,
        "images_per_s": len(ok) / wall if a.image_side and wall > 0 else None,
        "ttft_p50_s": pct([r[0] for r in ok if r[0] is not None], 50),
        "ttft_p90_s": pct([r[0] for r in ok if r[0] is not None], 90),
        "latency_p50_s": pct([r[1] for r in ok], 50),
        "latency_p90_s": pct([r[1] for r in ok], 90),
    }
    print(json.dumps(out))
    return 0 if not errors else 1


if __name__ == "__main__":
    sys.exit(main())
