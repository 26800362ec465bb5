#!/bin/sh
# tools/bench/cuda_build.sh — build the CUDA trellis test and benchmark with one
# nvcc/gcc line each, for machines without meson or the -dev packages (the GPU
# machine). Depends only on libc/libm/pthread, common/{status,alloc,threadpool},
# kernels/cpu/trellis*, quantize/viterbi.c, the kernel families of kernels/cuda/ (every .cu but
# backend_cuda.cu), cudart and cuBLAS.
#
#   tools/bench/cuda_build.sh [OUTDIR] [ARCHS]     (defaults: build-cuda-sh, "90 121")
# NVCCFLAGS (environment) is added to the nvcc lines. Writes OUTDIR/test_trellis_cuda,
# OUTDIR/cuda_bench, OUTDIR/test_trellis_encode_cuda, OUTDIR/trellis_encode_bench, OUTDIR/datapack and OUTDIR/ptxas.log (registers, shared memory and
# spills of every kernel). Run from the repo root.
set -eu
out=${1:-build-cuda-sh}
archs=${2:-"90 121"}
NVCC=${NVCC:-$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)}
CC=${CC:-gcc}
mkdir -p "$out"
gencode=""
for a in $archs; do gencode="$gencode -gencode arch=compute_$a,code=sm_$a"; done
cflags="-std=c11 -O2 -I. -Itests -D_GNU_SOURCE -I$(dirname "$NVCC")/../include"
simd=kernels/cpu/trellis_nosimd.c
# the same SIMD files kernels/cpu/meson.build picks (every AVX file on x86-64)
case "$(uname -m)" in x86_64) simd=$(ls kernels/cpu/trellis_avx*.c) ;; aarch64) simd=kernels/cpu/trellis_neon.c ;; esac
objs=""
for f in common/status.c common/alloc.c common/fault.c common/threadpool.c kernels/cpu/trellis.c $simd \
         quantize/viterbi.c; do
    o="$out/$(echo "$f" | tr / _).o"
    $CC $cflags -c "$f" -o "$o"
    objs="$objs $o"
done
: > "$out/ptxas.log"
cu() { # cu SOURCE: compile one .cu into $out, its ptxas report appended to ptxas.log
    o="$out/$(echo "$1" | tr / _).o"
    $NVCC -std=c++17 -O3 -I. $gencode ${NVCCFLAGS:-} -Xptxas -v -c "$1" -o "$o" 2> "$out/ptxas.tmp" ||
        { cat "$out/ptxas.tmp" >&2; exit 1; }
    cat "$out/ptxas.tmp" >> "$out/ptxas.log"
    echo "$o"
}
for f in trellis_linear gemv_int gemm_tc gemm_prefill moe_decode trellis_encode; do objs="$objs $(cu kernels/cuda/$f.cu)"; done
test_obj=$(cu tests/gpu/cuda_slow_copy.cu)       # the test's late PDL producer
bench_obj=$(cu tools/bench/cuda_launch_floor.cu) # the benchmark's empty launches
rm -f "$out/ptxas.tmp"
libs="-L$(dirname "$NVCC")/../lib64 -lcublas -lcudart -lpthread -lm -ldl"
$CC $cflags tests/gpu/test_trellis_cuda.c "$test_obj" $objs -o "$out/test_trellis_cuda" $libs -lstdc++
$CC $cflags tools/bench/cuda_bench.c "$bench_obj" $objs -o "$out/cuda_bench" $libs -lstdc++
$CC $cflags tests/gpu/test_trellis_encode_cuda.c $objs -o "$out/test_trellis_encode_cuda" $libs -lstdc++
$CC $cflags tools/bench/trellis_encode_bench.c $objs -o "$out/trellis_encode_bench" $libs -lstdc++
# the tests read tests/data with its packed files unpacked (tests/datapack.c); the GPU
# machine has no libzstd-dev, so datapack is built here with libzstd linked in statically
$CC -std=c11 -O2 tests/datapack.c -o "$out/datapack" -Wl,-Bstatic -lzstd -Wl,-Bdynamic ||
    echo "datapack not built (libzstd-dev missing?): carry one built elsewhere"
echo "built $out/test_trellis_cuda $out/cuda_bench $out/test_trellis_encode_cuda $out/trellis_encode_bench $out/datapack ($archs)"
