#!/usr/bin/env python3
"""Generate formats/unicode_tables.c from the Unicode Character Database.

What lives here and why: the tokenizer's pre-tokenizer regexes need exact
Unicode general categories (\\p{L}, \\p{N}, \\p{M}, \\p{P}, \\p{S}) and \\s
(White_Space), Qwen2/Qwen3's normalizer is NFC, and the Engram compressed
vocabulary (formats/engram_vocab.c) runs HF's NFKC, NFD, StripAccents and
Lowercase normalizers. Rather than depend on a regex or ICU library at build
time, we generate compact C tables once and commit them.

"Exact" means: as HF tokenizers 0.23.2 sees them, which is not one Unicode
version. Its regex engine (Oniguruma 6.9.10) has Unicode 16.0 categories;
its NFC (the unicode-normalization-alignments crate) has Unicode 9.0 data
(probed: a Unicode 13.0 composition and Unicode 10.0 combining classes are
unknown to it). So:
  - categories come from the `unicodedata2` package pinned at 16.0.0
    (pip install unicodedata2==16.0.0; Debian's UCD is only 15.0);
  - White_Space from PropList.txt (unchanged since Unicode 4.1);
  - combining classes, decompositions, composition exclusions and
    NFC_Quick_Check from the Debian UCD (/usr/share/unicode, 15.0), keeping
    only characters whose Age (DerivedAge.txt) is <= NFC_AGE = 9.0. The same
    crate's compatibility decompositions (NFKC) likewise: decompositions of
    assigned characters never change (Unicode's normalization stability), so
    "Age <= 9.0" gives exactly the 9.0 data;
  - StripAccents drops the crate's is_combining_mark, General_Category M
    (Mn, Mc and Me, not Mn only) of Unicode 9.0: the M characters of Age
    <= 9.0 less the category changes since (MARK_CHANGES below). Checked
    against unicodedata2 9.0.0's own table and against HF (2097 code points);
  - Lowercase is Rust's char::to_lowercase (full mapping: U+0130 gives two
    code points; no context, so final sigma is plain sigma), whose tables
    are Unicode 17.0 in the Rust that built tokenizers 0.23.2 (probed: the
    Beria Erfe capitals of 17.0 are lowered). Simple mappings of the UCD
    plus the unconditional SpecialCasing.txt entries, plus the mappings of
    capitals added in 16.0 and 17.0 that the local UCD (15.0) lacks
    (LOWER_ADDED below, from UnicodeData.txt 16.0 / 17.0);
  - Rust's char::is_whitespace (HF's Strip normalizer) is White_Space, the
    UNI_WS bit already there.

    python3 tools/tokenizer/gen_unicode_tables.py [/usr/share/unicode] > formats/unicode_tables.c

Tables:
  - uni_flags: two-level (cp >> 8, cp & 255) table of one byte per code point:
    category class bits, White_Space, NFC_Quick_Check != Yes, ccc != 0;
  - uni_ccc: two-level table of canonical combining classes;
  - uni_decomp: sorted (cp, offset, length) of FULL canonical decompositions
    (recursively expanded, Hangul excluded: algorithmic);
  - uni_comp: sorted ((first << 21) | second, composite) primary composites
    (Full_Composition_Exclusion removed);
  - uni_norm: two-level table of one byte per code point for the Engram
    normalizer: has a compatibility-or-canonical decomposition, is a mark
    StripAccents drops, has a lowercase mapping;
  - uni_kdecomp: sorted (cp, offset, length) of FULL compatibility
    decompositions (NFKD of the character, in canonical order; Hangul
    excluded);
  - uni_lower: sorted (cp, offset, length) of lowercase mappings.
"""
import re
import sys

import unicodedata2

CAT_VERSION = "16.0.0"
NFC_AGE = (9, 0)
assert unicodedata2.unidata_version == CAT_VERSION, unicodedata2.unidata_version

UCD = sys.argv[1] if len(sys.argv) > 1 else "/usr/share/unicode"
NCP = 0x110000

F_L, F_N, F_M, F_P, F_S, F_WS, F_NFCQC, F_CCC = 1, 2, 4, 8, 16, 32, 64, 128
N_KDECOMP, N_MARK, N_LOWER = 1, 2, 4
# General_Category changes since Unicode 9.0 that move a character into or out
# of M (Vedic signs ardhavisarga: Mc -> Lo in 10.0; Sharada sandhi mark:
# Po -> Mn in 11.0): cp -> is it M in 9.0.
MARK_CHANGES = {0x1CF2: True, 0x1CF3: True, 0x111C9: False}
MARKS_9 = 2097
# Lowercase mappings of capitals assigned after Unicode 15.0, which the local
# UCD lacks: (first, last, first's lowercase), cp maps to lowercase + (cp -
# first). Names from unicodedata2 16.0; the 17.0 entries were read off HF
# tokenizers' Lowercase (Rust's table) and are checked, like all the others,
# by the probe golden file of tests/formats/test_engram_vocab.c.
LOWER_ADDED = [
    (0x1C89, 0x1C89, 0x1C8A),    # 16.0 CYRILLIC CAPITAL LETTER TJE
    (0xA7CB, 0xA7CB, 0x0264),    # 16.0 LATIN CAPITAL LETTER RAMS HORN
    (0xA7CC, 0xA7CC, 0xA7CD),    # 16.0 LATIN CAPITAL LETTER S WITH DIAGONAL STROKE
    (0xA7CE, 0xA7CE, 0xA7CF),    # 17.0, Latin Extended-D
    (0xA7D2, 0xA7D2, 0xA7D3),    # 17.0, Latin Extended-D
    (0xA7D4, 0xA7D4, 0xA7D5),    # 17.0, Latin Extended-D
    (0xA7DA, 0xA7DA, 0xA7DB),    # 16.0 LATIN CAPITAL LETTER LAMBDA
    (0xA7DC, 0xA7DC, 0x019B),    # 16.0 LATIN CAPITAL LETTER LAMBDA WITH STROKE
    (0x10D50, 0x10D65, 0x10D70),  # 16.0 GARAY CAPITAL LETTER A .. OLD NA
    (0x16EA0, 0x16EB8, 0x16EBB),  # 17.0, Beria Erfe: 25 capitals
]
CAT = {"L": F_L, "N": F_N, "M": F_M, "P": F_P, "S": F_S}


def ranges(path, prop):
    out = []
    for line in open(path, encoding="utf-8"):
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        fields = [f.strip() for f in line.split(";")]
        if fields[1] != prop:
            continue
        if len(fields) > 2 and prop == "NFC_QC" and fields[2] not in ("N", "M"):
            continue
        a, _, b = fields[0].partition("..")
        out.append((int(a, 16), int(b or a, 16)))
    return out


def age_ranges(path):
    for line in open(path, encoding="utf-8"):
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        r, v = [f.strip() for f in line.split(";")]
        a, _, b = r.partition("..")
        yield int(a, 16), int(b or a, 16), tuple(int(x) for x in v.split("."))


def main():
    version = "?"
    for line in open(f"{UCD}/ReadMe.txt", encoding="utf-8"):
        m = re.search(r"Unicode(\d+\.\d+\.\d+)", line)
        if m:
            version = m.group(1)
            break
    old = set()  # code points assigned by Unicode NFC_AGE
    for a, b, v in age_ranges(f"{UCD}/DerivedAge.txt"):
        if v <= NFC_AGE:
            old.update(range(a, b + 1))

    flags = bytearray(NCP)
    ccc = bytearray(NCP)
    decomp = {}
    kdecomp = {}  # canonical and compatibility mappings (one level)
    marks = set()  # General_Category M of the local UCD, Age <= NFC_AGE
    lower = {}
    first = None
    for line in open(f"{UCD}/UnicodeData.txt", encoding="utf-8"):
        f = line.rstrip("\n").split(";")
        cp = int(f[0], 16)
        name, gc, cc, dm = f[1], f[2], int(f[3]), f[5]
        if name.endswith(", First>"):
            first = cp
            continue
        lo = first if name.endswith(", Last>") else cp
        first = None
        for c in range(lo, cp + 1):
            if c in old:
                ccc[c] = cc
                if cc:
                    flags[c] |= F_CCC
                if gc[0] == "M":
                    marks.add(c)
        if dm and not dm.startswith("<") and cp in old:
            decomp[cp] = [int(x, 16) for x in dm.split()]
        if dm and cp in old:
            kdecomp[cp] = [int(x, 16) for x in dm.split(">")[-1].split()]
        if f[13]:
            lower[cp] = [int(f[13], 16)]
    for line in open(f"{UCD}/SpecialCasing.txt", encoding="utf-8"):
        f = [x.strip() for x in line.split("#", 1)[0].split(";")]
        if len(f) < 4 or (len(f) > 4 and f[4]):  # blank, or conditional (final sigma, locales)
            continue
        cp, lo_ = int(f[0], 16), [int(x, 16) for x in f[1].split()]
        if lo_ != [cp]:
            lower[cp] = lo_
    for a, b, l0 in LOWER_ADDED:
        for c in range(a, b + 1):
            assert c not in lower, hex(c)
            lower[c] = [l0 + c - a]
    for c, is_mark in MARK_CHANGES.items():
        (marks.add if is_mark else marks.discard)(c)
    assert len(marks) == MARKS_9, len(marks)
    for c in range(NCP):
        flags[c] |= CAT.get(unicodedata2.category(chr(c))[0], 0)
    for a, b in ranges(f"{UCD}/PropList.txt", "White_Space"):
        for c in range(a, b + 1):
            flags[c] |= F_WS
    for a, b in ranges(f"{UCD}/DerivedNormalizationProps.txt", "NFC_QC"):
        for c in range(a, b + 1):
            if c in old:
                flags[c] |= F_NFCQC
    excl = set()
    for a, b in ranges(f"{UCD}/DerivedNormalizationProps.txt", "Full_Composition_Exclusion"):
        excl.update(range(a, b + 1))

    def full(cp):
        if cp not in decomp:
            return [cp]
        out = []
        for x in decomp[cp]:
            out.extend(full(x))
        return out

    def kfull(cp):
        if cp not in kdecomp:
            return [cp]
        out = []
        for x in kdecomp[cp]:
            out.extend(kfull(x))
        # canonical order (stable by combining class within runs of non-starters)
        for k in range(1, len(out)):
            j = k
            while j > 0 and ccc[out[j]] and ccc[out[j - 1]] > ccc[out[j]]:
                out[j - 1], out[j] = out[j], out[j - 1]
                j -= 1
        return out

    kfull_map = {}
    for cp in sorted(kdecomp):
        d = kfull(cp)
        assert "".join(map(chr, d)) == unicodedata2.normalize("NFKD", chr(cp)), hex(cp)
        kfull_map[cp] = d
    # formats/engram_vocab.c relies on these two: no reordering needed after
    # StripAccents, and a bound on the code points one character becomes
    assert all(c in marks for c in range(NCP) if ccc[c]), "a non-mark with a combining class"
    assert max(len(d) for d in kfull_map.values()) == 18
    norm = bytearray(NCP)
    for cp in kfull_map:
        norm[cp] |= N_KDECOMP
    for cp in marks:
        norm[cp] |= N_MARK
    for cp in lower:
        norm[cp] |= N_LOWER

    comp = []
    for cp, d in decomp.items():
        if len(d) == 2 and cp not in excl:
            comp.append(((d[0] << 21) | d[1], cp))
    comp.sort()

    def two_level(arr, name):
        blocks, index = {}, []
        for hi in range(NCP >> 8):
            blk = bytes(arr[hi << 8:(hi + 1) << 8])
            if blk not in blocks:
                blocks[blk] = len(blocks)
            index.append(blocks[blk])
        print(f"const uint16_t {name}_index[{len(index)}] = {{")
        for i in range(0, len(index), 16):
            print("    " + ", ".join(str(x) for x in index[i:i + 16]) + ",")
        print("};")
        print(f"const uint8_t {name}_blocks[{len(blocks)}][256] = {{")
        for blk in blocks:
            print("    {" + ",".join(str(x) for x in blk) + "},")
        print("};\n")

    print(f"/* formats/unicode_tables.c — GENERATED by tools/tokenizer/gen_unicode_tables.py. Do not edit.")
    print(f" * General categories: Unicode {CAT_VERSION} (unicodedata2); White_Space and NFC data: the UCD")
    print(f" * {version} (Debian unicode-data), NFC restricted to characters of Unicode "
          f"{NFC_AGE[0]}.{NFC_AGE[1]} (what HF tokenizers' NFC knows).")
    print(f" * NFKC and marks (General_Category M): Unicode {NFC_AGE[0]}.{NFC_AGE[1]} too; lowercase: Unicode 17.0 (Rust's")
    print(" * char::to_lowercase).")
    print(" * Category/White_Space/NFC tables for the tokenizer, NFKC/mark/lowercase tables for the Engram")
    print(" * normalizer; see formats/unicode_tables.h. */")
    print('#include "formats/unicode_tables.h"\n')
    print(f'const char uni_version[] = "categories {CAT_VERSION}, NFC/NFKC/marks {NFC_AGE[0]}.{NFC_AGE[1]}, '
          'lowercase 17.0";\n')
    two_level(flags, "uni_flags")
    two_level(ccc, "uni_ccc")

    pool, rows = [], []
    for cp in sorted(decomp):
        d = full(cp)
        rows.append((cp, len(pool), len(d)))
        pool.extend(d)
    print(f"const uint32_t uni_decomp_pool[{len(pool)}] = {{")
    for i in range(0, len(pool), 12):
        print("    " + ", ".join(f"0x{x:X}" for x in pool[i:i + 12]) + ",")
    print("};")
    print(f"const uni_decomp_entry uni_decomp[{len(rows)}] = {{")
    for cp, off, n in rows:
        print(f"    {{0x{cp:X}, {off}, {n}}},")
    print("};")
    print(f"const size_t uni_decomp_count = {len(rows)};\n")
    print(f"const uni_comp_entry uni_comp[{len(comp)}] = {{")
    for key, cp in comp:
        print(f"    {{0x{key:X}ull, 0x{cp:X}}},")
    print("};")
    print(f"const size_t uni_comp_count = {len(comp)};\n")
    two_level(norm, "uni_norm")
    for name, table in (("uni_kdecomp", kfull_map), ("uni_lower", lower)):
        pool, rows = [], []
        for cp in sorted(table):
            rows.append((cp, len(pool), len(table[cp])))
            pool.extend(table[cp])
        print(f"const uint32_t {name}_pool[{len(pool)}] = {{")
        for i in range(0, len(pool), 12):
            print("    " + ", ".join(f"0x{x:X}" for x in pool[i:i + 12]) + ",")
        print("};")
        print(f"const uni_decomp_entry {name}[{len(rows)}] = {{")
        for cp, off, n in rows:
            print(f"    {{0x{cp:X}, {off}, {n}}},")
        print("};")
        print(f"const size_t {name}_count = {len(rows)};\n")


main()
