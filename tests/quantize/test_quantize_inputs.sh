#!/bin/sh
# tests/quantize/test_quantize_inputs.sh — `sparq quantize` checks its inputs before it
# writes anything (issue 26, item 7):
#  - a missing --calib file, a FIFO as --calib, a missing MODEL: exit 1 naming it, and no
#    OUT.work (nor OUT) left behind;
#  - the default calibration text does not depend on the current directory: from another
#    directory quantize still finds it (a path fixed at build time).
. "$(dirname "$0")/../lib.sh"
M="$D/tiny-qwen3moe"
FAST="--method rtn --calib-rows 2 --calib-len 32 -q"

"$SPARQ" quantize "$M" "$T/a" $FAST --calib "$T/nope.txt" >/dev/null 2>"$T/e"; rc=$?
[ $rc -eq 1 ] && ok || bad "missing --calib: exit $rc, want 1"
grep -q "$T/nope.txt" "$T/e" && ok || bad "missing --calib: the message does not name it: $(cat "$T/e")"
[ ! -e "$T/a.work" ] && [ ! -e "$T/a" ] && ok || bad "missing --calib: $(ls "$T") left behind"

mkfifo "$T/fifo.txt"
timeout 20 "$SPARQ" quantize "$M" "$T/a" $FAST --calib "$T/fifo.txt" >/dev/null 2>"$T/e"; rc=$?
[ $rc -eq 1 ] && ok || bad "FIFO as --calib: exit $rc (124: it blocked), want 1"
grep -q "fifo.txt: not a regular file (a FIFO)" "$T/e" && ok || bad "FIFO as --calib: $(cat "$T/e")"
[ ! -e "$T/a.work" ] && ok || bad "FIFO as --calib: OUT.work left behind"

"$SPARQ" quantize "$T/no-model" "$T/a" $FAST --calib "$D/text/calib.txt" >/dev/null 2>"$T/e"; rc=$?
[ $rc -eq 1 ] && ok || bad "missing MODEL: exit $rc, want 1"
[ ! -e "$T/a.work" ] && ok || bad "missing MODEL: OUT.work left behind"

# the default calibration text, from another directory
(cd "$T" && "$SPARQ" quantize "$(cd "$M" && pwd)" "$T/b" $FAST >/dev/null 2>"$T/e") && ok \
  || bad "quantize without --calib from $T: $(cat "$T/e")"
[ -f "$T/b/model.safetensors" ] && ok || bad "quantize without --calib wrote no model"
"$SPARQ" quantize --help | grep -q "default .*tests/data/text/calib.txt" && ok || bad "--help names the default calibration file"

# --devices: a bad list is a usage error (exit 2) naming the entry, before anything is written
"$SPARQ" quantize "$M" "$T/c" $FAST --devices 0,,1 >/dev/null 2>"$T/e"; rc=$?
[ $rc -eq 2 ] && grep -q "entry 2 is empty" "$T/e" && ok || bad "--devices 0,,1: exit $rc: $(cat "$T/e")"
"$SPARQ" quantize "$M" "$T/c" $FAST --devices x >/dev/null 2>"$T/e"; rc=$?
[ $rc -eq 2 ] && grep -q "'x' is not a CUDA device ordinal" "$T/e" && ok || bad "--devices x: exit $rc: $(cat "$T/e")"
"$SPARQ" quantize "$M" "$T/c" $FAST --device cpu --devices 0 >/dev/null 2>"$T/e"; rc=$?
[ $rc -eq 2 ] && grep -q "needs --device cuda" "$T/e" && ok || bad "--device cpu --devices 0: exit $rc: $(cat "$T/e")"
[ ! -e "$T/c" ] && [ ! -e "$T/c.work" ] && ok || bad "--devices refused: $(ls "$T") left behind"
"$SPARQ" quantize --help | grep -q -- "--devices" && ok || bad "--help lacks --devices"

finish
