#include <algorithm>

#include "backend/cuda/kernels/bf16x8.cuh"
#include "backend/cuda/kernels/common.cuh"
#include "backend/cuda/kernels/pdl.cuh"
#include "backend/cuda/kernels/silu_mul.cuh"

namespace deltaserve::cuda {
namespace {

// Elements [from, n), one at a time (any alignment; also the tail of the vector kernel).
__global__ void silu_mul_kernel(const __nv_bfloat16* __restrict__ g,
                                const __nv_bfloat16* __restrict__ u, int64_t from, int64_t n,
                                __nv_bfloat16* __restrict__ out) {
  pdl::allow_successor();  // a programmatic dependent may start streaming its weights
  pdl::wait_for_predecessor();
  for (int64_t i = from + blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x)
    out[i] = __float2bfloat16(silu(__bfloat162float(g[i])) * __bfloat162float(u[i]));
}

// Eight elements per thread and step, 16-byte aligned: vectors [0, vecs).
__global__ void silu_mul_vec_kernel(const __nv_bfloat16* __restrict__ g,
                                    const __nv_bfloat16* __restrict__ u, int64_t vecs,
                                    __nv_bfloat16* __restrict__ out) {
  pdl::allow_successor();  // a programmatic dependent may start streaming its weights
  pdl::wait_for_predecessor();
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < vecs;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const F32x8 gv = load_bf16x8(g + 8 * i), uv = load_bf16x8(u + 8 * i);
    F32x8 y;
#pragma unroll
    for (int e = 0; e < 8; ++e) y.v[e] = silu(gv.v[e]) * uv.v[e];
    store_bf16x8(out + 8 * i, y);
  }
}

int blocks_for(int64_t items) {
  return static_cast<int>(std::min<int64_t>((items + 255) / 256, 132 * 16));
}

}  // namespace

void launch_silu_mul_bf16(const __nv_bfloat16* gate, const __nv_bfloat16* up, int64_t n,
                          __nv_bfloat16* out, cudaStream_t stream) {
  if (n == 0) return;
  int64_t done = 0;
  if (aligned16(gate, up, out) && n >= 8) {
    const int64_t vecs = n / 8;
    pdl::launch_dependent(silu_mul_vec_kernel, blocks_for(vecs), 256, 0, stream, gate, up, vecs,
                          out);
    done = 8 * vecs;
  }
  if (done < n) silu_mul_kernel<<<blocks_for(n - done), 256, 0, stream>>>(gate, up, done, n, out);
}

}  // namespace deltaserve::cuda
