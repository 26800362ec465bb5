#!/bin/sh
# tools/test-all.sh — README command (2): install dependencies, build, and run
# every test suite (unit, golden, cli, mpi, gpu — skipped without a GPU — and
# the fuzz suite in a separate clang build). Ends with "N passed, N failed".
# Environment: FUZZ_SECONDS (per fuzz target, default 60), JOBS.
set -eu
cd "$(dirname "$0")/.."
./tools/install-deps.sh
JOBS=${JOBS:-$(nproc)}
FUZZ_SECONDS=${FUZZ_SECONDS:-60}
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1

[ -f build/build.ninja ] || meson setup build
ninja -C build -j "$JOBS"
rc=0
meson test -C build --no-rebuild --print-errorlogs --num-processes "$JOBS" \
  --suite unit --suite golden --suite cli --suite mpi --suite gpu || rc=1

# Fuzz targets need clang's libFuzzer; they get their own build directory.
if [ ! -f build-fuzz/build.ninja ]; then
  CC=clang meson setup build-fuzz -Dfuzz=true -Dcuda=disabled -Dbuildtype=debug -Db_sanitize=address,undefined -Db_lundef=false
else  # an older build-fuzz may lack the sanitizers the library needs
  meson configure build-fuzz -Dfuzz=true -Db_sanitize=address,undefined -Db_lundef=false
fi
ninja -C build-fuzz -j "$JOBS"
SPARQ_FUZZ_SECONDS=$FUZZ_SECONDS meson test -C build-fuzz --no-rebuild --print-errorlogs \
  --num-processes "$JOBS" --suite fuzz --timeout-multiplier 4 || rc=1

python3 tools/test-summary.py build/meson-logs/testlog.json build-fuzz/meson-logs/testlog.json
exit $rc
