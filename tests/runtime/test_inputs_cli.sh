#!/bin/sh
# tests/runtime/test_inputs_cli.sh — inputs that must be refused, not waited on or quietly
# changed (issue 26, item 7):
#  - a FIFO as model.safetensors, config.json or tokenizer.json: `run` and `inspect` refuse
#    at once, naming the file (an open() for reading would block until a writer came);
#  - `run -c N` / `serve -c N` above the model's max_position_embeddings is refused (sparq
#    has no RoPE scaling: those positions were never trained), as is a -c above the ctx a
#    bundle was packed for; a -c within them is used as given.
. "$(dirname "$0")/../lib.sh"
M="$D/tiny-qwen3moe"
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

# --- -c above what the model or the bundle allows ------------------------------------
"$SPARQ" run "$M" -p "$P" -n 2 -c 8192 >/dev/null 2>"$T/e"; rc=$?
[ $rc -eq 1 ] && ok || bad "run -c 8192 (max_position_embeddings 4096): exit $rc, want 1"
grep -q "ctx 8192 exceeds the model's max_position_embeddings 4096" "$T/e" && ok || bad "run -c 8192: $(cat "$T/e")"
"$SPARQ" run "$M" -p "$P" -n 2 -c 4096 --stats >/dev/null 2>"$T/s4096" && ok || bad "run -c 4096: $(cat "$T/s4096")"
"$SPARQ" run "$M" -p "$P" -n 2 -c 1000 --stats >/dev/null 2>"$T/s1000" && ok || bad "run -c 1000"
k4=$(sed -n 's/^stats: kv_bytes=//p' "$T/s4096"); k1=$(sed -n 's/^stats: kv_bytes=//p' "$T/s1000")
[ -n "$k1" ] && [ $((k1 * 4096)) -eq $((k4 * 1000)) ] && ok || bad "-c sizes the KV cache: $k1 at 1000, $k4 at 4096"
"$SPARQ" serve "$M" --port 0 -c 8192 >/dev/null 2>"$T/e" & sp=$!
i=0; while kill -0 $sp 2>/dev/null && [ $i -lt 300 ]; do sleep 0.1; i=$((i+1)); done
kill $sp 2>/dev/null; wait $sp; rc=$?
[ $rc -eq 1 ] && grep -q "ctx 8192 exceeds the model's max_position_embeddings 4096" "$T/e" && ok \
  || bad "serve -c 8192: exit $rc: $(cat "$T/e")"

"$SPARQ" pack "$M" "$T/b" --boxes 1 --ctx 512 --users 2 >/dev/null 2>&1 && ok || bad "pack"
"$SPARQ" run "$T/b" -p "$P" -n 2 -c 1024 >/dev/null 2>"$T/e"; rc=$?
[ $rc -eq 1 ] && ok || bad "run BUNDLE -c 1024 (packed for 512): exit $rc, want 1"
grep -q "ctx 1024 exceeds the 512 the bundle was packed for" "$T/e" && ok || bad "run BUNDLE -c 1024: $(cat "$T/e")"
"$SPARQ" run "$T/b" -p "$P" -n 2 -c 256 --stats >/dev/null 2>"$T/s256" && ok || bad "run BUNDLE -c 256: $(cat "$T/s256")"
"$SPARQ" run "$T/b" -p "$P" -n 2 --stats >/dev/null 2>"$T/s512" && ok || bad "run BUNDLE"
k2=$(sed -n 's/^stats: kv_bytes=//p' "$T/s256"); k5=$(sed -n 's/^stats: kv_bytes=//p' "$T/s512")
[ -n "$k2" ] && [ $((k2 * 2)) -eq "$k5" ] && ok || bad "BUNDLE -c 256 halves the KV cache: $k2 vs $k5"

finish
