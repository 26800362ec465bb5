#!/bin/sh
# tools/bench/cuda_run_wire.sh — run the CUDA backend's tests and the
# `sparq run --device cuda` vs CPU benchmark on the GPU machine, which has
# the CUDA 13 runtime and cuBLAS but no meson and none of sparq's other
# shared libraries.
#
#   here:  tools/bench/cuda_run_wire.sh pack BUILD_DIR
#          packs sparq, the gpu test binaries and the non-CUDA shared
#          libraries they need (openblas, gfortran, quadmath, jansson, zstd,
#          xxhash) into .cwcarry/carry.tar.xz (to be named in the device
#          tool's `carry`, and ignored through .git/info/exclude meanwhile).
#   there: tools/bench/cuda_run_wire.sh run OUT_DIR
#          unpacks the libraries, runs the gpu tests and the benchmark, and
#          writes the logs to OUT_DIR (tests.log, bench.log, cuda_bench's
#          cuda-int.bench.log / cuda-moe.bench.log, trellis-encode.bench.log and
#          quantize-layer.bench.log).
# The numbers go to docs/benchmarks-cuda.md with this command.
# The device tool refuses a tree over 64 MiB counted in disk blocks (tracked files +
# untracked-not-ignored + carry): keep logs and build outputs out of the tree (the lab's
# run logs left it: they are in git at 4f01ecc, kernels/cuda/lab/README.md; tests/data
# stores its large files packed, so ~48 MiB are tracked).
set -u
mode=${1:-}
case "$mode" in
pack)
    b=${2:?build dir}
    rm -rf .cwcarry && mkdir -p .cwcarry/bin .cwcarry/lib || exit 1
    for f in cli/sparq tests/gpu/test_backend_cuda tests/gpu/test_cuda_model tests/gpu/test_gpu_present \
             tests/gpu/test_trellis_cuda tests/gpu/test_trellis_encode_cuda tests/gpu/test_dist_threads_cuda \
             tests/gpu/test_dist_experts_cuda tests/gpu/test_link_nccl \
             tests/gpu/test_ldlq_cuda tests/gpu/test_sample_cuda tests/gpu/test_hessian_cuda tests/gpu/test_calib_cuda tools/bench/cuda_bench tools/bench/trellis_encode_bench \
             tools/bench/quantize_layer_bench \
             tools/bench/runtime_bench tools/bench/dist_bench tools/bench/make_exl3_model tests/datapack; do
        [ -x "$b/$f" ] && strip -o ".cwcarry/bin/$(basename "$f")" "$b/$f"
    done
    # the CUDA backend module that `sparq --device cuda` opens (found beside the binary)
    strip -o .cwcarry/bin/libsparq_cuda.so "$b/libsparq_cuda.so" || exit 1
    # OpenBLAS with its Fortran runtime (~5 MB compressed; the quantizer's CPU half needs
    # spotrf_/strsm, so the sgemm-only stand-in of earlier rounds is gone)
    for l in libopenblas.so.0; do
        p=$(ldd "$b/cli/sparq" | awk -v l="$l" '$1 == l {print $3}')
        [ -n "$p" ] && cp -L "$p" .cwcarry/lib/ || exit 1
        for d in libgfortran.so.5 libquadmath.so.0; do
            q=$(ldd "$p" | awk -v l="$d" '$1 == l {print $3}')
            [ -n "$q" ] && cp -L "$q" .cwcarry/lib/
        done
    done
    for l in libjansson.so.4 libzstd.so.1 libxxhash.so.0; do
        p=$(ldd "$b/cli/sparq" | awk -v l="$l" '$1 == l {print $3}')
        [ -n "$p" ] && cp -L "$p" .cwcarry/lib/
    done
    # -9: xz's 64 MB window spans the binaries, whose CUDA fatbins are the same static library
    # each (~59 MB stripped packs to ~2.3 MB, where -6's 8 MB window gave ~8 MB)
    (cd .cwcarry && tar cf - lib bin | xz -T2 -9 > carry.tar.xz && rm -rf lib bin) || exit 1
    du -sh .cwcarry
    ;;
run)
    out=${2:?out dir}
    root=$(pwd)
    mkdir -p /tmp/cw && (cd /tmp/cw && xz -dc "$root/.cwcarry/carry.tar.xz" | tar xf -) || exit 1
    # libnccl.so.2 (linked when the build found NCCL): the CUDA folder's or PyTorch's
    nccl=$(find /usr/local/cuda/lib64 /usr/local/cuda/ /opt -name libnccl.so.2 2>/dev/null | head -n 1)
    export LD_LIBRARY_PATH=/tmp/cw/lib:/usr/local/cuda/lib64:${nccl:+$(dirname "$nccl"):}${LD_LIBRARY_PATH:-}
    bin=/tmp/cw/bin
    # tests/data with its packed files unpacked (tests/datapack.c), as the build makes it
    D=/tmp/cw/data
    $bin/datapack tree "$root/tests/data" $D /tmp/cw/data.stamp || exit 1
    export SPARQ_TEST_DATA=$D SPARQ_NO_PROGRESS=1
    {
        nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv
        ldd $bin/sparq | grep -i "not found"
        ldd $bin/sparq | grep -ci "cublas" | sed 's/^/sparq links cuBLAS directly: /'
        for t in test_gpu_present test_backend_cuda test_cuda_model test_trellis_cuda test_trellis_encode_cuda test_link_nccl \
                 test_ldlq_cuda test_sample_cuda test_hessian_cuda test_calib_cuda; do
            echo "== $t"
            $bin/$t
            echo "rc=$?"
        done
        echo "== test_dist_threads_cuda (GPU ranks as threads: hidden states over the device link, then staged with SPARQ_DIST_DEVICE_LINK=0)"
        $bin/test_dist_threads_cuda cuda
        echo "rc=$?"
        echo "== test_dist_experts_cuda (the expert split on GPU ranks as threads: the combine over the link, then staged)"
        $bin/test_dist_experts_cuda cuda
        echo "rc=$?"
        echo "== sparq serve --device cuda: greedy completion = sparq run --device cuda"
        p="The file system"
        $bin/sparq run $D/tiny-qwen3moe -p "$p" -n 32 --temp 0 --device cuda > /tmp/cw/run.txt 2>/dev/null
        $bin/sparq serve $D/tiny-qwen3moe --port 0 --device cuda 2> /tmp/cw/serve.log &
        sp=$!
        for i in $(seq 100); do grep -q "on http" /tmp/cw/serve.log && break; sleep 0.2; done
        port=$(sed -n 's/.*on http:\/\/127\.0\.0\.1:\([0-9]*\) .*/\1/p' /tmp/cw/serve.log)
        python3 - "$port" "$p" > /tmp/cw/serve.txt <<'PY'
import json, sys, urllib.request
body = json.dumps({"prompt": sys.argv[2], "max_tokens": 32, "temperature": 0}).encode()
r = urllib.request.urlopen(urllib.request.Request("http://127.0.0.1:%s/v1/completions" % sys.argv[1], data=body), timeout=120)
print(sys.argv[2] + json.load(r)["choices"][0]["text"])
PY
        kill -INT $sp; wait $sp; echo "serve rc=$?"
        cat /tmp/cw/serve.log
        cmp /tmp/cw/run.txt /tmp/cw/serve.txt && echo "serve --device cuda: identical to run --device cuda"
        head -c 300 /tmp/cw/serve.txt; echo
        if command -v compute-sanitizer > /dev/null; then # works on Firecracker machines, not on gVisor
            echo "== compute-sanitizer memcheck test_backend_cuda"
            timeout 180 compute-sanitizer --tool memcheck $bin/test_backend_cuda 2>&1 | tail -n 5
        fi
    } > "$out/tests.log" 2>&1
    prompt=$(head -c 1500 $D/exl3-model/text.txt)
    {
        for m in $D/tiny-qwen3moe $D/exl3-model/exl3-3.0bpw; do
            for dev in cuda cpu; do
                for rep in 1 2; do
                    echo "== $m --device $dev (run $rep)"
                    $bin/sparq run "$m" -p "$prompt" -n 128 --temp 0 --ignore-eos --device $dev -t 16 \
                        > "$out/text-$(basename $m)-$dev.txt"
                    echo "rc=$?"
                done
            done
            cmp "$out/text-$(basename $m)-cuda.txt" "$out/text-$(basename $m)-cpu.txt" &&
                echo "$m: greedy text identical on cuda and cpu"
        done
        echo "== eval fixture"
        for dev in cuda cpu; do
            $bin/sparq eval $D/tiny-qwen3moe -f $D/exl3-model/text.txt -c 256 --device $dev -t 16
            echo "rc=$?"
        done
    } > "$out/bench.log" 2>&1
    # the kernel benchmark (docs/benchmarks-cuda.md): the GEMV product kernels and the fused MoE layer
    if [ -x $bin/cuda_bench ]; then
        $bin/cuda_bench --int > "$out/cuda-int.bench.log" 2>&1
        $bin/cuda_bench --moe > "$out/cuda-moe.bench.log" 2>&1
    fi
    # the GPU trellis encoder vs the CPU one (docs/benchmarks-trellis.md)
    [ -x $bin/trellis_encode_bench ] && $bin/trellis_encode_bench > "$out/trellis-encode.bench.log" 2>&1
    # one V4.1-shaped MoE layer through quantize --device cuda's steps, with and without the
    # pipeline's overlap (docs/benchmarks-quantize.md §7.1)
    if [ -x $bin/quantize_layer_bench ]; then
        for o in "" --no-overlap; do
            $bin/quantize_layer_bench --preset v41 --run 8 --threads 16 --scale shared $o
        done > "$out/quantize-layer.bench.log" 2>&1
    fi
    tail -n 60 "$out/tests.log" "$out/bench.log"
    ;;
*)
    echo "usage: $0 pack BUILD_DIR | run OUT_DIR" >&2
    exit 2
    ;;
esac
