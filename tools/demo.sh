#!/bin/sh
# tools/demo.sh — README command (1): install the Debian packages sparq needs,
# build build/ with meson, and run the main job on the small model shipped in
# the repo. Until the quantize/eval/pack/run issues land, the main job is
# `sparq inspect` of tests/data/tiny-qwen3moe (the fixture) or, while that is
# absent, of tests/data/exl3-model/exl3-3.0bpw (exllamav3's 3.0 bpw quant).
# Later issues extend this script toward quantize → eval → pack → verify → run.
set -eu
cd "$(dirname "$0")/.."
./tools/install-deps.sh
JOBS=${JOBS:-$(nproc)}
[ -f build/build.ninja ] || meson setup build
ninja -C build -j "$JOBS"

MODEL=tests/data/exl3-model/exl3-3.0bpw
[ -f tests/data/tiny-qwen3moe/config.json ] && MODEL=tests/data/tiny-qwen3moe
echo
echo "== sparq inspect $MODEL"
build/cli/sparq inspect "$MODEL"
