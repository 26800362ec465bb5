#!/usr/bin/env python3
"""tools/bench/pack_fake_model.py — a full-size model made of holes, for `sparq plan`.

Writes OUT/config.json and OUT/model.safetensors with the exact tensor names, dtypes and shapes
an EXL3 conversion of a large Qwen3-MoE would have (reference.md §1.4: <key>.trellis int16
(k/16, n/16, 16*K), .suh/.svh fp16, .mul1 int32 scalar), but the data buffer is a sparse file
(truncate), so it takes no disk space. `sparq plan` reads only the header, so the plan's numbers
are those of the real model. Default: Qwen3-235B-A22B shapes, experts at 3 bits, attention at
5, lm_head at 6 (exllamav3's defaults for -b 3.0).

    python3 tools/bench/pack_fake_model.py /tmp/qwen3-235b-exl3
    build/cli/sparq plan /tmp/qwen3-235b-exl3 --boxes 1
"""
import json
import os
import struct
import sys

CFG = {
    "architectures": ["Qwen3MoeForCausalLM"], "model_type": "qwen3_moe",
    "vocab_size": 151936, "hidden_size": 4096, "num_hidden_layers": 94,
    "num_attention_heads": 64, "num_key_value_heads": 4, "head_dim": 128,
    "intermediate_size": 12288, "moe_intermediate_size": 1536, "num_experts": 128,
    "num_experts_per_tok": 8, "norm_topk_prob": True, "max_position_embeddings": 40960,
    "rope_theta": 1000000.0, "tie_word_embeddings": False, "torch_dtype": "bfloat16",
    "quantization_config": {"quant_method": "exl3", "bits": 3.0, "head_bits": 6, "codebook": "mul1"},
}


def main():
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    out = sys.argv[1]
    os.makedirs(out, exist_ok=True)
    c = CFG
    d, hd, H, KV = c["hidden_size"], c["head_dim"], c["num_attention_heads"], c["num_key_value_heads"]
    tensors = []  # (name, dtype, shape, nbytes)

    def plain(name, shape, dtype="BF16"):
        n = 2
        for s in shape:
            n *= s
        tensors.append((name, dtype, shape, n))

    def exl3(key, k, n, bits):
        tensors.append((key + ".trellis", "I16", [k // 16, n // 16, 16 * bits], k * n * bits // 8))
        tensors.append((key + ".suh", "F16", [k], 2 * k))
        tensors.append((key + ".svh", "F16", [n], 2 * n))
        tensors.append((key + ".mul1", "I32", [], 4))

    plain("model.embed_tokens.weight", [c["vocab_size"], d])
    plain("model.norm.weight", [d])
    exl3("lm_head", d, c["vocab_size"], 6)
    for L in range(c["num_hidden_layers"]):
        p = f"model.layers.{L}."
        plain(p + "input_layernorm.weight", [d])
        plain(p + "post_attention_layernorm.weight", [d])
        plain(p + "self_attn.q_norm.weight", [hd])
        plain(p + "self_attn.k_norm.weight", [hd])
        exl3(p + "self_attn.q_proj", d, H * hd, 5)
        exl3(p + "self_attn.k_proj", d, KV * hd, 5)
        exl3(p + "self_attn.v_proj", d, KV * hd, 5)
        exl3(p + "self_attn.o_proj", H * hd, d, 5)
        plain(p + "mlp.gate.weight", [c["num_experts"], d], "F16")
        mi = c["moe_intermediate_size"]
        for e in range(c["num_experts"]):
            exl3(p + f"mlp.experts.{e}.gate_proj", d, mi, 3)
            exl3(p + f"mlp.experts.{e}.up_proj", d, mi, 3)
            exl3(p + f"mlp.experts.{e}.down_proj", mi, d, 3)
    header, off = {}, 0
    for name, dt, shape, n in sorted(tensors):
        header[name] = {"dtype": dt, "shape": shape, "data_offsets": [off, off + n]}
        off += n
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * (-(8 + len(h)) % 4096)
    path = os.path.join(out, "model.safetensors")
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h)
        f.truncate(8 + len(h) + off)  # a hole: no disk space used
    with open(os.path.join(out, "config.json"), "w") as f:
        json.dump(c, f, indent=2)
    print(f"{out}: {len(tensors)} tensors, {off / 1e9:.1f} GB of (sparse) data")


if __name__ == "__main__":
    main()
