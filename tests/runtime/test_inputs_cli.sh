#!/bin/sh
# tests/runtime/test_inputs_cli.sh — inputs that must be refused, not waited on or quietly
# changed (issue 26, item 7):
#  - a FIFO as model.safetensors, config.json or tokenizer.json: `run` and `inspect` refuse
#    at once, naming the file (an open() for reading would block until a writer came).
SPARQ="${SPARQ_BIN:?}"
M="${SPARQ_TEST_DATA:?}/tiny-qwen3moe"
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT
pass=0; fail=0
ok() { pass=$((pass+1)); }
bad() { fail=$((fail+1)); echo "FAIL: $*" >&2; }
P="The file system"

# --- non-regular files -------------------------------------------------------------
for f in model.safetensors config.json tokenizer.json; do
  rm -rf "$T/d"; mkdir "$T/d"
  for g in model.safetensors config.json tokenizer.json; do [ "$g" = "$f" ] || ln -s "$(cd "$M" && pwd)/$g" "$T/d/$g"; done
  mkfifo "$T/d/$f"
  timeout 20 "$SPARQ" run "$T/d" -p "$P" -n 1 >/dev/null 2>"$T/e"; rc=$?
  [ $rc -eq 1 ] && ok || bad "run with a FIFO as $f: exit $rc (124: it blocked), want 1"
  grep -q "$f: not a regular file (a FIFO)" "$T/e" && ok || bad "run with a FIFO as $f: $(cat "$T/e")"
done
rm -rf "$T/d"; mkdir "$T/d"; cp "$M/config.json" "$T/d/"; mkfifo "$T/d/model.safetensors"
timeout 20 "$SPARQ" inspect "$T/d/model.safetensors" >/dev/null 2>"$T/e"; rc=$?
[ $rc -eq 1 ] && ok || bad "inspect FIFO: exit $rc (124: it blocked), want 1"
grep -q "not a regular file (a FIFO)" "$T/e" && ok || bad "inspect FIFO: $(cat "$T/e")"
timeout 20 "$SPARQ" inspect "$T/d" >/dev/null 2>"$T/e"; rc=$?
[ $rc -eq 1 ] && ok || bad "inspect of a folder with a FIFO: exit $rc (124: it blocked), want 1"
timeout 20 "$SPARQ" run /dev/zero -p "$P" -n 1 >/dev/null 2>"$T/e"; rc=$?
[ $rc -eq 1 ] && ok || bad "run /dev/zero: exit $rc, want 1"

echo "$pass passed, $fail failed"
[ $fail -eq 0 ]
