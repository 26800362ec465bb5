#!/bin/sh
# tests/kernels/cross_neon.sh — prove the trellis codec's NEON path equals the
# scalar path (and exllamav3's golden decode) on aarch64, from an x86 machine:
# cross-compile the trellis code, common/ and the trellis unit + golden tests
# with Debian's aarch64-linux-gnu-gcc (a direct compiler call, no meson cross
# build) and run them under qemu-aarch64. Exits 77 (skip) if the cross
# compiler or qemu is missing (tools/install-deps.sh installs both).
#   usage: cross_neon.sh SOURCE_ROOT   (SPARQ_TEST_DATA must point at BUILD/tests/data)
set -u
SRC=${1:?usage: cross_neon.sh SOURCE_ROOT}
CC=${AARCH64_CC:-aarch64-linux-gnu-gcc}
QEMU=${QEMU_AARCH64:-qemu-aarch64}
SYSROOT=${AARCH64_SYSROOT:-/usr/aarch64-linux-gnu}
if ! command -v "$CC" >/dev/null 2>&1; then
  echo "SKIP: $CC not found (apt-get install gcc-aarch64-linux-gnu)"; exit 77
fi
if ! command -v "$QEMU" >/dev/null 2>&1; then
  echo "SKIP: $QEMU not found (apt-get install qemu-user)"; exit 77
fi
OUT=$(mktemp -d "${TMPDIR:-/tmp}/sparq-cross-XXXXXX")
trap 'rm -rf "$OUT"' EXIT
LIB="$SRC/common/status.c $SRC/common/alloc.c $SRC/common/fault.c $SRC/common/threadpool.c \
  $SRC/kernels/cpu/trellis.c $SRC/kernels/cpu/trellis_neon.c \
  $SRC/quantize/hadamard.c $SRC/quantize/viterbi.c"
# -std=c11 as meson uses: no implicit fp contraction, so scalar stays unfused
FLAGS="-std=c11 -O2 -D_GNU_SOURCE -I$SRC -I$SRC/tests"
rc=0
objs=""
for f in $LIB; do
  o="$OUT/$(basename "$f" .c).o"
  $CC $FLAGS -c -o "$o" "$f" || { echo "FAIL: cross-compiling $f"; exit 1; }
  objs="$objs $o"
done
for t in test_trellis test_viterbi test_trellis_golden; do
  # test drivers without the vectoriser: Debian's gcc-12 aarch64 cross compiler
  # hits an internal error vectorising a reduction in test_trellis.c
  if ! $CC $FLAGS -fno-tree-vectorize -o "$OUT/$t" "$SRC/tests/kernels/$t.c" $objs -lm -lpthread; then
    echo "FAIL: cross-compiling $t"; exit 1
  fi
done
for t in test_trellis test_viterbi test_trellis_golden; do
  echo "== $t (aarch64, qemu)"
  start=$(date +%s)
  SPARQ_TEST_QUICK=1 "$QEMU" -L "$SYSROOT" "$OUT/$t" >"$OUT/$t.log" 2>&1
  st=$?
  cat "$OUT/$t.log"
  echo "($(( $(date +%s) - start )) s)"
  [ $st -eq 0 ] || rc=1
done
# the NEON path must have been the one in use
grep -q "best: neon" "$OUT/test_trellis.log" || { echo "FAIL: NEON path not selected"; rc=1; }
grep -q "code path: neon" "$OUT/test_trellis_golden.log" || { echo "FAIL: NEON path not used for golden"; rc=1; }
exit $rc
