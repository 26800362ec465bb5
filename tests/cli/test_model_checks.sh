#!/bin/sh
# tests/cli/test_model_checks.sh — models that are damaged or contradict their
# config are refused by every command, with a message naming the tensor or
# the field (issue 26, items 3 and 6). Made from tests/data/tiny-qwen3moe:
#  - NaN / Inf weights: `run` and `eval` fail naming the position of the
#    first non-finite logits, `quantize` refuses naming the tensor (a linear
#    as it is read, a kept norm before any work), `inspect --check` lists
#    every such tensor with its counts;
#  - config.json against the tensors: num_hidden_layers 1000 or 2 on the
#    4-layer file, no hidden_size, a transposed embedding, vocab_size 2^31,
#    a missing norm; `plan`, `pack`, `run`, `eval`, `quantize`,
#    `inspect --check` all refuse; `pack` also refuses an empty or garbage
#    tokenizer.json, with nothing written.
set -u
. "$(dirname "$0")/../lib.sh"
M="$D/tiny-qwen3moe"
need python3
CAL="--calib $D/text/calib.txt --calib-rows 2 --calib-len 32 -q"
head -c 3000 "$D/text/eval.txt" > "$T/eval.txt"

# variant NAME PYTHON: copy of the fixture, then PYTHON edits it with
#   cfg (config.json as a dict), ts (name -> [dtype, shape, bytes]), d (its folder)
variant() {
  edit_model "$M" "$T/$1" "$2"
}
# expect CMD-NAME RC-WANTED(nonzero|1|0) PATTERN FILE: the exit status and a message
expect() {
  name=$1 want=$2 pat=$3 file=$4 rc=$5
  if [ "$want" = nonzero ]; then [ "$rc" -ne 0 ] && ok || bad "$name: exit 0"; else
    [ "$rc" -eq "$want" ] && ok || bad "$name: exit $rc, want $want: $(head -c 600 "$file")"; fi
  grep -q -- "$pat" "$file" && ok || bad "$name: no '$pat' in: $(head -c 800 "$file")"
}
NAN='ts["model.layers.0.self_attn.o_proj.weight"][2] = b"\xc0\x7f" * (256 * 256)'
INF='ts["model.norm.weight"][2] = b"\x80\x7f" + ts["model.norm.weight"][2][2:]'

# --- the fixture itself passes ------------------------------------------------
"$SPARQ" inspect "$M" --check >"$T/ok.out" 2>&1; expect "inspect --check of the fixture" 0 "verdict *ok" "$T/ok.out" $?
grep -q "NaN / Inf: none in 231 tensors" "$T/ok.out" && ok || bad "inspect --check scans every tensor: $(cat "$T/ok.out")"

# --- item 3: NaN / Inf weights ------------------------------------------------
variant nan "$NAN"
"$SPARQ" run "$T/nan" -p "The file" -n 8 --temp 0 >"$T/r.out" 2>"$T/r.err"
expect "run with a NaN o_proj" nonzero "logits of sequence 0 at position [0-9]* are not finite" "$T/r.err" $?
"$SPARQ" eval "$T/nan" --text "$T/eval.txt" --ctx 64 >"$T/e.out" 2>"$T/e.err"
expect "eval with a NaN o_proj" nonzero "are not finite" "$T/e.err" $?
grep -q "perplexity" "$T/e.out" && bad "eval printed a perplexity for a NaN model: $(cat "$T/e.out")" || ok
"$SPARQ" quantize "$T/nan" "$T/nan-q" --method rtn $CAL >"$T/q.out" 2>&1
expect "quantize --method rtn with a NaN o_proj" 1 "model.layers.0.self_attn.o_proj.weight' holds 65536 NaN" "$T/q.out" $?
[ ! -e "$T/nan-q" ] && ok || bad "quantize wrote a model holding NaN"
"$SPARQ" inspect "$T/nan" --check >"$T/i.out" 2>&1
expect "inspect --check with a NaN o_proj" 1 "model.layers.0.self_attn.o_proj.weight: 65536 NaN, 0 Inf" "$T/i.out" $?
"$SPARQ" inspect "$T/nan" --check --json >"$T/ij.out" 2>/dev/null
python3 -c "import json,sys; c=json.load(open(sys.argv[1]))['check']; sys.exit(0 if not c['ok'] and c['nonfinite'][0]['nan'] == 65536 else 1)" \
  "$T/ij.out" && ok || bad "inspect --check --json: $(head -c 600 "$T/ij.out")"
variant inf "$INF"
"$SPARQ" quantize "$T/inf" "$T/inf-q" --method rtn $CAL >"$T/q2.out" 2>&1
expect "quantize with an Inf in a kept norm" 1 "model.norm.weight' holds 0 NaN and 1 Inf" "$T/q2.out" $?
[ ! -e "$T/inf-q" ] && [ ! -e "$T/inf-q.work/layer-0000.safetensors" ] && ok || bad "quantize worked on before refusing"
"$SPARQ" inspect "$T/inf" --check >"$T/i2.out" 2>&1
expect "inspect --check with an Inf norm" 1 "model.norm.weight: 0 NaN, 1 Inf" "$T/i2.out" $?

# --- item 6: config.json against the tensors -----------------------------------
variant layers1000 'cfg["num_hidden_layers"] = 1000'
"$SPARQ" plan "$T/layers1000" --boxes 1 --ctx 1024 >"$T/p.out" 2>&1
expect "plan, num_hidden_layers 1000" 1 "layers 4..999 have no tensors" "$T/p.out" $?
grep -q "verdict: fits" "$T/p.out" && bad "plan says fits for 1000 layers" || ok
"$SPARQ" pack "$T/layers1000" "$T/b1000" --ctx 1024 >"$T/pk.out" 2>&1
expect "pack, num_hidden_layers 1000" 1 "layers 4..999 have no tensors" "$T/pk.out" $?
[ ! -e "$T/b1000" ] && [ ! -e "$T/b1000.partial" ] && ok || bad "pack wrote a bundle for 1000 layers"

variant layers2 'cfg["num_hidden_layers"] = 2'
for c in plan run eval quantize inspect; do
  case $c in
    plan) "$SPARQ" plan "$T/layers2" --ctx 1024 ;;
    run) "$SPARQ" run "$T/layers2" -p "The file" -n 4 ;;
    eval) "$SPARQ" eval "$T/layers2" --text "$T/eval.txt" --ctx 64 ;;
    quantize) "$SPARQ" quantize "$T/layers2" "$T/l2-q" --method rtn $CAL ;;
    inspect) "$SPARQ" inspect "$T/layers2" --check ;;
  esac >"$T/l2.out" 2>&1
  expect "$c, num_hidden_layers 2 on 4 layers" 1 "tensors of layers 2..3 (.*) are left unused: config.json says num_hidden_layers 2" "$T/l2.out" $?
done

variant nohidden 'del cfg["hidden_size"]'
for c in plan run pack; do
  case $c in
    plan) "$SPARQ" plan "$T/nohidden" ;;
    run) "$SPARQ" run "$T/nohidden" -p "The file" -n 4 ;;
    pack) "$SPARQ" pack "$T/nohidden" "$T/bnh" ;;
  esac >"$T/nh.out" 2>&1
  expect "$c without hidden_size" 1 "no 'hidden_size'" "$T/nh.out" $?
done

variant transposed 'ts["model.embed_tokens.weight"][1] = [256, 4096]'
for c in plan pack run; do
  case $c in
    plan) "$SPARQ" plan "$T/transposed" ;;
    pack) "$SPARQ" pack "$T/transposed" "$T/btr" ;;
    run) "$SPARQ" run "$T/transposed" -p "The file" -n 4 ;;
  esac >"$T/tr.out" 2>&1
  expect "$c with a transposed embedding" 1 "'model.embed_tokens.weight' (the embeddings): shape \[256, 4096\], expected \[4096, 256\]" "$T/tr.out" $?
done

variant vocab31 'cfg["vocab_size"] = 2**31'
"$SPARQ" pack "$T/vocab31" "$T/bv" >"$T/v.out" 2>&1
expect "pack with vocab_size 2^31" 1 "inconsistent sizes\|vocab" "$T/v.out" $?
[ ! -e "$T/bv" ] && ok || bad "pack wrote a bundle with vocab_size 2^31"

variant noqnorm 'del ts["model.layers.1.self_attn.q_norm.weight"]'
for c in plan run; do
  case $c in
    plan) "$SPARQ" plan "$T/noqnorm" ;;
    run) "$SPARQ" run "$T/noqnorm" -p "The file" -n 4 ;;
  esac >"$T/qn.out" 2>&1
  expect "$c without a q_norm" 1 "tensor 'model.layers.1.self_attn.q_norm.weight' (layer 1, \[64\]) not found" "$T/qn.out" $?
done

variant extra 'ts["model.layers.1.mlp.shared_expert.up_proj.weight"] = ["BF16", [128, 256], b"\0" * 65536]'
"$SPARQ" plan "$T/extra" >"$T/x.out" 2>&1
expect "plan with a tensor the architecture does not read" 1 "shared_expert.up_proj.weight' is not one the architecture qwen3_moe reads: left unused" "$T/x.out" $?

# --- pack loads the tokenizer ----------------------------------------------------
for tk in empty garbage; do
  variant "tok-$tk" ''
  if [ $tk = empty ]; then : > "$T/tok-$tk/tokenizer.json"; else printf '{"model": {"type": "BPE", "vocab": 7}}' > "$T/tok-$tk/tokenizer.json"; fi
  "$SPARQ" pack "$T/tok-$tk" "$T/btok-$tk" --ctx 1024 >"$T/tk.out" 2>&1
  expect "pack with an $tk tokenizer.json" 1 "tokenizer does not load; nothing written" "$T/tk.out" $?
  [ ! -e "$T/btok-$tk" ] && [ ! -e "$T/btok-$tk.partial" ] && ok || bad "pack wrote a bundle with an $tk tokenizer"
done
variant tok-big 'cfg["vocab_size"] = 4000; cfg["eos_token_id"] = 3999; cfg["bos_token_id"] = cfg["pad_token_id"] = 3998; ts["model.embed_tokens.weight"] = ["BF16", [4000, 256], ts["model.embed_tokens.weight"][2][:4000*512]]; ts["lm_head.weight"] = ["BF16", [4000, 256], ts["lm_head.weight"][2][:4000*512]]'
"$SPARQ" pack "$T/tok-big" "$T/btok-big" --ctx 1024 >"$T/tb.out" 2>&1
expect "pack with tokenizer ids beyond vocab_size" 1 "tokenizer.json has ids 0..4095, but config.json's vocab_size is 4000" "$T/tb.out" $?

finish
