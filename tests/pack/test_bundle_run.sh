#!/bin/sh
# tests/pack/test_bundle_run.sh — the runtime loads a bundle from `sparq pack`:
#  - a 1-box bundle of the fixture generates exactly what the model dir does;
#  - it allocates what the plan said: KV bytes equal the plan's, workspace
#    within the plan (sparq run --stats against sparq plan --json);
#  - a truncated shard is refused at load, naming the file;
#  - a bundle packed for 2 boxes is refused in one process with a clear message.
# Usage: test_bundle_run.sh SPARQ_BIN (SPARQ_TEST_DATA points at BUILD/tests/data).
set -u
. "$(dirname "$0")/../lib.sh"
MODEL="$D/tiny-qwen3moe"

"$SPARQ" pack "$MODEL" "$T/b1" --boxes 1 --ctx 512 --users 2 >/dev/null 2>&1 && ok || bad "pack --boxes 1"
P="The SQLite library"
a=$("$SPARQ" run "$MODEL" -p "$P" -n 16 2>/dev/null)
b=$("$SPARQ" run "$T/b1" -p "$P" -n 16 --stats 2>"$T/stats")
[ -n "$a" ] && [ "$a" = "$b" ] && ok || bad "bundle output differs from the model's: '$b' vs '$a'"

"$SPARQ" plan "$MODEL" --boxes 1 --ctx 512 --users 2 --json > "$T/plan.json" 2>/dev/null
kv_plan=$(python3 -c "import json,sys; print(json.load(open(sys.argv[1]))['plan']['nodes'][0]['kv'])" "$T/plan.json")
ws_plan=$(python3 -c "import json,sys; print(json.load(open(sys.argv[1]))['plan']['nodes'][0]['workspace'])" "$T/plan.json")
kv_run=$(sed -n 's/^stats: kv_bytes=//p' "$T/stats")
ws_run=$(sed -n 's/^stats: workspace_bytes=//p' "$T/stats")
[ -n "$kv_run" ] && [ "$kv_run" = "$kv_plan" ] && ok || bad "runtime KV $kv_run bytes, plan says $kv_plan"
[ -n "$ws_run" ] && [ "$ws_run" -le "$ws_plan" ] && ok || bad "runtime workspace $ws_run bytes above the plan's $ws_plan"

cp -r "$T/b1" "$T/trunc"
f="$T/trunc/node-0/model.safetensors"
truncate -s -1 "$f"
"$SPARQ" run "$T/trunc" -p "$P" -n 2 >/dev/null 2>"$T/err"; rc=$?
[ $rc -eq 1 ] && ok || bad "truncated bundle: exit $rc, want 1"
grep -q "node-0/model.safetensors" "$T/err" && ok || bad "truncated bundle: message does not name the file: $(cat "$T/err")"

"$SPARQ" pack "$MODEL" "$T/b2" --boxes 2 --ctx 512 --users 2 >/dev/null 2>&1 && ok || bad "pack --boxes 2"
"$SPARQ" run "$T/b2" -p "$P" -n 2 >/dev/null 2>"$T/err2"; rc=$?
[ $rc -eq 1 ] && ok || bad "2-box bundle in one process: exit $rc, want 1"
grep -q "packed for 2 boxes" "$T/err2" && ok || bad "2-box bundle: unclear message: $(cat "$T/err2")"

finish
