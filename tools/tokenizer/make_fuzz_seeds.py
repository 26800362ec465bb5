#!/usr/bin/env python3
"""Seed corpora for the tokenizer fuzz targets (tests/fuzz/corpus/tokenizer_*).

tokenizer_load: small tokenizer.json files covering each supported feature
(Qwen2 Split + NFC, DeepSeek's three Splits, GPT-2 ByteLevel regex, added
tokens, TemplateProcessing, ignore_merges). tokenizer_encode: lines of the
stress texts, each prefixed by the selector byte (bit 0: tokenizer, bit 1:
parse_special).

    python3 tools/tokenizer/make_fuzz_seeds.py      # from the repository root
"""
import json
import os

C = "tests/fuzz/corpus"


def byte_vocab():
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(0xA1, 0xAD)) + list(range(0xAE, 0x100))
    cs, n = bs[:], 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {chr(c): i for i, c in enumerate(cs)}


def tok(pre, norm=None, merges=(("Ġ", "t"), ("h", "e")), added=(), post=None, **model):
    v = byte_vocab()
    for a, b in merges:
        v.setdefault(a + b, len(v))
    return {"version": "1.0", "added_tokens": list(added), "normalizer": norm, "pre_tokenizer": pre,
            "post_processor": post, "decoder": {"type": "ByteLevel"},
            "model": dict(type="BPE", vocab=v, merges=[f"{a} {b}" for a, b in merges], **model)}


def split(re):
    return {"type": "Split", "pattern": {"Regex": re}, "behavior": "Isolated", "invert": False}


QWEN = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
DS = ("[!\"#$%&'()*+,\\-./:;<=>?@\\[\\\\\\]^_`{|}~][A-Za-z]+|[^\r\n\\p{L}\\p{P}\\p{S}]?[\\p{L}\\p{M}]+| ?[\\p{P}\\p{S}]+"
      "[\r\n]*|\\s*[\r\n]+|\\s+(?!\\S)|\\s+")
BL = {"type": "ByteLevel", "add_prefix_space": False, "use_regex": False}
ADDED = [{"id": 300, "content": "<|im_end|>", "special": True, "normalized": False},
         {"id": 301, "content": "her", "special": False, "normalized": True}]

seeds = {
    "qwen2": tok({"type": "Sequence", "pretokenizers": [split(QWEN), BL]}, {"type": "NFC"}, added=ADDED),
    "deepseek": tok({"type": "Sequence", "pretokenizers": [split(r"\p{N}{1,3}"), split("[一-龥぀-ゟ゠-ヿ]+"), split(DS), BL]},
                    {"type": "Sequence", "normalizers": []}, added=ADDED),
    "gpt2": tok({"type": "ByteLevel", "add_prefix_space": False, "use_regex": True}, ignore_merges=True,
                post={"type": "TemplateProcessing", "single": [{"SpecialToken": {"id": "<|im_end|>", "type_id": 0}},
                                                               {"Sequence": {"id": "A", "type_id": 0}}]},
                added=ADDED),
}
os.makedirs(f"{C}/tokenizer_load", exist_ok=True)
for name, t in seeds.items():
    with open(f"{C}/tokenizer_load/{name}.json", "w", encoding="utf-8") as f:
        json.dump(t, f, ensure_ascii=False)

os.makedirs(f"{C}/tokenizer_encode", exist_ok=True)
lines = open("tests/data/text/tokenizer-stress.txt", "rb").read().split(b"\n")
lines += open("tests/data/text/tokenizer-stress-invalid.bin", "rb").read().split(b"\n")[:4]
for i, line in enumerate(lines):
    with open(f"{C}/tokenizer_encode/seed{i:02d}", "wb") as f:
        f.write(bytes([i & 3]) + line)
