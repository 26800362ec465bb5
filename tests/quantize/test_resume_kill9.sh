#!/bin/sh
# tests/quantize/test_resume_kill9.sh — `sparq quantize` killed with SIGKILL at a
# random moment, then resumed with --resume, writes exactly the same bytes as an
# uninterrupted run with the same seed. Model: tests/data/quantize/tiny-synth.
set -u
. "$(dirname "$0")/../lib.sh"
ARGS="--calib $D/text/calib.txt --calib-rows 3 --calib-len 64 --scale-search fixed --seed 5 --threads 2 -q"

"$SPARQ" quantize "$D/quantize/tiny-synth" "$T/a" $ARGS || { echo "FAIL: uninterrupted run"; exit 1; }

# Kill with SIGKILL at a random moment after the first layer checkpoint (layer-0000 written),
# up to 5 tries until the kill lands before the end; then resume.
killed=0
for try in 1 2 3 4 5; do
    rm -rf "$T/b" "$T/b.work" "$T/b.partial"
    "$SPARQ" quantize "$D/quantize/tiny-synth" "$T/b" $ARGS &
    pid=$!
    n=0
    while [ ! -f "$T/b.work/layer-0000.safetensors" ] && [ $n -lt 3000 ] && kill -0 "$pid" 2>/dev/null; do
        sleep 0.05; n=$((n+1))
    done
    delay=$(awk -v s="$$$try" 'BEGIN { srand(s); printf "%.2f", rand() * 0.8 }')
    sleep "$delay"
    if kill -9 "$pid" 2>/dev/null; then
        wait "$pid" 2>/dev/null
        if [ ! -d "$T/b" ] && [ -f "$T/b.work/hidden.bin" ]; then
            killed=1; echo "killed ${delay}s after the first checkpoint (try $try)"; break
        fi
    else
        wait "$pid" 2>/dev/null
    fi
done
ok [ "$killed" = 1 ]
ls "$T/b.work" 2>/dev/null
"$SPARQ" quantize "$D/quantize/tiny-synth" "$T/b" $ARGS --resume
ok [ $? -eq 0 ]
for f in model.safetensors config.json quantization_config.json tokenizer.json tokenizer_config.json; do
    ok cmp "$T/a/$f" "$T/b/$f"
done
# --resume with different options is refused (exit 1), usage errors exit 2.
rm -rf "$T/c"
"$SPARQ" quantize "$D/quantize/tiny-synth" "$T/c" $ARGS --stop-after-layer 0 >/dev/null 2>&1
ok [ $? -eq 1 ]
"$SPARQ" quantize "$D/quantize/tiny-synth" "$T/c" $ARGS --resume --bits 4 >/dev/null 2>&1
ok [ $? -eq 1 ]
"$SPARQ" quantize "$D/quantize/tiny-synth" "$T/d" --method bogus >/dev/null 2>&1
ok [ $? -eq 2 ]
finish
