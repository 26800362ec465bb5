#!/bin/sh
# tests/runtime/test_eval_cli.sh — `sparq eval` end to end on the fixture:
# perplexity as JSON, --save-ref / --ref-logits round trip (KL ~ 0, top-1 ~ 1),
# --ref against itself (KL exactly 0), a corrupted reference file is refused,
# usage errors exit 2.
. "$(dirname "$0")/../lib.sh"
M="$D/tiny-qwen3moe"
TXT="$D/text/eval.txt"
[ -f "$M/config.json" ] || skip "$M/config.json not there yet (fixture, issue 3)"

"$SPARQ" eval "$M" --text "$TXT" --ctx 128 --max-windows 3 --json >"$T/j" 2>"$T/e" && ok || bad "eval: $(cat "$T/e")"
ppl=$(num ppl "$T/j"); sc=$(num scored "$T/j")
[ "$sc" = 381 ] && ok || bad "3 windows of 128 score 381 tokens, got '$sc'"
lt 1 "$ppl" && lt "$ppl" 1000 && ok || bad "perplexity '$ppl' plausible"
"$SPARQ" eval "$M" --text "$TXT" --ctx 128 --max-windows 3 >"$T/tab" 2>/dev/null && grep -q "^perplexity" "$T/tab" \
  && ok || bad "table output"

"$SPARQ" eval "$M" --text "$TXT" --ctx 128 --max-windows 3 --save-ref "$T/ref.lp" >/dev/null 2>"$T/e" && ok \
  || bad "--save-ref: $(cat "$T/e")"
[ -s "$T/ref.lp" ] && ok || bad "reference file written"
ls "$T" | grep -q tmp && bad "temporary file left behind" || ok
"$SPARQ" eval "$M" --ref-logits "$T/ref.lp" --json >"$T/k" 2>"$T/e" && ok || bad "--ref-logits: $(cat "$T/e")"
[ "$(num ppl "$T/k")" = "$ppl" ] && ok || bad "same ppl from the file's tokens"
lt "$(num kl_mean "$T/k")" 1e-5 && ok || bad "KL vs own fp16 log-probs ~ 0: $(num kl_mean "$T/k")"
lt 0.98 "$(num top1 "$T/k")" && ok || bad "top-1 vs own log-probs ~ 1"
"$SPARQ" eval "$M" --text "$TXT" --ref-logits "$T/ref.lp" --json >/dev/null 2>&1 && ok || bad "--text with --ref-logits"
"$SPARQ" eval "$M" --text "$TXT" --ctx 128 --max-windows 2 --ref "$M" --json >"$T/r" 2>"$T/e" && ok \
  || bad "--ref: $(cat "$T/e")"
[ "$(num kl_max "$T/r")" = 0 ] && ok || bad "KL of a model against itself is 0: $(num kl_max "$T/r")"
[ "$(num top5 "$T/r")" = 1 ] && ok || bad "top-5 agreement with itself is 1"
[ "$(num top5_overlap "$T/r")" = 1 ] && ok || bad "top-5 overlap with itself is 1"
# against the other fixture (same tokenizer, different model): overlap is partial and above the strict form
"$SPARQ" eval "$M" --text "$TXT" --ctx 128 --max-windows 2 --ref "$D/tiny-qwen3moe-b" --json >"$T/rb" 2>"$T/e" && ok \
  || bad "--ref fixture b: $(cat "$T/e")"
lt "$(num top5 "$T/rb")" "$(num top5_overlap "$T/rb")" && lt "$(num top5_overlap "$T/rb")" 1 && lt 0.2 "$(num top5_overlap "$T/rb")" \
  && ok || bad "top-5 overlap $(num top5_overlap "$T/rb") should lie between the strict $(num top5 "$T/rb") and 1"

# a flipped byte in the compressed rows is caught
cp "$T/ref.lp" "$T/bad.lp"
sz=$(wc -c <"$T/bad.lp"); off=$((sz / 2))
printf '\377' | dd of="$T/bad.lp" bs=1 seek=$off conv=notrunc 2>/dev/null
"$SPARQ" eval "$M" --ref-logits "$T/bad.lp" >/dev/null 2>"$T/e"; [ $? -eq 1 ] && ok || bad "corrupt file exits 1"
grep -qi "checksum\|zstd\|format" "$T/e" && ok || bad "corruption is named: $(cat "$T/e")"
head -c 100 "$T/ref.lp" >"$T/short.lp"
"$SPARQ" eval "$M" --ref-logits "$T/short.lp" >/dev/null 2>&1; [ $? -eq 1 ] && ok || bad "truncated file exits 1"
"$SPARQ" eval "$M" --ref-logits "$T/ref.lp" --ctx 64 >/dev/null 2>&1; [ $? -eq 2 ] && ok || bad "ctx mismatch exits 2"

"$SPARQ" eval "$M" >/dev/null 2>&1; [ $? -eq 2 ] && ok || bad "no --text is a usage error"
"$SPARQ" eval "$M" --text "$TXT" --ref "$M" --ref-logits "$T/ref.lp" >/dev/null 2>&1; [ $? -eq 2 ] && ok \
  || bad "--ref with --ref-logits is a usage error"
"$SPARQ" eval "$M" --text "$T/nonexistent" >/dev/null 2>&1; [ $? -eq 1 ] && ok || bad "missing text exits 1"
finish
