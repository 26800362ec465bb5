#!/bin/sh
# tests/runtime/test_dsv41_cli.sh — the commands on the DeepSeek V4.1 fixture
# (tests/data/tiny-dsv41): `inspect --check` says what it skips, `run` greedy
# is the same text twice and equals serve's completion, `--parallel` batches
# sequences, `eval` scores and `eval --ref` against itself gives KL 0, a model
# with a contradicting config is refused naming the field.
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

# a config that contradicts the tensors is refused, naming the field
cp -r "$M" "$T/bad"
sed 's/"o_lora_rank": 32/"o_lora_rank": 64/' "$M/config.json" >"$T/bad/config.json"
"$SPARQ" run "$T/bad" -p x -n 1 >/dev/null 2>"$T/be"; [ $? -ne 0 ] && grep -q "wo_a\|wo_b" "$T/be" && ok \
  || bad "o_lora_rank contradicting wo_a is refused: $(cat "$T/be")"

finish
