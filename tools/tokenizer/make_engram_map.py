#!/usr/bin/env python3
"""Golden data for DeepSeek V4.1's Engram compressed vocabulary and hash rows.

What lives here and why: the Engram hash of DeepSeek V4.1 hashes compressed
token ids, a many-to-one map of the tokenizer's vocabulary defined by
DeepSeek's Engram demo (engram_demo_v1.py, CompressedTokenizer): every id in
order is decoded alone with transformers (special tokens kept), and keyed by
its raw token string if the text holds U+FFFD, else by a tokenizers
normalizer Sequence of the text (or the text itself if that is empty); the
first time a key is seen it gets the next id. This script runs exactly that
with transformers + tokenizers (written from the demo's description, not
copied) and, independently of sparq, the V4.1 hash rows of both Engram
layers for a tokenized text (reference.md 3.1). The C tests
(tests/formats/test_engram_vocab.c) compare sparq against what it writes.

    pip install tokenizers==0.23.2 transformers==5.24.0 numpy   # no torch needed
    ninja -C build                               # unpacks the DeepSeek V4 tokenizer.json
    python3 tools/tokenizer/make_engram_map.py   # from the repository root
    sh tools/pack-test-data.sh build             # packs the .npy files of 32 KiB or more

Writes, under tests/data/tokenizer/golden/ (see tests/data/tokenizer/README.md):
  deepseek-v4.engram-map.npy    uint32 [129280]: compressed id of every token id
  deepseek-v4.engram.json       the count, versions, the vendor-rule multiplier check,
                                normalizer cases (in/out by HF's normalizer)
  engram-norm.probe.npy         int32 records, HF's normalizer on every code point
                                alone and between "A" and "b", where it changes it
  probe-nfc.engram.txt          HF's normalizer on probe-nfc.in.txt (composition,
                                reordering and blocking contexts)
  deepseek-v4.engram-rows.ids.npy  int32 [T]: BOS + the ids of the head of text/eval.txt
  deepseek-v4.engram-rows.npy      int64 [T, 2, 24]: global Engram rows, layers 1 and 14
"""
import json
import os

import numpy as np
import tokenizers
import transformers
from tokenizers import Regex, normalizers
from transformers import AutoTokenizer

G = "tests/data/tokenizer/golden"
BUILD_DATA = os.environ.get("SPARQ_TEST_DATA", "build/tests/data")
TOK_DIR = f"{BUILD_DATA}/tokenizer/deepseek-v4"
EXPECTED_COMPRESSED = 99092
PAD = 2
SENTINEL = "\ue000"

# reference.md 3.1: the published multipliers, m_0..m_3 for layers 1 and 14
MULTIPLIERS = {
    1: [76632096046245, 4839876093313, 35959672319349, 73987337458391],
    14: [67716810739261, 51510806800915, 30921347202721, 82619226485591],
}
PRIME_BASE = 16_000_000
HEADS = 8
ROWS = {1: 384_006_168, 14: 384_016_682}

CASES = [
    "", " ", "  ", "\t", "\n", "\r\n", " \t\r\n ", "\u00a0", "\u3000", "\u2028", " \u2028", "\u0085 x ",
    "\ufb01", "\ufb01nal", "\uff21\uff42\uff43", "\u216b", "\u2460", "\u00bd", "\u33a1", "\ufdfa",
    "caf\u00e9", "cafe\u0301", "\u00c5ngstr\u00f6m", "\u212b", "\u0130stanbul", "\u0130", "I\u0307",
    "\u1e9e", "\u00df", "STRASSE", "\u01c5", "\u03a3\u039f\u03a6\u039f\u03a3", "\u1f88",
    "  Hello   World  ", "a\tb\nc\r\nd", "\ue000", " \ue000 ", "x\ue000y", "\ufffd", "\u00e9\u0301\u0301",
    "\ud55c\uad6d\uc5b4", "\u1100\u1161\u11a8", "\u0928\u093f", "\u0915\u094d\u0937", "\u0e01\u0e34",
    "\u05e9\u05c1\u05b8", "\u2126", "\u00b5", "\u017f", "\u1d43", "\u24b6", "\U0001d400\U0001d41a",
    "\u0345", "\u0344", "\u0f73", "\u1cf2", "\U000111c9", "\ua7cb", "\U00016ea0", "\u0041\u030a\u0301",
    "Hello, World!", "<\uff5cend\u2581of\u2581sentence\uff5c>", "\u2581\u2581",
]


def normalizer():
    return normalizers.Sequence([
        normalizers.NFKC(),
        normalizers.NFD(),
        normalizers.StripAccents(),
        normalizers.Lowercase(),
        normalizers.Replace(Regex(r"[ \t\r\n]+"), " "),
        normalizers.Replace(Regex(r"^ $"), SENTINEL),
        normalizers.Strip(),
        normalizers.Replace(SENTINEL, " "),
    ])


def compressed_map(tok, norm):
    """map[tid] for tid in 0..len(tok)-1, and the number of distinct keys."""
    key_id = {}
    out = np.empty(len(tok), dtype=np.uint32)
    for tid in range(len(tok)):
        text = tok.decode([tid], skip_special_tokens=False)
        if "\ufffd" in text:
            key = tok.convert_ids_to_tokens(tid)
        else:
            key = norm.normalize_str(text) or text
        out[tid] = key_id.setdefault(key, len(key_id))
    return out, len(key_id)


def next_prime(n):
    def is_prime(p):
        if p % 2 == 0:
            return p == 2
        f = 3
        while f * f <= p:
            if p % f == 0:
                return False
            f += 2
        return True
    p = n + 1
    while not is_prime(p):
        p += 1
    return p


def primes_per_layer():
    out, p = {}, PRIME_BASE
    for layer in (1, 14):
        ps = []
        for _ in range(3 * HEADS):
            p = next_prime(p)
            ps.append(p)
        out[layer] = ps
    assert out[1][0] == 16_000_057 and out[1][-1] == 16_000_463, out[1]
    assert out[14][0] == 16_000_477 and out[14][-1] == 16_000_889, out[14]
    for layer in (1, 14):
        assert sum(out[layer]) == ROWS[layer], (layer, sum(out[layer]))
    return out


def engram_rows(cids, primes):
    """int64 [T, 2, 24] global rows, numpy int64 arithmetic as the vendor's hash."""
    T = len(cids)
    x = np.asarray(cids, dtype=np.int64)
    shifted = [np.concatenate([np.full(k, PAD, dtype=np.int64), x[:T - k]]) for k in range(4)]
    rows = np.empty((T, 2, 3 * HEADS), dtype=np.int64)
    for li, layer in enumerate((1, 14)):
        m = np.asarray(MULTIPLIERS[layer], dtype=np.int64)
        ps = primes[layer]
        offsets = np.concatenate([[0], np.cumsum(ps[:-1])]).astype(np.int64)
        h = shifted[0] * m[0]
        for i in range(1, 4):  # n-gram order i + 1
            h = np.bitwise_xor(h, shifted[i] * m[i])
            for j in range(HEADS):
                c = (i - 1) * HEADS + j
                rows[:, li, c] = h % ps[c] + offsets[c]
    return rows


def vendor_multipliers(n_compressed, layer):
    """The vendor's rule: seeded by 10007 * layer_id (seed 0), odd, below 2 * half_bound."""
    half_bound = max(1, (np.iinfo(np.int64).max // n_compressed) // 2)
    g = np.random.default_rng(10007 * layer)
    return (g.integers(low=0, high=half_bound, size=(4,), dtype=np.int64) * 2 + 1).tolist()


def probe_records(norm):
    """HF's normalizer on every code point c, alone and as "A" c "b": one record
    [c, n1, out1..., n2, out2...] per c where either result is not the identity
    ("c" and "a" c "b")."""
    rec = []
    for c in range(0x110000):
        if 0xD800 <= c < 0xE000:
            continue
        ch = chr(c)
        o1, o2 = norm.normalize_str(ch), norm.normalize_str("A" + ch + "b")
        if o1 != ch or o2 != "a" + ch + "b":
            rec += [c, len(o1), *map(ord, o1), len(o2), *map(ord, o2)]
    return np.asarray(rec, dtype=np.int32)


def main():
    norm = normalizer()
    tok = AutoTokenizer.from_pretrained(TOK_DIR)
    # transformers' decode would apply clean_up_tokenization_spaces if the
    # config asked for it; DeepSeek V4's does not, so decode = tokenizers' decode
    assert tok.clean_up_tokenization_spaces is False
    cmap, n_compressed = compressed_map(tok, norm)
    print(f"{len(tok)} ids -> {n_compressed} compressed ids; pad {PAD} -> {cmap[PAD]}")
    assert n_compressed == EXPECTED_COMPRESSED, n_compressed
    assert cmap[PAD] == PAD
    np.save(f"{G}/deepseek-v4.engram-map.npy", cmap)

    vendor = {layer: vendor_multipliers(n_compressed, layer) for layer in (1, 14)}
    match = all(vendor[layer] == MULTIPLIERS[layer] for layer in (1, 14))
    print("multipliers from the vendor's rule:", vendor, "match" if match else "DO NOT MATCH the published ones")

    primes = primes_per_layer()
    text = open("tests/data/text/eval.txt", encoding="utf-8").read()
    text = text[:text.index("\n", 1500) + 1]
    # BOS first, as the model sees a prompt (transformers 5 honours the config's
    # add_bos_token = false, so it is prepended here rather than by the call)
    ids = [tok.bos_token_id] + tok.encode(text, add_special_tokens=False)
    rows = engram_rows(cmap[np.asarray(ids)].astype(np.int64), primes)
    for li, layer in enumerate((1, 14)):
        assert rows[:, li].min() >= 0 and rows[:, li].max() < ROWS[layer]
    np.save(f"{G}/deepseek-v4.engram-rows.ids.npy", np.asarray(ids, dtype=np.int32))
    np.save(f"{G}/deepseek-v4.engram-rows.npy", rows)
    print(f"rows of {len(ids)} positions ({len(text)} characters of eval.txt)")

    cases = [{"in": s, "out": norm.normalize_str(s)} for s in CASES]
    with open(f"{G}/deepseek-v4.engram.json", "w", encoding="utf-8") as f:
        json.dump({
            "tokenizer": "tests/data/tokenizer/deepseek-v4",
            "versions": {"tokenizers": tokenizers.__version__, "transformers": transformers.__version__,
                         "numpy": np.__version__},
            "n_ids": len(tok),
            "n_compressed": n_compressed,
            "pad": [PAD, int(cmap[PAD])],
            "multipliers": {str(k): v for k, v in MULTIPLIERS.items()},
            "vendor_rule_multipliers": {str(k): v for k, v in vendor.items()},
            "multipliers_match_vendor_rule": match,
            "primes": {str(k): v for k, v in primes.items()},
            "rows_text": f"tests/data/text/eval.txt, first {len(text)} characters, BOS prepended",
            "normalizer": cases,
        }, f, ensure_ascii=True, indent=1)
        f.write("\n")

    np.save(f"{G}/engram-norm.probe.npy", probe_records(norm))
    with open(f"{G}/probe-nfc.in.txt", encoding="utf-8", newline="") as f:
        probe = f.read()
    with open(f"{G}/probe-nfc.engram.txt", "w", encoding="utf-8", newline="") as f:
        f.write(norm.normalize_str(probe))


if __name__ == "__main__":
    main()
