#!/bin/sh
# tools/pack-test-data.sh — store tests/data's large files packed (zstd, with
# byte planes for safetensors / npy: tests/datapack.c), so that the tree stays
# small; the build unpacks them into BUILD/tests/data, which the tests read.
#
# Which files are packed (the rule; tests/data/README.md lists the result):
# every *.safetensors and *.npy of 32 KiB or more, and the two large JSON
# files of exllamav3's model (its tokenizer.json, quantization_config.json).
# Text that people read, run or diff stays plain (tests/data/text/*.txt, the
# fixtures' tokenizer.json, READMEs, golden .txt / .json).
#
# Run it after a generator (tools/fixtures/*, tools/tokenizer/make_golden.py,
# tests/quantize/make_*.py, tests/data/exl3/make_data.py) has written plain
# files into tests/data: it packs those and removes the plain copies (a
# packed file that is still current is left alone). Then commit the *.zst.
#   usage: tools/pack-test-data.sh [BUILD_DIR]   (default build, set up with meson)
# (It builds only the tool: a full ninja run would stop first, at the build step
# that refuses a plain file beside its packed form.)
set -eu
cd "$(dirname "$0")/.."
B=${1:-build}
DP="$B/tests/datapack"
ninja -C "$B" tests/datapack > /dev/null
{
  find tests/data -type f \( -name '*.safetensors' -o -name '*.npy' \) -size +32k
  for f in tests/data/exl3-model/exl3-3.0bpw/tokenizer.json tests/data/exl3-model/exl3-3.0bpw/quantization_config.json; do
    [ -f "$f" ] && echo "$f"
  done
} | sort | while read -r f; do
  "$DP" pack "$f"
done
