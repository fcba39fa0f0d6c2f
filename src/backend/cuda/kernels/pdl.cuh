// Programmatic dependent launch (sm_90): a kernel launched with the programmatic stream
// serialization attribute (launch_dependent) may start while the kernel before it in the stream
// still runs, once every block of that one has called allow_successor (or exited); it must call
// wait_for_predecessor before it touches anything an earlier kernel writes or reads (the wait
// returns once the predecessor has completed, which itself waited on its own: the chain orders
// every earlier kernel).
#pragma once

#include <cuda_runtime.h>

#include <utility>

#include "backend/cuda/ab_switch.h"

namespace deltaserve::cuda::pdl {

// Waits until the grids this one depends on have completed and their memory is visible (returns
// at once for a kernel launched without the attribute).
__device__ inline void wait_for_predecessor() {
  asm volatile("griddepcontrol.wait;\n" ::: "memory");
}

// Lets the next kernel in the stream, if launched with the attribute, start now (its blocks then
// take SM room beside this kernel's; a no-op for other successors).
__device__ inline void allow_successor() {
  asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");
}

// Steps of up to this many rows are decode-sized (the engine's largest decode graph bucket,
// EngineConfig::max_graph_batch): their norm and attention-prep kernels launch as dependents with
// their constant inputs loaded before the wait. Above it (prefill) they launch plainly, loading
// those inputs late: the early loads' registers would cost occupancy there.
constexpr int kDecodeSizedRows = 512;

// Host: whether launch_dependent sets the attribute (DS_PDL=0 turns it off, for A/B timing: each
// such kernel then starts once the one before it has completed; its waits return at once).
inline bool dependent_launch_enabled() {
  static const bool on = ab_switch_on("DS_PDL");
  return on;
}

// Launches `kernel` in thread-block clusters of `cluster` blocks (1 x 1 x 1: none), as a
// programmatic dependent of the stream's previous kernel when `dependent`. The kernel must call
// wait_for_predecessor before touching memory that earlier kernels write or read.
template <class... Params, class... Args>
cudaError_t launch_clustered(bool dependent, dim3 cluster, void (*kernel)(Params...), dim3 grid,
                             dim3 block, size_t smem, cudaStream_t stream, Args&&... args) {
  cudaLaunchAttribute attrs[2];
  unsigned n = 0;
  if (dependent) {
    attrs[n].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attrs[n++].val.programmaticStreamSerializationAllowed = 1;
  }
  if (cluster.x * cluster.y * cluster.z > 1) {
    attrs[n].id = cudaLaunchAttributeClusterDimension;
    attrs[n].val.clusterDim.x = cluster.x;
    attrs[n].val.clusterDim.y = cluster.y;
    attrs[n++].val.clusterDim.z = cluster.z;
  }
  cudaLaunchConfig_t cfg{};
  cfg.gridDim = grid;
  cfg.blockDim = block;
  cfg.dynamicSmemBytes = smem;
  cfg.stream = stream;
  cfg.attrs = attrs;
  cfg.numAttrs = n;
  return cudaLaunchKernelEx(&cfg, kernel, std::forward<Args>(args)...);
}

// launch_clustered without clusters.
template <class... Params, class... Args>
cudaError_t launch_with(bool dependent, void (*kernel)(Params...), dim3 grid, dim3 block,
                        size_t smem, cudaStream_t stream, Args&&... args) {
  return launch_clustered(dependent, dim3(1, 1, 1), kernel, grid, block, smem, stream,
                          std::forward<Args>(args)...);
}

// launch_with, dependent unless DS_PDL=0.
template <class... Params, class... Args>
cudaError_t launch_dependent(void (*kernel)(Params...), dim3 grid, dim3 block, size_t smem,
                             cudaStream_t stream, Args&&... args) {
  return launch_with(dependent_launch_enabled(), kernel, grid, block, smem, stream,
                     std::forward<Args>(args)...);
}

}  // namespace deltaserve::cuda::pdl
