#!/usr/bin/env bash
# A/B of two qwen3-vl binaries on the device machine, in one call: writes the random 2B
# checkpoint (bf16), GGUF files of it with NEW's `quantize` (f16, q4_k_m), then runs `bench
# --json` of each binary on each weight type, alternating A, B, A, B so drift shows, and prints
# one line per run (prefill / decode tok/s; the JSON is stdout's last line, as older binaries
# printed their tables before it). Usage, from the repository root:
#   tools/device-bench-ab.sh OLD_BINARY NEW_BINARY [OUT_DIR] [bench options...]
# e.g. tools/device-bench-ab.sh /tmp/old/qwen3-vl /tmp/new/qwen3-vl $OUT --prompt-tokens 512
set -euo pipefail
old=$1 new=$2 out=${3:-/tmp/ab}
shift 3 || shift $#
mkdir -p "$out"
work=${AB_WORK:-/tmp/ab-models}
mkdir -p "$work"
[ -f "$work/bf16/model.safetensors" ] || python3 tools/make_random_checkpoint.py --shape 2b --out "$work/bf16" > /dev/null
# quantize exports a tokenizer: the real one of the fixtures
cp -n tests/fixtures/tokenizer/tokenizer.json "$work/bf16/"
for ty in f16 q4_k_m; do
    [ -d "$work/$ty" ] || "$new" quantize "$work/bf16" "$work/$ty" --type "$ty" 2> "$out/quantize-$ty.log" || { cat "$out/quantize-$ty.log"; exit 1; }
done
printf '%-8s %-4s %-5s %12s %12s\n' weights bin round prefill decode
for ty in bf16 f16 q4_k_m; do
    for round in 1 2; do
        for side in A B; do
            bin=$old
            [ "$side" = B ] && bin=$new
            log="$out/bench-$ty-$side-$round"
            "$bin" bench -m "$work/$ty" --device cuda --json "$@" > "$log.json" 2> "$log.err" || { echo "$ty $side: failed, see $log.err"; continue; }
            python3 -c 'import json,sys; j=json.loads(open(sys.argv[1]).read().strip().splitlines()[-1]); print("%-8s %-4s %-5s %12.1f %12.1f" % (sys.argv[2], sys.argv[3], sys.argv[4], j["prefill_tokens_per_s"], j["decode_tokens_per_s"]))' "$log.json" "$ty" "$side" "$round"
        done
    done
done
