#!/usr/bin/env bash
# The same workload in-process (`bench offline`) and over HTTP (`bench serve` against a local
# `deltaserve serve`), at several concurrencies, 3 runs each; prints one JSON line per run.
# Usage: bench/http_overhead.sh DELTASERVE_BINARY TOKENIZER_DIR [MODEL_DIR]
set -euo pipefail
bin=$1 tok=$2 model=${3:-test_data/tiny_real}
common="--num-prompts 64 --input-len 128 --output-len 32"
"$bin" serve --model "$model" --tokenizer "$tok" --port 8123 --max-num-seqs 64 --max-model-len 512 \
  --kv-cache-gib 1 >/tmp/http_overhead_server.log 2>&1 &
pid=$!
trap 'kill $pid 2>/dev/null || true' EXIT
for _ in $(seq 1 300); do grep -q ready /tmp/http_overhead_server.log && break; sleep 0.1; done
for c in 1 16 64; do
  for run in 1 2 3; do
    "$bin" bench offline --model "$model" $common --max-concurrency $c --max-num-seqs 64 --max-model-len 512 2>/dev/null
    "$bin" bench serve --port 8123 $common --max-concurrency $c --vocab 384
  done
done
kill -TERM $pid
wait $pid
