#!/bin/sh
# tools/bench/cuda_real_size.sh — the GPU runtime at a real model size, on
# the GPU machine after `tools/bench/cuda_run_wire.sh run` has unpacked the
# binaries into /tmp/cw (or with BIN=dir): writes a random-weight EXL3 model
# of a real shape with make_exl3_model (default the Qwen3-30B-A3B preset,
# 12.3 GB), then times it with runtime_bench --device cuda (load, prefill,
# decode, the bytes the model holds and what the plan said, GPU memory in
# use) and compares its logits with the CPU's (COMPARE decode steps, default 4).
#
#   tools/bench/cuda_real_size.sh OUT_DIR [make_exl3_model options...]
set -u
out=${1:?out dir}
shift
bin=${BIN:-/tmp/cw/bin}
model=${MODEL_DIR:-/tmp/real-model}
export LD_LIBRARY_PATH=/tmp/cw/lib:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
export SPARQ_NO_PROGRESS=1
{
    echo "== make_exl3_model $model $*"
    rm -rf "$model"
    t0=$(date +%s)
    "$bin/make_exl3_model" "$model" "$@" || exit 1
    echo "written in $(( $(date +%s) - t0 )) s; $(du -sh "$model" | cut -f1)"
    nvidia-smi --query-gpu=name,memory.used,memory.total --format=csv
    echo "== runtime_bench --device cuda, prompt 512, decode 64 (best of 2)"
    "$bin/runtime_bench" "$model" --device cuda --prompt 512 --decode 64 --reps 2 --threads 16 --compare-cpu ${COMPARE:-4}
    echo "rc=$?"
} > "$out/real-size.log" 2>&1
cat "$out/real-size.log"
