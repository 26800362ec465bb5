#!/bin/sh
# tests/gpu/test_quantize_devices.sh — `sparq quantize --devices LIST` (one CUDA
# context and pipeline per entry, a layer's batches shared through one queue):
#  - the fixture quantized with --devices 0, 0,0 and 0,0,0 gives the same bytes in
#    every output file (one GPU listed several times is how it is tested with one
#    GPU: two or three contexts on it, each with its own free memory, so the batch
#    plans differ); SPARQ_QUANT_GPU_MAX_BATCH=1 makes every weight its own batch, so
#    every context takes some; the same with --scale-search shared (the first
#    expert's scale is searched in its batch's preparation and reused by the others,
#    whichever context they land on);
#  - one weight a batch gives the bytes of the planned batches (a weight's words do
#    not depend on its batch, ldlq_cuda.h);
#  - the report has one gpu_devices entry per listed device, each busy, summing to
#    gpu_seconds;
#  - --devices 0,99 fails (exit 1) naming 99, before any work: no OUT, no OUT.work;
#  - a --devices 0,0 run stopped after layer 0 and resumed with --devices 0,0 or with
#    --devices 0 writes the uninterrupted --devices 0 run's bytes.
# Without a GPU (no CUDA in the build, or none on the machine) it is skipped (77).
. "$(dirname "$0")/../lib.sh"
Q="$D/quantize/tiny-synth"
QA="--calib $D/text/calib.txt --calib-rows 3 --calib-len 64 --scale-search fixed --seed 5 --threads 2 -q"
export SPARQ_QUANT_GPU_MAX_BATCH=1

"$SPARQ" quantize "$Q" "$T/d1" $QA --devices 0 --report "$T/d1.json" >/dev/null 2>"$T/e"
rc=$?
if [ $rc -ne 0 ] && grep -Eq "no usable GPU|does not exist \(0 devices\)|CUDA module|without CUDA" "$T/e"; then
  skip "no GPU: $(cat "$T/e")"
fi
[ $rc -eq 0 ] && ok || { bad "quantize --devices 0: exit $rc: $(cat "$T/e")"; finish; }

# same_files A B WHAT: every file of A is in B with the same bytes, and B has no other
same_files() {
  n=0
  for f in "$1"/*; do cmp -s "$f" "$2/${f##*/}" || { n=$((n + 1)); echo "differs: ${f##*/}" >&2; }; done
  [ "$(ls "$1")" = "$(ls "$2")" ] || { n=$((n + 1)); echo "file lists differ: $(ls "$1") / $(ls "$2")" >&2; }
  [ $n -eq 0 ] && [ -n "$(ls "$1")" ] && ok || bad "$3: $n output files differ from --devices 0's"
}

# a weight's words do not depend on its batch (ldlq_cuda.h): one batch a weight against the planned batches
SPARQ_QUANT_GPU_MAX_BATCH=0 "$SPARQ" quantize "$Q" "$T/dplan" $QA --devices 0 >/dev/null 2>"$T/e" && ok \
  || bad "quantize --devices 0 with planned batches: $(cat "$T/e")"
same_files "$T/d1" "$T/dplan" "planned batches (SPARQ_QUANT_GPU_MAX_BATCH=0)"

for list in 0,0 0,0,0; do
  "$SPARQ" quantize "$Q" "$T/d$list" $QA --devices $list --report "$T/d$list.json" >/dev/null 2>"$T/e" \
    && ok || bad "quantize --devices $list: $(cat "$T/e")"
  same_files "$T/d1" "$T/d$list" "--devices $list"
  python3 - "$T/d$list.json" "$list" <<'PY' && ok || bad "--devices $list: the report's per-device busy seconds"
import json, sys
r = json.load(open(sys.argv[1]))
want = [int(x) for x in sys.argv[2].split(",")]
gd = r["gpu_devices"]
assert [d["device"] for d in gd] == want, gd
assert all(d["gpu_seconds"] > 0 for d in gd), ("a device took no batch", gd)
assert abs(sum(d["gpu_seconds"] for d in gd) - r["gpu_seconds"]) <= 1e-6 + 1e-6 * r["gpu_seconds"], (gd, r["gpu_seconds"])
PY
done

# the shared scale across contexts
QS=$(echo "$QA" | sed 's/--scale-search fixed/--scale-search shared/')
"$SPARQ" quantize "$Q" "$T/s1" $QS --devices 0 >/dev/null 2>"$T/e" && ok || bad "--scale-search shared --devices 0: $(cat "$T/e")"
"$SPARQ" quantize "$Q" "$T/s2" $QS --devices 0,0 >/dev/null 2>"$T/e" && ok || bad "--scale-search shared --devices 0,0: $(cat "$T/e")"
same_files "$T/s1" "$T/s2" "--scale-search shared --devices 0,0"

# an ordinal that does not exist: refused before any work, named
"$SPARQ" quantize "$Q" "$T/bad" $QA --devices 0,99 >/dev/null 2>"$T/e"; rc=$?
[ $rc -eq 1 ] && ok || bad "--devices 0,99: exit $rc, want 1"
grep -q "CUDA device 99" "$T/e" && ok || bad "--devices 0,99: the message does not name 99: $(cat "$T/e")"
[ ! -e "$T/bad" ] && [ ! -e "$T/bad.work" ] && ok || bad "--devices 0,99 left $(ls "$T" | grep bad)"

# stopped after layer 0 on two contexts, resumed on two and on one
for again in 0,0 0; do
  "$SPARQ" quantize "$Q" "$T/r$again" $QA --devices 0,0 --stop-after-layer 0 >/dev/null 2>&1
  [ -d "$T/r$again.work" ] && [ ! -e "$T/r$again" ] && ok || bad "--stop-after-layer 0 --devices 0,0: no work dir, or an OUT"
  "$SPARQ" quantize "$Q" "$T/r$again" $QA --devices $again --resume >/dev/null 2>"$T/e" && ok \
    || bad "resume with --devices $again: $(cat "$T/e")"
  same_files "$T/d1" "$T/r$again" "stopped on --devices 0,0, resumed on --devices $again"
done
finish
