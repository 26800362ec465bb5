#!/usr/bin/env python3
"""tools/bench/exl3_tiles_bench.py — exllamav3's own GPU trellis encoder
(`quantize_tiles`, the kernel its converter runs) timed on i.i.d. N(0,1) tiles,
for the comparison issue 24 asks for beside sparq's trellis_encode_bench.

    python3 tools/bench/exl3_tiles_bench.py WHEEL [--k 2,3,4,5,6] [--tiles N] [--cb mul1|mcg|3inst]

WHEEL is the PyPI wheel exllamav3-1.6.5-py3-none-any.whl (pure source; fetched
here with `pip download --no-deps exllamav3==1.6.5` and carried to the GPU
machine, never committed). Only the encoder's own sources are built (quant/
quantize.cu, exl3_devctx.cu and the quantize_tiles instances: ~1-2 min with
TORCH_CUDA_ARCH_LIST=9.0 MAX_JOBS=16) with a binding written here, not the
whole extension (~6 min). Prints, per K, tiles/s (best of --reps, after a
warm-up) and the mean squared error per weight of its encoding, with the
scratch sizes exllamav3's quantize.py gives the kernel.
"""
import argparse
import os
import sys
import tempfile
import time
import zipfile

BINDING = r"""
#include <torch/extension.h>
#include <tuple>
std::tuple<bool, int64_t> quantize_tiles_scratch(int device, int K, bool mcg, bool mul1, int L);
void quantize_tiles(at::Tensor input_tiles, at::Tensor output_tiles, at::Tensor output_indices,
                    at::Tensor temp_costs, at::Tensor temp_edges, int K, bool mcg, bool mul1);
PYBIND11_MODULE(TORCH_EXTENSION_NAME, m)
{
    m.def("quantize_tiles", &quantize_tiles);
    m.def("quantize_tiles_scratch", &quantize_tiles_scratch);
}
"""


def build(wheel, work):
    from torch.utils.cpp_extension import load
    with zipfile.ZipFile(wheel) as z:
        names = [n for n in z.namelist() if n.startswith("exllamav3/exllamav3_ext/")]
        z.extractall(work, names)
    ext = os.path.join(work, "exllamav3", "exllamav3_ext")
    q = os.path.join(ext, "quant")
    srcs = [os.path.join(q, "quantize.cu"), os.path.join(q, "exl3_devctx.cu")]
    srcs += [os.path.join(q, "comp_units", "quantize_tiles_inst_k%d.cu" % k) for k in range(1, 9)]
    srcs += [os.path.join(q, "comp_units", "quantize_tiles_frac_inst.cu")]
    b = os.path.join(work, "binding.cpp")
    with open(b, "w") as f:
        f.write(BINDING)
    bd = os.path.join(work, "build")
    os.makedirs(bd, exist_ok=True)
    return load(name="exl3_tiles", sources=[b] + srcs, build_directory=bd, extra_include_paths=[ext],
                extra_cuda_cflags=["-O3", "-lineinfo"], extra_cflags=["-O3"], verbose=False)


def scratch(mod, torch, K, cb):
    """The buffers exllamav3's get_temp_buffers (modules/quant/exl3_lib/quantize.py) allocates."""
    dev = torch.cuda.current_device()
    optimized, wave = mod.quantize_tiles_scratch(dev, K, cb == 1, cb == 2, 256)
    if optimized:
        cols = (65536 >> K) // (8 if K == 1 else 1)
        return (torch.empty((1,), dtype=torch.half, device="cuda"),
                torch.empty((wave, 256, cols), dtype=torch.uint8, device="cuda"), optimized)
    mb = 256
    if K >= 4:
        mb = max(256, {7: 4, 8: 8}.get(K, 2) * torch.cuda.get_device_properties(dev).multi_processor_count)
    return (torch.zeros((mb, 2, 65536 >> K), dtype=torch.half, device="cuda"),
            torch.zeros((mb, 256, 65536 >> K), dtype=torch.short, device="cuda"), optimized)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("wheel")
    ap.add_argument("--k", default="2,3,4,5,6")
    ap.add_argument("--tiles", type=int, default=8448)
    ap.add_argument("--reps", type=int, default=2)
    ap.add_argument("--cb", default="mul1", choices=["mul1", "mcg", "3inst"])
    a = ap.parse_args()
    import torch
    cb = {"3inst": 0, "mcg": 1, "mul1": 2}[a.cb]
    t0 = time.time()
    with tempfile.TemporaryDirectory() as work:
        mod = build(a.wheel, work)
        print("built exllamav3's quantize_tiles in %.0f s" % (time.time() - t0))
        print(" K  cb     kernel     tiles  tiles/s  weights/s  mse/weight")
        g = torch.Generator(device="cuda").manual_seed(1)
        for K in [int(k) for k in a.k.split(",")]:
            x = torch.randn((a.tiles, 256), generator=g, device="cuda", dtype=torch.float)
            out = torch.zeros_like(x)
            idx = torch.zeros_like(x, dtype=torch.short)
            tc, te, opt = scratch(mod, torch, K, cb)
            w = min(a.tiles, 512)
            mod.quantize_tiles(x[:w], out[:w], idx[:w], tc, te, K, cb == 1, cb == 2)
            torch.cuda.synchronize()
            best = 0.0
            for _ in range(a.reps):
                s = time.time()
                mod.quantize_tiles(x, out, idx, tc, te, K, cb == 1, cb == 2)
                torch.cuda.synchronize()
                best = max(best, a.tiles / (time.time() - s))
            mse = float(((out - x) ** 2).mean())
            print("%2d  %-5s  %-9s  %6d  %7.0f  %9.3g  %.5f" % (K, a.cb, "optimized" if opt else "generic", a.tiles,
                                                                best, best * 256, mse))
            sys.stdout.flush()


if __name__ == "__main__":
    main()
