#!/usr/bin/env bash
# One device call's worth of GPU work with every log brought back as one file: runs tools/gpu_run.sh
# with its logs under /tmp/gpu_logs (the device tool returns at most 8 files from $OUT), then packs
# them into $OUT/logs.tgz, also when the call is cut short (TERM) or a stage fails.
# Usage: tools/gpu_batch.sh PLAN   where PLAN is a shell snippet calling `stages [ENV=V ...] STAGE...`
#   e.g. tools/gpu_batch.sh 'stages ops gdntest & stages real; wait; PREFILLS=8192 stages bench'
set -uo pipefail
G=/tmp/gpu_logs
mkdir -p "$G"
pack() { tar -C "$G" -czf "${OUT:-.}/logs.tgz" . 2>/dev/null; }
trap 'pack; exit 143' TERM INT
# stages [ENV=V ...] STAGE...: gpu_run.sh with logs in $G (a sub-folder SUB when SUB=name is given,
# as an argument or in the environment).
stages() {
  local sub=${SUB:-}
  local envs=()
  while [[ $# -gt 0 && $1 == *=* ]]; do
    [[ $1 == SUB=* ]] && sub=${1#SUB=} || envs+=("$1")
    shift
  done
  mkdir -p "$G/$sub"
  env "${envs[@]}" OUT="$G/$sub" tools/gpu_run.sh "$@"
}
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv | tee "$G/gpu.txt"
cat .device_out/COMMIT 2>/dev/null | tee -a "$G/gpu.txt"  # written by tools/stage_device.sh
[ -f .device_out/BASE_COMMIT ] && echo "base $(cat .device_out/BASE_COMMIT)" | tee -a "$G/gpu.txt"
eval "$1"
pack
