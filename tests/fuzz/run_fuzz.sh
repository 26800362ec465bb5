#!/bin/sh
# tests/fuzz/run_fuzz.sh BIN SEED_DIR — run one libFuzzer target for
# $SPARQ_FUZZ_SECONDS (default 60) seconds. New inputs go to a temporary
# corpus (the committed seeds are read, never written); a crash, leak, timeout
# or sanitizer report makes libFuzzer exit non-zero and this test fail, with
# the reproducer kept under $SPARQ_FUZZ_ARTIFACTS (default the temp dir,
# printed). Ends with "N passed, N failed".
BIN="$1"; SEEDS="$2"
SECS="${SPARQ_FUZZ_SECONDS:-60}"
work=$(mktemp -d "${TMPDIR:-/tmp}/sparq-fuzz-XXXXXX")
art="${SPARQ_FUZZ_ARTIFACTS:-$work}"
mkdir -p "$work/corpus" "$art"
"$BIN" -max_total_time="$SECS" -timeout=10 -rss_limit_mb=2048 -print_final_stats=1 \
  -artifact_prefix="$art/" "$work/corpus" "$SEEDS" 2>"$work/log"
rc=$?
tail -n 30 "$work/log"
if [ $rc -eq 0 ]; then
  rm -rf "$work"
  echo "1 passed, 0 failed"
  exit 0
fi
echo "fuzzer exited $rc; reproducer and log in $art and $work" >&2
ls "$art" >&2
echo "0 passed, 1 failed"
exit 1
