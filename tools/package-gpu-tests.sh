#!/usr/bin/env bash
# Builds the test binaries with CUDA support and packs them, stripped, into a folder that can be
# copied to a CUDA machine without Rust (default: .device/gpu-tests). There, from a checkout of
# the repository (the tests read tests/fixtures), run
#   <folder>/run.sh
# which sets QWEN3_VL_EXPECT_GPU=1 (a GPU test then fails instead of skipping when CUDA does
# not come up), QWEN3_VL_ROOT to the current directory and QWEN3_VL_BIN to the packed qwen3-vl
# binary (for the CLI and server tests), and runs every test binary.
# Needs the environment of /opt/rust-cuda-env.sh. PACK_PROFILE=release packs release-built
# test binaries (faster when a release build is already there).
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:-.device/gpu-tests}
rm -rf "$out" && mkdir -p "$out"
profile=()
[ "${PACK_PROFILE:-}" = release ] && profile=(--release)
cargo test --workspace --features cuda "${profile[@]}" --no-run --message-format=json 2>/dev/null |
    python3 -c '
import json, sys
for line in sys.stdin:
    try:
        m = json.loads(line)
    except ValueError:
        continue
    if m.get("reason") == "compiler-artifact" and m.get("executable") and m["profile"]["test"]:
        print(m["target"]["name"] + " " + m["executable"])
    elif m.get("reason") == "compiler-artifact" and m.get("executable") and m["target"]["kind"] == ["bin"]:
        print("bin/" + m["target"]["name"] + " " + m["executable"])
' | while read -r name exe; do
    mkdir -p "$(dirname "$out/$name")"
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
# the CLI and server tests run the qwen3-vl binary packed beside the tests
export QWEN3_VL_BIN=$PWD/bin/qwen3-vl
status=0
for t in *; do
    [ "$t" = run.sh ] || [ -d "$t" ] && continue
    echo "== $t"
    ./"$t" --test-threads=1 "$@" || status=1
done
exit $status
RUN
chmod +x "$out/run.sh"
ls "$out"
