#!/bin/sh
# tests/runtime/test_v41_model_cli.sh — tools/bench/make_v41_model: a q128
# checkpoint made at test time passes `inspect --check` (config against the
# tensors, no NaN) and `run` gives finite logits and varied text; the same seed
# gives the same bytes; `real --sparse` writes the released config byte for
# byte and a ~500 GB checkpoint that costs ~no disk, which `inspect` reads
# without touching the data. Arguments: SPARQ MAKE_V41_MODEL.
. "$(dirname "$0")/../lib.sh"
MK=${2:-build/tools/bench/make_v41_model}
TOK="$D/tiny-dsv41"
[ -f "$TOK/tokenizer.json" ] || skip "$TOK/tokenizer.json not there"

"$MK" "$T/q" --preset q128 --tokenizer "$TOK" --seed 3 >"$T/mk" 2>&1 && ok || bad "make q128: $(cat "$T/mk")"
"$SPARQ" inspect "$T/q" --check >"$T/i" 2>&1 && ok || bad "inspect --check q128: $(cat "$T/i")"
grep -q "verdict *ok" "$T/i" && ok || bad "q128 verdict ok"
grep -q "^layers *16 " "$T/i" && ok || bad "q128 has 16 layers: $(grep ^layers "$T/i")"
grep -q "^engram .*Engram tables" "$T/i" && ok || bad "q128 has Engram tables"
grep -q "I8 .*384 tensors" "$T/i" && ok || bad "q128 experts are I8 (FP4 pairs): $(grep I8 "$T/i")"
"$SPARQ" run "$T/q" -p "The SQLite library" -n 24 --temp 0 >"$T/r" 2>"$T/e" && ok || bad "run q128: $(cat "$T/e")"
# random but sane: the continuation is not one token over and over
python3 - "$T/r" <<'PY' && ok || bad "run q128 text is varied: $(cat "$T/r")"
import sys
t = open(sys.argv[1], encoding="utf-8").read()[len("The SQLite library"):].strip()
sys.exit(0 if len(t) > 10 and len(set(t)) > 8 else 1)
PY
"$SPARQ" eval "$T/q" --text "$D/text/eval.txt" --ctx 64 --max-windows 1 --json >"$T/j" 2>"$T/e" && ok || bad "eval q128: $(cat "$T/e")"
python3 -c "import json,math,sys; p=json.load(open(sys.argv[1]))['ppl']; sys.exit(0 if math.isfinite(p) and p > 1 else 1)" \
  "$T/j" && ok || bad "q128 perplexity finite: $(cat "$T/j")"

"$MK" "$T/q2" --preset q128 --tokenizer "$TOK" --seed 3 >/dev/null 2>&1 && cmp -s "$T/q/model-00001.safetensors" \
  "$T/q2/model-00001.safetensors" && ok || bad "the same seed gives the same bytes"
"$MK" "$T/q3" --preset q128 --seed 4 >/dev/null 2>&1 && ! cmp -s "$T/q/model-00001.safetensors" \
  "$T/q3/model-00001.safetensors" && ok || bad "another seed gives other bytes"

"$MK" "$T/real" --preset real --sparse --tokenizer "$TOK" >"$T/mk" 2>&1 && ok || bad "make real --sparse: $(cat "$T/mk")"
cmp -s "$T/real/config.json" "$D/deepseek-v41/config.json" && ok || bad "real config.json is the released one"
kb=$(du -sk "$T/real" | cut -f1)
[ "$kb" -lt 200000 ] && ok || bad "real --sparse takes little disk: $kb kB"
"$SPARQ" inspect "$T/real" >"$T/i" 2>&1 && ok || bad "inspect real: $(cat "$T/i")"
grep -q "^layers *40 " "$T/i" && ok || bad "real has 40 layers"
grep -q "^experts *384 per MoE layer, 6 active" "$T/i" && ok || bad "real has 384 experts top-6: $(grep ^experts "$T/i")"
grep -q "^bytes *501382775248 " "$T/i" && ok || bad "real tensor bytes: $(grep ^bytes "$T/i")"
grep -q "^engram *196613849600 " "$T/i" && ok || bad "real Engram parameters: $(grep ^engram "$T/i")"

"$MK" "$T/x" --preset nope >/dev/null 2>"$T/e"; [ $? -eq 2 ] && grep -q "unknown preset" "$T/e" && ok \
  || bad "an unknown preset is refused: $(cat "$T/e")"
finish
