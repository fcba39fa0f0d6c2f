#include "backend/cuda/kernels/gather_rows.cuh"

namespace deltaserve::cuda {
namespace {

__global__ void gather_rows_kernel(const __nv_bfloat16* __restrict__ table,
                                   const int32_t* __restrict__ rows, int cols,
                                   __nv_bfloat16* __restrict__ out) {
  const int row = rows[blockIdx.x];
  const size_t dst = static_cast<size_t>(blockIdx.x) * cols;
  if (row < 0) {  // a zero row (an embedding id another rank's vocabulary slice holds)
    for (int i = threadIdx.x; i < cols; i += blockDim.x) out[dst + i] = __float2bfloat16(0.0f);
    return;
  }
  const size_t src = static_cast<size_t>(row) * cols;
  for (int i = threadIdx.x; i < cols; i += blockDim.x) out[dst + i] = table[src + i];
}

}  // namespace

void launch_gather_rows_bf16(const __nv_bfloat16* table, const int32_t* rows, int n, int cols,
                             __nv_bfloat16* out, cudaStream_t stream) {
  if (n == 0) return;
  gather_rows_kernel<<<n, 256, 0, stream>>>(table, rows, cols, out);
}

}  // namespace deltaserve::cuda
