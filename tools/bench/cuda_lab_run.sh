#!/bin/sh
# tools/bench/cuda_lab_run.sh — everything one GPU-machine call does, so a
# lease is one command: use the carried binaries (or build them there with
# tools/bench/cuda_build.sh if they do not start), run the correctness test,
# the benchmark, and dump the GEMM kernel's SASS.
#   tools/bench/cuda_lab_run.sh OUTDIR [BINDIR]
# SKIP_BENCH=1: test only; NO_NCU=1: no profiler.
# Logs: OUTDIR/{env,build,test,bench}.log, OUTDIR/sass_{gemm,fused}_k3.txt, OUTDIR/ncu.txt.
set -u
out=$1
bin=${2:-build-cuda-sh}
export SPARQ_TEST_DATA=tests/data
export LD_LIBRARY_PATH=/usr/local/cuda/lib64${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
mkdir -p "$out"
{ nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,clocks.mem --format=csv; nvcc --version | tail -2; } > "$out/env.log" 2>&1
"$bin/test_trellis_cuda" > "$out/test.log" 2>&1
trc=$?
if [ $trc -ne 0 ] && [ $trc -ne 1 ] && [ $trc -ne 77 ]; then
    echo "prebuilt test exited $trc: building here" | tee "$out/build.log"
    head -5 "$out/test.log"
    bin=build-cuda-sh-dev
    tools/bench/cuda_build.sh "$bin" "90" >> "$out/build.log" 2>&1 || { cat "$out/build.log"; exit 1; }
    "$bin/test_trellis_cuda" > "$out/test.log" 2>&1
    trc=$?
fi
cp "$bin/ptxas.log" "$out/ptxas.log" 2>/dev/null
echo "== test (exit $trc)"; grep -E 'FAIL|^ok|worst|passed' "$out/test.log" | tail -20
[ "${SKIP_BENCH:-0}" = 1 ] && exit $trc
echo "== bench"; "$bin/cuda_bench" ${BENCH_ARGS:-} 2>&1 | tee "$out/bench.log"
cuobjdump --dump-sass -fun '_Z6k_gemmILi3ELi2ELi2ELi4EEvPKjS1_Pfiiii' "$bin/cuda_bench" > "$out/sass_gemm_k3.txt" 2>&1
cuobjdump --dump-sass -fun '_ZN11trellis_dev12k_gemm_fusedILi3ELi2ELi4EEEvPKjPKfPK6__halfS7_PfPjS8_iiii' "$bin/cuda_bench" > "$out/sass_fused_k3.txt" 2>&1
echo "sass lines: k_gemm<3,mul1,2,4> $(grep -c ';' "$out/sass_gemm_k3.txt"), k_gemm_fused<3,mul1,4> $(grep -c ';' "$out/sass_fused_k3.txt")"
# hardware counters for one launch pair of each version (Firecracker machines have ncu)
NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
if [ -n "$NCU" ] && [ "${NO_NCU:-0}" = 0 ]; then
    timeout 150 "$NCU" --clock-control none -k 'regex:k_gemm' --launch-count 6 \
        --section SpeedOfLight --section ComputeWorkloadAnalysis --section WarpStateStats \
        --section SchedulerStats --section Occupancy --section LaunchStats \
        "$bin/cuda_bench" --profile > "$out/ncu.txt" 2>&1
    echo "ncu exit $?: $(grep -c 'k_gemm' "$out/ncu.txt") kernel reports in ncu.txt"
    # stall reasons and pipe use of the balanced (v4) and fused (v3) kernels
    timeout 120 "$NCU" --clock-control none -k 'regex:k_gemm_(bal|fused)' --launch-count 4 \
        --metrics 'regex:smsp__average_warps_issue_stalled_.*_per_issue_active\.ratio' \
        "$bin/cuda_bench" --profile > "$out/ncu_stalls.txt" 2>&1
    echo "ncu stalls exit $?"
    timeout 120 "$NCU" --clock-control none -k 'regex:k_gemm_(bal|fused)' --launch-count 4 \
        --metrics 'regex:sm__inst_executed_pipe_.*\.avg\.pct_of_peak_sustained_active' \
        "$bin/cuda_bench" --profile > "$out/ncu_pipes.txt" 2>&1
    echo "ncu pipes exit $?"
fi
exit $trc
