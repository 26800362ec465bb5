#!/bin/sh
# tests/pack/test_bundle_damage.sh — a damaged bundle never runs (issue 26, item 1):
#  - one bit flipped (XOR 0x40) in the high byte of a norm weight of the shard, in
#    tokenizer.json, generation_config.json or config.json: `run` and `serve` refuse at
#    load, naming the file and the block; `--no-verify` skips the check (and runs the
#    damaged shard);
#  - `sparq verify` also fails on a file the manifest does not list, on a manifest entry
#    removed (the shard, or tokenizer.json), and on a manifest whose model config, layer
#    count or ctx disagree with config.json and the shards — and `run` refuses a bundle
#    whose shard or tokenizer entry was removed (it could not check them), or whose plan
#    covers fewer layers than the model has.
# Usage: test_bundle_damage.sh SPARQ_BIN (SPARQ_TEST_DATA points at tests/data).
set -u
. "$(dirname "$0")/../lib.sh"
MODEL="$D/tiny-qwen3moe"
need python3
P="The file system"

"$SPARQ" pack "$MODEL" "$T/b1" --boxes 1 --ctx 512 --users 2 --block-size 4096 >/dev/null 2>&1 && ok || bad "pack"
"$SPARQ" verify "$T/b1" >/dev/null 2>&1 && ok || bad "the fresh bundle verifies"
"$SPARQ" run "$T/b1" -p "$P" -n 8 --temp 0 >"$T/good" 2>/dev/null && ok || bad "the fresh bundle runs"
# offset of the high byte of element 0 of a bf16 tensor in a safetensors file
tensor_hi() {
  python3 - "$1" "$2" <<'PY'
import json, struct, sys
f, name = sys.argv[1], sys.argv[2]
with open(f, "rb") as h:
    n = struct.unpack("<Q", h.read(8))[0]
    hdr = json.loads(h.read(n))
print(8 + n + hdr[name]["data_offsets"][0] + 1)
PY
}
# offset of a lowercase letter other than 'b' inside a JSON string, past the middle of the
# file (XOR 0x40 makes it punctuation: the file still parses, the text differs)
letter_at() {
  python3 - "$1" <<'PY'
import sys
d = open(sys.argv[1], "rb").read()
i = len(d) // 2
while not (0x61 <= d[i] <= 0x7a and d[i] != 0x62 and d[i-1] != 0x5c and 0x61 <= d[i-1] <= 0x7a): i += 1
print(i)
PY
}

# --- a flipped bit in the shard --------------------------------------------------
cp -r "$T/b1" "$T/s"
SH="$T/s/node-0/model.safetensors"
off=$(tensor_hi "$SH" model.layers.0.input_layernorm.weight)
blk=$((off / 4096))
flip "$SH" "$off"
"$SPARQ" verify "$T/s" >"$T/v" 2>&1; [ $? -eq 1 ] && ok || bad "verify: a flipped shard byte exits 1"
grep -q "node-0/model.safetensors: block $blk " "$T/v" && ok || bad "verify names block $blk: $(cat "$T/v")"
"$SPARQ" run "$T/s" -p "$P" -n 8 --temp 0 >"$T/o" 2>"$T/e"; rc=$?
[ $rc -eq 1 ] && ok || bad "run of a damaged shard: exit $rc, want 1 (stdout: $(cat "$T/o"))"
grep -q "node-0/model.safetensors: block $blk (bytes [0-9]*\.\.[0-9]*): checksum mismatch" "$T/e" && ok \
  || bad "run names the file and block $blk: $(cat "$T/e")"
grep -q -- "--no-verify" "$T/e" && ok || bad "run's message says how to skip the check: $(cat "$T/e")"
[ ! -s "$T/o" ] && ok || bad "run of a damaged shard printed text: $(cat "$T/o")"
# --no-verify loads it; the flipped exponent then makes NaN, which the logits check stops
# (issue 26, item 3): the damage is caught either way, never sampled
"$SPARQ" run "$T/s" -p "$P" -n 8 --temp 0 --no-verify >"$T/o" 2>"$T/e"
grep -q "checksum" "$T/e" && bad "run --no-verify still checked the blocks: $(cat "$T/e")" || ok
grep -q "not finite" "$T/e" && ok || bad "run --no-verify of the damaged shard: want the logits refused: $(cat "$T/e")"

# serve: refuses to start on the damaged bundle; --no-verify starts and answers /health
"$SPARQ" serve "$T/s" --port 0 --threads 1 >/dev/null 2>"$T/se" &
sp=$!; PIDS="$PIDS $sp"
i=0; while kill -0 $sp 2>/dev/null && [ $i -lt 300 ]; do sleep 0.1; i=$((i+1)); done
if kill -0 $sp 2>/dev/null; then bad "serve of a damaged bundle is still running: $(cat "$T/se")"; kill $sp
else wait $sp; rc=$?; [ $rc -eq 1 ] && ok || bad "serve of a damaged bundle: exit $rc, want 1"; fi
grep -q "node-0/model.safetensors: block $blk (bytes" "$T/se" && ok || bad "serve names the block: $(cat "$T/se")"
: >"$T/sl"
"$SPARQ" serve "$T/s" --port 0 --threads 1 --no-verify >/dev/null 2>"$T/sl" &
sp=$!; PIDS="$PIDS $sp"
port=$(serve_port "$T/sl" $sp)
[ -n "$port" ] && python3 -c "import urllib.request,sys; sys.exit(0 if urllib.request.urlopen('http://127.0.0.1:$port/health', timeout=10).status == 200 else 1)" \
  && ok || bad "serve --no-verify does not answer /health: $(cat "$T/sl")"
kill -INT $sp 2>/dev/null; wait $sp 2>/dev/null

# --- a flipped bit in the small files ----------------------------------------------
for f in tokenizer.json generation_config.json config.json; do
  rm -rf "$T/f"; cp -r "$T/b1" "$T/f"
  off=$(letter_at "$T/f/$f")
  flip "$T/f/$f" "$off"
  blk=$((off / 4096))
  "$SPARQ" run "$T/f" -p "$P" -n 8 --temp 0 >"$T/o" 2>"$T/e"; rc=$?
  [ $rc -eq 1 ] && ok || bad "run with a flipped byte in $f: exit $rc, want 1"
  grep -q "$f: block $blk (bytes" "$T/e" && ok || bad "run names $f block $blk: $(cat "$T/e")"
  "$SPARQ" verify "$T/f" >/dev/null 2>&1; [ $? -eq 1 ] && ok || bad "verify: a flipped byte in $f"
done
# the same tokenizer damage with --no-verify: the tokenizer's own parser finds it (a merge
# whose token is no longer in the vocab), and says so
rm -rf "$T/f"; cp -r "$T/b1" "$T/f"
flip "$T/f/tokenizer.json" "$(letter_at "$T/f/tokenizer.json")"
"$SPARQ" run "$T/f" -p "$P" -n 8 --temp 0 --no-verify >/dev/null 2>"$T/e"; rc=$?
[ $rc -eq 1 ] && grep -q "tokenizer.json: model.merges" "$T/e" && ok \
  || bad "run --no-verify with a damaged tokenizer.json: exit $rc: $(cat "$T/e")"

# --- verify: what the checksums alone do not see ----------------------------------
# mani BUNDLE PYTHON: edit BUNDLE/manifest.json with the statement PYTHON on `m`
mani() {
  python3 - "$1/manifest.json" "$2" <<'PY'
import json, sys
p = sys.argv[1]
m = json.load(open(p))
exec(sys.argv[2])
open(p, "w").write(json.dumps(m, indent=1) + "\n")
PY
}
# refused WHAT WANT [run]: `verify` of $T/x exits 1 and says WANT; with "run", `run` too
refused() {
  "$SPARQ" verify "$T/x" >"$T/v" 2>&1; [ $? -eq 1 ] && ok || bad "verify: $1: exit status not 1"
  grep -q "$2" "$T/v" && ok || bad "verify: $1: no '$2' in: $(cat "$T/v")"
  [ "${3:-}" = run ] || return 0
  "$SPARQ" run "$T/x" -p "$P" -n 2 >/dev/null 2>"$T/e"; [ $? -eq 1 ] && ok || bad "run: $1: exit status not 1"
  grep -q "$2" "$T/e" && ok || bad "run: $1: no '$2' in: $(cat "$T/e")"
}
# edited WHAT PYTHON WANT [run]: a copy of the bundle whose manifest PYTHON edits is refused
edited() {
  rm -rf "$T/x"; cp -r "$T/b1" "$T/x"
  mani "$T/x" "$2"
  refused "$1" "$3" "${4:-}"
}
rm -rf "$T/x"; cp -r "$T/b1" "$T/x"
echo "notes" > "$T/x/notes.txt"
refused "an extra file" "notes.txt: not listed in manifest.json"
rm "$T/x/notes.txt"; echo x > "$T/x/node-0/extra.bin"
refused "an extra file in node-0/" "node-0/extra.bin: not listed in manifest.json" run
edited "the shard's entry removed" 'm["files"] = [f for f in m["files"] if f["path"] != "node-0/model.safetensors"]' \
  "node-0/model.safetensors: not listed in manifest.json" run
edited "tokenizer.json's entry removed" 'm["files"] = [f for f in m["files"] if f["path"] != "tokenizer.json"]' \
  "tokenizer.json: not listed in manifest.json" run
edited "model.config edited" 'm["model"]["config"]["num_hidden_layers"] = 2' "model.config differs from config.json"
edited "model.n_layers edited" 'm["model"]["n_layers"] = 3' "model.n_layers 3"
edited "the plan's layers edited" 'm["plan"]["nodes"][0]["n_layers"] = 3; m["plan"]["n_layers"] = 3' "layers \[0, 3)" run
edited "the plan's ctx edited" 'm["plan"]["ctx"] = 4096' "ctx 4096"

finish
