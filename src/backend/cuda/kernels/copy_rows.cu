#include "backend/cuda/kernels/copy_rows.cuh"

namespace deltaserve::cuda {
namespace {

constexpr int kThreads = 256, kBlocksPerRow = 16;

// Block (slice of a row, tensor, move): 16-byte copies when the row allows, else bytes.
__global__ void __launch_bounds__(kThreads) copy_rows_kernel(RowCopies c) {
  const int t = blockIdx.y, m = blockIdx.z;
  const int64_t bytes = c.row_bytes[t];
  const char* src = c.base[t] + bytes * c.src[m];
  char* dst = c.base[t] + bytes * c.dst[m];
  const int64_t first = static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x,
                stride = static_cast<int64_t>(gridDim.x) * kThreads;
  if (bytes % 16 == 0) {
    const int4* s = reinterpret_cast<const int4*>(src);
    int4* d = reinterpret_cast<int4*>(dst);
    for (int64_t i = first; i < bytes / 16; i += stride) d[i] = s[i];
  } else {
    for (int64_t i = first; i < bytes; i += stride) dst[i] = src[i];
  }
}

}  // namespace

void launch_copy_rows(const RowCopies& c, cudaStream_t stream) {
  if (c.tensors == 0 || c.moves == 0) return;
  copy_rows_kernel<<<dim3(kBlocksPerRow, c.tensors, c.moves), kThreads, 0, stream>>>(c);
}

}  // namespace deltaserve::cuda
