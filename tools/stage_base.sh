#!/usr/bin/env bash
# Stages a base build for same-lease A/B runs on the H200 (gpu_run.sh's `ab` and `gdnab` stages):
# builds the named bench targets of another commit in a git worktree (its own build folder, ccache
# shared) and strips them into .device_out/bin as NAME_base, beside tools/stage_device.sh's current
# ones. Run tools/stage_device.sh first (it fills .device_out), then this.
# Usage: tools/stage_base.sh COMMIT [TARGET...]   (default targets: gpu_bench gdn_bench)
set -euo pipefail
commit=${1:?usage: tools/stage_base.sh COMMIT [TARGET...]}
shift
targets=("$@")
[ ${#targets[@]} -gt 0 ] || targets=(gpu_bench gdn_bench)
tree=${BASE_TREE:-/tmp/deltaserve_base}
if [ ! -d "$tree" ]; then
  git worktree add -f --detach "$tree" "$commit" >/dev/null
else
  git -C "$tree" checkout -q --detach "$commit"
fi
if [ ! -f "$tree/build/build.ninja" ]; then
  cmake -S "$tree" -B "$tree/build" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DDS_ENABLE_CUDA=ON \
    -DCMAKE_CXX_COMPILER_LAUNCHER=ccache -DCMAKE_CUDA_COMPILER_LAUNCHER=ccache >/dev/null
fi
ninja -C "$tree/build" -j2 "${targets[@]}" >/dev/null
mkdir -p .device_out/bin
for t in "${targets[@]}"; do
  bin=$(find "$tree/build" -type f -name "$t" -perm -u+x | head -1)
  [ -n "$bin" ] || { echo "stage_base: no binary $t built" >&2; exit 1; }
  strip -o ".device_out/bin/${t}_base" "$bin"
done
echo "$(git -C "$tree" rev-parse --short HEAD)" >.device_out/BASE_COMMIT
echo "stage_base: ${targets[*]} of $(cat .device_out/BASE_COMMIT) as *_base in .device_out/bin"
