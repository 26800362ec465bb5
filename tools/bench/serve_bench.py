#!/usr/bin/env python3
"""tools/bench/serve_bench.py — aggregate decode throughput of `sparq serve`
with C concurrent clients against one client at a time, in the same run on
the same server (standard library only).

    python3 tools/bench/serve_bench.py build/cli/sparq MODEL [--parallel 4] [--requests 16] [--tokens 128]
        [--threads T] [--np N]     (--np: `mpirun -np N sparq serve BUNDLE`)

Starts `sparq serve MODEL --port 0 --parallel P`, warms it up, then sends
--requests completions (greedy, max_tokens = --tokens, a different prompt
each, ignoring nothing: finish_reason is counted) once sequentially and once
from P client threads at a time, and prints tokens/s of each and the ratio.
"""
import argparse
import http.client
import json
import re
import subprocess
import sys
import threading
import time

PROMPTS = ["The file system", "A journal file", "Memory allocation", "The SQLite library", "In the beginning",
           "The page cache", "A B-tree index", "The virtual table"]


def post(port, prompt, tokens):
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=600)
    c.request("POST", "/v1/completions", body=json.dumps(
        {"prompt": prompt, "max_tokens": tokens, "temperature": 0}))
    r = json.loads(c.getresponse().read())
    c.close()
    return r["usage"]["completion_tokens"]


def run(port, n, tokens, conc):
    done = [0]
    lock = threading.Lock()
    jobs = list(range(n))

    def worker():
        while True:
            with lock:
                if not jobs:
                    return
                i = jobs.pop()
            t = post(port, PROMPTS[i % len(PROMPTS)] + " " * (i // len(PROMPTS)), tokens)
            with lock:
                done[0] += t

    t0 = time.perf_counter()
    th = [threading.Thread(target=worker) for _ in range(conc)]
    for t in th:
        t.start()
    for t in th:
        t.join()
    return done[0], time.perf_counter() - t0


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("sparq")
    ap.add_argument("model")
    ap.add_argument("--parallel", type=int, default=4)
    ap.add_argument("--requests", type=int, default=16)
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--threads", type=int, default=0)
    ap.add_argument("--np", type=int, default=0, help="run under mpirun with this many ranks (a bundle for that many boxes)")
    a = ap.parse_args()
    cmd = [a.sparq, "serve", a.model, "--port", "0", "--parallel", str(a.parallel)]
    if a.np:
        cmd = ["mpirun", "--oversubscribe", "-np", str(a.np)] + cmd
    if a.threads:
        cmd += ["--threads", str(a.threads)]
    srv = subprocess.Popen(cmd, stderr=subprocess.PIPE, text=True)
    line = srv.stderr.readline()
    m = re.search(r"http://127\.0\.0\.1:(\d+) ", line)
    if not m:
        print("server did not start: " + line + srv.stderr.read(), file=sys.stderr)
        return 1
    port = int(m.group(1))
    try:
        run(port, 2, 16, 1)  # warm-up
        tok1, t1 = run(port, a.requests, a.tokens, 1)
        tokc, tc = run(port, a.requests, a.tokens, a.parallel)
    finally:
        srv.terminate()
        srv.wait()
    print("sparq serve %s, %d requests x %d tokens, greedy" % (a.model, a.requests, a.tokens))
    print("%-28s %10s %9s %10s" % ("clients", "tokens", "s", "tok/s"))
    print("%-28s %10d %9.2f %10.1f" % ("1 at a time", tok1, t1, tok1 / t1))
    print("%-28s %10d %9.2f %10.1f" % ("%d at once (--parallel %d)" % (a.parallel, a.parallel), tokc, tc, tokc / tc))
    print("aggregate speedup: %.2fx" % ((tokc / tc) / (tok1 / t1)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
