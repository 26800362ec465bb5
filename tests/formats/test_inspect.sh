#!/bin/sh
# tests/formats/test_inspect.sh — `sparq inspect` on the shipped EXL3 model
# (table, --tensors, --json), on a tiny tied model (also with an FP8
# quantization_config) and on a missing path. The fixture's parameter count is
# checked by test_inspect_fixture.sh.
. "$(dirname "$0")/../lib.sh"
M="$D/exl3-model/exl3-3.0bpw"

"$SPARQ" inspect "$M" > "$T/table" && ok || bad "inspect exits 0"
grep -q "^architecture *qwen3_moe" "$T/table" && ok || bad "architecture line"
grep -q "^layers *4 (4 MoE, 0 dense)" "$T/table" && ok || bad "layers line"
grep -q "16 per MoE layer, 4 active per token" "$T/table" && ok || bad "experts line"
# 8,145,664 of the original + the separate 6-bit lm_head exllamav3 stores (4096 x 256)
grep -q "^parameters *9194240 " "$T/table" && ok || bad "total parameters"
# 12 of 16 experts idle per token in each of 4 layers: 9194240 - 4*12*3*256*128
grep -q "^active/token *4475648 " "$T/table" && ok || bad "active parameters"
grep -q "^  I16 *3440640 " "$T/table" && ok || bad "I16 bytes"
grep -q "^  BF16 *2102784 " "$T/table" && ok || bad "BF16 bytes"
grep -q "exl3 3 bpw (head 6), codebook mul1" "$T/table" && ok || bad "quantization line"

"$SPARQ" inspect "$M" --tensors > "$T/tensors" && ok || bad "--tensors exits 0"
# an expert linear: trellis (8, 16, 48) -> in 128, out 256, K=3; 3 + 16*(128+256)/32768 bpw
grep -q "^model.layers.0.mlp.experts.0.down_proj  *EXL3 K=3  *\[256, 128\]  *13060  3.188 (mul1)" "$T/tensors" \
  && ok || bad "EXL3 expert line"
grep -q "^lm_head  *EXL3 K=6  *\[4096, 256\]" "$T/tensors" && ok || bad "lm_head line"
grep -q "^model.embed_tokens.weight  *BF16  *\[4096, 256\]  *2097152$" "$T/tensors" && ok || bad "embedding line"
grep -q "\.suh\|\.svh\|\.mul1" "$T/tensors" && bad "EXL3 parts folded into their linear" || ok
[ "$(grep -c ' EXL3 K=' "$T/tensors")" -eq 209 ] && ok || bad "209 EXL3 linears"

"$SPARQ" inspect "$M" --json --tensors > "$T/json" && ok || bad "--json exits 0"
grep -q '"parameters": 9194240,' "$T/json" && ok || bad "json parameters"
grep -q '"active_parameters": 4475648,' "$T/json" && ok || bad "json active"
grep -q '"bits_per_weight": 3.1875' "$T/json" && ok || bad "json bits per weight"
if command -v python3 >/dev/null; then
  python3 -c "import json,sys; d=json.load(open(sys.argv[1])); assert len(d['tensors'])==858-3*209" "$T/json" \
    && ok || bad "json parses, one entry per logical tensor"
fi

# A tiny tied model written here: lm_head.weight stored but tied (counted once),
# layer 0 MoE (4 experts, top 2), layer 1 dense (mlp_only_layers).
if command -v python3 >/dev/null; then
  mkdir -p "$T/tied"
  python3 - "$T/tied" <<'PY'
import json, struct, sys
d = sys.argv[1]
cfg = {"model_type": "qwen3_moe", "vocab_size": 8, "hidden_size": 4, "num_hidden_layers": 2,
       "num_attention_heads": 2, "num_key_value_heads": 1, "head_dim": 2, "intermediate_size": 3,
       "moe_intermediate_size": 2, "num_experts": 4, "num_experts_per_tok": 2, "mlp_only_layers": [1],
       "tie_word_embeddings": True}
json.dump(cfg, open(d + "/config.json", "w"))
t = {"model.embed_tokens.weight": [8, 4], "lm_head.weight": [8, 4], "model.norm.weight": [4]}
for e in range(4):
    for p, s in (("gate_proj", [2, 4]), ("up_proj", [2, 4]), ("down_proj", [4, 2])):
        t["model.layers.0.mlp.experts.%d.%s.weight" % (e, p)] = s
for p, s in (("gate_proj", [3, 4]), ("up_proj", [3, 4]), ("down_proj", [4, 3])):
    t["model.layers.1.mlp.%s.weight" % p] = s
hdr, off = {}, 0
for k, s in t.items():
    n = 1
    for x in s: n *= x
    hdr[k] = {"dtype": "F32", "shape": s, "data_offsets": [off, off + 4 * n]}
    off += 4 * n
h = json.dumps(hdr).encode()
open(d + "/model.safetensors", "wb").write(struct.pack("<Q", len(h)) + h + bytes(off))
PY
  "$SPARQ" inspect "$T/tied" > "$T/tied.out" && ok || bad "inspect tied model"
  # 32 (embeddings, lm_head tied) + 96 (experts) + 36 (dense MLP) + 4 (norm)
  grep -q "^parameters *168 " "$T/tied.out" && ok || bad "tied lm_head counted once"
  # 2 of 4 experts per token: 168 - 96 + 48
  grep -q "^active/token *120 " "$T/tied.out" && ok || bad "active with a dense layer"
  grep -q "^layers *2 (1 MoE, 1 dense)" "$T/tied.out" && ok || bad "MoE/dense layer split"
  # the same config with DeepSeek V4.1's FP8 quantization_config
  python3 - "$T/tied/config.json" <<'PY'
import json, sys
c = json.load(open(sys.argv[1]))
c["quantization_config"] = {"quant_method": "fp8", "fmt": "e4m3", "weight_block_size": [32, 32],
                            "scale_fmt": "ue8m0", "activation_scheme": "dynamic", "expert_dtype": "fp4"}
json.dump(c, open(sys.argv[1], "w"))
PY
  "$SPARQ" inspect "$T/tied" > "$T/fp8.out" && ok || bad "inspect with an fp8 quantization_config"
  grep -q "^quantization *fp8 e4m3, 32x32 blocks ue8m0, experts fp4$" "$T/fp8.out" && ok || bad "fp8 quantization line"
  "$SPARQ" inspect "$T/tied" --json > "$T/fp8.json" && ok || bad "fp8 --json"
  python3 -c "import json,sys; q=json.load(open(sys.argv[1]))['quantization']; assert q == {'quant_method': 'fp8', 'fmt': 'e4m3', 'weight_block_size': [32, 32], 'scale_fmt': 'ue8m0', 'expert_dtype': 'fp4'}, q" "$T/fp8.json" \
    && ok || bad "fp8 quantization in --json"
fi

"$SPARQ" inspect "$D/no-such-model" >/dev/null 2>"$T/err"; [ $? -eq 1 ] && ok || bad "missing path exits 1"
grep -q "no-such-model" "$T/err" && ok || bad "error names the path"
"$SPARQ" inspect >/dev/null 2>&1; [ $? -eq 2 ] && ok || bad "no PATH exits 2"

finish
