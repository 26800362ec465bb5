#!/usr/bin/env python3
"""tools/test-summary.py — fold meson testlog.json files into one closing line.

Prints each failed or skipped test by name, then "N passed, N failed, N skipped".
A test counts as failed unless meson recorded OK, EXPECTEDFAIL or SKIP."""
import json
import sys

passed = failed = skipped = 0
for path in sys.argv[1:]:
    try:
        lines = open(path, encoding="utf-8").read().splitlines()
    except FileNotFoundError:
        # meson writes no log when a suite has no tests in that build dir
        print(f"test-summary: {path}: no tests ran there")
        continue
    for line in lines:
        if not line.strip():
            continue
        t = json.loads(line)
        res = t.get("result")
        name = t.get("name", "?")
        if res in ("OK", "EXPECTEDFAIL"):
            passed += 1
        elif res == "SKIP":
            skipped += 1
            why = next((ln[5:].strip() for ln in (t.get("stdout") or "").splitlines()
                        if ln.startswith("SKIP:")), "no reason given")
            print(f"skipped: {name}: {why}")
        else:
            failed += 1
            print(f"FAILED: {name} ({res})")
print(f"{passed} passed, {failed} failed, {skipped} skipped")
sys.exit(1 if failed else 0)
