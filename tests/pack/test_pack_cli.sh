#!/bin/sh
# tests/pack/test_pack_cli.sh — `sparq plan`, `sparq pack`, `sparq verify` end
# to end on tests/data/exl3-model/exl3-3.0bpw (exllamav3's EXL3 model):
# verdicts and exit codes, a budget one byte too small refused with nothing
# written, kill -9 during pack then --resume giving the identical bundle, a
# flipped byte located by file and block, truncation reported.
. "$(dirname "$0")/../lib.sh"
MODEL="$D/exl3-model/exl3-3.0bpw"
[ -d "$MODEL" ] || skip "$MODEL absent"
SMALL="--ctx 1024 --users 2 --chunk 64"

# --- plan ---------------------------------------------------------------------
out=$("$SPARQ" plan "$MODEL" --boxes 2 $SMALL) && ok || bad "plan exits 0 when it fits"
echo "$out" | grep -q "^verdict: fits" && ok || bad "plan prints a fitting verdict"
echo "$out" | grep -q "^1 .*H " && ok || bad "plan table: last node holds the head"
"$SPARQ" plan "$MODEL" --boxes 2 $SMALL --json > "$T/plan.json" && ok || bad "plan --json exits 0"
grep -q '"fits": true' "$T/plan.json" && ok || bad "plan --json says fits"
# the largest per-node total, for a budget one byte too small
need=$(sed -n 's/^ *"total": \([0-9]*\),*$/\1/p' "$T/plan.json" | sort -n | tail -1)
[ -n "$need" ] && [ "$need" -gt 0 ] && ok || bad "plan --json has node totals ($need)"
EXACT="--reserve-os 0 --display-reserve 0 --unlock-display 0 --gpu-util 1"
out=$("$SPARQ" plan "$MODEL" --boxes 2 $SMALL $EXACT --mem-per-box $((need - 1)))
[ $? -eq 1 ] && ok || bad "plan exits 1 when it does not fit"
echo "$out" | grep -q "over by 0.00 GiB (1 bytes)" && ok || bad "plan says it is 1 byte over: $out"
echo "$out" | grep -q "smallest box count that fits: [34]" && ok || bad "plan suggests a box count"
echo "$out" | grep -q "largest ctx that fits on 2 boxes: 10[0-9][0-9]" && ok || bad "plan suggests a ctx"
"$SPARQ" plan "$MODEL" --boxes 9 >/dev/null 2>&1; [ $? -eq 1 ] && ok || bad "more boxes than layers is an error"
"$SPARQ" plan >/dev/null 2>&1; [ $? -eq 2 ] && ok || bad "plan without MODEL is a usage error"
"$SPARQ" plan "$MODEL" --gpu-util 2 >/dev/null 2>&1; [ $? -eq 2 ] && ok || bad "bad --gpu-util is a usage error"

# --- pack refuses what does not fit -----------------------------------------
"$SPARQ" pack "$MODEL" "$T/short" --boxes 2 $SMALL $EXACT --mem-per-box $((need - 1)) 2> "$T/err"
[ $? -eq 1 ] && ok || bad "pack exits 1 when it does not fit"
grep -q "nothing written" "$T/err" && ok || bad "pack says nothing was written"
[ ! -e "$T/short" ] && [ ! -e "$T/short.partial" ] && ok || bad "nothing written for a refused pack"
"$SPARQ" pack "$MODEL" "$T/exact" --boxes 2 $SMALL $EXACT --mem-per-box "$need" --block-size 64K 2>/dev/null \
  && ok || bad "pack with exactly enough memory succeeds"

# --- pack, verify ---------------------------------------------------------------
"$SPARQ" pack "$MODEL" "$T/a" --boxes 2 $SMALL --block-size 64K 2>/dev/null && ok || bad "pack exits 0"
[ -f "$T/a/manifest.json" ] && [ -f "$T/a/node-0/model.safetensors" ] && [ -f "$T/a/node-1/model.safetensors" ] \
  && [ -f "$T/a/tokenizer.json" ] && [ -f "$T/a/config.json" ] && ok || bad "bundle layout"
[ ! -e "$T/a.partial" ] && ok || bad "no .partial left"
out=$("$SPARQ" verify "$T/a" --threads 2) && ok || bad "verify of a good bundle exits 0"
echo "$out" | grep -q "GB/s): ok" && ok || bad "verify prints GB/s and ok: $out"
"$SPARQ" pack "$MODEL" "$T/a" --boxes 2 $SMALL 2>/dev/null; [ $? -eq 1 ] && ok || bad "pack over an existing OUT exits 1"
# the manifest's whole-file digest is what `xxhsum -H2` prints (when xxhsum is installed)
if command -v xxhsum >/dev/null 2>&1; then
  h=$(xxhsum -H2 "$T/a/node-1/model.safetensors" | cut -d' ' -f1)
  grep -A4 '"path": "node-1/model.safetensors"' "$T/a/manifest.json" | grep -q "\"xxh3_128\": \"$h\"" && ok \
    || bad "manifest digest of node-1 equals xxhsum -H2 ($h)"
fi
"$SPARQ" pack "$MODEL" "$T/x" --block-size 5000 2>/dev/null; [ $? -eq 2 ] && ok || bad "bad --block-size is a usage error"
"$SPARQ" pack "$MODEL" 2>/dev/null; [ $? -eq 2 ] && ok || bad "pack without OUT is a usage error"

# --- kill -9 during pack, then --resume: the same bytes -------------------------
SPARQ_PACK_TEST_SLEEP_MS=3000 "$SPARQ" pack "$MODEL" "$T/b" --boxes 2 $SMALL --block-size 64K 2>/dev/null &
pid=$!
i=0
while [ ! -f "$T/b.partial/node-0/model.safetensors" ] && [ $i -lt 100 ]; do sleep 0.1; i=$((i+1)); done
kill -9 $pid 2>/dev/null; wait $pid 2>/dev/null
[ -f "$T/b.partial/node-0/model.safetensors" ] && [ ! -e "$T/b.partial/node-1/model.safetensors" ] && ok \
  || bad "killed in the middle: node-0 written, node-1 not yet"
[ ! -e "$T/b" ] && ok || bad "an interrupted pack leaves no OUT"
mkdir -p "$T/b.partial/node-1" && echo junk > "$T/b.partial/node-1/model.safetensors.tmp.99999"  # what a kill mid-write leaves
"$SPARQ" pack "$MODEL" "$T/b" --boxes 2 $SMALL --block-size 64K 2>/dev/null; [ $? -eq 1 ] && ok \
  || bad "pack without --resume refuses an existing OUT.partial"
"$SPARQ" pack "$MODEL" "$T/b" --boxes 2 $SMALL --block-size 64K --ctx 2048 --resume 2>/dev/null; [ $? -eq 1 ] && ok \
  || bad "--resume with other options is refused"
"$SPARQ" pack "$MODEL" "$T/b" --boxes 2 $SMALL --block-size 64K --resume 2>/dev/null && ok || bad "--resume exits 0"
diff -r "$T/a" "$T/b" >/dev/null && ok || bad "resumed bundle is byte-identical to an uninterrupted one"
[ ! -e "$T/b.partial" ] && ok || bad "resume leaves no .partial"

# --- damage -------------------------------------------------------------------
f="$T/b/node-1/model.safetensors"
printf '\377' | dd of="$f" bs=1 seek=70000 conv=notrunc 2>/dev/null
out=$("$SPARQ" verify "$T/b" 2>&1); [ $? -eq 1 ] && ok || bad "verify exits 1 on a flipped byte"
echo "$out" | grep -q "node-1/model.safetensors: block 1 (bytes 65536..131071): checksum mismatch" && ok \
  || bad "verify names the file and block: $out"
"$SPARQ" verify "$T/b" --node 0 >/dev/null 2>&1 && ok || bad "verify --node 0 ignores node 1's shard"
truncate -s 5000 "$f"
out=$("$SPARQ" verify "$T/b" --quick 2>&1); [ $? -eq 1 ] && ok || bad "verify --quick exits 1 on a truncated file"
echo "$out" | grep -q "node-1/model.safetensors: 5000 bytes but the manifest says .* (truncated)" && ok \
  || bad "verify names the truncated file: $out"
"$SPARQ" verify "$T/b" --node 7 >/dev/null 2>&1; [ $? -eq 1 ] && ok || bad "verify --node out of range exits 1"
"$SPARQ" verify "$T/nonexistent" >/dev/null 2>&1; [ $? -eq 1 ] && ok || bad "verify of a missing bundle exits 1"

finish
