#!/bin/sh
# tests/tokenizer/test_tokenize_cli.sh — `sparq tokenize` end to end: ids of a
# known text, --text back, --special, --info, and the error exits.
# usage: test_tokenize_cli.sh SPARQ_BIN   (SPARQ_TEST_DATA set by meson)
set -u
bin="$1"
d="$SPARQ_TEST_DATA/exl3-model/exl3-3.0bpw"   # its tokenizer files (tokenizer.json, _config, chat_template)
pass=0; fail=0
ok() { pass=$((pass + 1)); }
ko() { fail=$((fail + 1)); echo "FAIL: $*" >&2; }
check() { if [ "$2" = "$3" ]; then ok; else ko "$1: got [$2] want [$3]"; fi; }

# ids from HF tokenizers 0.23.2 for this exact text (see tools/tokenizer/make_golden.py)
got=$(printf "Hello world, it's a test.\n  x" | "$bin" tokenize "$d")
check "encode" "$got" "42 375 341 351 277 994 14 616 1453 316 1624 337 223 717"
back=$(printf '%s' "$got" | "$bin" tokenize "$d" --text)
check "decode" "$back" "$(printf "Hello world, it's a test.\n  x")"
check "special" "$(printf '<|im_end|>' | "$bin" tokenize "$d" --special)" "2"
plain=$(printf '<|im_end|>' | "$bin" tokenize "$d")
[ "$plain" != "2" ] && ok || ko "without --special the text must not become id 2"
check "skip-special" "$(echo 2 42 | "$bin" tokenize "$d" --text --skip-special)" "$(echo 42 | "$bin" tokenize "$d" --text)"
check "file" "$("$bin" tokenize "$d" -f "$SPARQ_TEST_DATA/text/tokenizer-stress.txt" | wc -w | tr -d " ")" "2469"
"$bin" tokenize "$d" --info | grep -q "^chat chatml$" && ok || ko "--info"
# --chat: the template (jinja2's rendering of it is in tests/data/tokenizer/golden/exl3-model.chat.json)
msgs='[{"role": "user", "content": "Hello!"}]'
check "chat render" "$(echo "$msgs" | "$bin" tokenize "$d" --chat --render)" "$(printf '<|im_start|>user\nHello!<|im_end|>\n<|im_start|>assistant\n')"
check "chat ids" "$(echo "$msgs" | "$bin" tokenize "$d" --chat)" \
    "$(printf '<|im_start|>user\nHello!<|im_end|>\n<|im_start|>assistant\n' | "$bin" tokenize "$d" --special)"
check "chat no-gen" "$(echo "$msgs" | "$bin" tokenize "$d" --chat --render --no-generation-prompt)" "$(printf '<|im_start|>user\nHello!<|im_end|>')"
echo '[{"role": "tool", "content": "x"}]' | "$bin" tokenize "$d" --chat 2>/dev/null; check "chat bad role rc" "$?" "1"
echo '{"role": "user"}' | "$bin" tokenize "$d" --chat 2>/dev/null; check "chat not array rc" "$?" "1"
"$bin" tokenize "$d" --render </dev/null 2>/dev/null; check "render without chat rc" "$?" "2"
# errors: invalid UTF-8 -> 1 with the offset; bad ids -> 1; usage -> 2
printf 'ab\377' | "$bin" tokenize "$d" 2>/tmp/sparq-tok-err.$$; rc=$?
check "utf8 rc" "$rc" "1"
grep -q "byte offset 2" /tmp/sparq-tok-err.$$ && ok || ko "utf8 message: $(cat /tmp/sparq-tok-err.$$)"
echo "1 x 2" | "$bin" tokenize "$d" --text 2>/dev/null; check "bad ids rc" "$?" "1"
echo "99999" | "$bin" tokenize "$d" --text 2>/dev/null; check "range rc" "$?" "1"
"$bin" tokenize 2>/dev/null; check "no model rc" "$?" "2"
"$bin" tokenize "$SPARQ_TEST_DATA/no-such" </dev/null 2>/dev/null; check "missing model rc" "$?" "1"
rm -f /tmp/sparq-tok-err.$$
echo "$pass passed, $fail failed"
[ "$fail" -eq 0 ]
