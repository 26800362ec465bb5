#!/bin/sh
# tests/formats/test_inspect_fixture.sh — `sparq inspect` reports the same
# total parameter count as transformers' model.num_parameters() for the
# fixtures tests/data/tiny-qwen3moe{,-b} (golden/golden.json, written by
# tools/fixtures/make_golden.py). Skipped (exit 77) while no fixture exists.
SPARQ="$1"
DATA="${SPARQ_TEST_DATA:-build/tests/data}"
pass=0; fail=0; seen=0
for fx in tiny-qwen3moe tiny-qwen3moe-b; do
  G="$DATA/$fx/golden/golden.json"
  if [ ! -f "$G" ] || [ ! -f "$DATA/$fx/config.json" ]; then
    echo "note: $fx: no config.json or golden/golden.json yet"
    continue
  fi
  seen=$((seen+1))
  want=$(sed -n 's/.*"num_parameters": *\([0-9]*\).*/\1/p' "$G" | head -1)
  got=$("$SPARQ" inspect "$DATA/$fx" --json | sed -n 's/^  "parameters": \([0-9]*\),/\1/p')
  if [ -n "$want" ] && [ "$got" = "$want" ]; then
    pass=$((pass+1)); echo "ok: $fx has $got parameters, as transformers says"
  else
    fail=$((fail+1)); echo "FAIL: $fx parameters: sparq '$got', transformers '$want'" >&2
  fi
done
if [ $seen -eq 0 ]; then
  echo "SKIP: no fixture with golden/golden.json under $DATA (tiny-qwen3moe is made by another issue)"
  exit 77
fi
echo "$pass passed, $fail failed"
[ $fail -eq 0 ]
