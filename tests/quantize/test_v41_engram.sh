#!/bin/sh
# tests/quantize/test_v41_engram.sh — `sparq quantize` on DeepSeek V4.1's
# Engram layers: a checkpoint of make_v41_model --preset q128 cut to 15 layers
# (Engram on layers 1 and 14, the hash's only layout; the real vocabulary, which
# its token map needs), 2 experts. Checks:
#  - each layer's engram.wkv gets its own K (4, the SQ_ROLE_ENGRAM default),
#    not the routed experts' --bits;
#  - the Engram gate's q/k weights and the tables (FP8 + UE8M0 scales) are
#    byte-identical to the source;
#  - the work dir holds no table bytes (the skeleton is placeholders only,
#    written as holes), so the tables were copied once, source -> output;
#  - the output loads and runs: greedy text, Engram rows read (--stats), and
#    the report's quality section is there and finite.
# The head (129,280 x 128 at 6 bits) is most of the run: ~6 min on 2 shared
# cores. Arguments: SPARQ MAKE_V41_MODEL.
. "$(dirname "$0")/../lib.sh"
MK=${2:-build/tools/bench/make_v41_model}
TOK="$D/tiny-dsv41"
[ -f "$TOK/tokenizer.json" ] || skip "$TOK/tokenizer.json not there"
need python3

"$MK" "$T/src" --preset q128 --layers 15 --experts 2 --tokenizer "$TOK" --seed 5 >"$T/mk" 2>&1 && ok ||
  bad "make_v41_model: $(cat "$T/mk")"
"$SPARQ" quantize "$T/src" "$T/out" --calib "$D/text/calib.txt" --calib-rows 4 --calib-len 32 \
  --scale-search fixed -t 2 --report "$T/q.json" >"$T/qo" 2>"$T/qe" && ok || bad "quantize: $(tail -5 "$T/qe")"

# tensors: K of engram.wkv, native q/k and tables byte for byte, nothing of the tables in the work dir
python3 - "$T/src" "$T/out" "$T/out.work" >"$T/py" 2>&1 <<'PY' && ok || bad "tensor checks: $(cat "$T/py")"
import json, os, struct, sys
def open_dir(d):
    files = [f for f in os.listdir(d) if f.endswith(".safetensors")]
    out = {}
    for f in files:
        p = os.path.join(d, f)
        with open(p, "rb") as h:
            n = struct.unpack("<Q", h.read(8))[0]
            hdr = json.loads(h.read(n))
        for k, v in hdr.items():
            if k != "__metadata__":
                out[k] = (p, 8 + n + v["data_offsets"][0], v["data_offsets"][1] - v["data_offsets"][0], v)
    return out
def data(t):
    with open(t[0], "rb") as h:
        h.seek(t[1])
        return h.read(t[2])
src, out = open_dir(sys.argv[1]), open_dir(sys.argv[2])
err = []
for L in (1, 14):
    tr = out.get("layers.%d.engram.wkv.trellis" % L)
    if not tr:
        err.append("layer %d: no engram.wkv.trellis" % L)
    elif tr[3]["shape"][2] // 16 != 4:
        err.append("layer %d: engram.wkv K %d, expected 4" % (L, tr[3]["shape"][2] // 16))
    for name in ("engram.q_weight", "engram.k_weight", "engram.embed.weight", "engram.embed.scale"):
        k = "layers.%d.%s" % (L, name)
        if k not in out:
            err.append(k + " missing from the output")
        elif out[k][3]["dtype"] != src[k][3]["dtype"] or data(out[k]) != data(src[k]):
            err.append(k + " differs from the source")
    for k in ("layers.%d.engram.wkv.weight" % L, "layers.%d.engram.wkv.scale" % L):
        if k in out:
            err.append(k + " is still in the output")
if out["layers.1.engram.embed.weight"][3]["dtype"] != "F8_E4M3":
    err.append("table not FP8: " + out["layers.1.engram.embed.weight"][3]["dtype"])
if out["layers.3.ffn.experts.0.w1.trellis"][3]["shape"][2] // 16 != 3:
    err.append("experts are not at --bits 3")
table_bytes = sum(src[k][2] for k in src if ".engram.embed." in k)
for root, _, names in os.walk(sys.argv[3]):
    for f in names:
        if f.endswith(".safetensors"):
            for k, t in open_dir(root).items():
                if ".engram.embed." in k:
                    err.append("work dir %s holds %s" % (root, k))
            break
skel = os.path.join(sys.argv[3], "skeleton")
st = [os.stat(os.path.join(skel, f)) for f in os.listdir(skel) if f.endswith(".safetensors")]
disk, size = sum(s.st_blocks * 512 for s in st), sum(s.st_size for s in st)
if disk * 4 > size:
    err.append("skeleton takes %d bytes of disk for %d apparent: placeholders not holes" % (disk, size))
if not st or size < table_bytes:
    print("note: skeleton %d bytes apparent, tables %d" % (size, table_bytes))
print("\n".join(err) if err else "ok: %d table bytes copied once" % table_bytes)
sys.exit(1 if err else 0)
PY

"$SPARQ" run "$T/out" -p "The SQLite library" -n 8 --temp 0 --stats >"$T/r" 2>"$T/e" && ok || bad "run: $(cat "$T/e")"
t=$(cat "$T/r"); [ ${#t} -gt 20 ] && ok || bad "run printed: $t"
rows=$(sed -n 's/^stats: engram_rows=//p' "$T/e")
[ -n "$rows" ] && [ "$rows" -gt 0 ] && ok || bad "--stats shows no Engram rows read: $(grep engram "$T/e")"
python3 -c "import json,math,sys; q=json.load(open(sys.argv[1]))['quality']; \
sys.exit(0 if q['tokens'] > 0 and all(math.isfinite(q[k]) for k in ('kld','top1','ppl_source','ppl_output')) else 1)" \
  "$T/q.json" && ok || bad "the report's quality section: $(grep -A8 quality "$T/q.json")"
grep -q "^quality vs the source" "$T/qo" && ok || bad "no quality line in the report table: $(tail -3 "$T/qo")"
finish
