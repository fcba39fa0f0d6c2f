#include "backend/cuda/kernels/l2_prefetch.cuh"

namespace deltaserve::cuda {
namespace {

// Bytes one bulk prefetch asks for, and threads a block: one warp a block, so that the requests
// leave from many SMs' copy engines at once.
constexpr size_t kPieceBytes = 16 * 1024;
constexpr int kThreads = 32;

__global__ void l2_prefetch_kernel(const char* p, size_t bytes) {
  const size_t stride = static_cast<size_t>(gridDim.x) * kThreads * kPieceBytes;
  for (size_t off = (static_cast<size_t>(blockIdx.x) * kThreads + threadIdx.x) * kPieceBytes;
       off < bytes; off += stride) {
    const auto n = static_cast<uint32_t>(bytes - off < kPieceBytes ? bytes - off : kPieceBytes);
    asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;\n" ::"l"(p + off), "r"(n) : "memory");
  }
}

}  // namespace

cudaError_t launch_l2_prefetch(const void* p, size_t bytes, cudaStream_t stream) {
  if (!l2_prefetch_supported(p, bytes)) return cudaErrorInvalidValue;
  if (bytes == 0) return cudaSuccess;
  const size_t pieces = (bytes + kPieceBytes - 1) / kPieceBytes;
  const size_t blocks = (pieces + kThreads - 1) / kThreads;
  constexpr size_t kMaxBlocks = 1024;  // more pieces a thread past this
  l2_prefetch_kernel<<<static_cast<unsigned>(blocks < kMaxBlocks ? blocks : kMaxBlocks), kThreads,
                       0, stream>>>(static_cast<const char*>(p), bytes);
  return cudaGetLastError();
}

}  // namespace deltaserve::cuda
