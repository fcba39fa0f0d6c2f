#include <algorithm>

#include "backend/cuda/kernels/common.cuh"
#include "backend/cuda/kernels/silu_mul.cuh"

namespace deltaserve::cuda {
namespace {

__global__ void silu_mul_kernel(const __nv_bfloat16* __restrict__ g,
                                const __nv_bfloat16* __restrict__ u, int64_t n,
                                __nv_bfloat16* __restrict__ out) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x)
    out[i] = __float2bfloat16(silu(__bfloat162float(g[i])) * __bfloat162float(u[i]));
}

}  // namespace

void launch_silu_mul_bf16(const __nv_bfloat16* gate, const __nv_bfloat16* up, int64_t n,
                          __nv_bfloat16* out, cudaStream_t stream) {
  if (n == 0) return;
  const int blocks = static_cast<int>(std::min<int64_t>((n + 255) / 256, 132 * 16));
  silu_mul_kernel<<<blocks, 256, 0, stream>>>(gate, up, n, out);
}

}  // namespace deltaserve::cuda
