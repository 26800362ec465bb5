#!/bin/sh
# tests/mpi/test_dist_experts.sh — the expert split (`sparq pack --split experts`,
# runtime/dist/dist.h) under mpirun on localhost, 2 and 3 ranks:
#  - greedy text (64 tokens) of the fixture packed for 2 and 3 boxes equals the
#    one-process run of the 1-box pipeline bundle, token for token;
#  - every rank holds the KV cache of every layer: rank 0's equals the plan's node 0 term;
#  - the bundle on the wrong number of ranks is refused, as the pipeline's is;
#  - --device cuda runs (a GPU each) or, without a GPU, fails on every rank saying so;
#  - stopping a rank (SIGSTOP) in the middle of the generation ends every rank after
#    --timeout, rank 0 naming it (its piece of an all-gather did not come);
#  - killing a rank mid-generation ends every rank, with mpirun naming the killed process.
# Usage: test_dist_experts.sh SPARQ_BIN (SPARQ_TEST_DATA points at BUILD/tests/data).
set -u
. "$(dirname "$0")/../lib.sh"
. "$(dirname "$0")/dist_lib.sh"
MODEL="$D/tiny-qwen3moe"

"$SPARQ" pack "$MODEL" "$T/b1" --boxes 1 --ctx 1024 --users 4 --chunk 64 >/dev/null 2>&1 && ok || bad "pack --boxes 1"
for b in 2 3; do
  "$SPARQ" pack "$MODEL" "$T/e$b" --boxes $b --split experts --ctx 1024 --users 4 --chunk 64 >/dev/null 2>&1 && ok ||
    bad "pack --boxes $b --split experts"
done
P="The SQLite library"
"$SPARQ" run "$T/b1" -p "$P" -n 64 --temp 0 -t 1 >"$T/o1" 2>"$T/e1" && ok || bad "1 rank: $(cat "$T/e1")"
for b in 2 3; do
  $MPIRUN -np $b "$SPARQ" run "$T/e$b" -p "$P" -n 64 --temp 0 -t 1 >"$T/o$b" 2>"$T/err$b" && ok ||
    bad "experts, $b ranks: $(cat "$T/err$b")"
  [ -s "$T/o1" ] && cmp -s "$T/o1" "$T/o$b" && ok || bad "experts, $b ranks: greedy text differs: '$(cat "$T/o$b")' vs '$(cat "$T/o1")'"
done

# every rank runs every layer: rank 0's KV cache is every layer's, the plan's node 0 term
$MPIRUN -np 2 "$SPARQ" run "$T/e2" -p "$P" -n 2 -t 1 --stats >/dev/null 2>"$T/st2" && ok || bad "--stats on 2 ranks"
"$SPARQ" plan "$MODEL" --boxes 2 --split experts --ctx 1024 --users 4 --chunk 64 --json >"$T/plan2.json" 2>/dev/null
kv_plan=$(python3 -c "import json,sys; print(json.load(open(sys.argv[1]))['plan']['nodes'][0]['kv'])" "$T/plan2.json")
kv_run=$(sed -n 's/^stats: kv_bytes=//p' "$T/st2")
[ -n "$kv_run" ] && [ "$kv_run" = "$kv_plan" ] && ok || bad "rank 0 KV $kv_run bytes, the plan's node 0 says $kv_plan"

# the wrong number of ranks; a device the split does not run on
$MPIRUN -np 3 "$SPARQ" run "$T/e2" -p "$P" -n 4 >/dev/null 2>"$T/w3"; rc=$?
[ $rc -ne 0 ] && grep -q "packed for 2 boxes but started on 3 processes" "$T/w3" && ok || bad "2-box experts bundle on 3 ranks: $(cat "$T/w3")"
# --device cuda: the split runs on GPU ranks; without a GPU every rank says that is what is missing
$MPIRUN -np 2 "$SPARQ" run "$T/e2" -p "$P" -n 4 --device cuda >/dev/null 2>"$T/cu"; rc=$?
{ [ $rc -eq 0 ] || grep -q "ranks 0, 1: device cuda: no usable CUDA GPU" "$T/cu"; } && ok ||
  bad "--device cuda on the expert split: $(cat "$T/cu")"

# a rank stalls (SIGSTOP) mid-generation: the others' all-gather names it within --timeout
stall estall 3 "$T/e3" 1 2
[ "$SECS" -le 15 ] && ok || bad "stall: every rank ended only after $SECS s (--timeout 2)"
grep -q "rank 0: all-gather of [0-9]* bytes: nothing from rank 1 after .* rank 1 is stopped, hung or dead" "$T/estall.err" &&
  ok || bad "stall: rank 0 does not name rank 1: $(cat "$T/estall.err")"
none_left "$T/e3" stall

# a rank dies mid-generation
SPARQ_DIST_DELAY_MS=20 $MPIRUN -np 3 "$SPARQ" run "$T/e3" -p "$P" -n 900 --ignore-eos --temp 0 -t 1 \
  >"$T/k.out" 2>"$T/k.err" &
mp=$!
started "$T/k.out"
victim=$(rank_pid "$T/e3" 2)
[ -n "$victim" ] && kill -9 "$victim" && ok || bad "kill: rank 2 not found"
wait_for $mp 20
[ "$RC" != 999 ] && [ "$RC" != 0 ] && ok || bad "kill: mpirun exit '$RC' (999 = still running after 20 s)"
grep -q "process rank [0-9]* .* exited on signal 9" "$T/k.err" && ok || bad "kill: mpirun does not name the killed rank: $(cat "$T/k.err")"
[ -s "$T/k.out" ] && ok || bad "kill: nothing was generated before the kill (not mid-generation)"
none_left "$T/e3" kill

finish
