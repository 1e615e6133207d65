#!/usr/bin/env bash
# Builds the test binaries with CUDA support and packs them, stripped, into a folder that can be
# copied to a CUDA machine without Rust (default: .device/gpu-tests). There, from a checkout of
# the repository (the tests read tests/fixtures), run
#   <folder>/run.sh
# which sets QWEN3_VL_EXPECT_GPU=1 (a GPU test then fails instead of skipping when CUDA does
# not come up) and QWEN3_VL_ROOT to the current directory, and runs every test binary.
# Needs the environment of /opt/rust-cuda-env.sh.
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:-.device/gpu-tests}
rm -rf "$out" && mkdir -p "$out"
cargo test --workspace --features cuda --no-run --message-format=json 2>/dev/null |
    python3 -c '
import json, sys
for line in sys.stdin:
    try:
        m = json.loads(line)
    except ValueError:
        continue
    if m.get("reason") == "compiler-artifact" and m.get("executable") and m["profile"]["test"]:
        print(m["target"]["name"] + " " + m["executable"])
' | while read -r name exe; do
    cp "$exe" "$out/$name"
    strip "$out/$name"
done
cat > "$out/run.sh" <<'RUN'
#!/usr/bin/env bash
# Runs the packed test binaries on this (CUDA) machine. Uses the machine's own libcuda.
set -u
export QWEN3_VL_ROOT=${QWEN3_VL_ROOT:-$PWD}
[ -d "$QWEN3_VL_ROOT/tests/fixtures" ] || { echo "run this from the repository root (tests/fixtures not found)" >&2; exit 2; }
cd "$(dirname "$0")"
export QWEN3_VL_EXPECT_GPU=1
status=0
for t in *; do
    [ "$t" = run.sh ] && continue
    echo "== $t"
    ./"$t" --test-threads=1 "$@" || status=1
done
exit $status
RUN
chmod +x "$out/run.sh"
ls "$out"
