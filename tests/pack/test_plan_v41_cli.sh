#!/bin/sh
# tests/pack/test_plan_v41_cli.sh — `sparq plan --bits` on the real DeepSeek
# V4.1 without its weights (tools/bench/make_v41_model real --sparse: the full
# headers, data left holes). Per node the weights of the EXL3 target are
# computed here from the safetensors headers (shapes × bits, quantizer's rule
# written out again in Python) and must equal the plan's to the byte; so must
# the KV of the V4.1 state (window ring, pools, indexer keys, compressor
# group, Engram id history). The split must be the one the shared caches
# allow (cut at 20 for 2 boxes; 8, 14, 20 for 4), Engram tables land on the
# nodes of layers 1 and 14, and what does not fit is refused.
# Arguments: SPARQ MAKE_V41_MODEL.
. "$(dirname "$0")/../lib.sh"
MK=${2:-build/tools/bench/make_v41_model}
M="$T/real"
"$MK" "$M" --preset real --sparse >"$T/mk" 2>&1 && ok || bad "make real --sparse: $(cat "$T/mk")"

# check BOXES BITS CTX USERS [extra plan args]: the plan's weights and kv per node against ours
check() {
  boxes=$1 bits=$2 ctx=$3 users=$4
  shift 4
  "$SPARQ" plan "$M" --bits "$bits" --boxes "$boxes" --ctx "$ctx" --users "$users" --json "$@" >"$T/p.json" 2>"$T/e"
  echo $? >"$T/rc"
  python3 - "$M" "$T/p.json" "$boxes" "$bits" "$ctx" "$users" "$@" <<'PY'
import fnmatch, json, math, os, struct, sys
model, pj, boxes, bits, ctx, users = sys.argv[1], sys.argv[2], int(sys.argv[3]), float(sys.argv[4]), int(sys.argv[5]), int(sys.argv[6])
rules = [("*.engram.wkv", 4)]
extra = sys.argv[7:]
for i, a in enumerate(extra):
    if a == "--bits-for":
        pat, k = extra[i + 1].rsplit("=", 1)
        rules.append((pat, int(k)))
cfg = json.load(open(os.path.join(model, "config.json")))["text_config"]
plan = json.load(open(pj))
cache = os.path.join(os.path.dirname(pj), "headers.json")  # the headers, read once per test
if os.path.exists(cache):
    tensors = json.load(open(cache))
else:
    tensors = {}
    for fn in sorted(os.listdir(model)):
        if fn.endswith(".safetensors"):
            with open(os.path.join(model, fn), "rb") as f:
                n = struct.unpack("<Q", f.read(8))[0]
                h = json.loads(f.read(n))
            for k, v in h.items():
                if k != "__metadata__":
                    tensors[k] = (v["dtype"], v["shape"], v["data_offsets"][1] - v["data_offsets"][0])
    json.dump(tensors, open(cache, "w"))
def expert_bits(L):
    base = math.floor(bits + 1e-9); frac = bits - base
    return base + 1 if frac > 1e-9 and math.floor((L + 1) * frac + 1e-9) > math.floor(L * frac + 1e-9) else base
def rule(key, K):
    for pat, k in rules:
        if fnmatch.fnmatchcase(key, pat): K = k
    return K
def exl3(i, o, K): return i * o * K // 8 + 2 * i + 2 * o + 4
ATTN = ("wq_a", "wq_b", "wkv", "wo_a", "wo_b")
layer_bytes = [0] * cfg["num_hidden_layers"]; engram = [0] * cfg["num_hidden_layers"]; embed = head = 0
for name, (dt, shape, nb) in tensors.items():
    parts = name.split(".")
    key = name.rsplit(".", 1)[0]
    if name == "embed.weight": embed += nb; continue
    if name == "norm.weight": head += nb; continue
    if name == "head.weight": head += exl3(shape[1], shape[0], rule("head", 6)); continue
    L = int(parts[1])
    if parts[2] == "engram" and parts[3] == "embed": engram[L] += nb; continue
    quant = None
    if parts[2] == "ffn" and parts[3] == "experts": quant = (2 * shape[1], shape[0], expert_bits(L)) if dt == "I8" else None
    elif parts[2] == "ffn" and parts[3] == "shared_experts": quant = (shape[1], shape[0], 4) if dt == "F8_E4M3" else None
    elif parts[2] == "attn" and parts[3] in ATTN: quant = (shape[1], shape[0], 5) if dt == "F8_E4M3" else None
    elif parts[2] == "engram" and parts[3] == "wkv": quant = (shape[1], shape[0], 5) if dt == "F8_E4M3" else None
    if quant: layer_bytes[L] += exl3(quant[0], quant[1], rule(key, quant[2])); continue
    if name.endswith(".scale") and key + ".weight" in tensors and tensors[key + ".weight"][0] in ("I8", "F8_E4M3") \
       and not key.endswith("engram.embed") and ("experts" in key or parts[3] in ATTN or key.endswith("engram.wkv")):
        continue  # the scale of a quantized linear goes with it
    layer_bytes[L] += nb
# the V4.1 state of a layer range, in floats per user (runtime/models/deepseek_v41.c's plan, written out again)
rows = max(512, users)
def kv(first, n):
    f = 0
    for L in range(first, first + n):
        f += (cfg["sliding_window"] + rows) * cfg["head_dim"]
        r = cfg["compress_ratios"][L]
        if r and L in cfg["kv_source_layer_ids"]:
            P = ctx // r
            f += P * cfg["head_dim"] + P * cfg["index_head_dim"] + 2 * r * cfg["head_dim"]
        if r and L in cfg["index_source_layer_ids"]:  # the last rows' selections, kept per sequence (ints)
            f += rows * (cfg["index_topk"] + 1)
            if L == cfg["candidate_source_layer_id"]: f += rows * (cfg["candidate_topk_blocks"] + 1)
    if any(first <= L < first + n for L in cfg["engram_layer_ids"]): f += rows + 4
    if "--ship-pools" in extra:  # copies of the earlier sources' pools and indexer keys the range reads
        srcs = cfg["kv_source_layer_ids"]
        read = {max(s for s in srcs if s <= L) for L in range(first, first + n) if cfg["compress_ratios"][L]}
        for s in sorted(x for x in read if x < first):
            P = ctx // cfg["compress_ratios"][s]
            f += P * cfg["head_dim"] + (P * cfg["index_head_dim"] if s in cfg["index_source_layer_ids"] else 0)
    return f * users * 4
errs = []
nodes = plan["plan"]["nodes"]
for k, nd in enumerate(nodes):
    a, n = nd["first_layer"], nd["n_layers"]
    want = sum(layer_bytes[a:a + n]) + (embed if k == 0 else 0) + (head if k == boxes - 1 else 0)
    if nd["weights"] != want: errs.append(f"node {k}: weights {nd['weights']}, computed {want} (diff {nd['weights'] - want})")
    if nd["kv"] != kv(a, n): errs.append(f"node {k}: kv {nd['kv']}, computed {kv(a, n)}")
    if plan["engram_ssd"][k] != sum(engram[a:a + n]): errs.append(f"node {k}: engram on SSD {plan['engram_ssd'][k]}")
cuts = [nd["first_layer"] for nd in nodes]
print(" ".join(map(str, cuts)), "fits" if plan["fits"] else "refused")
if errs: print("\n".join(errs), file=sys.stderr); sys.exit(1)
PY
}

check 2 2.9 32768 6 >"$T/o" && ok || bad "2 boxes, 2.9: per-node bytes"
[ "$(cat "$T/o")" = "0 20 fits" ] && ok || bad "2 boxes, 2.9: cut at 20 and fits: $(cat "$T/o")"
check 2 3 131072 4 >"$T/o" && ok || bad "2 boxes, 3.0, 128k x 4: per-node bytes"
[ "$(cat "$T/o")" = "0 20 fits" ] && [ "$(cat "$T/rc")" = 0 ] && ok || bad "2 boxes, 3.0: $(cat "$T/o")"
check 2 3 32768 6 --bits-for 'layers.1[89].ffn.experts.*=2' --bits-for 'layers.2[0-2].ffn.experts.*=2' >"$T/o" && ok \
  || bad "2 boxes, the field's 2.9 bpw recipe: per-node bytes"
check 4 2.9 32768 6 >"$T/o" && ok || bad "4 boxes, 2.9: per-node bytes"
[ "$(cat "$T/o")" = "0 8 14 20 fits" ] && ok || bad "4 boxes: the cuts the shared caches allow: $(cat "$T/o")"
check 4 3 1048576 1 >"$T/o" && ok || bad "4 boxes, 3.0, 1M x 1: per-node bytes"
[ "$(cat "$T/o")" = "0 8 14 20 fits" ] && ok || bad "4 boxes, 3.0, 1M x 1 fits: $(cat "$T/o")"
python3 -c "import json,sys; p=json.load(open(sys.argv[1])); e=p['engram_ssd']; sys.exit(0 if e[0] > 0 and e[1] == 0 and e[2] > 0 and e[3] == 0 else 1)" \
  "$T/p.json" && ok || bad "Engram tables on nodes 0 (layer 1) and 2 (layer 14)"

# refused: the 2.9 pack on one box; 2 boxes at 1M x 8 users; 4 boxes at 1M x 8 (node 3 holds layers 20-39)
check 1 2.9 32768 6 >"$T/o" && ok || bad "1 box: per-node bytes"
[ "$(cat "$T/o")" = "0 refused" ] && [ "$(cat "$T/rc")" = 1 ] && ok || bad "1 box refused with status 1: $(cat "$T/o")"
check 2 2.9 1048576 8 >"$T/o" && ok || bad "2 boxes, 1M x 8: per-node bytes"
[ "$(cat "$T/o")" = "0 20 refused" ] && [ "$(cat "$T/rc")" = 1 ] && ok || bad "2 boxes at 1M x 8 refused: $(cat "$T/o")"
check 4 2.9 1048576 8 >"$T/o" && ok || bad "4 boxes, 1M x 8: per-node bytes"
[ "$(cat "$T/o")" = "0 8 14 20 refused" ] && ok || bad "4 boxes at 1M x 8 refused (node 3): $(cat "$T/o")"
# the what-if of shipped pools: any cut; a node after a source holds a copy of its pool
check 4 2.9 1048576 8 --ship-pools >"$T/o" && ok || bad "4 boxes, 1M x 8, --ship-pools: per-node bytes"
python3 -c "import sys; w=sys.argv[1].split(); c=list(map(int,w[:-1]))+[40]; sys.exit(0 if w[-1]=='fits' and max(b-a for a,b in zip(c,c[1:]))<=11 else 1)" \
  "$(cat "$T/o")" && ok || bad "4 boxes, --ship-pools: a balanced split (<= 11 layers a node) that fits: $(cat "$T/o")"
check 3 3 131072 4 --ship-pools >"$T/o" && ok || bad "3 boxes, --ship-pools: per-node bytes"
grep -q "fits" "$T/o" && ok || bad "3 boxes, --ship-pools fits: $(cat "$T/o")"
"$SPARQ" plan "$M" --bits 2.9 --boxes 7 --ship-pools >"$T/t" 2>&1 && grep -q "what-if --ship-pools" "$T/t" && ok \
  || bad "7 boxes with --ship-pools plan, saying it is a what-if: $(cat "$T/t")"
"$SPARQ" plan "$M" --bits 2.9 --boxes 2 --ctx 1048576 --users 8 >"$T/t" 2>&1; [ $? -eq 1 ] && \
  grep -q "largest ctx that fits on 2 boxes" "$T/t" && grep -q "engram tables on SSD: .*node 0" "$T/t" && ok \
  || bad "the table says what would fit: $(cat "$T/t")"
"$SPARQ" plan "$M" --bits 2.9 --boxes 7 >/dev/null 2>"$T/e"; [ $? -eq 1 ] && grep -q "cannot be split into 7" "$T/e" && ok \
  || bad "7 boxes: no split respects the caches: $(cat "$T/e")"
"$SPARQ" plan "$M" --bits-for '*=3' >/dev/null 2>"$T/e"; [ $? -eq 2 ] && grep -q "needs --bits" "$T/e" && ok \
  || bad "--bits-for without --bits is a usage error: $(cat "$T/e")"
"$SPARQ" plan "$M" --bits 9 >/dev/null 2>&1; [ $? -eq 2 ] && ok || bad "--bits 9 is a usage error"
finish
