#!/bin/sh
# tools/bench/cuda_lab_run.sh — everything one GPU-machine call does, so a
# lease is one command: use the carried binaries (or build them there with
# tools/bench/cuda_build.sh if they do not start), run the correctness test,
# the benchmark, and dump the GEMM kernel's SASS.
#   tools/bench/cuda_lab_run.sh OUTDIR [BINDIR]
# SKIP_BENCH=1: test only; NO_NCU=1: no profiler; NCU_LAB=1: only the lab
# round's counters (ncu_lab.txt); BENCH_ARGS: e.g. --lab (the lab round's columns).
# BENCH_ARGS=--moe: only the fused MoE section (every MoE lab version);
# BENCH_ARGS=--int: lab round 3, the integer mul1 GEMM (v20..v28) against v10.
# Logs: OUTDIR/{env,build,test,bench}.log, OUTDIR/sass_{gemm,fused,v7}_k3.txt, OUTDIR/ncu*.txt.
set -u
out=$1
bin=${2:-build-cuda-sh}
# tests/data with its packed files unpacked (tests/datapack.c; made by cuda_build.sh)
"$bin/datapack" tree tests/data /tmp/sparq-test-data /tmp/sparq-test-data.stamp ||
    { echo "cannot unpack tests/data: $bin/datapack missing? (tools/bench/cuda_build.sh makes it)"; exit 1; }
export SPARQ_TEST_DATA=/tmp/sparq-test-data
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
cuobjdump --dump-sass -fun '_ZN11trellis_dev12k_gemm_fusedILi3ELi2ELi4ELi0EEEvPKjPKfPK6__halfS7_PfPjS8_iiii' "$bin/cuda_bench" > "$out/sass_fused_k3.txt" 2>&1
# lab v7's main kernel (k_gemm_bal<3, mul1, 2, 256, DEC_2W|DEC_PF|DEC_IMMA>)
cuobjdump --dump-sass -fun '_Z10k_gemm_balILi3ELi2ELi2ELi256ELi7EEvPKjS1_Pfiiiij' "$bin/cuda_bench" > "$out/sass_v7_k3.txt" 2>&1
echo "sass lines: k_gemm<3,mul1,2,4> $(grep -c ';' "$out/sass_gemm_k3.txt"), k_gemm_fused<3,mul1,4> $(grep -c ';' "$out/sass_fused_k3.txt"), v7 $(grep -c ';' "$out/sass_v7_k3.txt")"
# hardware counters for one launch pair of each version (Firecracker machines have ncu)
NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
if [ -n "$NCU" ] && [ "${NCU_LAB:-0}" = 1 ]; then
    # lab round 2: issue, pipes and stalls of the balanced kernels (v4 at 2 and 6
    # blocks/SM, v6, v7, v8, v10, v12: the first seven k_gemm_bal launches of --profile)
    timeout 200 "$NCU" --clock-control none -k 'regex:k_gemm_bal' --launch-count 7 \
        --metrics 'gpu__time_duration.sum,smsp__issue_active.avg.pct_of_peak_sustained_active,smsp__warps_active.avg.per_cycle_active,smsp__warps_eligible.avg.per_cycle_active,regex:sm__inst_executed_pipe_.*\.avg\.pct_of_peak_sustained_active,regex:smsp__average_warps_issue_stalled_.*_per_issue_active\.ratio,dram__throughput.avg.pct_of_peak_sustained_elapsed' \
        "$bin/cuda_bench" --profile > "$out/ncu_lab.txt" 2>&1
    echo "ncu lab exit $?: $(grep -c 'k_gemm_bal' "$out/ncu_lab.txt") kernel reports"
elif [ -n "$NCU" ] && [ "${NO_NCU:-0}" = 0 ]; then
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
