#include "backend/cuda/kernels/common.cuh"
#include "backend/cuda/kernels/rms_norm.cuh"

namespace deltaserve::cuda {
namespace {

constexpr int kThreads = 256;

// One block per row. With `add`, residual += x first (rounded to bf16, as the residual stream is).
template <bool kAdd>
__global__ void rms_norm_kernel(__nv_bfloat16* __restrict__ residual,
                                const __nv_bfloat16* __restrict__ x, const float* __restrict__ w,
                                float eps, int n, __nv_bfloat16* __restrict__ out) {
  const size_t row = blockIdx.x;
  __nv_bfloat16* r = residual + row * n;
  const __nv_bfloat16* xr = x + row * n;
  float ss = 0.0f;
  for (int i = threadIdx.x; i < n; i += kThreads) {
    float v = __bfloat162float(xr[i]);
    if (kAdd) {
      const __nv_bfloat16 sum = __float2bfloat16(__bfloat162float(r[i]) + v);
      r[i] = sum;
      v = __bfloat162float(sum);
    }
    ss += v * v;
  }
  const float inv = rsqrtf(block_sum<kThreads>(ss) / static_cast<float>(n) + eps);
  const __nv_bfloat16* src = kAdd ? r : xr;
  for (int i = threadIdx.x; i < n; i += kThreads)
    out[row * n + i] = __float2bfloat16(__bfloat162float(src[i]) * inv * (1.0f + w[i]));
}

}  // namespace

void launch_rms_norm_bf16(const __nv_bfloat16* x, const float* w, float eps, int rows, int n,
                          __nv_bfloat16* out, cudaStream_t stream) {
  if (rows == 0) return;
  rms_norm_kernel<false><<<rows, kThreads, 0, stream>>>(nullptr, x, w, eps, n, out);
}

void launch_add_rms_norm_bf16(__nv_bfloat16* residual, const __nv_bfloat16* x, const float* w,
                              float eps, int rows, int n, __nv_bfloat16* out, cudaStream_t stream) {
  if (rows == 0) return;
  rms_norm_kernel<true><<<rows, kThreads, 0, stream>>>(residual, x, w, eps, n, out);
}

}  // namespace deltaserve::cuda
