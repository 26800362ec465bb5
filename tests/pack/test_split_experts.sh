#!/bin/sh
# tests/pack/test_split_experts.sh — `sparq plan / pack / verify --split experts` on the
# Qwen3-MoE fixture (tests/data/tiny-qwen3moe):
#  - plan: every node's weights, kv, comm and total, its experts and the per-token
#    traffic of both splits, for 1, 2 and 3 boxes, against values this script works
#    out itself from the fixture's safetensors header and config.json (not copied
#    from sparq's output): expert e of every layer on node e mod N, the head and the
#    final norm on node 0, everything else on every node;
#  - pack writes exactly those tensors to each node (the shards' headers read here),
#    a version-2 manifest with plan.split and each node's expert_set; verify accepts it;
#  - a manifest whose split is edited, whose node lacks its expert_set, whose expert
#    set is short, or whose version says pipeline fails verify naming manifest.json
#    and what is wrong; the run refuses it too;
#  - DeepSeek V4.1, more boxes than experts and an unknown --split are refused.
. "$(dirname "$0")/../lib.sh"
MODEL="$D/tiny-qwen3moe"
SMALL="--ctx 1024 --users 4 --chunk 64"

# --- plan: the numbers, worked out from the header --------------------------------
for n in 1 2 3; do
  "$SPARQ" plan "$MODEL" --boxes $n --split experts $SMALL --json >"$T/pe$n.json" && ok || bad "plan --split experts --boxes $n"
  "$SPARQ" plan "$MODEL" --boxes $n $SMALL --json >"$T/pp$n.json" && ok || bad "plan --boxes $n"
done
python3 - "$MODEL" "$T" <<'PY' && ok || bad "plan: the expert split's numbers (above)"
import json, re, struct, sys
model, tmp = sys.argv[1], sys.argv[2]
cfg = json.load(open(model + "/config.json"))
with open(model + "/model.safetensors", "rb") as f:
    n = struct.unpack("<Q", f.read(8))[0]
    hdr = json.loads(f.read(n))
sizes = {k: v["data_offsets"][1] - v["data_offsets"][0] for k, v in hdr.items() if k != "__metadata__"}
L, E, d, V = cfg["num_hidden_layers"], cfg["num_local_experts"], cfg["hidden_size"], cfg["vocab_size"]
kvh, hd = cfg["num_key_value_heads"], cfg.get("head_dim", d // cfg["num_attention_heads"])
ctx, users, chunk = 1024, 4, 64
rows = max(chunk, users)
M = L  # every layer of the fixture is a MoE layer (mlp_only_layers [], decoder_sparse_step 1)
assert cfg.get("mlp_only_layers", []) == [] and cfg.get("decoder_sparse_step", 1) == 1
def node_of(name, N):
    m = re.search(r"\.experts\.(\d+)\.", name)
    if m: return [int(m.group(1)) % N]
    if name.startswith("lm_head.") or name.startswith("model.norm."): return [0]
    return list(range(N))
errs = []
def want(what, got, exp):
    if got != exp: errs.append("%s: sparq says %s, expected %s" % (what, got, exp))
for N in (1, 2, 3):
    p = json.load(open("%s/pe%d.json" % (tmp, N)))
    plan = p["plan"]
    want("N=%d split" % N, plan["split"], "experts")
    w = [0] * N
    for name, b in sizes.items():
        for k in node_of(name, N): w[k] += b
    kv = 2 * L * kvh * hd * ctx * users * 4
    comm = 0 if N == 1 else N * rows * d * 4 + rows * 12 + 64 + (64 << 20)
    for k, nd in enumerate(plan["nodes"]):
        own = len(range(k, E, N))
        want("N=%d node %d weights" % (N, k), nd["weights"], w[k])
        want("N=%d node %d kv" % (N, k), nd["kv"], kv)
        want("N=%d node %d comm" % (N, k), nd["comm"], comm)
        want("N=%d node %d experts" % (N, k), nd["experts"], M * own)
        want("N=%d node %d expert_set" % (N, k), nd["expert_set"], list(range(k, E, N)))
        want("N=%d node %d layers" % (N, k), (nd["first_layer"], nd["n_layers"]), (0, L))
        want("N=%d node %d embed/head" % (N, k), (nd["has_embed"], nd["has_head"]), (True, k == 0))
        want("N=%d node %d total" % (N, k), nd["total"],
             w[k] + kv + nd["workspace"] + comm + (512 << 20))
    # the workspace is the pipeline's: node 0 the head node's, the others the rest's
    pp = json.load(open("%s/pp%d.json" % (tmp, N)))["plan"]["nodes"]
    want("N=%d node 0 workspace" % N, plan["nodes"][0]["workspace"], pp[-1]["workspace"])
    if N > 1: want("N=%d node 1 workspace" % N, plan["nodes"][1]["workspace"], pp[0]["workspace"])
    # traffic of one decoded token, both splits (payload bytes)
    W = d * 4
    t = p["traffic_per_token"]
    exp_p = {"bytes": 0, "bytes_max_node": 0, "messages": 0, "collectives": 0} if N == 1 else \
        {"bytes": (N - 1) * W + V * 4, "bytes_max_node": max(W, V * 4), "messages": N, "collectives": 0}
    exp_e = {"bytes": 0, "bytes_max_node": 0, "messages": 0, "collectives": 0} if N == 1 else \
        {"bytes": (N - 1) * 12 + M * N * (N - 1) * W, "bytes_max_node": (N - 1) * (12 + M * W),
         "messages": (N - 1) * (1 + M * N), "collectives": M}
    want("N=%d traffic pipeline" % N, t["pipeline"], exp_p)
    want("N=%d traffic experts" % N, t["experts"], exp_e)
    want("N=%d pipeline plan's traffic" % N, json.load(open("%s/pp%d.json" % (tmp, N)))["traffic_per_token"], t)
for e in errs: print(e, file=sys.stderr)
sys.exit(1 if errs else 0)
PY
out=$("$SPARQ" plan "$MODEL" --boxes 3 --split experts $SMALL)
echo "$out" | grep -q "^split: experts (every node runs all 4 layers; routed expert e of every MoE layer on node e mod 3" &&
  ok || bad "plan text names the split: $out"
echo "$out" | grep -q "^  experts .* 4 collectives; .*(this plan)$" && ok || bad "plan text: the expert split's traffic: $out"
echo "$out" | grep -q "^  pipeline .* 0 collectives;" && ok || bad "plan text: the pipeline's traffic: $out"
"$SPARQ" plan "$MODEL" --boxes 2 $SMALL | grep -q "^split: pipeline" && ok || bad "plan text: pipeline by default"
"$SPARQ" plan "$MODEL" --split sideways >/dev/null 2>"$T/e"; [ $? -eq 2 ] && grep -q "not pipeline or experts" "$T/e" &&
  ok || bad "--split sideways is a usage error: $(cat "$T/e")"
"$SPARQ" plan "$MODEL" --boxes 17 --split experts >/dev/null 2>"$T/e"; [ $? -eq 1 ] && grep -q "only 16 routed experts" "$T/e" &&
  ok || bad "17 boxes for 16 experts: $(cat "$T/e")"
"$SPARQ" plan "$D/tiny-dsv41" --boxes 2 --split experts >/dev/null 2>"$T/e"; [ $? -eq 1 ] &&
  grep -q "deepseek_v41 cannot be split by experts yet: its MoE .* use --split pipeline" "$T/e" && ok ||
  bad "V4.1 --split experts: $(cat "$T/e")"
"$SPARQ" pack "$D/tiny-dsv41" "$T/v" --boxes 2 --split experts >/dev/null 2>"$T/e"; [ $? -eq 1 ] && [ ! -e "$T/v" ] &&
  grep -q "cannot be split by experts" "$T/e" && ok || bad "V4.1 pack --split experts: $(cat "$T/e")"

# --- pack / verify ------------------------------------------------------------------
"$SPARQ" pack "$MODEL" "$T/e3" --boxes 3 --split experts $SMALL --block-size 4096 2>/dev/null && ok || bad "pack --split experts"
"$SPARQ" verify "$T/e3" >/dev/null 2>&1 && ok || bad "verify of the fresh experts bundle"
python3 - "$T/e3" <<'PY' && ok || bad "the experts bundle's manifest and shards (above)"
import json, re, struct, sys
b = sys.argv[1]
m = json.load(open(b + "/manifest.json"))
errs = []
if m["format_version"] != 2 or m["plan"]["split"] != "experts": errs.append("version / split: %s %s" % (m["format_version"], m["plan"]["split"]))
for k in range(3):
    with open("%s/node-%d/model.safetensors" % (b, k), "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        names = [x for x in json.loads(f.read(n)) if x != "__metadata__"]
    ex = {int(g.group(1)) for g in (re.search(r"\.experts\.(\d+)\.", x) for x in names) if g}
    if ex != set(range(k, 16, 3)): errs.append("node %d experts %s" % (k, sorted(ex)))
    if ("lm_head.weight" in names) != (k == 0) or ("model.norm.weight" in names) != (k == 0): errs.append("node %d head" % k)
    if "model.embed_tokens.weight" not in names: errs.append("node %d lacks the embeddings" % k)
    if not any(x.startswith("model.layers.3.self_attn.") for x in names): errs.append("node %d lacks layer 3's attention" % k)
for e in errs: print(e, file=sys.stderr)
sys.exit(1 if errs else 0)
PY
# damaged manifests: edit(BUNDLE, python statement on m)
edit() {
  rm -rf "$T/d"; cp -r "$T/e3" "$T/d"
  python3 -c "import json,sys; m=json.load(open(sys.argv[1])); $1; json.dump(m, open(sys.argv[1], 'w'), indent=1)" "$T/d/manifest.json"
}
refused() { # NAME PATTERN: verify of $T/d fails naming manifest.json and PATTERN
  "$SPARQ" verify "$T/d" >"$T/vo" 2>&1; rc=$?
  [ $rc -ne 0 ] && grep -q "manifest.json.*$2" "$T/vo" && ok || bad "$1: verify says (exit $rc): $(cat "$T/vo")"
}
edit "m['plan']['split'] = 'pipeline'"
refused "split edited to pipeline" "plan 'split' is \"pipeline\" but format_version is 2"
"$SPARQ" run "$T/d" -p hi -n 2 >/dev/null 2>"$T/ro"; [ $? -ne 0 ] && grep -q "manifest.json.*format_version is 2" "$T/ro" &&
  ok || bad "run of the edited bundle: $(cat "$T/ro")"
edit "m['plan']['split'] = 'sideways'"
refused "split edited to sideways" "plan 'split' must be \"pipeline\" or \"experts\""
edit "del m['plan']['nodes'][1]['expert_set']"
refused "node 1's expert_set removed" "plan node 1 has no 'expert_set'"
edit "m['plan']['nodes'][1]['expert_set'] = [1, 4]"
refused "node 1's expert_set short" "plan node 1 lists 2 experts (up to id 4), but 16 experts over 3 boxes give it 5"
edit "m['plan']['nodes'][2]['expert_set'] = [2, 3]"
refused "node 2's expert_set holds node 0's expert 3" "plan node 2: 'expert_set' entry 1 is not an expert id above 2 with id mod 3 == 2"
edit "m['format_version'] = 1"
refused "version 1 with split experts" "plan 'split' is \"experts\" but format_version is 1"
edit "m['format_version'] = 3"
refused "version 3" "format_version 3; this sparq reads versions 1 and 2"

finish
