#!/bin/sh
# tools/bench/dist_bench.sh — the multi-process runtime on this machine, both
# splits: packs the fixture for 1, 2 and 3 boxes as a pipeline and with
# --split experts, runs tools/bench/dist_bench.c on 1, 2 and 3 ranks (one
# thread each, like one box each) with 1, 2 and 4 concurrent sequences, then
# prints aggregate tokens/s against the one-rank pipeline run with the same
# number of sequences, all measured in the same invocation.
#   tools/bench/dist_bench.sh [BUILD_DIR] [TOKENS] [SPLITS]
#   (defaults: build, 128, "pipeline experts")
set -eu
B=${1:-build}
T=${2:-128}
SPLITS=${3:-pipeline experts}
MODEL=${MODEL:-build/tests/data/tiny-qwen3moe}
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
W=$(mktemp -d)
trap 'rm -rf "$W"' EXIT
for s in $SPLITS; do
  for r in 1 2 3; do
    "$B/cli/sparq" pack "$MODEL" "$W/$s$r" --boxes $r --split $s --ctx 1024 --users 4 >/dev/null 2>&1
    mpirun --oversubscribe -np $r "$B/tools/bench/dist_bench" "$W/$s$r" --tokens "$T" --users 1,2,4 --reps 5 |
      tee "$W/r$s$r"
  done
done
echo
echo "aggregate tokens/s relative to the 1-rank pipeline (same sequences, same run of this script):"
printf '%-9s %-6s %-8s %-8s %-8s\n' split users "1 rank" "2 ranks" "3 ranks"
base=$(echo "$SPLITS" | awk '{print $1}')
for s in $SPLITS; do
  for u in 1 2 4; do
    a=$(awk -v u=$u '$1=="1" && $2==u {print $3}' "$W/r${base}1")
    printf '%-9s %-6s' $s $u
    for r in 1 2 3; do
      x=$(awk -v u=$u -v r=$r '$1==r && $2==u {print $3}' "$W/r$s$r")
      printf ' %-8s' $(echo "$x $a" | awk '{printf "%.2f", $1/$2}')
    done
    echo
  done
done
