#!/usr/bin/env bash
# The multi-GPU issue's runs in one device command (H200 x2 or larger): every stage of
# tools/gpu_run.sh that belongs to it, in priority order, under one deadline, logs packed into
# $OUT/logs.tgz (the device tool brings back only a few files).
# Usage: tools/gpu_multi.sh [deadline-seconds]
set -uo pipefail
OUT=${OUT:-$PWD/gpu_logs}
mkdir -p "$OUT/logs"
STOP_ON_FAIL=1 OUT=$OUT/logs TP_TIMEOUT=100 BENCH_TIMEOUT=240 timeout "${1:-560}" \
  tools/gpu_run.sh model nccl real benchtp:4b servetp benchtp:9b,27b
echo "gpu_run rc=$?"
tar czf "$OUT/logs.tgz" -C "$OUT/logs" . && rm -rf "$OUT/logs"
