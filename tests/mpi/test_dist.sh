#!/bin/sh
# tests/mpi/test_dist.sh — the multi-process runtime (runtime/dist/dist.h) on
# localhost, 2 and 3 ranks (mpirun --oversubscribe: more ranks than cores).
#  - greedy text of the fixture bundle packed for 2 and 3 boxes equals the
#    one-process run of the 1-box bundle, token for token;
#  - logits agree bit for bit: `sparq eval --save-ref-f32` files are identical;
#  - --parallel 3 (micro-batched, several sequences in flight) gives the same
#    text on 1 and 3 ranks, and continuation k equals a single run --seed k;
#  - a bundle on the wrong number of ranks is refused, naming both numbers;
#  - killing a rank mid-generation ends every rank, with mpirun naming it;
#  - stopping a rank (SIGSTOP) ends every rank after --timeout, rank 0 naming it;
#  - stopping rank 0 (SIGSTOP) ends every rank after --timeout too, a worker naming
#    rank 0 (its heartbeat stopped);
#  - `sparq serve` on 2 ranks answers with the same greedy text and stops cleanly on SIGINT;
#  - the DeepSeek V4.1 fixture on 2 ranks (Engram rows from each rank's node file)
#    gives the model folder's greedy text.
# Usage: test_dist.sh SPARQ_BIN (SPARQ_TEST_DATA points at BUILD/tests/data).
set -u
. "$(dirname "$0")/../lib.sh"
. "$(dirname "$0")/dist_lib.sh"
MODEL="$D/tiny-qwen3moe"

for b in 1 2 3; do
  "$SPARQ" pack "$MODEL" "$T/b$b" --boxes $b --ctx 1024 --users 4 --chunk 64 >/dev/null 2>&1 && ok || bad "pack --boxes $b"
done
P="The SQLite library"
"$SPARQ" run "$T/b1" -p "$P" -n 48 --temp 0 -t 1 >"$T/o1" 2>"$T/e1" && ok || bad "1 rank: $(cat "$T/e1")"
for b in 2 3; do
  $MPIRUN -np $b "$SPARQ" run "$T/b$b" -p "$P" -n 48 --temp 0 -t 1 >"$T/o$b" 2>"$T/e$b" && ok || bad "$b ranks: $(cat "$T/e$b")"
  [ -s "$T/o1" ] && cmp -s "$T/o1" "$T/o$b" && ok || bad "$b ranks: greedy text differs: '$(cat "$T/o$b")' vs '$(cat "$T/o1")'"
done

# rank 0 allocates the KV cache of its own layers only: the plan's node-0 term
$MPIRUN -np 2 "$SPARQ" run "$T/b2" -p "$P" -n 2 -t 1 --stats >/dev/null 2>"$T/st2" && ok || bad "--stats on 2 ranks"
"$SPARQ" plan "$MODEL" --boxes 2 --ctx 1024 --users 4 --chunk 64 --json >"$T/plan2.json" 2>/dev/null
kv_plan=$(python3 -c "import json,sys; print(json.load(open(sys.argv[1]))['plan']['nodes'][0]['kv'])" "$T/plan2.json")
kv_run=$(sed -n 's/^stats: kv_bytes=//p' "$T/st2")
[ -n "$kv_run" ] && [ "$kv_run" = "$kv_plan" ] && ok || bad "rank 0 KV $kv_run bytes, the plan's node 0 says $kv_plan"
grep -q "^stats: ranks=2$" "$T/st2" && ok || bad "--stats does not say ranks=2"
# CPU ranks have no device link: rank 0's hidden states went to rank 1 in its messages
staged=$(sed -n 's/^stats: hidden_staged_bytes=//p' "$T/st2")
grep -q "^stats: hidden_link_bytes=0$" "$T/st2" && [ "${staged:-0}" -gt 0 ] && ok ||
  bad "--stats on 2 CPU ranks: $(grep hidden_ "$T/st2" | tr '\n' ' ')"

# logits, bit for bit: eval windows of 200 tokens = several 64-row chunks in flight
head -c 6000 "$D/text/eval.txt" > "$T/eval.txt"
"$SPARQ" eval "$T/b1" --text "$T/eval.txt" --ctx 200 -t 1 --save-ref "$T/l1" --save-ref-f32 >/dev/null 2>&1 && ok || bad "eval 1 rank"
for b in 2 3; do
  $MPIRUN -np $b "$SPARQ" eval "$T/b$b" --text "$T/eval.txt" --ctx 200 -t 1 --save-ref "$T/l$b" --save-ref-f32 \
    >/dev/null 2>"$T/ee$b" && ok || bad "eval $b ranks: $(cat "$T/ee$b")"
  [ -s "$T/l1" ] && cmp -s "$T/l1" "$T/l$b" && ok || bad "eval $b ranks: logits differ from one rank"
done

# --ref on rank 0 while the model runs on 2 ranks: the bundle is the same model, so KL is exactly 0
$MPIRUN -np 2 "$SPARQ" eval "$T/b2" --ref "$MODEL" --text "$T/eval.txt" --ctx 200 -t 1 --json >"$T/kl.json" 2>"$T/kle" &&
  ok || bad "eval --ref on 2 ranks: $(cat "$T/kle")"
python3 -c "import json,sys; r=json.load(open(sys.argv[1])); sys.exit(0 if r['kl_mean'] == 0 and r['kl_max'] == 0 and r['top1'] == 1 else 1)" \
  "$T/kl.json" 2>/dev/null && ok || bad "eval --ref on 2 ranks: not identical to the model: $(cat "$T/kl.json")"

# several sequences in flight
"$SPARQ" run "$T/b1" -p "$P" -n 24 --parallel 3 --seed 5 -t 1 >"$T/p1" 2>/dev/null && ok || bad "--parallel 3, 1 rank"
$MPIRUN -np 3 "$SPARQ" run "$T/b3" -p "$P" -n 24 --parallel 3 --seed 5 -t 1 >"$T/p3" 2>"$T/pe3" && ok ||
  bad "--parallel 3, 3 ranks: $(cat "$T/pe3")"
[ -s "$T/p1" ] && cmp -s "$T/p1" "$T/p3" && ok || bad "--parallel 3: 3 ranks differ from 1"
"$SPARQ" run "$T/b1" -p "$P" -n 24 --seed 6 -t 1 2>/dev/null | sed "s/^$P//" >"$T/s6"
sed -n '/^--- continuation 1 (seed 6) ---$/,/^--- continuation 2/p' "$T/p1" | sed '1d;$d' >"$T/c1"
[ -s "$T/c1" ] && cmp -s "$T/c1" "$T/s6" && ok || bad "continuation 1 ('$(cat "$T/c1")') is not the --seed 6 run ('$(cat "$T/s6")')"

# more sequences than ranks: groups of 2 on 2 ranks (the last rank must never block the first)
"$SPARQ" run "$T/b1" -p "$P" -n 24 --parallel 4 --seed 5 -t 1 >"$T/q1" 2>/dev/null && ok || bad "--parallel 4, 1 rank"
$MPIRUN -np 2 "$SPARQ" run "$T/b2" -p "$P" -n 24 --parallel 4 --seed 5 -t 1 --timeout 20 >"$T/q2" 2>"$T/qe2" && ok ||
  bad "--parallel 4, 2 ranks: $(cat "$T/qe2")"
[ -s "$T/q1" ] && cmp -s "$T/q1" "$T/q2" && ok || bad "--parallel 4: 2 ranks differ from 1"

# wrong number of ranks
$MPIRUN -np 3 "$SPARQ" run "$T/b2" -p "$P" -n 4 >/dev/null 2>"$T/w3"; rc=$?
[ $rc -ne 0 ] && ok || bad "2-box bundle on 3 ranks: exit 0"
grep -q "packed for 2 boxes but started on 3 processes" "$T/w3" && ok || bad "2-box bundle on 3 ranks: $(cat "$T/w3")"
"$SPARQ" run "$T/b3" -p "$P" -n 4 >/dev/null 2>"$T/w1"; rc=$?
[ $rc -eq 1 ] && ok || bad "3-box bundle in one process: exit $rc"
grep -q "packed for 3 boxes; run it as 3 processes" "$T/w1" && ok || bad "3-box bundle alone: $(cat "$T/w1")"

# every box must hold the same bundle: rank 1 given a copy whose manifest differs
cp -r "$T/b2" "$T/b2x"
echo >> "$T/b2x/manifest.json"
mpirun --oversubscribe -np 1 "$SPARQ" run "$T/b2" -p "$P" -n 2 : -np 1 "$SPARQ" run "$T/b2x" -p "$P" -n 2 \
  >/dev/null 2>"$T/mx"; rc=$?
[ $rc -ne 0 ] && ok || bad "different bundles on the ranks: exit 0"
grep -q "rank 1: its manifest.json differs from rank 0's" "$T/mx" && ok || bad "different bundles: $(cat "$T/mx")"

# a rank dies mid-generation
SPARQ_DIST_DELAY_MS=20 $MPIRUN -np 3 "$SPARQ" run "$T/b3" -p "$P" -n 900 --ignore-eos --temp 0 -t 1 \
  >"$T/k.out" 2>"$T/k.err" &
mp=$!
started "$T/k.out"
victim=$(rank_pid "$T/b3" 1)
[ -n "$victim" ] && ok || bad "kill: rank 1 not found"
[ -n "$victim" ] && kill -9 "$victim"
wait_for $mp 20; rc=$RC
[ "$rc" != 999 ] && [ "$rc" != 0 ] && ok || bad "kill: mpirun exit '$rc' (999 = still running after 20 s)"
grep -qi "rank 1" "$T/k.err" && ok || bad "kill: no message names rank 1: $(cat "$T/k.err")"
echo "--- kill: what the ranks and mpirun said:"; cat "$T/k.err"
[ -s "$T/k.out" ] && ok || bad "kill: nothing was generated before the kill (not mid-generation)"
none_left "$T/b3" kill

# a rank stalls (SIGSTOP): rank 0's deadline names it, every rank ends
stall stall 3 "$T/b3" 1 2
grep -q "rank 1 does not answer" "$T/stall.err" && ok || bad "stall: rank 0 does not name rank 1: $(cat "$T/stall.err")"
none_left "$T/b3" stall

# rank 0 stalls (SIGSTOP): the workers wait for its next step without a deadline of their own,
# but rank 0's heartbeat stops; every rank ends within --timeout (+ slack), a worker naming rank 0
stall stall0 2 "$T/b2" 0 3
[ "$SECS" -le 15 ] && ok || bad "stall of rank 0: every rank ended only after $SECS s (--timeout 3)"
grep -q "rank 1: .*rank 0 has said nothing for .* rank 0 is stopped, hung or dead" "$T/stall0.err" && ok ||
  bad "stall of rank 0: rank 1 does not name rank 0: $(cat "$T/stall0.err")"
none_left "$T/b2" "stall of rank 0"

# sparq serve on 2 ranks: rank 0 answers over HTTP with the one-process greedy text;
# SIGINT to rank 0 shuts the pipeline down and every rank exits 0
$MPIRUN -np 2 "$SPARQ" serve "$T/b2" --port 0 -t 1 >/dev/null 2>"$T/sv.err" &
mp=$!
port=$(serve_port "$T/sv.err")
[ -n "$port" ] && ok || bad "serve on 2 ranks did not start: $(cat "$T/sv.err")"
python3 - "$port" "$P" >"$T/sv.out" 2>"$T/sv.perr" <<'PY'
import json, sys, urllib.request
body = json.dumps({"prompt": sys.argv[2], "max_tokens": 48, "temperature": 0}).encode()
r = urllib.request.urlopen(urllib.request.Request("http://127.0.0.1:%s/v1/completions" % sys.argv[1], data=body), timeout=60)
print(sys.argv[2] + json.load(r)["choices"][0]["text"])
PY
cmp -s "$T/o1" "$T/sv.out" && ok || bad "serve on 2 ranks: '$(cat "$T/sv.out" "$T/sv.perr")' vs '$(cat "$T/o1")'"
r0=""
for p in $(pgrep -f "sparq serve $T/b2"); do
  tr '\0' '\n' < /proc/$p/environ 2>/dev/null | grep -qx "OMPI_COMM_WORLD_RANK=0" && r0=$p
done
[ -n "$r0" ] && kill -INT "$r0"
wait_for $mp 20; rc=$RC
[ "$rc" = 0 ] && ok || bad "serve on 2 ranks: SIGINT to rank 0: mpirun exit '$rc': $(cat "$T/sv.err")"
grep -q "stopped after 1 requests" "$T/sv.err" && ok || bad "serve on 2 ranks: no stop line: $(cat "$T/sv.err")"
pkill -9 -f "sparq serve $T/b2" 2>/dev/null

# DeepSeek V4.1 on 2 ranks: each rank reads its Engram layer's rows from its own
# node file (layer 1 on rank 0, layer 14 on rank 1); the greedy text is the
# model folder's in one process
V="$D/tiny-dsv41"
"$SPARQ" pack "$V" "$T/v2" --boxes 2 --ctx 512 --users 2 --chunk 64 >/dev/null 2>&1 && ok || bad "pack tiny-dsv41 --boxes 2"
"$SPARQ" run "$V" -p "$P" -n 16 --temp 0 -t 1 --stats >"$T/vo1" 2>"$T/ve1" && ok || bad "tiny-dsv41, 1 process: $(cat "$T/ve1")"
$MPIRUN -np 2 "$SPARQ" run "$T/v2" -p "$P" -n 16 --temp 0 -t 1 --stats >"$T/vo2" 2>"$T/ve2" && ok ||
  bad "tiny-dsv41, 2 ranks: $(cat "$T/ve2")"
[ -s "$T/vo1" ] && cmp -s "$T/vo1" "$T/vo2" && ok || bad "tiny-dsv41, 2 ranks: '$(cat "$T/vo2")' vs '$(cat "$T/vo1")'"
# --stats sums every rank's Engram reads (rank 0 reads layer 1's rows, rank 1 layer 14's) and gives each rank a line
r1=$(sed -n 's/^stats: engram_rows=//p' "$T/ve1")
[ -n "$r1" ] && [ "$r1" -gt 0 ] && grep -q "^stats: engram_rows=$r1$" "$T/ve2" && ok ||
  bad "tiny-dsv41, 2 ranks read as many Engram rows as 1 process ($r1): $(grep engram "$T/ve2")"
grep -q "^stats: rank 0 engram_rows=$((r1 / 2)) " "$T/ve2" && grep -q "^stats: rank 1 engram_rows=$((r1 / 2)) " "$T/ve2" &&
  ok || bad "tiny-dsv41, one line per rank, half the rows each: $(grep engram "$T/ve2")"

finish
