#!/bin/sh
# tests/formats/test_inspect_fixture.sh — `sparq inspect` reports the same
# total parameter count as transformers' model.num_parameters() for the
# fixtures tests/data/tiny-qwen3moe{,-b} (golden/golden.json, written by
# tools/fixtures/make_golden.py). Skipped (exit 77) while no fixture exists.
. "$(dirname "$0")/../lib.sh"
seen=0
for fx in tiny-qwen3moe tiny-qwen3moe-b; do
  G="$D/$fx/golden/golden.json"
  if [ ! -f "$G" ] || [ ! -f "$D/$fx/config.json" ]; then
    echo "note: $fx: no config.json or golden/golden.json yet"
    continue
  fi
  seen=$((seen+1))
  want=$(sed -n 's/.*"num_parameters": *\([0-9]*\).*/\1/p' "$G" | head -1)
  got=$("$SPARQ" inspect "$D/$fx" --json | sed -n 's/^  "parameters": \([0-9]*\),/\1/p')
  if [ -n "$want" ] && [ "$got" = "$want" ]; then
    ok; echo "ok: $fx has $got parameters, as transformers says"
  else
    bad "$fx parameters: sparq '$got', transformers '$want'"
  fi
done
if [ $seen -eq 0 ]; then
  skip "no fixture with golden/golden.json under $D (tiny-qwen3moe is made by another issue)"
fi
finish
