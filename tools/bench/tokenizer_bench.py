#!/usr/bin/env python3
"""Encode throughput, sparq vs HF tokenizers, one thread, same text, same run.

    ninja -C build tools/bench/tokenizer_bench
    python3 tools/bench/tokenizer_bench.py build/tools/bench/tokenizer_bench [TEXT]

TEXT defaults to a ~4 MB text assembled deterministically from
tests/data/text/{calib,eval}.txt and the plain-text files under
/usr/share/doc and /usr/share/common-licenses (gzip'ed ones decompressed),
taken in sorted order until 4 MB. For each tokenizer (the exl3-model one:
Qwen2 regex + NFC, 4k vocab; DeepSeek V4: three Split regexes, 128k vocab)
it prints MB/s of both, the ratio sparq/HF, and checks the id counts agree
(sparq's ids are checked exactly by the tests). HF runs with
RAYON_NUM_THREADS=1. Two modes, both sides doing the same calls: "chunks"
encodes each blank-line-separated paragraph on its own (many short calls),
"whole" encodes the text as one string (HF is slow on a single multi-MB
string). Both take the best of 3.
"""
import glob
import gzip
import os
import subprocess
import sys
import tempfile
import time

os.environ["RAYON_NUM_THREADS"] = "1"
os.environ["TOKENIZERS_PARALLELISM"] = "false"
import tokenizers  # noqa: E402

TOKS = [("exl3-model (Qwen2 regex, NFC, 4k)", "tests/data/exl3-model/exl3-3.0bpw/tokenizer.json.zst"),
        ("deepseek-v4 (3 Splits, 128k)", "tests/data/tokenizer/deepseek-v4/tokenizer.json.zst")]


def build_text(path, limit=4 << 20):
    parts, size = [], 0
    files = ["tests/data/text/calib.txt", "tests/data/text/eval.txt"]
    files += sorted(glob.glob("/usr/share/common-licenses/*")) + sorted(glob.glob("/usr/share/doc/*/*"))
    for f in files:
        if size >= limit or not os.path.isfile(f):
            continue
        try:
            data = gzip.open(f).read() if f.endswith(".gz") else open(f, "rb").read()
            data.decode("utf-8")
        except (OSError, UnicodeDecodeError, EOFError):
            continue
        parts.append(data)
        size += len(data)
    open(path, "wb").write(b"\n".join(parts)[:limit].decode("utf-8", "ignore").encode("utf-8"))


def main():
    bench = sys.argv[1]
    tmp = tempfile.mkdtemp()
    text_path = sys.argv[2] if len(sys.argv) > 2 else os.path.join(tmp, "bench.txt")
    if len(sys.argv) <= 2:
        build_text(text_path)
    text = open(text_path, "rb").read().decode("utf-8")
    nbytes = len(text.encode("utf-8"))
    print(f"text: {text_path}, {nbytes} bytes; tokenizers {tokenizers.__version__}, one thread")
    for name, tf in TOKS:
        if tf.endswith(".zst"):
            plain = os.path.join(tmp, os.path.basename(tf)[:-4])
            with open(plain, "wb") as f:
                f.write(subprocess.run(["zstd", "-d", "-c", tf], check=True, capture_output=True).stdout)
            tf = plain
        hf = tokenizers.Tokenizer.from_file(tf)
        for mode in ("chunks", "whole"):
            pieces = text.split("\n\n") if mode == "chunks" else [text]
            best, n_hf = 1e30, 0
            for _ in range(3):
                t0 = time.perf_counter()
                n_hf = sum(len(hf.encode(p, add_special_tokens=False).ids) for p in pieces)
                best = min(best, time.perf_counter() - t0)
            hf_mbs = nbytes / best / 1e6
            out = subprocess.run([bench, tf, text_path, "3", mode], check=True, capture_output=True,
                                 text=True).stdout.split()
            kv = dict(zip(out[::2], out[1::2]))
            sq_mbs = float(kv["mb_per_s"])
            agree = "same id count" if int(kv["ids"]) == n_hf else f"ID COUNT DIFFERS ({kv['ids']} vs {n_hf})"
            print(f"{name:34s} {mode:6s} sparq {sq_mbs:7.2f} MB/s  HF {hf_mbs:6.2f} MB/s  "
                  f"ratio {sq_mbs / hf_mbs:5.2f}x  ({agree}, {len(pieces)} calls)")


if __name__ == "__main__":
    main()
