#!/bin/sh
# tests/runtime/test_serve_cli.sh — `sparq serve` end to end on the fixture
# model, driven by a Python standard-library client: /health, /v1/models;
# greedy completions and chat equal `sparq run` (whole and streamed), stop
# strings (also across stream chunks), seeds, usage chunks; concurrent
# requests each equal to their own `sparq run`; error answers
# (bad JSON, unsupported fields, 404, 405, malformed HTTP, chunked bodies,
# oversized bodies, a prompt longer than the context); a client that hangs up
# mid-stream; --api-key; SIGTERM; usage errors and a busy port; and (issue 26)
# half-open connections, the header timeout, NUL-only / short / oversized
# requests, /health with every worker busy, non-streaming clients that go away,
# --max-connections and the open-file limit.
. "$(dirname "$0")/../lib.sh"
M="$D/tiny-qwen3moe"
[ -f "$M/config.json" ] || skip "$M/config.json missing"
need python3
# what every Python client below shares (PYTHONPATH="$T"): the port (argv[1]), checks, requests
cat >"$T/sq_client.py" <<'EOF'
import http.client, json, sys
port = int(sys.argv[1])
passed = failed = 0
def check(cond, what):
    global passed, failed
    if cond: passed += 1
    else:
        failed += 1
        print("FAIL:", what)
def summary():
    print("py: %d passed, %d failed" % (passed, failed))
    sys.exit(1 if failed else 0)
def req(method, path, body=None, headers=None, timeout=60):
    """(status, Content-Type, body); status 0 and the error when the connection failed"""
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    data = json.dumps(body) if isinstance(body, (dict, list)) else body
    try:
        c.request(method, path, body=data, headers=headers or {})
        r = c.getresponse()
        raw = r.read()
    except OSError as e:
        return 0, None, repr(e).encode()
    finally:
        c.close()
    return r.status, r.getheader("Content-Type"), raw
EOF

# start_server LOG ARGS...: start in the background, wait for its port
start_server() {
  log=$1; shift
  "$SPARQ" serve "$M" --port 0 --threads 1 "$@" 2>"$log" &
  PIDS="$PIDS $!"
  LAST_PID=$!
  LAST_PORT=$(serve_port "$log" $LAST_PID) && return 0
  echo "server did not start: $(cat "$log")" >&2
  return 1
}

# references from `sparq run`
"$SPARQ" run "$M" -p "The file system" -n 24 --temp 0 2>/dev/null >"$T/run_greedy" || bad "sparq run (reference)"
"$SPARQ" run "$M" --chat -p "Hello" -n 12 --temp 0 2>/dev/null >"$T/run_chat" || bad "sparq run --chat (reference)"
# two interactive turns whose first reply ends on -n: its last token was never run through the
# model, and the second turn must not take it for cached (session.c)
printf 'Hello\nAnd then?\n' | "$SPARQ" run "$M" --chat -n 6 --temp 0 2>/dev/null >"$T/run_turns" || bad "sparq run --chat, 2 turns"

set --  # "$@" collects the prompts and their references (an argument given to the script is sparq: lib.sh)
for i in 1 2 3; do
  p=$(sed -n "${i}p" <<'PROMPTS'
The SQLite library
A journal file
Memory allocation
PROMPTS
)
  "$SPARQ" run "$M" -p "$p" -n 24 --temp 0 2>/dev/null >"$T/run_c$i" || bad "sparq run (reference $i)"
  set -- "$@" "$p" "$T/run_c$i"
done
start_server "$T/log" --ctx 256 --parallel 3 && ok || bad "server starts"
PORT=$LAST_PORT; SPID=$LAST_PID
grep -q "tiny-qwen3moe on http://127.0.0.1:$PORT" "$T/log" && ok || bad "start-up line names model and address"

PYTHONPATH="$T" python3 - "$PORT" "$T/run_greedy" "$T/run_chat" "$T/run_turns" "$@" >"$T/py.out" 2>&1 <<'EOF'
import json, socket, sys
from sq_client import port, check, summary, req
greedy = open(sys.argv[2], encoding="utf-8").read()
assert greedy.startswith("The file system") and greedy.endswith("\n")
greedy = greedy[len("The file system"):-1]
chat_ref = open(sys.argv[3], encoding="utf-8").read()[:-1]

def post(path, body, **kw):
    s, ct, raw = req("POST", path, body, **kw)
    return s, (json.loads(raw) if ct == "application/json" else raw)

def stream(path, body):
    s, ct, raw = req("POST", path, body)
    check(s == 200 and ct == "text/event-stream", "stream status %s %s" % (s, ct))
    events = [e[len("data: "):] for e in raw.decode("utf-8").split("\n\n") if e]
    check(events and events[-1] == "[DONE]", "stream ends with [DONE]")
    return [json.loads(e) for e in events[:-1]]

def raw_request(data):
    s = socket.create_connection(("127.0.0.1", port), timeout=30)
    s.sendall(data)
    out = b""
    while True:
        b = s.recv(65536)
        if not b: break
        out += b
    s.close()
    return out

s, ct, raw = req("GET", "/health")
h = json.loads(raw)
check(s == 200 and h["status"] == "ok" and h["slots"] == 3 and h["active"] == 0, "/health: %s" % h)
s, m = post("/v1/models", {})
check(s == 405, "POST /v1/models is 405")
s, ct, raw = req("GET", "/v1/models")
check(s == 200 and json.loads(raw)["data"][0]["id"] == "tiny-qwen3moe", "/v1/models names the model")

# greedy completion == sparq run
s, r = post("/v1/completions", {"prompt": "The file system", "max_tokens": 24, "temperature": 0})
check(s == 200, "completion status %s %s" % (s, r))
c = r["choices"][0]
check(c["text"] == greedy, "greedy completion equals sparq run: %r vs %r" % (c["text"], greedy))
check(c["finish_reason"] == "length", "finish_reason length")
check(r["object"] == "text_completion" and r["model"] == "tiny-qwen3moe" and r["id"].startswith("cmpl-"), "envelope")
check(r["usage"]["completion_tokens"] == 24 and r["usage"]["prompt_tokens"] > 0 and
      r["usage"]["total_tokens"] == r["usage"]["prompt_tokens"] + 24, "usage %s" % r["usage"])

# streamed: the same text in pieces
ch = stream("/v1/completions", {"prompt": "The file system", "max_tokens": 24, "temperature": 0, "stream": True})
check("".join(x["choices"][0]["text"] for x in ch) == greedy, "streamed text equals the whole one")
check(ch[-1]["choices"][0]["finish_reason"] == "length" and all(x["choices"][0]["finish_reason"] is None for x in ch[:-1]),
      "only the last chunk has a finish_reason")
check(len(ch) >= 2, "text chunks and a final chunk (%d)" % len(ch))  # how many depends on timing

# stop strings: cut before the stop, finish_reason stop; the same when streamed (the stop spans chunks)
words = greedy.split(" ")
stop = " ".join(words[3:5])
check(len(stop) > 3 and stop in greedy, "a stop string from the greedy text: %r" % stop)
want = greedy[:greedy.index(stop)]
s, r = post("/v1/completions", {"prompt": "The file system", "max_tokens": 24, "temperature": 0, "stop": [stop, "zzzz"]})
check(r["choices"][0]["text"] == want and r["choices"][0]["finish_reason"] == "stop", "stop string: %r" % r["choices"][0])
ch = stream("/v1/completions", {"prompt": "The file system", "max_tokens": 24, "temperature": 0, "stop": stop, "stream": True})
check("".join(x["choices"][0]["text"] for x in ch) == want and ch[-1]["choices"][0]["finish_reason"] == "stop",
      "streamed stop string")

# seeds: same seed, same text
a = post("/v1/completions", {"prompt": "The file", "max_tokens": 16, "temperature": 0.9, "seed": 7})[1]["choices"][0]["text"]
b = post("/v1/completions", {"prompt": "The file", "max_tokens": 16, "temperature": 0.9, "seed": 7})[1]["choices"][0]["text"]
check(a == b and len(a) > 0, "same seed, same text")

# chat == sparq run --chat, whole and streamed (with the usage chunk)
body = {"messages": [{"role": "user", "content": "Hello"}], "max_tokens": 12, "temperature": 0}
s, r = post("/v1/chat/completions", body)
check(s == 200 and r["object"] == "chat.completion", "chat status")
msg = r["choices"][0]["message"]
check(msg["role"] == "assistant" and msg["content"] == chat_ref, "chat equals sparq run --chat: %r vs %r" % (msg["content"], chat_ref))
ch = stream("/v1/chat/completions", dict(body, stream=True, stream_options={"include_usage": True}))
check(ch[0]["choices"][0]["delta"].get("role") == "assistant", "first chat chunk carries the role")
check("".join(x["choices"][0]["delta"].get("content", "") for x in ch if x["choices"]) == chat_ref, "streamed chat text")
check(ch[-1]["choices"] == [] and ch[-1]["usage"]["completion_tokens"] == r["usage"]["completion_tokens"], "usage chunk")
check(all(x["object"] == "chat.completion.chunk" for x in ch), "chunk objects")
# a second turn reuses the first (prefix cache): still answers
body2 = {"messages": [{"role": "user", "content": "Hello"}, {"role": "assistant", "content": chat_ref},
                      {"role": "user", "content": "And then?"}], "max_tokens": 8, "temperature": 0}
s, r = post("/v1/chat/completions", body2)
check(s == 200 and r["usage"]["prompt_tokens"] > 12, "second chat turn")

# concurrent requests (3 slots): each equals its own sparq run, whatever runs beside it
import threading
refs = [(p, open(f, encoding="utf-8").read()[len(p):-1]) for p, f in zip(sys.argv[5::2], sys.argv[6::2])]
results = {}
def one(p):
    results[p] = post("/v1/completions", {"prompt": p, "max_tokens": 24, "temperature": 0})[1]["choices"][0]["text"]
threads = [threading.Thread(target=one, args=(p,)) for p, _ in refs for _ in range(2)]
for t in threads: t.start()
for t in threads: t.join()
for p, want in refs:
    check(results.get(p) == want, "concurrent %r: %r vs sparq run %r" % (p, results.get(p), want))
s, ct, raw = req("GET", "/health")
h = json.loads(raw)
check(h["active"] == 0 and h["queued"] == 0 and h["completed"] >= 6, "/health after the concurrent requests: %s" % h)

# sparq run's second interactive turn equals the whole conversation sent at once
turns = open(sys.argv[4], encoding="utf-8").read().split("\n")
s, r = post("/v1/chat/completions", {"messages": [{"role": "user", "content": "Hello"},
            {"role": "assistant", "content": turns[0]}, {"role": "user", "content": "And then?"}],
            "max_tokens": 6, "temperature": 0})
check(s == 200 and r["choices"][0]["message"]["content"] == turns[1],
      "run's second turn %r vs the conversation at once %r" % (turns[1], r["choices"][0]["message"]["content"]))

# errors: each a JSON error naming the problem
def err(path, body, status, needle, param=None):
    s, r = post(path, body)
    e = r.get("error", {}) if isinstance(r, dict) else {}
    check(s == status and needle in e.get("message", "") and (param is None or e.get("param") == param),
          "%s %r -> %s %r" % (path, body, s, r))
err("/v1/completions", "{\"prompt\": ", 400, "not valid JSON")
err("/v1/completions", {"prompt": "a", "n": 2}, 400, "only one completion", "n")
err("/v1/completions", {"prompt": "a", "temperature": -1}, 400, "temperature", "temperature")
err("/v1/chat/completions", {"messages": "hi"}, 400, "messages", "messages")
err("/v1/completions", {"prompt": "word " * 400, "max_tokens": 4}, 400, "context")
err("/v1/nothing", {}, 404, "no such endpoint")
s, ct, raw = req("GET", "/v1/completions")
check(s == 405, "GET /v1/completions is 405")
out = raw_request(b"BREW /pot HTTP/1.1\r\n\r\n")
check(out.startswith(b"HTTP/1.1 404"), "unknown path with an unknown method: 404 (%r)" % out[:40])
out = raw_request(b"GET /health HTTP/9.9\r\n\r\n")
check(out.startswith(b"HTTP/1.1 505"), "HTTP/9.9 is 505 (%r)" % out[:40])
out = raw_request(b"garbage\r\n\r\n")
check(out.startswith(b"HTTP/1.1 400") and b"request line" in out, "malformed request line is 400")
out = raw_request(b"POST /v1/completions HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n")
check(out.startswith(b"HTTP/1.1 501") and b"Content-Length" in out, "chunked body is 501")
out = raw_request(b"POST /v1/completions HTTP/1.1\r\nContent-Length: 99999999\r\n\r\n")
check(out.startswith(b"HTTP/1.1 413"), "oversized body is 413")

# a client that hangs up mid-stream: the server carries on
sk = socket.create_connection(("127.0.0.1", port), timeout=30)
body = json.dumps({"prompt": "The file", "max_tokens": 200, "temperature": 0, "stream": True, "ignore": 1}).encode()
sk.sendall(b"POST /v1/completions HTTP/1.1\r\nContent-Length: %d\r\n\r\n" % len(body) + body)
sk.recv(200)
sk.close()
s, ct, raw = req("GET", "/health")
check(s == 200, "server alive after a client hung up mid-stream")
summary()
EOF
rc=$?
cat "$T/py.out"
[ $rc -eq 0 ] && ok || bad "python client checks (see above)"

kill -TERM $SPID
wait $SPID; src=$?
[ $src -eq 0 ] && ok || bad "SIGTERM: exit 0 (got $src)"
grep -q "stopped after [0-9]* requests" "$T/log" && ok || bad "SIGTERM: stop line ($(tail -2 "$T/log"))"

# --api-key: /v1 needs the bearer key, /health does not
start_server "$T/log2" --api-key s3cret && ok || bad "server with --api-key starts"
python3 - "$LAST_PORT" >"$T/py2.out" 2>&1 <<'EOF'
import http.client, json, sys
port = int(sys.argv[1])
def get(path, headers={}):
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    c.request("GET", path, headers=headers)
    r = c.getresponse(); body = r.read(); c.close()
    return r.status, body
bad = 0
for hdrs, want in (({}, 401), ({"Authorization": "Bearer nope"}, 401), ({"Authorization": "Bearer s3cret"}, 200)):
    s, b = get("/v1/models", hdrs)
    if s != want: print("FAIL: /v1/models with %s: %s %s" % (hdrs, s, b)); bad += 1
    if s == 401 and json.loads(b)["error"]["type"] != "authentication_error": print("FAIL: 401 type"); bad += 1
s, b = get("/health")
if s != 200: print("FAIL: /health without a key: %s" % s); bad += 1
sys.exit(1 if bad else 0)
EOF
[ $? -eq 0 ] && ok || bad "api key checks: $(cat "$T/py2.out")"
P2=$LAST_PORT
# the port is taken: a clear error, exit 1
"$SPARQ" serve "$M" --port "$P2" --threads 1 >/dev/null 2>"$T/busy"; rc=$?
[ $rc -eq 1 ] && grep -q "cannot listen on 127.0.0.1 port $P2" "$T/busy" && ok || bad "busy port: exit $rc, $(cat "$T/busy")"
kill -INT $LAST_PID; wait $LAST_PID && ok || bad "SIGINT: exit 0"

# robustness (issue 26): half-open connections must not lock clients out (reading a request holds
# no worker; a slow header has --header-timeout), unauthenticated ones take no queue place, /health
# always answers, NUL-only / short / oversized requests get 400 / 408 / 413, a non-streaming client
# that goes away has its job cancelled within half a second, and open connections are capped.
start_server "$T/log3" --api-key k --parallel 2 --queue 4 --header-timeout 1 --request-timeout 2 && ok \
  || bad "server with --header-timeout starts"
R_PID=$LAST_PID
PYTHONPATH="$T" python3 - "$LAST_PORT" >"$T/py3.out" 2>&1 <<'EOF'
import json, socket, time
from sq_client import port, check, summary, req
KEY = {"Authorization": "Bearer k"}
def health():
    s, _, raw = req("GET", "/health", timeout=5)
    h = json.loads(raw) if s else {}
    return s, h if "status" in h else dict(h, status=None, active=-1, queued=-1)
def opened(data):
    sk = socket.create_connection(("127.0.0.1", port), timeout=10)
    if data: sk.sendall(data)
    return sk
def answer(sk, timeout):  # everything the server sends until it closes (or timeout)
    sk.settimeout(timeout)
    out = b""
    try:
        while True:
            b = sk.recv(65536)
            if not b: break
            out += b
    except OSError as e:
        out += b"<%s>" % type(e).__name__.encode()
    sk.close()
    return out
def timed(f):
    t = time.monotonic(); r = f(); return r, time.monotonic() - t

# 100 half-open connections (a request line, then nothing) and 8 unauthenticated ones with a body
# still to come: /health and an authenticated completion answer at once
half = [opened(b"GET /health HTTP/1.1\r\n") for _ in range(100)]
unauth = [opened(b"POST /v1/completions HTTP/1.1\r\nContent-Length: 100\r\n\r\n{") for _ in range(8)]
time.sleep(0.2)
(s, h), dt = timed(health)
check(s == 200 and h["status"] == "ok" and dt < 0.5, "/health beside 108 half-open connections: %s %s in %.2f s" % (s, h, dt))
(s, _, raw), dt = timed(lambda: req("POST", "/v1/completions", {"prompt": "The file", "max_tokens": 8, "temperature": 0}, KEY, 10))
check(s == 200 and dt < 2, "a completion beside 108 half-open connections: %s in %.2f s (%r)" % (s, dt, raw[:80]))
out = answer(unauth[0], 2)
check(out.startswith(b"HTTP/1.1 401"), "an unauthenticated request is answered 401 before its body: %r" % out[:40])
# the header timeout (1 s) answers a half-open connection with 408, long before --request-timeout
out, dt = timed(lambda: answer(half[0], 5))
check(out.startswith(b"HTTP/1.1 408") and dt < 1.6, "a half-open connection: 408 after --header-timeout (%.2f s, %r)" % (dt, out[:40]))
for sk in half + unauth: sk.close()

# NUL bytes only: 400 at once; a body shorter than its Content-Length: 408 after --request-timeout
nul = opened(b"\0" * 64)
short = opened(b"POST /v1/completions HTTP/1.1\r\nAuthorization: Bearer k\r\nContent-Length: 100\r\n\r\n{\"prompt\":")
out, dt = timed(lambda: answer(nul, 5))
check(out.startswith(b"HTTP/1.1 400") and dt < 0.5, "NUL-only request: 400 at once (%.2f s, %r)" % (dt, out[:40]))
out, dt = timed(lambda: answer(short, 5))
check(out.startswith(b"HTTP/1.1 408"), "a body shorter than Content-Length: 408 (%.2f s, %r)" % (dt, out[:40]))
# a body over 4 MiB, sent whole: a 413 answer, not a reset
big = b"x" * (5 << 20)
sk = socket.create_connection(("127.0.0.1", port), timeout=10)
sent = "whole"
try:
    sk.sendall(b"POST /v1/completions HTTP/1.1\r\nAuthorization: Bearer k\r\nContent-Length: %d\r\n\r\n" % len(big) + big)
except OSError as e:
    sent = repr(e)
out = answer(sk, 5)
check(sent == "whole" and out.startswith(b"HTTP/1.1 413") and not out.endswith(b">"),
      "a 5 MiB body: sent %s, then 413 and a clean close (%r)" % (sent, out[:40] + out[-24:]))

# every worker busy (2 slots + 4 queued, long non-streaming completions): /health still answers,
# one more completion is refused; then their clients go away and every job ends within 0.5 s
long_body = json.dumps({"prompt": "The file system", "max_tokens": 3000, "temperature": 0}).encode()
def long_req():
    return opened(b"POST /v1/completions HTTP/1.1\r\nAuthorization: Bearer k\r\nContent-Length: %d\r\n\r\n"
                  % len(long_body) + long_body)
busy = [long_req() for _ in range(6)]
t = time.monotonic()
while time.monotonic() - t < 5 and health()[1]["active"] < 2: time.sleep(0.05)
time.sleep(0.3)
(s, h), dt = timed(health)
check(s == 200 and h["active"] == 2 and h["queued"] == 4 and dt < 0.5,
      "/health with every worker busy: %s %s (%.2f s)" % (s, h, dt))
s, _, raw = req("POST", "/v1/completions", {"prompt": "a", "max_tokens": 1}, KEY, 10)
check(s == 503, "a completion beyond slots + queue: 503 (%s)" % s)
for sk in busy: sk.close()
t = time.monotonic()
while time.monotonic() - t < 10 and (h["active"] or h["queued"]):
    h = health()[1]
    time.sleep(0.02)
dt = time.monotonic() - t
check(h["active"] == 0 and h["queued"] == 0 and dt < 0.5, "6 non-streaming clients closed: every job ended in %.2f s" % dt)
check(h.get("cancelled") == 6, "/health counts the 6 cancelled jobs: %s" % h)
summary()
EOF
rc=$?
cat "$T/py3.out"
[ $rc -eq 0 ] && ok || bad "robustness checks (see above)"
kill -TERM $R_PID; wait $R_PID && ok || bad "SIGTERM after the robustness checks: exit 0"

# --max-connections: more sockets than it allows take no more descriptors, the oldest is answered
# 503 to make room, and /health answers
start_server "$T/log4" --max-connections 8 && ok || bad "server with --max-connections starts"
C_PID=$LAST_PID
PYTHONPATH="$T" python3 - "$LAST_PORT" "$C_PID" >"$T/py4.out" 2>&1 <<'EOF'
import os, socket, sys, time
from sq_client import port, check, summary, req
pid = sys.argv[2]
fds = lambda: len(os.listdir("/proc/%s/fd" % pid)) if os.path.isdir("/proc/%s/fd" % pid) else 0
base = fds()
socks = [socket.create_connection(("127.0.0.1", port), timeout=10) for _ in range(40)]
for sk in socks: sk.sendall(b"GET /health HTTP/1.1\r\n")
time.sleep(0.3)
n = fds()
check(n <= base + 8, "40 half-open sockets hold %d descriptors (%d before, --max-connections 8)" % (n, base))
t = time.monotonic()
s, _, raw = req("GET", "/health", timeout=5)
check(s == 200 and time.monotonic() - t < 0.5, "/health beside 40 sockets: %s" % s)
socks[0].settimeout(2)
try: first = socks[0].recv(100)
except OSError as e: first = repr(e).encode()
check(first.startswith(b"HTTP/1.1 503"), "the oldest connection, closed for a new one, is answered 503: %r" % first)
for sk in socks: sk.close()
summary()
EOF
[ $? -eq 0 ] && ok || bad "--max-connections: $(cat "$T/py4.out")"
kill -TERM $C_PID; wait $C_PID
# an open-file limit too low for --max-connections: raised to the hard limit, else the cap is lowered and said
( ulimit -n 200 && exec "$SPARQ" serve "$M" --port 0 --threads 1 --parallel 2 --queue 2 ) 2>"$T/log5" &
L_PID=$!; PIDS="$PIDS $L_PID"
i=0; while [ $i -lt 300 ] && ! grep -q " on http://" "$T/log5"; do sleep 0.1; i=$((i+1)); done
grep -q "max-connections 1024 lowered to 132 to fit the open-file limit (ulimit -n 200)" "$T/log5" && ok \
  || bad "a low open-file limit lowers --max-connections: $(cat "$T/log5")"
kill -TERM $L_PID; wait $L_PID

# usage errors: exit 2
"$SPARQ" serve "$M" --port 70000 >/dev/null 2>&1; [ $? -eq 2 ] && ok || bad "--port 70000 is a usage error"
"$SPARQ" serve >/dev/null 2>&1; [ $? -eq 2 ] && ok || bad "no MODEL is a usage error"
"$SPARQ" serve "$M" --header-timeout 0 >/dev/null 2>&1; [ $? -eq 2 ] && ok || bad "--header-timeout 0 is a usage error"
"$SPARQ" serve "$M" --max-connections 0 >/dev/null 2>&1; [ $? -eq 2 ] && ok || bad "--max-connections 0 is a usage error"
"$SPARQ" serve "$T/none" --port 0 >/dev/null 2>"$T/nomodel"; [ $? -eq 1 ] && grep -q "$T/none" "$T/nomodel" && ok \
  || bad "missing model: exit 1 naming it ($(cat "$T/nomodel"))"

finish
