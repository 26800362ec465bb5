#!/bin/sh
# tests/runtime/test_run_cli.sh — `sparq run` end to end on the fixture model:
# streaming output, deterministic seeds, greedy == --temp 0, --stats and the
# peak-RSS inequality (RSS <= weights + KV + 64 MB), chat (one-shot and
# interactive on stdin), usage and runtime errors with their exit codes.
. "$(dirname "$0")/../lib.sh"
M="$D/tiny-qwen3moe"
[ -f "$M/config.json" ] || skip "$M/config.json not there yet (fixture, issue 3)"

"$SPARQ" run "$M" -p "The file" -n 24 --temp 0 >"$T/g1" 2>"$T/e1" && ok || bad "greedy run exits 0: $(cat "$T/e1")"
head -c 8 "$T/g1" | grep -q "^The file" && ok || bad "output starts with the prompt"
[ "$(wc -c <"$T/g1")" -gt 12 ] && ok || bad "something was generated"
grep -q "prompt: .* tok/s); decode: .* tok/s)" "$T/e1" && ok || bad "speeds on stderr"
"$SPARQ" run "$M" -p "The file" -n 24 --temp 0 --threads 1 >"$T/g2" 2>/dev/null && cmp -s "$T/g1" "$T/g2" && ok \
  || bad "greedy output independent of thread count"
"$SPARQ" run "$M" -p "The file" -n 24 --temp 0.9 --seed 7 >"$T/s1" 2>/dev/null &&
"$SPARQ" run "$M" -p "The file" -n 24 --temp 0.9 --seed 7 >"$T/s2" 2>/dev/null && cmp -s "$T/s1" "$T/s2" && ok \
  || bad "same seed, same text"
"$SPARQ" run "$M" -p "The file" -n 24 --temp 1.5 --top-k 0 --top-p 1 --min-p 0 --seed 1 --repeat-penalty 1.1 \
  >/dev/null 2>&1 && ok || bad "all sampler flags accepted"

# --stats: peak RSS within weights + KV + 64 MB
"$SPARQ" run "$M" -p "The file" -n 32 --temp 0 --stats >/dev/null 2>"$T/st" && ok || bad "--stats run"
rss=$(sed -n 's/^stats: peak_rss_bytes=//p' "$T/st"); w=$(sed -n 's/^stats: weights_bytes=//p' "$T/st")
kv=$(sed -n 's/^stats: kv_bytes=//p' "$T/st"); ws=$(sed -n 's/^stats: workspace_bytes=//p' "$T/st")
if [ -n "$rss" ] && [ -n "$w" ] && [ -n "$kv" ] && [ -n "$ws" ]; then
  ok
  lim=$((w + kv + 64 * 1024 * 1024))
  [ "$rss" -le "$lim" ] && ok || bad "peak RSS $rss > weights $w + KV $kv + 64 MB = $lim"
  echo "peak RSS $rss, weights $w, KV $kv, workspace $ws, limit $lim"
else
  bad "--stats lines missing: $(cat "$T/st")"
fi

# chat: one-shot and interactive
"$SPARQ" run "$M" --chat -p "What is a file system?" -n 16 --temp 0 >"$T/c1" 2>"$T/ce" && ok || bad "chat run: $(cat "$T/ce")"
printf 'hello\nand then?\n\n' | "$SPARQ" run "$M" --chat -n 8 --temp 0 >"$T/c2" 2>"$T/ce2" && ok \
  || bad "interactive chat: $(cat "$T/ce2")"
[ "$(grep -c '' "$T/c2")" -ge 2 ] && ok || bad "interactive chat answered two turns"

# greedy text through the whole CLI path (tokenizer, chat template, streaming
# detokenizer) equals transformers' golden continuation (python3 reads the JSON)
if command -v python3 >/dev/null 2>&1; then
  for fx in tiny-qwen3moe tiny-qwen3moe-b; do
    G="$SPARQ_TEST_DATA/$fx/golden/golden.json"
    [ -f "$G" ] || continue
    for i in 0 1 2 3; do
      python3 - "$G" "$i" "$T" <<'PY'
import json, shlex, sys
g = json.load(open(sys.argv[1]))["greedy"][int(sys.argv[2])]
t = sys.argv[3]
out = g["output_text"]
for s in ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]:
    out = out.replace(s, "")  # sparq run does not print special tokens
if g["kind"] == "plain":
    args = ["-p", g["prompt_text"]]
    want = g["prompt_text"] + out + "\n"
else:
    args = ["--chat"]
    for m in g["messages"]:
        args += ["--system" if m["role"] == "system" else "-p", m["content"]]
    want = out + "\n"
open(t + "/args", "w").write(" ".join(shlex.quote(a) for a in args))
open(t + "/want", "w").write(want)
open(t + "/name", "w").write(g["name"])
PY
      name=$(cat "$T/name")
      eval "set -- $(cat "$T/args")"
      "$SPARQ" run "$SPARQ_TEST_DATA/$fx" "$@" -n 64 --temp 0 --ignore-eos >"$T/got" 2>/dev/null
      cmp -s "$T/got" "$T/want" && ok || bad "$fx greedy '$name' differs from transformers: $(diff "$T/got" "$T/want" | head -5)"
    done
  done
fi

# errors
"$SPARQ" run "$M" >/dev/null 2>&1; [ $? -eq 2 ] && ok || bad "no prompt is a usage error (2)"
"$SPARQ" run "$M" -p x --top-p 2 >/dev/null 2>&1; [ $? -eq 2 ] && ok || bad "--top-p 2 is a usage error (2)"
"$SPARQ" run "$M" -p x --temp abc >/dev/null 2>&1; [ $? -eq 2 ] && ok || bad "--temp abc is a usage error (2)"
"$SPARQ" run "$T/none" -p x >/dev/null 2>"$T/ee"; [ $? -eq 1 ] && ok || bad "missing model exits 1"
"$SPARQ" run "$M" -p "The file system of the computer" --ctx 4 >/dev/null 2>"$T/ee"; [ $? -eq 1 ] && ok \
  || bad "prompt longer than --ctx exits 1"
finish
