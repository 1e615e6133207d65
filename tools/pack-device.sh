#!/usr/bin/env bash
# Session aid: packs the release CLI and the GPU test binaries into .devpack/pack.tar.xz (an
# ignored folder small enough to carry to the device machine). Needs /opt/rust-cuda-env.sh.
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build --release --features cuda
tools/package-gpu-tests.sh .device/gpu-tests > /dev/null
mkdir -p .device/bin .devpack
cp target/release/qwen3-vl .device/bin/ && strip .device/bin/qwen3-vl
tar -cJf .devpack/pack.tar.xz -C .device bin gpu-tests
ls -la .devpack/pack.tar.xz
