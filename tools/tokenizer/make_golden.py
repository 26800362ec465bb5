#!/usr/bin/env python3
"""Golden data for the tokenizer tests, made by the reference implementations.

What lives here and why: sparq's tokenizer must give exactly HF tokenizers'
ids and HF's chat-template rendering. This script runs HF tokenizers
(pip install tokenizers==0.23.2 jinja2 numpy unicodedata2==16.0.0) and jinja2 on the committed
tokenizers and texts and writes what they produce; the C tests compare
against it. Nothing here is computed by sparq's own code.

    ninja -C build                             # unpacks tests/data into build/tests/data
    python3 tools/tokenizer/make_stress.py     # the stress texts (if changed)
    python3 tools/tokenizer/make_golden.py     # from the repository root
    sh tools/pack-test-data.sh                 # packs the large .npy it wrote (tests/datapack.c)

Reads the files that are stored packed (the exl3-model tokenizer, the fixtures'
golden.safetensors) from the unpacked copy, build/tests/data ($SPARQ_TEST_DATA if set).
The exl3-model tokenizer is the one exllamav3 copied into tests/data/exl3-model/exl3-3.0bpw/.

Writes (see tests/data/tokenizer/README.md):
  tests/data/tokenizer/random.txt     a seeded random text of edge-case characters
  tests/data/tokenizer/golden/<tok>.<text>.<mode>.npy  int32 ids; mode "special" = special tokens
        parsed (HF default), "plain" = special-token text encoded as text (encode_special_tokens)
  tests/data/tokenizer/golden/<tok>.decode.ids.npy / .txt  random ids and HF's decode of them
  tests/data/tokenizer/golden/<tok>.chat.json  chat renderings by jinja2 of the tokenizer's template
                                      (deepseek-v3: the template of tests/data/tokenizer/deepseek-v3/)
  tests/data/<fixture>/golden/tokenizer_stress_ids.npy  (fixtures, when present; HF default)
"""
import json
import os
import random
import subprocess

import jinja2
import jinja2.sandbox
import numpy as np
import tokenizers

D = "tests/data/tokenizer"
G = f"{D}/golden"
TEXTS = {
    "stress": "tests/data/text/tokenizer-stress.txt",
    "eval": "tests/data/text/eval.txt",
    "random": f"{D}/random.txt",
    "text": "tests/data/exl3-model/text.txt",  # the shared exl3 model's text (its ids.npy = first 512 ids)
}
U = os.environ.get("SPARQ_TEST_DATA", "build/tests/data")  # tests/data with the packed files unpacked
EXL3 = f"{U}/exl3-model/exl3-3.0bpw"  # tokenizer.json, tokenizer_config.json, chat_template.jinja

CHATS = [
    ([("user", "Hello!")], True),
    ([("user", "Hello!")], False),
    ([("system", "You are terse."), ("user", "2+2?")], True),
    ([("system", "S"), ("user", "q1"), ("assistant", "a1"), ("user", "q2")], True),
    ([("user", "q1"), ("assistant", "<think>\nmull\n</think>\n\nanswer"), ("user", "q2"),
      ("assistant", "\n\nplain answer")], False),
    ([("user", "q"), ("assistant", "<think>x</think>y")], False),
    ([("user", "q"), ("system", "late system"), ("user", "<tool_response>r</tool_response>"),
      ("assistant", "<think>\n\nr1\n\n</think>\n\nfinal")], True),
    ([("user", "ünïcödé ✓ <|im_end|> inside")], True),
    ([("system", "A"), ("user", "u"), ("system", "B"), ("assistant", "x</think>y</think>z")], True),
    ([("user", "  padded \n\t"), ("assistant", "\u00a0nbsp\u2003\x1f")], False),
    ([], True),
]


def _gpt2(v):
    v["pre_tokenizer"] = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": True}


LLAMA3_RE = ("(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|"
             "\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+")


def _llama3(v):
    v["pre_tokenizer"]["pretokenizers"][0]["pattern"]["Regex"] = LLAMA3_RE


def _ignore_merges(v):
    v["model"]["ignore_merges"] = True


def _no_norm(v):
    v["normalizer"] = None


VARIANTS = {"gpt2": _gpt2, "ignore_merges": _ignore_merges, "no_nfc": _no_norm, "llama3": _llama3}


def probe_cps():
    """Code points whose class decides piece boundaries: every one whose
    regex class (L/N/M/P/S/other) changed between Unicode 14 and 16, all
    White_Space, printable ASCII, and 6000 random others (seed 3)."""
    import unicodedata
    import unicodedata2
    cls = lambda m, c: m.category(chr(c))[0] if m.category(chr(c))[0] in "LNMPS" else "o"
    pick = {c for c in range(0x110000) if not 0xD800 <= c < 0xE000 and cls(unicodedata, c) != cls(unicodedata2, c)}
    pick |= {0x09, 0x0A, 0x0B, 0x0C, 0x0D, 0x20, 0x85, 0xA0, 0x1680, 0x2028, 0x2029, 0x202F, 0x205F, 0x3000}
    pick |= set(range(0x2000, 0x200B)) | set(range(0x21, 0x7F))
    rnd = random.Random(3)
    while len(pick) < 6000 + 200:
        c = rnd.randrange(1, 0x110000)
        if not 0xD800 <= c < 0xE000:
            pick.add(c)
    return sorted(pick)


def probe_text(cps):
    # must match build_probe_text() in tests/tokenizer/test_tokenizer.c
    return "".join(f"x{chr(c)}y {chr(c)}1{chr(c)}{chr(c)}\n" for c in cps)


def nfc_probe_text():
    """Every character with a canonical decomposition or a combining class
    (Unicode 16), in contexts that compose, reorder and block; plus Hangul."""
    import unicodedata2
    out = []
    for c in range(0x110000):
        if 0xD800 <= c < 0xE000:
            continue
        ch = chr(c)
        d = unicodedata2.decomposition(ch)
        if unicodedata2.combining(ch) or (d and not d.startswith("<")):
            out.append(f"a{ch}\u0323 {ch}\u0301\u0316 {unicodedata2.normalize('NFD', ch)}|")
    out.append("\u1100\u1161\u11a8 \uac00\u11a8 \u1100\u1161 \uac01\u11a8 \u1112\u1175\u11c2")
    return "".join(out)


def random_text(seed, n):
    rnd = random.Random(seed)
    pool = list(" \t\n\r\u00a0\u3000\u2028\u0085\x0b'sStTrReEvVmMlLdDxſ0123456789\u0661\u00b2\u2160aébZ"
                "\u0301\u0308\u0323\u0345\u1100\u1161\u11a8\uac00中文日本カタ\u309b한!?.,;:-_()[]{}<>|/\\\"#$%&*+=@^`~"
                "\u2019\u20ac\U0001f600\U0001f3fd\u200d\ufe0f\u00ad\x01\x1f\x7f\u0100\u0120\u212b\u1e9b\u00c5"
                "\u0958\u0915\u093c\u0f73")
    pool += ["<|im_end|>", "<|im_start|>", "<|endoftext|>", "<\uff5cUser\uff5c>",
             "<\uff5cend\u2581of\u2581sentence\uff5c>", "<|im_end|", "  ", "\r\n", "'ll", "'RE", "hello", " world"]
    return "".join(rnd.choice(pool) for _ in range(n))


def load_tok(path):
    if path.endswith(".zst"):
        data = subprocess.run(["zstd", "-d", "-c", path], check=True, capture_output=True).stdout
        return tokenizers.Tokenizer.from_str(data.decode("utf-8"))
    return tokenizers.Tokenizer.from_file(path)


def encode(tok, text, special):
    tok.encode_special_tokens = not special
    ids = tok.encode(text, add_special_tokens=False).ids
    tok.encode_special_tokens = False
    return np.asarray(ids, dtype=np.int32)


def render_chat(template, msgs, gen, cfg):
    """As transformers' apply_chat_template renders (same jinja2 settings)."""
    env = jinja2.sandbox.ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                                       extensions=["jinja2.ext.loopcontrols"])
    env.filters["tojson"] = lambda x, **k: json.dumps(x, ensure_ascii=False, **k)
    tmpl = env.from_string(template)

    def tok_str(k):
        v = cfg.get(k)
        return v.get("content") if isinstance(v, dict) else v

    return tmpl.render(messages=[{"role": r, "content": c} for r, c in msgs], add_generation_prompt=gen,
                       bos_token=tok_str("bos_token") or "", eos_token=tok_str("eos_token") or "")


def chat_template_of(d):
    p = f"{d}/chat_template.jinja"
    if os.path.exists(p):
        return open(p, encoding="utf-8").read()
    cfg = json.load(open(f"{d}/tokenizer_config.json", encoding="utf-8"))
    return cfg.get("chat_template")


def write_chat(name, d):
    template = chat_template_of(d)
    cfg = json.load(open(f"{d}/tokenizer_config.json", encoding="utf-8"))
    out = []
    for msgs, gen in CHATS:
        try:
            text = render_chat(template, msgs, gen, cfg)
        except jinja2.TemplateError:  # e.g. Qwen3's template indexes messages[0]
            continue
        out.append({"messages": [{"role": r, "content": c} for r, c in msgs], "add_generation_prompt": gen,
                    "text": text})
    with open(f"{G}/{name}.chat.json", "w", encoding="utf-8") as f:
        json.dump(out, f, ensure_ascii=False, indent=1)


def do_tokenizer(name, d, tok_file, texts, fixture_golden=None):
    tok = load_tok(f"{d}/{tok_file}")
    for tname in texts:
        text = open(TEXTS[tname], "rb").read().decode("utf-8")
        # eval.txt has no special-token text: one mode is enough; a fixture's
        # eval ids are `eval_ids` in its golden.safetensors (tools/fixtures/
        # make_golden.py writes them; the C test compares against those), so
        # they are checked here rather than stored twice
        for mode in ("special",) if tname in ("eval", "text") else ("special", "plain"):
            ids = encode(tok, text, mode == "special")
            if fixture_golden and tname == "eval":
                from safetensors.numpy import load_file
                ref = load_file(f"{U}/{name}/golden/golden.safetensors")["eval_ids"]  # stored packed
                assert ids.tolist() == ref.tolist(), f"{name}: eval ids differ from golden.safetensors"
            if fixture_golden and mode == "special" and tname == "stress":
                np.save(f"{fixture_golden}/tokenizer_{tname}_ids.npy", ids)
            if not (fixture_golden and tname == "eval"):
                np.save(f"{G}/{name}.{tname}.{mode}.npy", ids)
        # decode(encode(x)) == normalize(x): check it here, and keep HF's normalized
        # text for the C round-trip test when the tokenizer has a normalizer
        norm = tok.normalizer.normalize_str(text) if tok.normalizer else text
        assert tok.decode(encode(tok, text, True).tolist(), skip_special_tokens=False) == norm, (name, tname)
        if norm != text:
            with open(f"{G}/{name}.{tname}.normalized.txt", "w", encoding="utf-8", newline="") as f:
                f.write(norm)
    # decode of random ids (exercises the lossy UTF-8 repair), special tokens kept
    rnd = random.Random(7)
    ids = [rnd.randrange(tok.get_vocab_size(with_added_tokens=True)) for _ in range(4000)]
    ids = [i for i in ids if tok.id_to_token(i) is not None]
    np.save(f"{G}/{name}.decode.ids.npy", np.asarray(ids, dtype=np.int32))
    with open(f"{G}/{name}.decode.txt", "w", encoding="utf-8", newline="") as f:
        f.write(tok.decode(ids, skip_special_tokens=False))
    with open(f"{G}/{name}.decode-skip.txt", "w", encoding="utf-8", newline="") as f:
        f.write(tok.decode(ids, skip_special_tokens=True))
    if os.path.exists(f"{d}/tokenizer_config.json") and chat_template_of(d):
        write_chat(name, d)
    print(f"{name}: ok")


def main():
    os.makedirs(G, exist_ok=True)
    with open(TEXTS["random"], "w", encoding="utf-8", newline="") as f:
        f.write(random_text(1, 12000))
    do_tokenizer("exl3-model", EXL3, "tokenizer.json", ["stress", "eval", "random", "text"])
    do_tokenizer("deepseek-v4", f"{D}/deepseek-v4", "tokenizer.json.zst", ["stress", "eval", "random"])
    # DeepSeek V3/R1's chat template (its tokenizer_config.json only; the test
    # pairs it with the V4 tokenizer.json, which has the same special tokens)
    write_chat("deepseek-v3", f"{D}/deepseek-v3")
    # variants of the exl3-model tokenizer exercising other code paths; the C
    # test applies the same patch to the JSON before loading it
    base = json.load(open(f"{EXL3}/tokenizer.json", encoding="utf-8"))
    text = open(TEXTS["stress"], "rb").read().decode("utf-8") + open(TEXTS["random"], "rb").read().decode("utf-8")
    for vname, patch in VARIANTS.items():
        v = json.loads(json.dumps(base))
        patch(v)
        tok = tokenizers.Tokenizer.from_str(json.dumps(v))
        for mode in ("special", "plain"):
            np.save(f"{G}/exl3-model+{vname}.stress+random.{mode}.npy", encode(tok, text, mode == "special"))
    # pre-tokenizer piece boundaries on the probe text, per pre-tokenizer
    cps = probe_cps()
    np.save(f"{G}/probe.cps.npy", np.asarray(cps, dtype=np.int32))
    ptext = probe_text(cps)
    pre = {"qwen2": load_tok(f"{EXL3}/tokenizer.json").pre_tokenizer,
           "deepseek": load_tok(f"{D}/deepseek-v4/tokenizer.json.zst").pre_tokenizer}
    v = json.loads(json.dumps(base))
    _gpt2(v)
    pre["gpt2"] = tokenizers.Tokenizer.from_str(json.dumps(v)).pre_tokenizer
    v = json.loads(json.dumps(base))
    _llama3(v)
    pre["llama3"] = tokenizers.Tokenizer.from_str(json.dumps(v)).pre_tokenizer
    for pname, p in pre.items():
        lens = [len(piece) for piece, _ in p.pre_tokenize_str(ptext)]  # ByteLevel: one char per byte
        assert max(lens) < 256 and sum(lens) == len(ptext.encode("utf-8"))
        np.save(f"{G}/probe.{pname}.lens.npy", np.asarray(lens, dtype=np.uint8))
    # NFC as HF's normalizer does it
    ntext = nfc_probe_text()
    with open(f"{G}/probe-nfc.in.txt", "w", encoding="utf-8", newline="") as f:
        f.write(ntext)
    with open(f"{G}/probe-nfc.out.txt", "w", encoding="utf-8", newline="") as f:
        f.write(tokenizers.normalizers.NFC().normalize_str(ntext))
    # first bad byte of each line of the invalid-UTF-8 file, by Python's decoder
    offs = []
    for line in open("tests/data/text/tokenizer-stress-invalid.bin", "rb").read().split(b"\n")[:-1]:
        try:
            line.decode("utf-8")
            offs.append(-1)
        except UnicodeDecodeError as e:
            offs.append(e.start)
    with open(f"{G}/invalid-offsets.txt", "w") as f:
        f.write(" ".join(map(str, offs)) + "\n")
    seen = {}
    for fx in ("tiny-qwen3moe", "tiny-qwen3moe-b"):
        d = f"tests/data/{fx}"
        if not os.path.exists(f"{d}/tokenizer.json"):
            print(f"{fx}: no tokenizer.json yet, skipped")
            continue
        key = open(f"{d}/tokenizer.json", "rb").read() + open(f"{d}/tokenizer_config.json", "rb").read()
        if key in seen:  # same tokenizer: only the fixture's own golden ids
            tok = load_tok(f"{d}/tokenizer.json")
            for tname in ("eval", "stress"):
                text = open(TEXTS[tname], "rb").read().decode("utf-8")
                np.save(f"{d}/golden/tokenizer_{tname}_ids.npy", encode(tok, text, True))
            print(f"{fx}: same tokenizer as {seen[key]}, fixture golden only")
            continue
        seen[key] = fx
        do_tokenizer(fx, d, "tokenizer.json", ["stress", "eval", "random"], fixture_golden=f"{d}/golden")
    print("now pack the large files written: sh tools/pack-test-data.sh")


if __name__ == "__main__":
    main()
