#!/bin/bash
# Beside llama.cpp on one GPU, in one run: the rows of BENCHMARKS.md's side-by-side tables.
#
#   tools/peer_bench.sh --ours BIN --llama DIR --llama-src DIR [--work DIR] [--only LIST] [--side S] [--rounds N]
#
# --ours       our `qwen3-vl` binary (built with --features cuda)
# --llama      llama.cpp's build/bin (llama-bench, llama-batched-bench, llama-server and libs);
#              built with `cmake -DGGML_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=<arch>` from the
#              `vendor/llama.cpp` of the llama-cpp-python sdist
# --llama-src  that llama.cpp source tree (its convert_hf_to_gguf.py and gguf-py)
# --work       scratch (default /tmp/peer-work): the random checkpoint and the GGUF files
# --only       comma-separated sections (default all): decode, long, prefill, batch, serve, images
# --side       ours, llama or both (default): one side's rows only (e.g. ours while llama.cpp
#              still builds in the same session; the weights are made once in --work)
# --rounds     rounds of each server load (default 2)
#
# Weights: one random 2B checkpoint (tools/make_random_checkpoint.py --shape 2b, the tokenizer
# of tests/fixtures). llama.cpp reads the bf16 GGUF its own convert_hf_to_gguf.py writes from it;
# both read the Q8_0 / Q4_K_M files of our `quantize`, and llama-server's images go through the
# mmproj our `quantize --type f16` writes (llama.cpp's layout) when its converter gives none.
# Flash attention on, every layer on the GPU. Each row prints ours first, then llama.cpp's, as
# the tools print them; nothing is parsed or summarised here. Needs python3 with torch,
# transformers and numpy (the converter).
set -u
here=$(cd "$(dirname "$0")/.." && pwd)
OURS="" LL="" LSRC="" W=/tmp/peer-work ONLY=decode,long,prefill,batch,serve,images SIDE=both ROUNDS=2
while [ $# -gt 0 ]; do
    case $1 in
        --ours) OURS=$2; shift 2 ;;
        --llama) LL=$2; shift 2 ;;
        --llama-src) LSRC=$2; shift 2 ;;
        --work) W=$2; shift 2 ;;
        --only) ONLY=$2; shift 2 ;;
        --side) SIDE=$2; shift 2 ;;
        --rounds) ROUNDS=$2; shift 2 ;;
        *) echo "unknown argument $1" >&2; exit 2 ;;
    esac
done
case $SIDE in ours | llama | both) ;; *) echo "--side is ours, llama or both" >&2; exit 2 ;; esac
[ -x "$OURS" ] && { [ $SIDE = ours ] || [ -x "$LL/llama-bench" ]; } && [ -f "$LSRC/convert_hf_to_gguf.py" ] || { echo "usage: $0 --ours BIN --llama DIR --llama-src DIR [--work DIR] [--only LIST] [--side ours|llama|both]" >&2; exit 2; }
export LD_LIBRARY_PATH=$LL${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
on() { case ",$ONLY," in *",$1,"*) return 0 ;; esac; return 1; }
ours() { [ $SIDE != llama ]; }
llama() { [ $SIDE != ours ]; }
say() { echo "== $*"; }
# llama.cpp's tables (stdout); its logs go to $W/llama.err
LB_() { timeout 300 "$LL/llama-bench" "$@" 2>> "$W/llama.err"; }

# 1. the weights
mkdir -p "$W"
if [ ! -f "$W/bf16/model.safetensors" ]; then
    python3 "$here/tools/make_random_checkpoint.py" --shape 2b --out "$W/bf16" > "$W/make.log" 2>&1 || { cat "$W/make.log"; exit 1; }
    cp "$here"/tests/fixtures/tokenizer/tokenizer*.json "$W/bf16/"
fi
[ -s "$W/llama-bf16.gguf" ] || (cd "$LSRC" && PYTHONPATH=$LSRC/gguf-py python3 convert_hf_to_gguf.py "$W/bf16" --outtype bf16 --outfile "$W/llama-bf16.gguf" > "$W/convert.log" 2>&1 || echo "convert failed: $(tail -2 "$W/convert.log")") &
[ -f "$W/convert-mmproj.log" ] || (cd "$LSRC" && PYTHONPATH=$LSRC/gguf-py python3 convert_hf_to_gguf.py "$W/bf16" --mmproj --outtype f16 --outfile "$W/llama-mmproj.gguf" > "$W/convert-mmproj.log" 2>&1 || echo "mmproj convert failed: $(tail -2 "$W/convert-mmproj.log")") &
for t in q8_0 q4_k_m f16; do
    [ -d "$W/$t" ] || "$OURS" quantize -q --type $t "$W/bf16" "$W/$t" > "$W/quantize-$t.log" 2>&1 || echo "quantize $t failed: $(tail -2 "$W/quantize-$t.log")" &
done
wait
gguf() { ls "$W/$1"/*.gguf | grep -v -i mmproj | head -1; }
mmproj() { ls "$W/$1"/*.gguf | grep -i mmproj | head -1; }
Q8=$(gguf q8_0) Q4=$(gguf q4_k_m) LB=$W/llama-bf16.gguf
MM=$W/llama-mmproj.gguf
[ -s "$MM" ] || MM=$(mmproj f16)
say "weights: $(ls -la "$LB" "$Q8" "$Q4" "$MM" 2>&1 | awk '{print $5, $NF}' | tr '\n' ' ')"
B() { timeout 200 "$OURS" bench -m "$@" --device cuda 2>&1 | grep "^| CUDA"; }

# 2. decode at batch 1 after 64 tokens
if on decode; then
    ours && say "decode batch 1 (ours: bench --batch 1 --prompt-tokens 64 --gen-tokens 128 --runs 3)"
    ours && for m in "$W/bf16" "$Q8" "$Q4"; do B "$m" --batch 1 --prompt-tokens 64 --gen-tokens 128 --runs 3; done
    llama && say "decode batch 1 (llama-bench -p 0 -n 128 -d 64 -fa 1 -r 3)"
    llama && LB_ -m "$LB,$Q8,$Q4" -ngl 99 -fa 1 -p 0 -n 128 -d 64 -r 3
fi
# 3. decode after 32,768 tokens
if on long; then
    ours && say "decode after 32768 tokens (ours: --prompt-tokens 32768 --gen-tokens 64 --runs 2)"
    ours && B "$W/bf16" --batch 1 --prompt-tokens 32768 --gen-tokens 64 --runs 2
    llama && say "decode after 32768 tokens (llama-bench -p 0 -n 64 -d 32768 -r 2)"
    llama && LB_ -m "$LB" -ngl 99 -fa 1 -p 0 -n 64 -d 32768 -r 2
fi
# 4. prefill
if on prefill; then
    ours && say "prefill (ours: the session, --prompt-tokens P --gen-tokens 8 --runs 3; 32768 --runs 2)"
    ours && for p in 512 4096; do B "$W/bf16" --prompt-tokens $p --gen-tokens 8 --runs 3; done
    ours && B "$W/bf16" --prompt-tokens 32768 --gen-tokens 8 --runs 2
    llama && say "prefill (llama-bench -p 512,4096 -n 0 -r 3; -p 32768 -r 2)"
    llama && LB_ -m "$LB" -ngl 99 -fa 1 -p 512,4096 -n 0 -r 3
    llama && LB_ -m "$LB" -ngl 99 -fa 1 -p 32768 -n 0 -r 2
fi
# 5. batched decode, 233-token prompts, 128 out
if on batch; then
    ours && say "batch 16 / 64 (ours: bench --batch B --prompt-tokens 233 --gen-tokens 128 --runs 2)"
    ours && for b in 16 64; do B "$W/bf16" --batch $b --prompt-tokens 233 --gen-tokens 128 --runs 2; done
    llama && say "batch 16 / 64 (llama-batched-bench -npp 233 -ntg 128 -npl 16,64; S_TG is its decode tok/s)"
    llama && timeout 300 "$LL/llama-batched-bench" -m "$LB" -ngl 99 -fa on -c 32768 -npp 233 -ntg 128 -npl 16,64 2>&1 | grep -E "^\|" || true
fi
# 6. servers: ours, then llama-server, under tools/load_test.py
up() { # $1 log: waits for a server to answer /health (ours prints "listening on")
    for _ in $(seq 1 120); do
        python3 -c "import urllib.request as u; u.urlopen('http://127.0.0.1:$PORT/health', timeout=2)" > /dev/null 2>&1 && return 0
        grep -q "^listening on http://" "$1" 2>/dev/null && return 0
        sleep 1
    done
    echo "server did not come up: $(tail -3 "$1")"; return 1
}
lt() { timeout 300 python3 "$here/tools/load_test.py" --url "http://127.0.0.1:$PORT" "$@" 2> /dev/null | python3 -c "
import json, sys
d = json.load(sys.stdin)
print({k: d.get(k) for k in ('clients', 'ok', 'failed', 'errors', 'aggregate_tokens_per_s', 'images_per_s', 'latency_p50_s', 'ttft_p50_s', 'prompt_tokens_mean')})" 2>&1; }
PORT=8177
# rounds NAME KIND: the measured loads against the server on $PORT (text: 64 then 16 clients,
# ≈168-token prompts, 128 out; images: 16 clients, a distinct 1024² then 512² image each, 64 out)
rounds() {
    local r x
    for r in $(seq 1 "$ROUNDS"); do
        if [ "$2" = text ]; then
            for x in 64 16; do echo -n "$1 c$x r$r "; lt --clients $x --requests 3 --prompt-words 150:170 --max-tokens 128; done
        else
            for x in 1024 512; do echo -n "$1 ${x}² r$r "; lt --clients 16 --requests 4 --image-side $x --max-tokens 64; done
        fi
    done
}
# served NAME KIND TITLE -- COMMAND...: starts the server, warms it up, runs the rounds, stops it
served() {
    local name=$1 kind=$2 title=$3 log="$W/$1-$2.log" sp
    shift 4
    "$@" > "$log" 2>&1 &
    sp=$!
    if up "$log"; then
        if [ "$kind" = text ]; then
            lt --clients 64 --requests 1 --prompt-words 150:170 --max-tokens 64 > /dev/null
        else
            lt --clients 16 --requests 2 --image-side 1024 --max-tokens 16 > /dev/null
        fi
        say "$title"
        rounds "$name" "$kind"
    fi
    kill $sp
    wait $sp 2> /dev/null
}
OURS_SERVE=("$OURS" serve -m "$W/bf16" --device cuda --max-batch 64 --queue 1024 --max-client-connections 1024 --port $PORT)
if on serve && ours; then
    served ours text "serve text (ours: serve --max-batch 64; load_test --requests 3 --prompt-words 150:170 --max-tokens 128)" -- "${OURS_SERVE[@]}"
fi
if on serve && llama; then
    served llama text "serve text (llama-server -np 64 -c 32768 -fa on)" -- "$LL/llama-server" -m "$LB" -ngl 99 -fa on -np 64 -c 32768 --port $PORT --no-webui
fi
if on images && ours; then
    served ours images "images, 16 clients, a distinct image each, 64 out (ours: serve --max-batch 64; load_test --requests 4 --image-side S)" -- "${OURS_SERVE[@]}"
fi
if on images && llama; then
    served llama images "images (llama-server --mmproj -np 16 -c 65536 -fa on)" -- "$LL/llama-server" -m "$LB" --mmproj "$MM" -ngl 99 -fa on -np 16 -c 65536 --port $PORT --no-webui
fi
