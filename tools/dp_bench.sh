#!/usr/bin/env bash
# Data-parallel scaling of `serve` on a machine with several GPUs: writes the random 2B-shaped
# checkpoint (bf16, kept in $DP_WORK), then for each replica count N (default: 1 2) starts
# `serve --data-parallel N` (one replica per GPU, the first N), warms it up, and drives it with
# tools/load_test.py at 64 clients (streamed, ~160-word prompts, 128 tokens out, greedy) for
# $DP_ROUNDS rounds. Prints one line per run, aggregate completion tok/s and its ratio to the
# first N's best, plus how many requests each replica finished (from its log lines); the JSON
# of every run and the server logs stay in OUT_DIR. Usage, from the repository root:
#   tools/dp_bench.sh BINARY [OUT_DIR] [N ...]
# e.g. tools/dp_bench.sh target/release/qwen3-vl /tmp/dp 1 2 4
# Environment: DP_CLIENTS (64), DP_REQUESTS per client (3), DP_LOADGENS (load generator
# processes the clients are split over: 1; latencies then are the worst process's), DP_ROUNDS (2), DP_MAX_BATCH per
# replica (64), DP_PORT (18180), DP_WORK (/tmp/dp-models), DP_SERVE_ARGS (more serve flags);
# for a smoke run without GPUs: DP_DEVICE=cpu DP_MODEL=tests/fixtures/vision/tiny (CPU
# replicas; add --tokenizer tests/fixtures/tokenizer/tokenizer.json to DP_SERVE_ARGS).
set -euo pipefail
bin=$1 out=${2:-/tmp/dp}
shift 2 || shift $#
counts=("$@")
[ ${#counts[@]} -gt 0 ] || counts=(1 2)
clients=${DP_CLIENTS:-64} requests=${DP_REQUESTS:-3} loadgens=${DP_LOADGENS:-1} rounds=${DP_ROUNDS:-2} batch=${DP_MAX_BATCH:-64}
port=${DP_PORT:-18180} work=${DP_WORK:-/tmp/dp-models} device=${DP_DEVICE:-cuda} model=${DP_MODEL:-}
mkdir -p "$out"
# 1. the weights: random, 2B-shaped, with the real tokenizer of the fixtures
if [ -z "$model" ]; then
    model=$work/bf16
    mkdir -p "$work"
    [ -f "$model/model.safetensors" ] || python3 tools/make_random_checkpoint.py --shape 2b --out "$model" > /dev/null
    cp -n tests/fixtures/tokenizer/tokenizer.json "$model/"
fi
if [ "$device" = cpu ]; then
    gpus=1024
else
    gpus=$(nvidia-smi -L 2> /dev/null | wc -l || true)
fi
echo "model $model on $device (GPUs: $gpus); $clients clients x $requests requests, --max-batch $batch per replica, $rounds rounds"
printf '%-3s %-6s %12s %8s %14s %14s  %s\n' N round tok/s ratio "p50/p90 (s)" "ttft p50 (s)" "requests per replica"
base=""
for n in "${counts[@]}"; do
    if [ "$n" -gt "$gpus" ]; then
        echo "$n: skipped, this machine has $gpus GPUs"
        continue
    fi
    log="$out/serve-dp$n.log"
    # 2. the server: N replicas, the queue and connection limits above the clients
    # shellcheck disable=SC2086
    "$bin" serve -m "$model" --device "$device" --data-parallel "$n" --max-batch "$batch" --queue 1024 \
        --max-client-connections 1024 --port "$port" ${DP_SERVE_ARGS:-} 2> "$log" &
    pid=$!
    for _ in $(seq 600); do
        grep -q '^listening on http://' "$log" && break
        kill -0 "$pid" 2> /dev/null || break
        sleep 1
    done
    if ! grep -q '^listening on http://' "$log"; then
        echo "$n: the server did not start, see $log"
        kill "$pid" 2> /dev/null || true
        wait "$pid" 2> /dev/null || true
        continue
    fi
    url="http://127.0.0.1:$port"
    # 3. warm-up (graphs recorded, pools filled on every replica), then the measured rounds
    python3 tools/load_test.py --url "$url" --clients "$((8 * n))" --requests 2 --prompt-words 150:170 --max-tokens 32 --seed 99 > "$out/warmup-dp$n.json" || true
    before=$(grep -c 'generated tokens' "$log" || true)
    for round in $(seq "$rounds"); do
        json="$out/load-dp$n-$round.json"
        # the clients split over $loadgens generator processes (one Python process tops out
        # near 15k streamed tokens/s), their counts summed over the longest one's wall time
        gens=()
        for g in $(seq "$loadgens"); do
            python3 tools/load_test.py --url "$url" --clients "$((clients / loadgens))" --requests "$requests" --prompt-words 150:170 \
                --max-tokens 128 --seed "$round$g" > "$json.$g" &
            gens+=($!)
        done
        for g in "${gens[@]}"; do wait "$g" || echo "$n round $round: some requests failed, see $json.*"; done
        python3 -c '
import json, sys
js = [json.load(open(p)) for p in sys.argv[2:]]
out = dict(js[0])
out["completion_tokens"] = sum(j["completion_tokens"] for j in js)
out["wall_s"] = max(j["wall_s"] for j in js)
out["aggregate_tokens_per_s"] = out["completion_tokens"] / out["wall_s"]
for k in ("latency_p50_s", "latency_p90_s", "ttft_p50_s"):
    out[k] = max(j[k] for j in js)
json.dump(out, open(sys.argv[1], "w"))
' "$json" $(for g in $(seq "$loadgens"); do echo "$json.$g"; done)
        tps=$(python3 -c 'import json,sys; print("%.1f" % json.load(open(sys.argv[1]))["aggregate_tokens_per_s"])' "$json")
        # the ratio is to the first replica count's best round
        if [ "$n" = "${counts[0]}" ]; then
            base=$(python3 -c 'import sys; print(max(float(x) for x in sys.argv[1:] if x))' "$tps" "$base")
        fi
        per=$(grep 'generated tokens' "$log" | tail -n +"$((before + 1))" | sed -n 's/^info: replica \([0-9]*\): .*/\1/p' | sort -n | uniq -c | awk '{printf "r%s=%s ", $2, $1}')
        [ -n "$per" ] || per="(one replica)"
        before=$(grep -c 'generated tokens' "$log" || true)
        python3 -c '
import json, sys
j = json.load(open(sys.argv[1]))
tps, base = j["aggregate_tokens_per_s"], float(sys.argv[4])
print("%-3s %-6s %12.1f %7.2fx %14s %14s  %s" % (sys.argv[2], sys.argv[3], tps, tps / base,
      "%.2f/%.2f" % (j["latency_p50_s"], j["latency_p90_s"]), "%.3f" % j["ttft_p50_s"], sys.argv[5]))
' "$json" "$n" "$round" "$base" "$per"
    done
    kill -TERM "$pid" 2> /dev/null || true
    wait "$pid" 2> /dev/null || true
done
