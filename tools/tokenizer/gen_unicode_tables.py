#!/usr/bin/env python3
"""Generate formats/unicode_tables.c from the Unicode Character Database.

What lives here and why: the tokenizer's pre-tokenizer regexes need exact
Unicode general categories (\\p{L}, \\p{N}, \\p{M}, \\p{P}, \\p{S}) and \\s
(White_Space), and Qwen2/Qwen3's normalizer is NFC. Rather than depend on a
regex or ICU library at build time, we generate compact C tables once and
commit them.

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
    only characters whose Age (DerivedAge.txt) is <= NFC_AGE = 9.0.

    python3 tools/tokenizer/gen_unicode_tables.py [/usr/share/unicode] > formats/unicode_tables.c

Tables:
  - uni_flags: two-level (cp >> 8, cp & 255) table of one byte per code point:
    category class bits, White_Space, NFC_Quick_Check != Yes, ccc != 0;
  - uni_ccc: two-level table of canonical combining classes;
  - uni_decomp: sorted (cp, offset, length) of FULL canonical decompositions
    (recursively expanded, Hangul excluded: algorithmic);
  - uni_comp: sorted ((first << 21) | second, composite) primary composites
    (Full_Composition_Exclusion removed).
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
        if dm and not dm.startswith("<") and cp in old:
            decomp[cp] = [int(x, 16) for x in dm.split()]
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
    print(" * Category/White_Space/NFC tables for the tokenizer; see formats/unicode_tables.h. */")
    print('#include "formats/unicode_tables.h"\n')
    print(f'const char uni_version[] = "categories {CAT_VERSION}, NFC {NFC_AGE[0]}.{NFC_AGE[1]}";\n')
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
    print(f"const size_t uni_comp_count = {len(comp)};")


main()
