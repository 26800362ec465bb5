# tests/lib.sh — what the shell tests share: where sparq and the test data are, a
# temporary folder removed at exit, the pass / fail counters and the closing
# "N passed, N failed" line, and the small checks several tests make. POSIX sh
# (dash runs it under meson), clean under `set -u`.
#
# A test sources it first, by its own path (meson runs `sh /abs/path/test_x.sh`,
# so $0 names the script; by hand, from the source root, `sh tests/x/test_x.sh`):
#     . "$(dirname "$0")/../lib.sh"
# and ends with `finish`.
#
# Sourcing it sets
#   SPARQ       the sparq binary: the script's first argument when meson passes one,
#               else $SPARQ_BIN (tests/meson.build's test_env), else build/cli/sparq
#   D           the test data: $SPARQ_TEST_DATA (meson: BUILD/tests/data, the unpacked
#               copy of tests/data), else build/tests/data
#   T           a new empty folder under $TMPDIR (default /tmp) named after the script;
#               the EXIT trap calls cleanup, which removes it
#   PIDS        background processes cleanup kills first: PIDS="$PIDS $!" after starting
#               one (a server); a test that must end more defines its own cleanup()
#   pass, fail  0, the counters ok and bad advance

SPARQ=${1:-${SPARQ_BIN:-build/cli/sparq}}
D=${SPARQ_TEST_DATA:-build/tests/data}
PIDS=""
pass=0
fail=0
T=$(mktemp -d "${TMPDIR:-/tmp}/sparq-$(basename "$0" .sh)-XXXXXX") || { echo "FAIL: mktemp -d"; exit 1; }

# cleanup: the EXIT trap's action: kill every process in $PIDS, remove $T.
cleanup() {
  for p in $PIDS; do kill "$p" 2>/dev/null; done
  rm -rf "$T"
}
trap cleanup EXIT

# ok [CMD ARG...]: without arguments, count a passed check (`test && ok || bad "..."`);
# with a command, run it and count a pass if it succeeds, else a failure named by it.
ok() {
  if [ $# -eq 0 ] || "$@"; then pass=$((pass + 1)); else bad "$*"; fi
}

# bad MESSAGE...: count a failed check and say which on stderr ("FAIL: MESSAGE").
bad() {
  fail=$((fail + 1))
  echo "FAIL: $*" >&2
}

# skip REASON...: end the test as skipped (exit 77, which meson counts as a skip),
# printing "SKIP: REASON".
skip() {
  echo "SKIP: $*"
  exit 77
}

# need COMMAND: skip the test unless COMMAND is on PATH ("SKIP: COMMAND not found").
need() {
  command -v "$1" >/dev/null 2>&1 || skip "$1 not found"
}

# need_mpi: skip the test unless mpirun is on PATH and sparq was built with MPI; let
# mpirun run as root and start more ranks than there are cores (--oversubscribe).
need_mpi() {
  need mpirun
  "$SPARQ" version | grep -q "mpi: yes" || skip "sparq built without MPI"
  export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
}

# finish: print "N passed, N failed" and exit 0 if nothing failed, else 1.
finish() {
  echo "$pass passed, $fail failed"
  [ "$fail" -eq 0 ] && exit 0
  exit 1
}

# num KEY FILE: the number after "KEY": in a JSON file (one key a line, as sparq's
# --json writes it); empty when there is none.
num() {
  sed -n "s/.*\"$1\": \([-0-9.e+]*\).*/\1/p" "$2"
}

# lt A B: true if the number A is below the number B (decimals and exponents too).
lt() {
  awk -v a="$1" -v b="$2" 'BEGIN { exit !(a + 0 < b + 0) }'
}

# flip FILE OFFSET: XOR 0x40 into the byte at OFFSET of FILE, in place (a bit of damage
# that keeps the size).
flip() {
  _b=$(od -An -tu1 -j "$2" -N1 "$1")
  # shellcheck disable=SC2059 # the format is the byte, as an octal escape
  printf "\\$(printf %03o $((_b ^ 64)))" | dd of="$1" bs=1 seek="$2" conv=notrunc 2>/dev/null
}

# edit_model SRC OUT PYTHON: a copy of the model folder SRC (its *.json files and its one
# model.safetensors) in OUT, edited by PYTHON, which runs with cfg (config.json as a dict),
# ts (tensor name -> [dtype, shape, bytes]) and d (OUT); config.json and model.safetensors
# are then written from cfg and ts. Needs python3.
edit_model() {
  mkdir -p "$2"
  cp "$1"/*.json "$2/"
  python3 - "$1/model.safetensors" "$2" "$3" <<'PY'
import json, struct, sys
src, d, code = sys.argv[1], sys.argv[2], sys.argv[3]
with open(src, "rb") as f:
    n = struct.unpack("<Q", f.read(8))[0]
    hdr = json.loads(f.read(n))
    data = f.read()
hdr.pop("__metadata__", None)
ts = {k: [v["dtype"], v["shape"], data[v["data_offsets"][0]:v["data_offsets"][1]]] for k, v in hdr.items()}
cfg = json.load(open(d + "/config.json"))
exec(code)
json.dump(cfg, open(d + "/config.json", "w"), indent=1)
out, off, body = {}, 0, b""
for k in sorted(ts):
    dt, sh, b = ts[k]
    out[k] = {"dtype": dt, "shape": sh, "data_offsets": [off, off + len(b)]}
    off += len(b)
    body += b
h = json.dumps(out).encode()
h += b" " * (-len(h) % 8)
with open(d + "/model.safetensors", "wb") as f:
    f.write(struct.pack("<Q", len(h)) + h + body)
PY
}

# serve_port LOG [PID]: wait up to 30 s for `sparq serve --port 0` to say where it
# listens in LOG (its stderr) and print the port; returns 1 if it does not, or as soon
# as process PID (the server) has exited.
serve_port() {
  _i=0
  while [ $_i -lt 300 ]; do
    _port=$(sed -n 's/.*on http:\/\/127\.0\.0\.1:\([0-9]*\) .*/\1/p' "$1")
    [ -n "$_port" ] && { echo "$_port"; return 0; }
    [ -n "${2:-}" ] && ! kill -0 "$2" 2>/dev/null && return 1
    sleep 0.1
    _i=$((_i + 1))
  done
  return 1
}
