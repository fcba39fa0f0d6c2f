// Bringing a weight into L2 ahead of the projection that reads it. A decode step's GDN and
// attention kernels stream little from DRAM, so the output projection after them can have its
// weight pulled into L2 under them, from a stream beside the step's (l2_prefetcher.h), instead of
// streaming it from DRAM itself.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

namespace deltaserve::cuda {

// Asks L2 for `bytes` bytes from `p` (bulk prefetches, nothing to wait for: the kernel ends once
// they are issued). A plain launch: it orders after the stream's earlier work.
// Precondition: l2_prefetch_supported(p, bytes). Never allocates or syncs.
cudaError_t launch_l2_prefetch(const void* p, size_t bytes, cudaStream_t stream);

// The bulk prefetch's alignment: p on 16 bytes, bytes a multiple of 16.
inline bool l2_prefetch_supported(const void* p, size_t bytes) {
  return reinterpret_cast<uintptr_t>(p) % 16 == 0 && bytes % 16 == 0;
}

}  // namespace deltaserve::cuda
