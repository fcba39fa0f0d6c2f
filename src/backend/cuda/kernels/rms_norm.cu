#include "backend/cuda/kernels/rms_norm.cuh"

namespace deltaserve::cuda {
namespace {

constexpr int kThreads = 256;

__device__ float block_sum(float v) {
  __shared__ float warp_sums[kThreads / 32];
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  if (lane == 0) warp_sums[warp] = v;
  __syncthreads();
  v = lane < kThreads / 32 ? warp_sums[lane] : 0.0f;
  if (warp == 0)
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  __shared__ float total;
  if (threadIdx.x == 0) total = v;
  __syncthreads();
  return total;
}

// One block per row; each thread handles 8 consecutive elements per iteration.
__global__ void rms_norm_bf16_kernel(const __nv_bfloat16* __restrict__ x,
                                     const __nv_bfloat16* __restrict__ w, float eps, int n,
                                     __nv_bfloat16* __restrict__ out) {
  const size_t row = blockIdx.x;
  const uint4* xr = reinterpret_cast<const uint4*>(x + row * n);
  float ss = 0.0f;
  for (int i = threadIdx.x; i < n / 8; i += kThreads) {
    uint4 v = xr[i];
    const __nv_bfloat16* e = reinterpret_cast<const __nv_bfloat16*>(&v);
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      const float f = __bfloat162float(e[j]);
      ss += f * f;
    }
  }
  const float r = rsqrtf(block_sum(ss) / static_cast<float>(n) + eps);
  uint4* o = reinterpret_cast<uint4*>(out + row * n);
  const uint4* wr = reinterpret_cast<const uint4*>(w);
  for (int i = threadIdx.x; i < n / 8; i += kThreads) {
    uint4 v = xr[i], wv = wr[i], res;
    const __nv_bfloat16* e = reinterpret_cast<const __nv_bfloat16*>(&v);
    const __nv_bfloat16* we = reinterpret_cast<const __nv_bfloat16*>(&wv);
    __nv_bfloat16* oe = reinterpret_cast<__nv_bfloat16*>(&res);
#pragma unroll
    for (int j = 0; j < 8; ++j)
      oe[j] = __float2bfloat16(__bfloat162float(e[j]) * r * (1.0f + __bfloat162float(we[j])));
    o[i] = res;
  }
}

}  // namespace

void launch_rms_norm_bf16(const __nv_bfloat16* x, const __nv_bfloat16* w, float eps, int rows,
                          int n, __nv_bfloat16* out, cudaStream_t stream) {
  if (rows == 0) return;
  rms_norm_bf16_kernel<<<rows, kThreads, 0, stream>>>(x, w, eps, n, out);
}

}  // namespace deltaserve::cuda
