#!/bin/sh
# tools/demo.sh — README command (1): install the Debian packages sparq needs,
# build sparq in build/ with meson, and run the main job on the small model shipped in
# the repo (tests/data/tiny-qwen3moe, a trained 9.2M-parameter Qwen3-MoE; its
# weights are stored packed, and ninja unpacks them into build/tests/data):
#
#   inspect → quantize (EXL3, 3-bit experts, calibrated) → eval (perplexity and
#   KL divergence against the original) → plan → pack (2 boxes) → verify → run
#   (one process on the quantized model, then the 2-box bundle as 2 processes)
#
# Everything it writes goes to build/demo/ (remade on every run). About 6
# minutes on a 2-core machine (6 min 9 s from a fresh clone), ~5 of them the
# quantizer's Viterbi search.
set -eu
cd "$(dirname "$0")/.."
./tools/install-deps.sh
JOBS=${JOBS:-$(nproc)}
[ -f build/build.ninja ] || meson setup build
# Only what the demo runs: sparq and build/tests/data (the test data, unpacked). The rest of
# build/ (tests, benchmarks and, where nvcc is found, the CUDA module for --device cuda, whose
# kernels/cuda/trellis.cu alone takes ~5.5 min to compile on 2 cores) is `ninja -C build`;
# `meson test -C build` builds what the tests it runs need.
ninja -C build -j "$JOBS" cli/sparq tests/data.stamp

SPARQ=build/cli/sparq
MODEL=build/tests/data/tiny-qwen3moe   # tests/data/tiny-qwen3moe, unpacked by ninja
OUT=build/demo
rm -rf "$OUT"
mkdir -p "$OUT"
step() { printf '\n== %s\n' "$*"; }

step "sparq inspect $MODEL"
$SPARQ inspect "$MODEL"

step "sparq quantize $MODEL $OUT/tiny-3bpw --bits 3"
# --scale-search fixed: no search for each linear's global scale; it takes the per-bits value
# that the search finds on exllamav3's golden case (quantize/ldlq.c, ldlq_default_g). On this
# model that is the same quality as searching (KLD 0.0487 vs 0.0490 with `shared` on all of
# eval.txt) for 38 % less CPU time; `shared` was itself a third of the CPU of the default
# `full`, at the same KLD (docs/benchmarks-quantize.md §4.1, §5). On other models keep a search.
$SPARQ quantize "$MODEL" "$OUT/tiny-3bpw" --bits 3 --calib tests/data/text/calib.txt --scale-search fixed \
  --report "$OUT/tiny-3bpw-report.json"

step "sparq eval $OUT/tiny-3bpw --ref $MODEL (held-out text)"
$SPARQ eval "$OUT/tiny-3bpw" --ref "$MODEL" --text tests/data/text/eval.txt --ctx 512 --max-windows 16

step "sparq plan $OUT/tiny-3bpw --boxes 2"
$SPARQ plan "$OUT/tiny-3bpw" --boxes 2 --ctx 4096 --users 2

step "sparq pack $OUT/tiny-3bpw $OUT/bundle --boxes 2"
$SPARQ pack "$OUT/tiny-3bpw" "$OUT/bundle" --boxes 2 --ctx 4096 --users 2

step "sparq verify $OUT/bundle"
$SPARQ verify "$OUT/bundle"

step "sparq run $OUT/tiny-3bpw"
$SPARQ run "$OUT/tiny-3bpw" -p "The SQLite library" -n 48 --temp 0

# The 2-box bundle runs as 2 processes (one per box; here both on this machine).
# Same greedy text as above, token for token.
step "mpirun -np 2 sparq run $OUT/bundle"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
mpirun --oversubscribe -np 2 $SPARQ run "$OUT/bundle" -p "The SQLite library" -n 48 --temp 0

printf '\n(build/ holds only what the demo ran: `ninja -C build` builds the rest, the CUDA module included)\n'
