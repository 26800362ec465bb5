#!/bin/sh
# tools/bench/dist_bench.sh — the multi-process pipeline on this machine:
# packs the fixture for 1, 2 and 3 boxes and runs tools/bench/dist_bench.c
# on 1, 2 and 3 ranks (one thread each, like one box each) with 1, 2 and 4
# concurrent sequences, then prints aggregate tokens/s against the one-rank
# run with the same number of sequences, measured in the same invocation.
#   tools/bench/dist_bench.sh [BUILD_DIR] [TOKENS]      (defaults: build, 128)
set -eu
B=${1:-build}
T=${2:-128}
MODEL=${MODEL:-build/tests/data/tiny-qwen3moe}
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
W=$(mktemp -d)
trap 'rm -rf "$W"' EXIT
for r in 1 2 3; do
  "$B/cli/sparq" pack "$MODEL" "$W/b$r" --boxes $r --ctx 1024 --users 4 >/dev/null
done
for r in 1 2 3; do
  mpirun --oversubscribe -np $r "$B/tools/bench/dist_bench" "$W/b$r" --tokens "$T" --users 1,2,4 --reps 5 | tee "$W/r$r"
done
echo
echo "aggregate tokens/s relative to 1 rank (same sequences, same run of this script):"
printf '%-6s %-8s %-8s %-8s\n' users "1 rank" "2 ranks" "3 ranks"
for u in 1 2 4; do
  a=$(awk -v u=$u '$1=="1" && $2==u {print $3}' "$W/r1")
  b=$(awk -v u=$u '$1=="2" && $2==u {print $3}' "$W/r2")
  c=$(awk -v u=$u '$1=="3" && $2==u {print $3}' "$W/r3")
  printf '%-6s %-8s %-8s %-8s\n' $u 1.00 $(echo "$b $a" | awk '{printf "%.2f", $1/$2}') $(echo "$c $a" | awk '{printf "%.2f", $1/$2}')
done
