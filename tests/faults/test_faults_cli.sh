#!/bin/sh
# tests/faults/test_faults_cli.sh — the fault injector from the environment
# (common/fault.h: SPARQ_FAULT_COUNT / SPARQ_FAULT_ALLOC / SPARQ_FAULT_IO),
# sweeping whole `sparq` processes as a script would: a clean run's exit
# line gives the counts, then every N fails once and the process must exit 1
# (no signal, no abort) with a message besides the injector's own line, or
# exit 0 where a fallback absorbed the fault. Swept: every allocation and
# file operation of `sparq verify` on a bundle of tiny-synth, and every file
# operation of `sparq pack`, each failed pack followed by `pack --resume`
# and a verify of what it finished, and every nf/8-th file operation of
# packing tiny-dsv41 (with its Engram files). test_faults.c sweeps the library calls
# themselves, with more checks.
SPARQ="$1"
MODEL="${SPARQ_TEST_DATA:-build/tests/data}/quantize/tiny-synth"
[ -d "$MODEL" ] || { echo "SKIP: $MODEL absent"; exit 77; }
T=$(mktemp -d "${TMPDIR:-/tmp}/sparq-faults-cli-XXXXXX")
trap 'rm -rf "$T"' EXIT
pass=0; fail=0
ok() { pass=$((pass+1)); }
bad() { fail=$((fail+1)); echo "FAIL: $*" >&2; }
PACK="--boxes 2 --ctx 256 --users 2 --chunk 64 --block-size 64K"

# "sparq fault: A allocations, F file operations..." -> "A F"
counts() { sed -n 's/^sparq fault: \([0-9]*\) allocations, \([0-9]*\) file operations.*/\1 \2/p' "$1"; }

# One faulted run's verdict: $1 its exit code, $2 its stderr, $3 what failed ("allocation N").
judge() {
    case $1 in
    0) ok ;;
    1) if grep -v '^sparq fault:' "$2" | grep -q .; then ok; else bad "$3: exit 1 without a message"; fi ;;
    *) bad "$3: exit code $1: $(head -c 300 "$2")" ;;
    esac
    grep -q "^sparq fault: .*failed $3\$" "$2" && ok || bad "$3: the injector's line does not name it: $(tail -1 "$2")"
}

"$SPARQ" pack "$MODEL" "$T/b" $PACK 2> "$T/err" && ok || bad "pack: $(cat "$T/err")"
SPARQ_FAULT_COUNT=1 "$SPARQ" verify "$T/b" > /dev/null 2> "$T/err" && ok || bad "verify: $(cat "$T/err")"
set -- $(counts "$T/err")
na=${1:-0} nf=${2:-0}
[ "$na" -gt 10 ] && [ "$nf" -gt 5 ] && ok || bad "verify's counts: '$(tail -1 "$T/err")'"
for kind in ALLOC IO; do
    [ $kind = ALLOC ] && n=$na what=allocation || { n=$nf; what="file operation"; }
    i=1
    while [ $i -le "$n" ]; do
        env SPARQ_FAULT_$kind=$i "$SPARQ" verify "$T/b" > /dev/null 2> "$T/err"
        judge $? "$T/err" "$what $i"
        i=$((i+1))
    done
done
echo "verify: $na allocations and $nf file operations swept"

SPARQ_FAULT_COUNT=1 "$SPARQ" pack "$MODEL" "$T/c" $PACK 2> "$T/err" && ok || bad "pack: $(cat "$T/err")"
set -- $(counts "$T/err")
nf=${2:-0}
[ "$nf" -gt 20 ] && ok || bad "pack's counts: '$(tail -1 "$T/err")'"
rm -rf "$T/c"
i=1
while [ $i -le "$nf" ]; do
    SPARQ_FAULT_IO=$i "$SPARQ" pack "$MODEL" "$T/c" $PACK 2> "$T/err"
    rc=$?
    judge $rc "$T/err" "file operation $i"
    [ $rc -eq 0 ] || [ ! -e "$T/c" ] || bad "file operation $i: pack failed but $T/c exists"
    if [ -d "$T/c.partial" ]; then
        "$SPARQ" pack "$MODEL" "$T/c" $PACK --resume 2> "$T/err2" && ok || bad "file operation $i: --resume: $(cat "$T/err2")"
    elif [ ! -d "$T/c" ]; then
        "$SPARQ" pack "$MODEL" "$T/c" $PACK 2> "$T/err2" && ok || bad "file operation $i: rerun: $(cat "$T/err2")"
    fi
    "$SPARQ" verify "$T/c" > /dev/null 2> "$T/err2" && ok || bad "file operation $i: verify: $(cat "$T/err2")"
    cmp -s "$T/b/manifest.json" "$T/c/manifest.json" && ok || bad "file operation $i: another manifest"
    rm -rf "$T/c" "$T/c.partial"
    i=$((i+1))
done
echo "pack: $nf file operations swept"


# pack of the DeepSeek V4.1 fixture (it writes the Engram node files): a file
# operation every nf/8 (the suite has a 300 s limit), each failure resumed or rerun to the same bundle
V="${SPARQ_TEST_DATA:-build/tests/data}/tiny-dsv41"
if [ -d "$V" ]; then
    "$SPARQ" pack "$V" "$T/vb" $PACK 2> "$T/err" && ok || bad "pack tiny-dsv41: $(cat "$T/err")"
    SPARQ_FAULT_COUNT=1 "$SPARQ" pack "$V" "$T/vc" $PACK 2> "$T/err" && ok || bad "pack tiny-dsv41: $(cat "$T/err")"
    set -- $(counts "$T/err")
    nf=${2:-0}
    rm -rf "$T/vc"
    step=$((nf / 8 + 1)) i=1 swept=0
    while [ $i -le "$nf" ]; do
        SPARQ_FAULT_IO=$i "$SPARQ" pack "$V" "$T/vc" $PACK 2> "$T/err"
        rc=$?
        judge $rc "$T/err" "file operation $i"
        [ $rc -eq 0 ] || [ ! -e "$T/vc" ] || bad "tiny-dsv41 file operation $i: pack failed but $T/vc exists"
        if [ -d "$T/vc.partial" ]; then
            "$SPARQ" pack "$V" "$T/vc" $PACK --resume 2> "$T/err2" && ok || bad "tiny-dsv41 file operation $i: --resume: $(cat "$T/err2")"
        elif [ ! -d "$T/vc" ]; then
            "$SPARQ" pack "$V" "$T/vc" $PACK 2> "$T/err2" && ok || bad "tiny-dsv41 file operation $i: rerun: $(cat "$T/err2")"
        fi
        "$SPARQ" verify "$T/vc" > /dev/null 2> "$T/err2" && ok || bad "tiny-dsv41 file operation $i: verify: $(cat "$T/err2")"
        cmp -s "$T/vb/engram/engram-node-1.bin" "$T/vc/engram/engram-node-1.bin" && ok ||
            bad "tiny-dsv41 file operation $i: another Engram file"
        rm -rf "$T/vc" "$T/vc.partial"
        i=$((i + step)) swept=$((swept + 1))
    done
    echo "pack tiny-dsv41: $swept of $nf file operations swept"
fi
echo "$pass passed, $fail failed"
[ "$fail" -eq 0 ]
