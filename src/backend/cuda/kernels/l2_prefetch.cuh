// Bringing a weight into L2 ahead of the projection that reads it: a decode step's GDN and
// attention kernels stream little from DRAM, so the output projection after them can have its
// weight copied into L2 under them instead of streaming it from DRAM itself.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

namespace deltaserve::cuda {

// Launched as a programmatic dependent of the stream's previous kernel: lets its successor start
// at once, waits for the previous kernel to complete (so that its copies do not compete with that
// kernel's streaming, nor does the successor's wait return before that kernel has completed), then
// asks L2 for `bytes` bytes from `p` (bulk prefetches, no completion to wait for).
// Precondition: l2_prefetch_supported(p, bytes). Never allocates or syncs.
cudaError_t launch_l2_prefetch(const void* p, size_t bytes, cudaStream_t stream);

// The bulk prefetch's alignment: p on 16 bytes, bytes a multiple of 16.
inline bool l2_prefetch_supported(const void* p, size_t bytes) {
  return reinterpret_cast<uintptr_t>(p) % 16 == 0 && bytes % 16 == 0;
}

}  // namespace deltaserve::cuda
