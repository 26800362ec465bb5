#!/bin/sh
# tests/runtime/test_serve_cli.sh — `sparq serve` end to end on the fixture
# model, driven by a Python standard-library client: /health, /v1/models;
# greedy completions and chat equal `sparq run` (whole and streamed), stop
# strings (also across stream chunks), seeds, usage chunks; concurrent
# requests each equal to their own `sparq run`; error answers
# (bad JSON, unsupported fields, 404, 405, malformed HTTP, chunked bodies,
# oversized bodies, a prompt longer than the context); a client that hangs up
# mid-stream; --api-key; SIGTERM; usage errors and a busy port.
SPARQ="${SPARQ_BIN:?}"
M="${SPARQ_TEST_DATA:?}/tiny-qwen3moe"
[ -f "$M/config.json" ] || { echo "SKIP: $M/config.json missing"; exit 77; }
command -v python3 >/dev/null || { echo "SKIP: python3 not found"; exit 77; }
T=$(mktemp -d)
PIDS=""
trap 'for p in $PIDS; do kill $p 2>/dev/null; done; rm -rf "$T"' EXIT
pass=0; fail=0
ok() { pass=$((pass+1)); }
bad() { fail=$((fail+1)); echo "FAIL: $*" >&2; }

# start_server LOG ARGS...: start in the background, wait for its port
start_server() {
  log=$1; shift
  "$SPARQ" serve "$M" --port 0 --threads 1 "$@" 2>"$log" &
  PIDS="$PIDS $!"
  LAST_PID=$!
  i=0
  while [ $i -lt 300 ]; do
    port=$(sed -n 's/.*on http:\/\/127\.0\.0\.1:\([0-9]*\) .*/\1/p' "$log")
    [ -n "$port" ] && { LAST_PORT=$port; return 0; }
    kill -0 $LAST_PID 2>/dev/null || break
    sleep 0.1; i=$((i+1))
  done
  echo "server did not start: $(cat "$log")" >&2
  return 1
}

# references from `sparq run`
"$SPARQ" run "$M" -p "The file system" -n 24 --temp 0 2>/dev/null >"$T/run_greedy" || bad "sparq run (reference)"
"$SPARQ" run "$M" --chat -p "Hello" -n 12 --temp 0 2>/dev/null >"$T/run_chat" || bad "sparq run --chat (reference)"
# two interactive turns whose first reply ends on -n: its last token was never run through the
# model, and the second turn must not take it for cached (session.c)
printf 'Hello\nAnd then?\n' | "$SPARQ" run "$M" --chat -n 6 --temp 0 2>/dev/null >"$T/run_turns" || bad "sparq run --chat, 2 turns"

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

python3 - "$PORT" "$T/run_greedy" "$T/run_chat" "$T/run_turns" "$@" >"$T/py.out" 2>&1 <<'EOF'
import http.client, json, socket, sys
port = int(sys.argv[1])
greedy = open(sys.argv[2], encoding="utf-8").read()
assert greedy.startswith("The file system") and greedy.endswith("\n")
greedy = greedy[len("The file system"):-1]
chat_ref = open(sys.argv[3], encoding="utf-8").read()[:-1]
passed = failed = 0
def check(cond, what):
    global passed, failed
    if cond: passed += 1
    else:
        failed += 1
        print("FAIL:", what)

def req(method, path, body=None, headers=None):
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    data = json.dumps(body) if isinstance(body, (dict, list)) else body
    c.request(method, path, body=data, headers=headers or {})
    r = c.getresponse()
    raw = r.read()
    c.close()
    return r.status, r.getheader("Content-Type"), raw

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
print("py: %d passed, %d failed" % (passed, failed))
sys.exit(1 if failed else 0)
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

# usage errors: exit 2
"$SPARQ" serve "$M" --port 70000 >/dev/null 2>&1; [ $? -eq 2 ] && ok || bad "--port 70000 is a usage error"
"$SPARQ" serve >/dev/null 2>&1; [ $? -eq 2 ] && ok || bad "no MODEL is a usage error"
"$SPARQ" serve "$T/none" --port 0 >/dev/null 2>"$T/nomodel"; [ $? -eq 1 ] && grep -q "$T/none" "$T/nomodel" && ok \
  || bad "missing model: exit 1 naming it ($(cat "$T/nomodel"))"

echo "$pass passed, $fail failed"
[ $fail -eq 0 ]
