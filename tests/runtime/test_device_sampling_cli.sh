#!/bin/sh
# tests/runtime/test_device_sampling_cli.sh — the split sampling path (issue 21:
# the backend's sample_select op, then the candidates' draw on the host) wired
# through `sparq run`, --parallel and serve's scheduler, on the CPU backend:
# SPARQ_DEVICE_SAMPLING=1 sends every decode step through the op, and the text
# must be the whole-row sampler's (SPARQ_DEVICE_SAMPLING=0) byte for byte.
# tests/gpu/test_device_cli.sh does the same with --device cuda.
. "$(dirname "$0")/../lib.sh"
M="$D/tiny-qwen3moe"
[ -f "$M/config.json" ] || skip "$M/config.json not there yet"

for a in "-n 24 --temp 0" "-n 32 --seed 3" "-n 16 --seed 5 --parallel 12" \
         "-n 32 --seed 9 --top-k 5 --temp 1.2 --repeat-penalty 1.3" "-n 24 --seed 2 --top-k 0 --top-p 0.9"; do
  SPARQ_DEVICE_SAMPLING=1 "$SPARQ" run "$M" -p "The file" $a >"$T/op" 2>"$T/e" &&
  SPARQ_DEVICE_SAMPLING=0 "$SPARQ" run "$M" -p "The file" $a >"$T/host" 2>>"$T/e" &&
  cmp -s "$T/op" "$T/host" && ok || bad "run $a: the split path's text differs from the whole row's: $(cat "$T/e")"
done
# not a test that cannot fail: another seed gives other text
SPARQ_DEVICE_SAMPLING=1 "$SPARQ" run "$M" -p "The file" -n 32 --seed 4 >"$T/op4" 2>/dev/null
SPARQ_DEVICE_SAMPLING=1 "$SPARQ" run "$M" -p "The file" -n 32 --seed 3 >"$T/op3" 2>/dev/null
cmp -s "$T/op3" "$T/op4" && bad "seeds 3 and 4 gave the same text" || ok
finish
