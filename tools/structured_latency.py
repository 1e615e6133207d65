#!/usr/bin/env python3
"""Time to the first token with and without a JSON schema, against a running `qwen3-vl serve`.

Sends the same chat request alternately free and under `response_format` json_schema (the
schema from --schema), each with max_tokens 1 so a request's time is its time to first token,
and prints the medians. The first constrained request compiles the schema (reported apart);
the rest use the cached grammar. Standard library only.

    python3 tools/structured_latency.py --url http://127.0.0.1:8080 --schema benches/schemas/invoice.json
"""
import argparse
import json
import statistics
import time
import urllib.request


def post(url, body):
    req = urllib.request.Request(url + "/v1/chat/completions", data=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
    t0 = time.perf_counter()
    with urllib.request.urlopen(req, timeout=120) as r:
        reply = json.loads(r.read())
    return time.perf_counter() - t0, reply


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--url", default="http://127.0.0.1:8080")
    ap.add_argument("--schema", required=True)
    ap.add_argument("--runs", type=int, default=30)
    ap.add_argument("--prompt", default="Read this invoice into JSON: ACME GmbH, Hauptstr. 1, Berlin, Germany; 2 x widget at 9.99 EUR, 19% tax; issued 2026-11-27, number A-17.")
    a = ap.parse_args()
    with open(a.schema) as f:
        schema = json.load(f)
    base = {"model": "m", "messages": [{"role": "user", "content": a.prompt}], "max_tokens": 1, "temperature": 0}
    constrained = dict(base, response_format={"type": "json_schema", "json_schema": {"name": "doc", "schema": schema}})
    first, _ = post(a.url, constrained)  # compiles the schema
    post(a.url, base)  # the prompt's blocks into the prefix cache
    free, cons = [], []
    for _ in range(a.runs):
        free.append(post(a.url, base)[0])
        cons.append(post(a.url, constrained)[0])
    mf, mc = statistics.median(free), statistics.median(cons)
    print(json.dumps({"first_constrained_ms": round(first * 1e3, 2), "free_ms": round(mf * 1e3, 2), "constrained_ms": round(mc * 1e3, 2), "difference_ms": round((mc - mf) * 1e3, 2), "runs": a.runs}))


if __name__ == "__main__":
    main()
