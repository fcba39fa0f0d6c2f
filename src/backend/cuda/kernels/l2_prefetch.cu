#include <cstdint>

#include "backend/cuda/kernels/l2_prefetch.cuh"
#include "backend/cuda/kernels/pdl.cuh"

namespace deltaserve::cuda {
namespace {

// Bytes a thread asks for in one bulk prefetch, and threads a block.
constexpr size_t kChunkBytes = 16 * 1024;
constexpr int kThreads = 128;

__global__ void l2_prefetch_kernel(const char* p, size_t bytes) {
  pdl::allow_successor();
  pdl::wait_for_predecessor();
  const size_t stride = static_cast<size_t>(gridDim.x) * kThreads * kChunkBytes;
  for (size_t off = (static_cast<size_t>(blockIdx.x) * kThreads + threadIdx.x) * kChunkBytes;
       off < bytes; off += stride) {
    const auto n = static_cast<uint32_t>(bytes - off < kChunkBytes ? bytes - off : kChunkBytes);
    asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;\n" ::"l"(p + off), "r"(n) : "memory");
  }
}

}  // namespace

cudaError_t launch_l2_prefetch(const void* p, size_t bytes, cudaStream_t stream) {
  if (!l2_prefetch_supported(p, bytes)) return cudaErrorInvalidValue;
  if (bytes == 0) return cudaSuccess;
  const size_t chunks = (bytes + kChunkBytes - 1) / kChunkBytes;
  const int blocks = static_cast<int>((chunks + kThreads - 1) / kThreads);
  return pdl::launch_dependent(l2_prefetch_kernel, blocks, kThreads, 0, stream,
                               static_cast<const char*>(p), bytes);
}

}  // namespace deltaserve::cuda
