#!/bin/sh
# tests/runtime/test_dsv41_cli.sh — the commands on the DeepSeek V4.1 fixture
# (tests/data/tiny-dsv41): `inspect --check` says what it skips, `run` greedy
# is the same text twice and equals serve's completion, `--parallel` batches
# sequences, `eval` scores and `eval --ref` against itself gives KL 0, the
# fixture packed for 1 and 2 boxes runs from its Engram files with the same
# greedy text (damaged and truncated Engram files are named), a model with a
# contradicting config is refused naming the field.
. "$(dirname "$0")/../lib.sh"
M="$D/tiny-dsv41"
TXT="$D/text/eval.txt"
[ -f "$M/config.json" ] || skip "$M/config.json not there"

"$SPARQ" inspect "$M" --check >"$T/i" 2>&1 && ok || bad "inspect --check: $(cat "$T/i")"
grep -q "^architecture *deepseek_v41" "$T/i" && ok || bad "inspect names the architecture"
grep -q "^skipped .*mtp\.\*, vision\.\*" "$T/i" && ok || bad "inspect says MTP and vision are skipped: $(grep skipped "$T/i")"
grep -q "^engram .*Engram tables" "$T/i" && ok || bad "inspect counts the Engram tables"
grep -q "verdict *ok" "$T/i" && ok || bad "inspect --check verdict ok"

"$SPARQ" run "$M" -p "The SQLite library" -n 16 --temp 0 >"$T/r1" 2>"$T/e" && ok || bad "run: $(cat "$T/e")"
"$SPARQ" run "$M" -p "The SQLite library" -n 16 --temp 0 --threads 1 >"$T/r2" 2>/dev/null && ok || bad "run, 1 thread"
cmp -s "$T/r1" "$T/r2" && ok || bad "greedy text depends on the thread count"
[ "$(wc -c <"$T/r1")" -gt 20 ] && ok || bad "run printed text"
"$SPARQ" run "$M" -p "The SQLite library" -n 8 --temp 0.8 --parallel 3 >"$T/par" 2>"$T/e" && ok || bad "run --parallel 3: $(cat "$T/e")"
"$SPARQ" run "$M" -p "x" -n 4 --device cuda >/dev/null 2>"$T/cu"; [ $? -ne 0 ] && grep -q "CPU only\|CUDA" "$T/cu" && ok \
  || bad "--device cuda refused clearly: $(cat "$T/cu")"

"$SPARQ" eval "$M" --text "$TXT" --ctx 128 --max-windows 2 --json >"$T/j" 2>"$T/e" && ok || bad "eval: $(cat "$T/e")"
[ -n "$(num ppl "$T/j")" ] && ok || bad "eval prints a perplexity"
"$SPARQ" eval "$M" --text "$TXT" --ctx 128 --max-windows 2 --ref "$M" --json >"$T/k" 2>"$T/e" && ok || bad "eval --ref: $(cat "$T/e")"
[ "$(num kl_max "$T/k")" = 0 ] && ok || bad "KL against itself is 0: $(num kl_max "$T/k")"

# serve: a greedy completion equals `sparq run`
"$SPARQ" serve "$M" --port 0 --threads 2 --parallel 2 2>"$T/slog" &
PIDS="$PIDS $!"
port=$(serve_port "$T/slog")
[ -n "$port" ] && ok || bad "serve starts: $(cat "$T/slog")"
if [ -n "$port" ]; then
  python3 - "$port" "$T/r1" <<'PY' && ok || bad "serve's greedy completion equals run's"
import http.client, json, sys
c = http.client.HTTPConnection("127.0.0.1", int(sys.argv[1]), timeout=60)
c.request("POST", "/v1/completions", json.dumps({"prompt": "The SQLite library", "max_tokens": 16, "temperature": 0}),
          {"Content-Type": "application/json"})
r = c.getresponse(); body = json.loads(r.read())
want = open(sys.argv[2], encoding="utf-8").read()
got = "The SQLite library" + body["choices"][0]["text"]
sys.exit(0 if r.status == 200 and want.rstrip("\n") == got.rstrip("\n") else (print(repr(want), repr(got)) or 1))
PY
fi

# bundles: the Engram rows come from the node files (docs/engram-format.md); the
# greedy text is the model folder's; --stats reports the reads; damage is named
for b in 1 2; do
  "$SPARQ" pack "$M" "$T/b$b" --boxes $b --ctx 512 --users 2 --chunk 64 >/dev/null 2>"$T/pe" && ok || bad "pack --boxes $b: $(cat "$T/pe")"
  "$SPARQ" verify "$T/b$b" >/dev/null 2>&1 && ok || bad "verify the $b-box bundle"
done
[ -f "$T/b2/engram/engram-node-0.bin" ] && [ -f "$T/b2/engram/engram-node-1.bin" ] && ok || bad "2 boxes: an Engram file per node"
"$SPARQ" run "$T/b1" -p "The SQLite library" -n 16 --temp 0 --stats >"$T/rb" 2>"$T/sb" && ok || bad "run the bundle: $(cat "$T/sb")"
cmp -s "$T/r1" "$T/rb" && ok || bad "bundle greedy text differs: '$(cat "$T/rb")' vs '$(cat "$T/r1")'"
rows=$(sed -n 's/^stats: engram_rows=//p' "$T/sb")
[ "$rows" = 912 ] && ok || bad "--stats engram_rows=$rows, expected 912 (19 positions x 2 layers x 24)"
grep -q "^stats: engram_unique_rows=[0-9]" "$T/sb" && grep -q "^stats: engram_rows_per_s=[0-9]" "$T/sb" &&
  grep -q "^stats: engram_hidden_fraction=[0-9.]" "$T/sb" && ok || bad "--stats Engram lines: $(grep engram "$T/sb")"
# the plan's Engram row cache (the manifest's engram_cache, 2 GiB by default: here every row of the tables): rows
# of the earlier steps are found in it, only the misses are read, and both continuations are the folder's text
"$SPARQ" run "$T/b1" -p "The SQLite library" -n 16 --temp 0 --parallel 2 --stats >"$T/rp" 2>"$T/sp" && ok ||
  bad "run --parallel 2: $(cat "$T/sp")"
python3 - "$T/r1" "$T/rp" <<'PY' && ok || bad "--parallel 2 with the row cache: '$(cat "$T/rp")' vs '$(cat "$T/r1")'"
import sys
want = open(sys.argv[1], encoding="utf-8").read()[len("The SQLite library"):].strip("\n")
got = [p.split("\n", 1)[1].strip("\n") for p in open(sys.argv[2], encoding="utf-8").read().split("--- continuation ")[1:]]
sys.exit(0 if len(got) == 2 and all(g == want for g in got) else 1)
PY
u=$(sed -n 's/^stats: engram_unique_rows=//p' "$T/sp"); h=$(sed -n 's/^stats: engram_cache_hits=//p' "$T/sp")
m=$(sed -n 's/^stats: engram_cache_misses=//p' "$T/sp")
[ -n "$h" ] && [ "$h" -gt 0 ] && [ $((h + m)) = "$u" ] && grep -q "^stats: engram_cache_bytes=[1-9]" "$T/sp" && ok ||
  bad "--stats row cache: hits $h + misses $m = distinct rows $u: $(grep engram "$T/sp")"
cp -r "$T/b1" "$T/flip"
python3 -c "import sys; f=open(sys.argv[1],'r+b'); f.seek(20000); c=f.read(1); f.seek(20000); f.write(bytes([c[0]^0x5A]))" \
  "$T/flip/engram/engram-node-0.bin"
"$SPARQ" verify "$T/flip" >/dev/null 2>"$T/fe"; [ $? -ne 0 ] && grep -q "engram/engram-node-0.bin: block 0" "$T/fe" && ok \
  || bad "verify names the flipped Engram block: $(cat "$T/fe")"
"$SPARQ" run "$T/flip" -p x -n 1 >/dev/null 2>"$T/fr"; [ $? -ne 0 ] && grep -q "engram-node-0.bin" "$T/fr" && ok \
  || bad "run refuses the flipped Engram file, naming it: $(cat "$T/fr")"
cp -r "$T/b1" "$T/trunc"
python3 -c "import os,sys; os.truncate(sys.argv[1], os.path.getsize(sys.argv[1]) - 33)" "$T/trunc/engram/engram-node-0.bin"
"$SPARQ" run "$T/trunc" -p x -n 1 --no-verify >/dev/null 2>"$T/tr"; [ $? -ne 0 ] && grep -q "engram-node-0.bin" "$T/tr" && ok \
  || bad "run --no-verify refuses the truncated Engram file, naming it: $(cat "$T/tr")"
cp -r "$T/b1" "$T/noef"
python3 - "$T/noef/manifest.json" <<'PY'
import json, sys
m = json.load(open(sys.argv[1])); del m["plan"]["nodes"][0]["engram_file"]
open(sys.argv[1], "w").write(json.dumps(m, indent=1) + "\n")
PY
"$SPARQ" verify "$T/noef" >/dev/null 2>"$T/ne"; [ $? -ne 0 ] && grep -q "plan node 0 names no Engram file" "$T/ne" && ok \
  || bad "verify: a node with Engram layers must name its file: $(cat "$T/ne")"
"$SPARQ" run "$T/noef" -p x -n 1 >/dev/null 2>"$T/nr"; [ $? -ne 0 ] && grep -q "names no Engram file" "$T/nr" && ok \
  || bad "run refuses a node without its Engram file: $(cat "$T/nr")"

# a config that contradicts the tensors is refused, naming the field
cp -r "$M" "$T/bad"
sed 's/"o_lora_rank": 32/"o_lora_rank": 64/' "$M/config.json" >"$T/bad/config.json"
"$SPARQ" run "$T/bad" -p x -n 1 >/dev/null 2>"$T/be"; [ $? -ne 0 ] && grep -q "wo_a\|wo_b" "$T/be" && ok \
  || bad "o_lora_rank contradicting wo_a is refused: $(cat "$T/be")"

finish
