#!/bin/sh
# tests/mpi/test_dist_damage.sh — a damaged 2-box bundle under mpirun (issue 26, items 1, 7):
#  - one bit flipped in node 1's shard: every rank checks its own node at load, the run
#    fails, and rank 0's stderr carries rank 1's full message (file and block);
#  - a bit flipped in tokenizer.json: every rank names it;
#  - --no-verify runs the damaged shard to the end;
#  - with --no-verify, a tokenizer.json that does not parse: rank 0 prints the parser's full
#    message (the file and what is wrong), not just "format error".
# Usage: test_dist_damage.sh SPARQ_BIN (SPARQ_TEST_DATA points at tests/data).
set -u
. "$(dirname "$0")/../lib.sh"
MODEL="$D/tiny-qwen3moe"
need_mpi
# --tag-output: every line says which rank wrote it ("[1,0]<stderr>:" is rank 0)
MPIRUN="mpirun --oversubscribe --tag-output -np 2"
P="The SQLite library"
"$SPARQ" pack "$MODEL" "$T/b2" --boxes 2 --ctx 512 --users 2 --block-size 4096 >/dev/null 2>&1 && ok || bad "pack --boxes 2"
$MPIRUN "$SPARQ" run "$T/b2" -p "$P" -n 8 --temp 0 -t 1 >"$T/good" 2>"$T/ge" && ok || bad "the fresh bundle runs: $(cat "$T/ge")"

# a flipped bit in node 1's shard, in its last block
cp -r "$T/b2" "$T/s"
SH="$T/s/node-1/model.safetensors"
sz=$(wc -c <"$SH"); off=$((sz - 100)); blk=$((off / 4096))
flip "$SH" "$off"
$MPIRUN "$SPARQ" run "$T/s" -p "$P" -n 8 --temp 0 -t 1 >"$T/o" 2>"$T/e"; rc=$?
[ $rc -ne 0 ] && ok || bad "2 ranks, damaged node-1 shard: exit 0"
grep '^\[1,0\]<stderr>:' "$T/e" | grep -q "rank 1: .*node-1/model.safetensors: block $blk (bytes [0-9]*\.\.[0-9]*): checksum mismatch" \
  && ok || bad "rank 0 does not print rank 1's full message (block $blk): $(cat "$T/e")"
grep -q '<stdout>:.*[a-z]' "$T/o" && bad "the damaged bundle generated text: $(cat "$T/o")" || ok
$MPIRUN "$SPARQ" run "$T/s" -p "$P" -n 8 --temp 0 -t 1 --no-verify >"$T/o" 2>"$T/e" && ok \
  || bad "2 ranks, --no-verify: $(cat "$T/e")"

# a flipped bit in tokenizer.json: every rank checks the shared files
rm -rf "$T/t"; cp -r "$T/b2" "$T/t"
flip "$T/t/tokenizer.json" 5000
$MPIRUN "$SPARQ" run "$T/t" -p "$P" -n 8 --temp 0 -t 1 >"$T/o" 2>"$T/e"; rc=$?
[ $rc -ne 0 ] && ok || bad "2 ranks, damaged tokenizer.json: exit 0"
grep '^\[1,0\]<stderr>:' "$T/e" | grep -q "ranks 0, 1: .*tokenizer.json: block 1 (bytes 4096\.\.8191): checksum mismatch" \
  && ok || bad "rank 0 does not name tokenizer.json block 1 for both ranks: $(cat "$T/e")"

# --no-verify and a tokenizer.json that does not parse: the parser's message reaches rank 0's stderr
rm -rf "$T/t"; cp -r "$T/b2" "$T/t"
printf '#' | dd of="$T/t/tokenizer.json" bs=1 conv=notrunc 2>/dev/null  # same size: past the size check
$MPIRUN "$SPARQ" run "$T/t" -p "$P" -n 8 --temp 0 -t 1 --no-verify >"$T/o" 2>"$T/e"; rc=$?
[ $rc -ne 0 ] && ok || bad "2 ranks, broken tokenizer.json: exit 0"
grep '^\[1,0\]<stderr>:' "$T/e" | grep -q "rank 0 of 2: format error: .*tokenizer.json: " && ok \
  || bad "rank 0 does not print the tokenizer's message: $(cat "$T/e")"

finish
