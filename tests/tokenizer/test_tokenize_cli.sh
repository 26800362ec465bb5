#!/bin/sh
# tests/tokenizer/test_tokenize_cli.sh — `sparq tokenize` end to end: ids of a
# known text, --text back, --special, --info, and the error exits.
# usage: test_tokenize_cli.sh SPARQ_BIN   (SPARQ_TEST_DATA set by meson)
set -u
. "$(dirname "$0")/../lib.sh"
d="$D/exl3-model/exl3-3.0bpw"   # its tokenizer files (tokenizer.json, _config, chat_template)
check() { if [ "$2" = "$3" ]; then ok; else bad "$1: got [$2] want [$3]"; fi; }

# ids from HF tokenizers 0.23.2 for this exact text (see tools/tokenizer/make_golden.py)
got=$(printf "Hello world, it's a test.\n  x" | "$SPARQ" tokenize "$d")
check "encode" "$got" "42 375 341 351 277 994 14 616 1453 316 1624 337 223 717"
back=$(printf '%s' "$got" | "$SPARQ" tokenize "$d" --text)
check "decode" "$back" "$(printf "Hello world, it's a test.\n  x")"
check "special" "$(printf '<|im_end|>' | "$SPARQ" tokenize "$d" --special)" "2"
plain=$(printf '<|im_end|>' | "$SPARQ" tokenize "$d")
[ "$plain" != "2" ] && ok || bad "without --special the text must not become id 2"
check "skip-special" "$(echo 2 42 | "$SPARQ" tokenize "$d" --text --skip-special)" "$(echo 42 | "$SPARQ" tokenize "$d" --text)"
check "file" "$("$SPARQ" tokenize "$d" -f "$D/text/tokenizer-stress.txt" | wc -w | tr -d " ")" "2469"
"$SPARQ" tokenize "$d" --info | grep -q "^chat chatml$" && ok || bad "--info"
# --chat: the template (jinja2's rendering of it is in tests/data/tokenizer/golden/exl3-model.chat.json)
msgs='[{"role": "user", "content": "Hello!"}]'
check "chat render" "$(echo "$msgs" | "$SPARQ" tokenize "$d" --chat --render)" "$(printf '<|im_start|>user\nHello!<|im_end|>\n<|im_start|>assistant\n')"
check "chat ids" "$(echo "$msgs" | "$SPARQ" tokenize "$d" --chat)" \
    "$(printf '<|im_start|>user\nHello!<|im_end|>\n<|im_start|>assistant\n' | "$SPARQ" tokenize "$d" --special)"
check "chat no-gen" "$(echo "$msgs" | "$SPARQ" tokenize "$d" --chat --render --no-generation-prompt)" "$(printf '<|im_start|>user\nHello!<|im_end|>')"
echo '[{"role": "tool", "content": "x"}]' | "$SPARQ" tokenize "$d" --chat 2>/dev/null; check "chat bad role rc" "$?" "1"
echo '{"role": "user"}' | "$SPARQ" tokenize "$d" --chat 2>/dev/null; check "chat not array rc" "$?" "1"
"$SPARQ" tokenize "$d" --render </dev/null 2>/dev/null; check "render without chat rc" "$?" "2"
# errors: invalid UTF-8 -> 1 with the offset; bad ids -> 1; usage -> 2
printf 'ab\377' | "$SPARQ" tokenize "$d" 2>"$T/err"; rc=$?
check "utf8 rc" "$rc" "1"
grep -q "byte offset 2" "$T/err" && ok || bad "utf8 message: $(cat "$T/err")"
echo "1 x 2" | "$SPARQ" tokenize "$d" --text 2>/dev/null; check "bad ids rc" "$?" "1"
echo "99999" | "$SPARQ" tokenize "$d" --text 2>/dev/null; check "range rc" "$?" "1"
"$SPARQ" tokenize 2>/dev/null; check "no model rc" "$?" "2"
"$SPARQ" tokenize "$D/no-such" </dev/null 2>/dev/null; check "missing model rc" "$?" "1"
finish
