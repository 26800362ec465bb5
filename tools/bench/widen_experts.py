#!/usr/bin/env python3
"""tools/bench/widen_experts.py — a larger runnable model for load benchmarks.

    python3 tools/bench/widen_experts.py tests/data/tiny-qwen3moe OUT --experts 1024

Copies a Qwen3-MoE model directory (bf16, one model.safetensors) to OUT with E routed experts
per layer instead of its own: expert e is a copy of expert e % E0, the router gets row e % E0,
so the weights are the trained model's (finite, sane) and the model runs, just with many more
bytes (tiny-qwen3moe at --experts 1024: 0.8 GB). Standard library only.
"""
import argparse
import json
import os
import re
import shutil
import struct

ap = argparse.ArgumentParser()
ap.add_argument("model")
ap.add_argument("out")
ap.add_argument("--experts", type=int, required=True)
a = ap.parse_args()

cfg = json.load(open(os.path.join(a.model, "config.json")))
e0 = cfg.get("num_local_experts", cfg.get("num_experts"))
src = open(os.path.join(a.model, "model.safetensors"), "rb")
n = struct.unpack("<Q", src.read(8))[0]
hdr = json.loads(src.read(n))
base = 8 + n
meta = hdr.pop("__metadata__", None)


def data(name):
    lo, hi = hdr[name]["data_offsets"]
    src.seek(base + lo)
    return src.read(hi - lo)


pat = re.compile(r"^(model\.layers\.\d+\.mlp\.experts\.)(\d+)(\..*)$")
out = []  # (name, dtype, shape, source name, router rows)
for name in sorted(hdr):
    m = pat.match(name)
    if m:
        if int(m.group(2)) == 0:
            for e in range(a.experts):
                out.append((m.group(1) + str(e) + m.group(3), name.replace(".experts.0.", ".experts.%d." % (e % e0))))
        continue
    out.append((name, name))

os.makedirs(a.out, exist_ok=True)
new_hdr, off, parts = {}, 0, []
for name, from_name in out:
    t = hdr[from_name]
    shape = list(t["shape"])
    if name.endswith(".mlp.gate.weight"):  # the router: [E0, d] -> [E, d]
        shape[0] = a.experts
        blob = data(from_name)
        row = len(blob) // e0
        blob = b"".join(blob[(e % e0) * row:(e % e0 + 1) * row] for e in range(a.experts))
    else:
        blob = None
    size = len(blob) if blob is not None else hdr[from_name]["data_offsets"][1] - hdr[from_name]["data_offsets"][0]
    new_hdr[name] = {"dtype": t["dtype"], "shape": shape, "data_offsets": [off, off + size]}
    parts.append((from_name, blob))
    off += size
if meta:
    new_hdr["__metadata__"] = meta
hj = json.dumps(new_hdr, separators=(",", ":")).encode()
hj += b" " * ((8 - (8 + len(hj)) % 8) % 8)
with open(os.path.join(a.out, "model.safetensors"), "wb") as f:
    f.write(struct.pack("<Q", len(hj)))
    f.write(hj)
    for from_name, blob in parts:
        f.write(blob if blob is not None else data(from_name))
cfg["num_local_experts"] = a.experts
cfg.pop("num_experts", None)
with open(os.path.join(a.out, "config.json"), "w") as f:
    json.dump(cfg, f, indent=2)
for fn in os.listdir(a.model):
    if fn.endswith(".json") and fn != "config.json" or fn.endswith(".jinja"):
        shutil.copy(os.path.join(a.model, fn), os.path.join(a.out, fn))
print("%s: %d experts per layer, %.3f GB" % (a.out, a.experts, (8 + len(hj) + off) / 1e9))
