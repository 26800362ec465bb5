#!/usr/bin/env python3
"""tests/quantize/make_tiny_model.py — write tests/data/quantize/tiny-synth/: a random (untrained)
Qwen3-MoE small enough for the quantizer's driver tests to run in seconds: hidden 128, 2 layers,
2 query heads + 2 KV heads of 64, 4 experts top-2 of moe_intermediate 128, vocab 256, untied
lm_head; bf16. The tokenizer is tests/data/tiny-qwen3moe/tokenizer.json cut to its 256 byte
symbols (no merges, no added tokens): byte-level, every byte one token. Deterministic (numpy seed 7).

    python3 tests/quantize/make_tiny_model.py tests/data/tiny-qwen3moe/tokenizer.json tests/data/quantize/tiny-synth
"""
import json, os, struct, sys
import numpy as np

tok_src, dst = sys.argv[1], sys.argv[2]
os.makedirs(dst, exist_ok=True)
H, L, NH, NKV, HD, E, TOPK, MI, V = 128, 2, 2, 2, 64, 4, 2, 128, 256
cfg = {
    "architectures": ["Qwen3MoeForCausalLM"], "model_type": "qwen3_moe", "hidden_size": H,
    "num_hidden_layers": L, "num_attention_heads": NH, "num_key_value_heads": NKV, "head_dim": HD,
    "intermediate_size": 256, "moe_intermediate_size": MI, "num_experts": E, "num_experts_per_tok": TOPK,
    "norm_topk_prob": True, "decoder_sparse_step": 1, "mlp_only_layers": [], "vocab_size": V,
    "max_position_embeddings": 4096, "rms_norm_eps": 1e-6, "rope_theta": 10000.0,
    "tie_word_embeddings": False, "attention_bias": False, "hidden_act": "silu",
    "eos_token_id": 10, "pad_token_id": 0, "bos_token_id": None, "torch_dtype": "bfloat16",
    "use_sliding_window": False, "sliding_window": None,
}
json.dump(cfg, open(dst + '/config.json', 'w'), indent=2)
rng = np.random.default_rng(7)

def bf16(a):
    u = np.asarray(a, dtype=np.float32).view(np.uint32)
    return ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)

t = {}
def lin(name, out, inp, std):
    t[name] = rng.standard_normal((out, inp)) * std
t['model.embed_tokens.weight'] = rng.standard_normal((V, H))
for l in range(L):
    p = f'model.layers.{l}.'
    t[p + 'input_layernorm.weight'] = np.ones(H)
    t[p + 'post_attention_layernorm.weight'] = np.ones(H)
    t[p + 'self_attn.q_norm.weight'] = np.ones(HD)
    t[p + 'self_attn.k_norm.weight'] = np.ones(HD)
    lin(p + 'self_attn.q_proj.weight', NH * HD, H, H ** -0.5)
    lin(p + 'self_attn.k_proj.weight', NKV * HD, H, H ** -0.5)
    lin(p + 'self_attn.v_proj.weight', NKV * HD, H, H ** -0.5)
    lin(p + 'self_attn.o_proj.weight', H, NH * HD, (NH * HD) ** -0.5 * 0.5)
    lin(p + 'mlp.gate.weight', E, H, H ** -0.5)
    for e in range(E):
        q = p + f'mlp.experts.{e}.'
        lin(q + 'gate_proj.weight', MI, H, H ** -0.5)
        lin(q + 'up_proj.weight', MI, H, H ** -0.5)
        lin(q + 'down_proj.weight', H, MI, MI ** -0.5 * 0.5)
t['model.norm.weight'] = np.ones(H)
lin('lm_head.weight', V, H, H ** -0.5)

hdr, off, blobs = {'__metadata__': {'format': 'pt'}}, 0, []
for k in sorted(t):
    b = bf16(t[k]).tobytes()
    hdr[k] = {'dtype': 'BF16', 'shape': list(np.shape(t[k])), 'data_offsets': [off, off + len(b)]}
    off += len(b)
    blobs.append(b)
hj = json.dumps(hdr, separators=(',', ':')).encode()
hj += b' ' * ((8 - (len(hj) + 8) % 8) % 8)
with open(dst + '/model.safetensors', 'wb') as f:
    f.write(struct.pack('<Q', len(hj)))
    f.write(hj)
    for b in blobs:
        f.write(b)

tok = json.load(open(tok_src))
tok['model']['vocab'] = {s: i for s, i in tok['model']['vocab'].items() if i < 256}
tok['model']['merges'] = []
tok['added_tokens'] = []
json.dump(tok, open(dst + '/tokenizer.json', 'w'), ensure_ascii=False)
json.dump({"add_bos_token": False, "bos_token": None, "eos_token": None, "pad_token": None,
           "tokenizer_class": "Qwen2Tokenizer"}, open(dst + '/tokenizer_config.json', 'w'), indent=2)
