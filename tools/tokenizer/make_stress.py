#!/usr/bin/env python3
"""Write the tokenizer stress texts (tests/data/text/tokenizer-stress.txt and
tokenizer-stress-invalid.bin).

What lives here and why: the pre-tokenizer regexes, NFC and BPE have many
edge cases that ordinary prose never hits (whitespace runs before a
non-space, \\r\\n, contractions in odd cases, combining marks, ZWJ emoji,
scripts with marks, digits, special-token lookalikes). This script writes one
text that hits each of them, line by line, so that ids can be compared
against HF tokenizers; and a companion of invalid UTF-8 cases, one per line,
for the error tests.

    python3 tools/tokenizer/make_stress.py          # from the repository root
"""
import os

OUT = "tests/data/text"

lines = [
    # English, contractions in every case, and the long-s fold of 's
    "It's, it'S, IT'S; don't DON'T Don'T; we're WE'RE; I've I'VE; I'm I'M; you'll YOU'LL; he'd HE'D.",
    "'s 't 're 've 'm 'll 'd 'x ''s ' s \u2019s (curly) l'amour aujourd'hui rock'n'roll o'clock 'ſ' it'ſ",
    "Contractions at the end: it'", "and 'RE 'Ve 'lL 'Ll",
    # whitespace runs of all kinds
    "two  spaces,   three,    four;\tone tab,\t\ttwo tabs, \t mixed \t\t ends with spaces   ",
    "trailing tab\t",
    "   leading spaces",
    "CRLF line\r\nnext line\r\n\r\n\r\nafter three CRLFs\rlone CR\n\n\nthree LF",
    "spaces before newline   \n  \n\t\n \r\n",
    "NBSP:\u00a0a\u00a0\u00a0b \u00a0c; en quad\u2000em space\u2003thin\u2009hair\u200a; ideographic\u3000space; "
    "line sep\u2028para sep\u2029; NNBSP\u202f; MMSP\u205f; ogham\u1680x; NEL\u0085y; VT\x0bFF\x0cend",
    "zero width: a\u200bb\u200cc\u200dd\ufeffe; word\u2060joiner; soft\u00adhyphen",
    # digits
    "1 12 123 1234 12345 123456 1234567890 3.14159 -2.5e-10 0x1F 1,000,000 10%",
    "Arabic-Indic \u0661\u0662\u0663\u0664; Devanagari \u0967\u0968\u0969; fullwidth \uff11\uff12\uff13; "
    "superscript x\u00b2 \u2153 \u2160\u2161\u2162 \u2460\u2461 \U0001d7ce\U0001d7cf",
    # code
    "def f(x):\n    return x**2 + 1  # comment\n\nclass A(B):\n\tpass\n",
    "int main(void) { for (int i = 0; i < n; ++i) a[i] += b[i] >> 2; return 0; } /* done */",
    "if (x != y && y <= z || !w) { printf(\"%d\\n\", x); } // C++ style; a->b; ::std::vector<int>",
    "<html><body class=\"main\">&nbsp;&amp;</body></html> $HOME ${PATH} `cmd` @decorator #include <stdio.h>",
    "URL: https://example.com/path?q=1&r=2#frag e-mail: someone@example.org",
    "    indented code\n        more indented\n\t\ttabbed",
    "!!! ??? ... --- *** ### ((( ))) [[[ ]]] {{{ }}} ~~~ ^^^ ||| \\\\\\ /// ::: ;;; ,,, '''",
    "a!b?c.d,e;f:g(h)i[j]k{l}m<n>o/p\\q|r~s^t&u*v+w=x-y_z\"'",
    # long words
    "Pneumonoultramicroscopicsilicovolcanoconiosis supercalifragilisticexpialidocious "
    "Donaudampfschifffahrtsgesellschaftskapit\u00e4n " + "abcdefghij" * 12,
    "=" * 100 + " " + "-" * 64 + " " + "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa",
    "base64: QUJDREVGR0hJSktMTU5PUFFSU1RVVldYWVphYmNkZWZnaGlqa2xtbm9wcXJzdHV2d3h5ejAxMjM0NTY3ODkrLw==",
    # Latin with diacritics, precomposed and decomposed (NFC matters)
    "caf\u00e9 cafe\u0301 na\u00efve nai\u0308ve \u00c5ngstr\u00f6m A\u030angstro\u0308m \u212b (angstrom sign) "
    "\u1e9b\u0323 q\u0307\u0323 \u00f1 n\u0303",
    "Stra\u00dfe STRASSE \u0130stanbul \u0131 \u01c5 \ufb01 \ufb03 \u2126 \u212a \u00b5",
    "a\u0300\u0301\u0302\u0303\u0304 stacked marks; e\u0327\u0301 x\u0338 \u0345\u0301",
    "Vietnamese: Ti\u1ebfng Vi\u1ec7t c\u00f3 d\u1ea5u; Tie\u0302\u0301ng Vie\u0323\u0302t",
    # other scripts
    "\u0420\u0443\u0441\u0441\u043a\u0438\u0439 \u0442\u0435\u043a\u0441\u0442; \u0395\u03bb\u03bb\u03b7\u03bd"
    "\u03b9\u03ba\u03ac \u1f00\u0301; \u0423\u043a\u0440\u0430\u0457\u043d\u0441\u044c\u043a\u0430",
    "\u4e2d\u6587\u6587\u672c\uff0c\u5305\u542b\u6807\u70b9\u3002\u65e5\u672c\u8a9e\u306e\u30c6\u30ad\u30b9\u30c8"
    "\u3068\u30ab\u30bf\u30ab\u30ca\u3002\u30fc\u309b\u309c \uff8a\uff9d\uff76\uff78 \u9fa5\u9fa6\u3400\U00020000",
    "\ud55c\uad6d\uc5b4 \ud14d\uc2a4\ud2b8 \u1100\u1161\u11a8 (jamo) \u3131\u314f",
    "\u0627\u0644\u0639\u0631\u0628\u064a\u0629 \u0645\u064e\u0631\u0652\u062d\u064e\u0628\u064b\u0627 "
    "\u05e2\u05d1\u05e8\u05d9\u05ea \u05e9\u05b8\u05c1\u05dc\u05d5\u05b9\u05dd",
    "\u0939\u093f\u0928\u094d\u0926\u0940 \u0915\u094d\u0937\u093f; \u0ba4\u0bae\u0bbf\u0bb4\u0bcd; "
    "\u0e20\u0e32\u0e29\u0e32\u0e44\u0e17\u0e22; \u1019\u103c\u1014\u103a\u1019\u102c; \u0f56\u0f7c\u0f51",
    "\u10e5\u10d0\u10e0\u10d7\u10e3\u10da\u10d8 \u0540\u0561\u0575\u0565\u0580\u0565\u0576 \u12a0\u121b\u122d"
    "\u129b \u13e3\u13b3\u13a9 \u1780\u17d2\u1798\u17c2\u179a",
    "Math: \u2200x\u2208\u211d, \u2203y: x\u00b2+y\u00b2\u2264r\u00b2 \u221e \u2211 \u222b \u2202 \u2207 "
    "\U0001d400\U0001d401 \u2192 \u21d2 \u00b1 \u00d7 \u00f7",
    "Currency: $5 \u20ac10 \u00a320 \u00a5300 \u20b9400 \u20bf0.1 \u00a9 \u00ae \u2122 \u00b0C \u2030",
    # emoji
    "emoji: \U0001f600\U0001f603 \U0001f44d\U0001f3fd \U0001f468\u200d\U0001f469\u200d\U0001f467\u200d"
    "\U0001f466 \U0001f3f3\ufe0f\u200d\U0001f308 \u2764\ufe0f \U0001f1fa\U0001f1f8 \U0001f1e9\U0001f1ea",
    "skin tones: \U0001f44b\U0001f3fb\U0001f44b\U0001f3fc\U0001f44b\U0001f3fd\U0001f44b\U0001f3fe\U0001f44b"
    "\U0001f3ff \U0001f9d1\U0001f3ff\u200d\U0001f4bb keycap 1\ufe0f\u20e3 #\ufe0f\u20e3",
    "\U0001f600text\U0001f600 text\U0001f600 \U0001f600 \U0001f600  \U0001f600",
    # special-token lookalikes
    "<|im_start|>user\nhello<|im_end|>\n<|im_start|>assistant\n",
    "<|endoftext|><|endoftext|> <|im_end|>x<|im_start|><|im_start|>",
    "almost: <|im_end| <|im_end |> <| im_end|> <|IM_END|> <im_end> |im_end| <<|im_end|>> <|im_start|",
    "<think>\nreasoning\n</think>\n\nanswer <tool_call>{\"a\": 1}</tool_call>",
    "<\uff5cbegin\u2581of\u2581sentence\uff5c>deepseek<\uff5cend\u2581of\u2581sentence\uff5c> <\uff5cUser\uff5c>"
    "hi<\uff5cAssistant\uff5c> \u2581\u2581 \uff5c",
    # byte-level edge cases: control characters, the mapped range
    "controls: \x01\x02\x03\x1b[0m\x7f \x1f\x1e done; \u0100\u0120\u0121 \u00ad\u00a0\u00ff",
    "mixed: abc123def 4x4 A1B2C3 3rd 21st i18n l10n x86_64 utf-8 UTF8 e\u0301t\u00e9 123abc \u00e9123",
    "end without newline",
]

text = "\n".join(lines)
os.makedirs(OUT, exist_ok=True)
with open(f"{OUT}/tokenizer-stress.txt", "w", encoding="utf-8", newline="") as f:
    f.write(text)

# Invalid UTF-8, one case per line (each line is invalid on its own; the
# first bad byte's offset within the line is what the tests check).
bad = [
    b"overlong slash \xc0\xaf",
    b"overlong NUL \xc0\x80",
    b"overlong 3-byte \xe0\x80\xaf",
    b"overlong 4-byte \xf0\x80\x80\xaf",
    b"surrogate high \xed\xa0\x80",
    b"surrogate low \xed\xbf\xbf",
    b"beyond U+10FFFF \xf4\x90\x80\x80",
    b"F5 lead \xf5\x80\x80\x80",
    b"truncated 2-byte \xc3",
    b"truncated 3-byte \xe2\x82 end",
    b"truncated 4-byte \xf0\x9f\x98 end",
    b"lone continuation \x80 and \xbf",
    b"0xFF \xff and 0xFE \xfe",
    b"valid \xc3\xa9 then bad \xc3\x28",
]
with open(f"{OUT}/tokenizer-stress-invalid.bin", "wb") as f:
    f.write(b"\n".join(bad) + b"\n")
