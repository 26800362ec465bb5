#!/bin/sh
# tests/cli/test_cli_basics.sh — `sparq help`, every command's --help, exit codes.
. "$(dirname "$0")/../lib.sh"

"$SPARQ" help > "$T/help" && ok || bad "sparq help exits 0"
grep -q "usage: sparq" "$T/help" && ok || bad "help shows usage"
# every listed command answers --help with exit 0 and a usage line
for cmd in $(sed -n 's/^  \([a-z]*\)  .*/\1/p' "$T/help"); do
  [ "$cmd" = help ] && continue
  out=$("$SPARQ" "$cmd" --help) && ok || bad "$cmd --help exits 0"
  echo "$out" | grep -q "usage: sparq $cmd" && ok || bad "$cmd --help shows usage"
  "$SPARQ" "$cmd" --no-such-flag >/dev/null 2>&1; [ $? -eq 2 ] && ok || bad "$cmd rejects unknown flag with 2"
done
"$SPARQ" no-such-command >/dev/null 2>&1; [ $? -eq 2 ] && ok || bad "unknown command exits 2"
"$SPARQ" version | grep -q "^sparq " && ok || bad "version"
finish
