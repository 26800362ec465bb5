#!/usr/bin/env python3
"""tests/fuzz/corpus/make_seeds.py — (re)make the committed seed corpora.

safetensors_header/: small valid images (every dtype, metadata, scalars,
zero-size tensors, padded headers) and a few near-misses; hfconfig/: both
transformers config styles, an EXL3 config, FP8 configs (DeepSeek V4.1 / V3),
defaults only, and broken ones; engram_normalize/: texts for the Engram key normalizer.
Run from anywhere: python3 tests/fuzz/corpus/make_seeds.py"""
import json, os, struct

HERE = os.path.dirname(os.path.abspath(__file__))
BITS = {"BOOL": 8, "U8": 8, "I8": 8, "U16": 16, "I16": 16, "U32": 32, "I32": 32, "U64": 64, "I64": 64,
        "F16": 16, "BF16": 16, "F32": 32, "F64": 64, "F8_E4M3": 8, "F8_E5M2": 8, "F8_E8M0": 8, "F4": 4}


def image(tensors, meta=None, pad=0, header_override=None):
    hdr, data, off = {}, b"", 0
    if meta is not None:
        hdr["__metadata__"] = meta
    for name, dt, shape in tensors:
        n = 1
        for s in shape:
            n *= s
        nb = n * BITS[dt] // 8
        hdr[name] = {"dtype": dt, "shape": shape, "data_offsets": [off, off + nb]}
        data += bytes((off + i) * 37 & 0xFF for i in range(nb))
        off += nb
    h = header_override if header_override is not None else json.dumps(hdr, separators=(",", ":")).encode()
    h += b" " * pad
    return struct.pack("<Q", len(h)) + h + data


def write(sub, name, blob):
    d = os.path.join(HERE, sub)
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, name), "wb") as f:
        f.write(blob)


S = "safetensors_header"
write(S, "all_dtypes", image([("t." + dt, dt, [2, 4]) for dt in BITS], {"format": "pt"}))
write(S, "scalar_empty", image([("s", "I32", []), ("e", "F32", [0]), ("v", "F16", [3])], pad=5))
write(S, "exl3_linear", image([("w.trellis", "I16", [1, 1, 48]), ("w.suh", "F16", [16]), ("w.svh", "F16", [16]),
                               ("w.mul1", "I32", [])]))
write(S, "fp8_block", image([("w", "F8_E4M3", [4, 8]), ("w.scale", "F8_E8M0", [1, 1]),
                             ("e", "I8", [2, 16]), ("e.scale", "F8_E8M0", [2, 1])]))
write(S, "metadata_only", image([], {"a": "b", "c": ""}))
write(S, "empty_object", image([]))  # once crashed: qsort of an empty table
write(S, "overlap", image([], header_override=b'{"a":{"dtype":"U8","shape":[2],"data_offsets":[0,2]},'
                                                 b'"b":{"dtype":"U8","shape":[2],"data_offsets":[1,3]}}') + b"xyz")
write(S, "dup_key", image([], header_override=b'{"a":{"dtype":"U8","shape":[1],"data_offsets":[0,1]},'
                                                b'"a":{"dtype":"U8","shape":[1],"data_offsets":[0,1]}}') + b"x")

C = "hfconfig"
base5 = {"architectures": ["Qwen3MoeForCausalLM"], "model_type": "qwen3_moe", "vocab_size": 4096,
         "hidden_size": 256, "intermediate_size": 768, "num_hidden_layers": 4, "num_attention_heads": 4,
         "num_key_value_heads": 2, "head_dim": 64, "moe_intermediate_size": 128, "num_local_experts": 16,
         "num_experts_per_tok": 4, "norm_topk_prob": True, "decoder_sparse_step": 1, "mlp_only_layers": [],
         "rms_norm_eps": 1e-6, "rope_parameters": {"rope_theta": 10000.0, "rope_type": "default"},
         "max_position_embeddings": 4096, "tie_word_embeddings": True, "attention_bias": False,
         "bos_token_id": None, "eos_token_id": 2, "pad_token_id": 0, "dtype": "bfloat16"}
write(C, "transformers5.json", json.dumps(base5, indent=2).encode())
base4 = dict(base5)
del base4["num_local_experts"], base4["rope_parameters"], base4["dtype"]
base4.update({"num_experts": 16, "rope_theta": 1000000.0, "rope_scaling": None, "torch_dtype": "float16",
              "eos_token_id": [2, 3], "mlp_only_layers": [0, 3], "decoder_sparse_step": 2})
write(C, "transformers4.json", json.dumps(base4).encode())
exl3 = dict(base5, num_experts=16, rope_theta=10000.0,
            quantization_config={"quant_method": "exl3", "version": "1.4.1", "bits": 3.0, "head_bits": 6,
                                 "calibration": {"rows": 250, "cols": 2048}, "out_scales": "always",
                                 "codebook": "mul1"})
write(C, "exl3.json", json.dumps(exl3, indent=4).encode())
fp8 = dict(base5, quantization_config={"quant_method": "fp8", "fmt": "e4m3", "weight_block_size": [32, 32],
                                      "scale_fmt": "ue8m0", "activation_scheme": "dynamic", "expert_dtype": "fp4"})
write(C, "fp8.json", json.dumps(fp8, indent=2).encode())  # DeepSeek V4.1's
write(C, "fp8_v3.json", b'{"model_type":"qwen3_moe","quantization_config":{"quant_method":"fp8","fmt":"e4m3",'
      b'"activation_scheme":"dynamic","weight_block_size":[128,128]}}')
write(C, "fp8_bad_block.json", b'{"model_type":"qwen3_moe","quantization_config":{"quant_method":"fp8",'
      b'"weight_block_size":[32,-1]}}')
write(C, "defaults.json", b'{"model_type":"qwen3_moe"}')
write(C, "llama.json", b'{"model_type":"llama","hidden_size":4096}')
write(C, "yarn.json", b'{"model_type":"qwen3_moe","rope_scaling":{"rope_type":"yarn","factor":4.0}}')
write(C, "truncated.json", json.dumps(base5).encode()[:200])

# Regression seeds: inputs the fuzzers once found.
write(C, "regress_huge_real.json", b'{"model_type": "qwen3_moe", "vocab_size": 204866666E61}')  # real -> int cast

# engram_normalize/: text for the Engram key normalizer (formats/engram_vocab.h):
# compatibility forms, accents, case, whitespace runs, the U+E000 sentinel,
# Hangul, Indic marks, and one invalid sequence.
C = "engram_normalize"
write(C, "latin.txt", "  Caf\u00e9 \ufb01nal \u00c5NGSTR\u00d6M \u0130stanbul STRASSE \u1e9e\t\r\n ".encode())
write(C, "compat.txt", "\uff21\uff42\u216b\u2460\u00bd\u33a1\ufdfa\U0001d400\u1f88\u01c5".encode())
write(C, "space.txt", " ".encode())
write(C, "sentinel.txt", " \ue000 x\ue000\u2028\u0085\u00a0\u3000".encode())
write(C, "scripts.txt", "\ud55c\uad6d\uc5b4 \u0915\u094d\u0937\u093f \u05e9\u05c1\u05b8 \u0e01\u0e34 \ufffd".encode())
write(C, "invalid.bin", b"ok \xC3\x28 \xED\xA0\x80")
