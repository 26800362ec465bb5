#!/bin/sh
# tests/cli/test_cli_basics.sh — `sparq help`, every command's --help, exit codes.
SPARQ="$1"
pass=0; fail=0
ok() { pass=$((pass+1)); }
bad() { fail=$((fail+1)); echo "FAIL: $*" >&2; }

"$SPARQ" help > /tmp/sparq-help.$$ && ok || bad "sparq help exits 0"
grep -q "usage: sparq" /tmp/sparq-help.$$ && ok || bad "help shows usage"
# every listed command answers --help with exit 0 and a usage line
for cmd in $(sed -n 's/^  \([a-z]*\)  .*/\1/p' /tmp/sparq-help.$$); do
  [ "$cmd" = help ] && continue
  out=$("$SPARQ" "$cmd" --help) && ok || bad "$cmd --help exits 0"
  echo "$out" | grep -q "usage: sparq $cmd" && ok || bad "$cmd --help shows usage"
  "$SPARQ" "$cmd" --no-such-flag >/dev/null 2>&1; [ $? -eq 2 ] && ok || bad "$cmd rejects unknown flag with 2"
done
rm -f /tmp/sparq-help.$$
"$SPARQ" no-such-command >/dev/null 2>&1; [ $? -eq 2 ] && ok || bad "unknown command exits 2"
"$SPARQ" version | grep -q "^sparq " && ok || bad "version"
echo "$pass passed, $fail failed"
[ $fail -eq 0 ]
