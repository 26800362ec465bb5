#!/bin/sh
# tests/runtime/test_padded_vocab_cli.sh — a head padded past the tokenizer, as real
# checkpoints have it (Qwen3: vocab_size 151936 for 151669 tokenizer ids): a copy of
# tests/data/tiny-qwen3moe whose config says vocab_size 4608 for the tokenizer's 4096 ids,
# with 512 extra rows of embedding (zeros) and of lm_head (+-1000 on one coordinate each,
# so a padding row has the highest logit at every position). `run` (greedy, sampled,
# --parallel, --chat) and `serve` must never pick a padding id: they give exactly the text
# of the unpadded model, whose logits over the real ids are the same.
. "$(dirname "$0")/../lib.sh"
M="$D/tiny-qwen3moe"
[ -f "$M/config.json" ] || skip "$M/config.json missing"
need python3
P="The file system"

# the padding: embedding rows of zeros; lm_head row r is +-1000 (bf16 0x447a / 0xc47a) at
# coordinate r % hidden_size, so one of them has the highest logit whatever the hidden state
PAD='V, H, PAD = cfg["vocab_size"], cfg["hidden_size"], 512
for k in ("model.embed_tokens.weight", "lm_head.weight"):
    assert ts[k][0] == "BF16" and ts[k][1] == [V, H], (k, ts[k][:2])
    ts[k][1] = [V + PAD, H]
ts["model.embed_tokens.weight"][2] += bytes(2 * PAD * H)
rows = bytearray(2 * PAD * H)
for r in range(PAD):
    rows[2 * (r * H + r % H):2 * (r * H + r % H) + 2] = b"\x7a\x44" if r < H else b"\x7a\xc4"
ts["lm_head.weight"][2] += bytes(rows)
cfg["vocab_size"] = V + PAD'
edit_model "$M" "$T/pad" "$PAD" && ok || bad "writing the padded copy"
"$SPARQ" inspect "$T/pad" --check >"$T/i" 2>&1 && grep -q "^shape .* vocab 4608$" "$T/i" && ok \
  || bad "inspect --check of the padded copy: $(cat "$T/i")"

# run: greedy, sampled over every id (no top-k / top-p / min-p), several sequences, chat
for args in "--temp 0" "--temp 1.2 --top-k 0 --top-p 1 --min-p 0 --seed 7" "--temp 0.9 --seed 3 --parallel 2"; do
  "$SPARQ" run "$M" -p "$P" -n 32 $args >"$T/want" 2>"$T/e" || bad "run $args (unpadded): $(cat "$T/e")"
  "$SPARQ" run "$T/pad" -p "$P" -n 32 $args >"$T/got" 2>"$T/e" && ok || bad "run $args: $(cat "$T/e")"
  cmp -s "$T/want" "$T/got" && ok || bad "run $args: '$(cat "$T/got")', unpadded '$(cat "$T/want")'"
done
"$SPARQ" run "$M" --chat -p "What is a file system?" -n 16 --temp 0 >"$T/want" 2>/dev/null
"$SPARQ" run "$T/pad" --chat -p "What is a file system?" -n 16 --temp 0 >"$T/got" 2>"$T/e" && ok \
  || bad "run --chat: $(cat "$T/e")"
cmp -s "$T/want" "$T/got" && ok || bad "run --chat: '$(cat "$T/got")', unpadded '$(cat "$T/want")'"

# serve: a greedy and a sampled completion, each equal to `run` of the unpadded model
"$SPARQ" run "$M" -p "$P" -n 32 --temp 0 >"$T/run0" 2>/dev/null
"$SPARQ" run "$M" -p "$P" -n 32 --temp 1.2 --top-k 0 --top-p 1 --min-p 0 --seed 7 >"$T/run1" 2>/dev/null
"$SPARQ" serve "$T/pad" --port 0 --threads 1 2>"$T/slog" &
PIDS="$PIDS $!"
port=$(serve_port "$T/slog" $!) && ok || bad "serve of the padded copy starts: $(cat "$T/slog")"
if [ -n "$port" ]; then
  python3 - "$port" "$P" "$T/run0" "$T/run1" <<'PY' && ok || bad "serve's completions equal run's (above)"
import http.client, json, sys
port, prompt, want0, want1 = int(sys.argv[1]), sys.argv[2], sys.argv[3], sys.argv[4]
bad = 0
for want, extra in ((want0, {"temperature": 0}), (want1, {"temperature": 1.2, "top_k": 0, "top_p": 1, "min_p": 0, "seed": 7})):
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    body = dict(prompt=prompt, max_tokens=32, **extra)
    c.request("POST", "/v1/completions", json.dumps(body), {"Content-Type": "application/json"})
    r = c.getresponse()
    got = r.read().decode()
    text = prompt + json.loads(got)["choices"][0]["text"] if r.status == 200 else None
    exp = open(want, encoding="utf-8").read().rstrip("\n")
    if text != exp:
        print("FAIL:", extra, r.status, repr(got)[:300], "want", repr(exp))
        bad += 1
sys.exit(bad)
PY
fi
finish
