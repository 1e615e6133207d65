#!/usr/bin/env python3
"""Writes a request file in the OpenAI Batch format for `qwen3-vl batch` benchmarks: N chat
requests, greedy, each with a prompt of random words (the same shapes as tools/load_test.py) or
a distinct random image of SIDE x SIDE pixels (written as PNG files beside the output, sent by
path: run `batch --allowed-image-dir DIR`) and a question. Standard library only.

  python3 tools/make_batch.py --out text.jsonl --requests 512 --prompt-words 150:170 --max-tokens 128
  python3 tools/make_batch.py --out img.jsonl --requests 256 --image-side 1024 --max-tokens 64
"""
import argparse
import json
import os
import random
import struct
import zlib

WORDS = ("time person year way day thing man world life hand part child eye woman place work week case point "
         "government company number group problem fact river mountain light music garden window paper story").split()


def png(path, side, rng):
    """A random smooth-ish RGB image (blocks of noise), so that every image differs."""
    block = 16
    cells = [[bytes(rng.randrange(256) for _ in range(3)) for _ in range(side // block + 1)] for _ in range(side // block + 1)]
    raw = bytearray()
    for y in range(side):
        raw.append(0)
        row = cells[y // block]
        raw += b"".join(row[x // block] for x in range(side))

    def chunk(kind, data):
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF)

    with open(path, "wb") as f:
        f.write(b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", side, side, 8, 2, 0, 0, 0)) + chunk(b"IDAT", zlib.compress(bytes(raw), 6)) + chunk(b"IEND", b""))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--requests", type=int, default=256)
    ap.add_argument("--prompt-words", default="150:170", help="LO:HI words per text prompt")
    ap.add_argument("--image-side", type=int, default=0, help="a distinct image of this side per request (0: text only)")
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--seed", type=int, default=1)
    a = ap.parse_args()
    rng = random.Random(a.seed)
    lo, hi = (int(x) for x in a.prompt_words.split(":"))
    img_dir = os.path.join(os.path.dirname(os.path.abspath(a.out)), "images")
    os.makedirs(os.path.dirname(os.path.abspath(a.out)), exist_ok=True)
    if a.image_side:
        os.makedirs(img_dir, exist_ok=True)
    with open(a.out, "w") as f:
        for i in range(a.requests):
            if a.image_side:
                p = os.path.join(img_dir, "img%05d.png" % i)
                png(p, a.image_side, rng)
                content = [{"type": "image_url", "image_url": {"url": p}}, {"type": "text", "text": "Describe this image."}]
            else:
                content = " ".join(rng.choice(WORDS) for _ in range(rng.randint(lo, hi)))
            body = {"messages": [{"role": "user", "content": content}], "max_tokens": a.max_tokens, "temperature": 0, "ignore_eos": True}
            f.write(json.dumps({"custom_id": "r%05d" % i, "method": "POST", "url": "/v1/chat/completions", "body": body}) + "\n")


if __name__ == "__main__":
    main()
