#!/usr/bin/env bash
# Writes the tokenizer benchmark text (a few MB of code, prose and the multilingual test corpus)
# to $1, deterministically from the working tree, so both machines measure the same bytes.
set -euo pipefail
cd "$(dirname "$0")/.."
out=$1
: > "$out"
files=$(find src tests tools docs README.md -type f \( -name '*.cpp' -o -name '*.h' -o -name '*.cu' -o -name '*.cuh' -o -name '*.py' -o -name '*.md' \) | LC_ALL=C sort)
for _ in $(seq 1 200); do
  cat $files test_data/tokenizer/corpus.json >> "$out"
  [ "$(stat -c %s "$out")" -ge 4000000 ] && break
done
