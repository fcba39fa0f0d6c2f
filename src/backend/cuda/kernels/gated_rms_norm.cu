#include "backend/cuda/kernels/common.cuh"
#include "backend/cuda/kernels/gated_rms_norm.cuh"

namespace deltaserve::cuda {
namespace {

constexpr int kThreads = 128;

__global__ void gated_rms_norm_kernel(__nv_bfloat16* __restrict__ o,
                                      const __nv_bfloat16* __restrict__ z,
                                      const float* __restrict__ w, float eps, int dv) {
  const size_t base = static_cast<size_t>(blockIdx.x) * dv;
  float ss = 0.0f;
  for (int i = threadIdx.x; i < dv; i += kThreads) {
    const float v = __bfloat162float(o[base + i]);
    ss += v * v;
  }
  const float inv = rsqrtf(block_sum<kThreads>(ss) / static_cast<float>(dv) + eps);
  for (int i = threadIdx.x; i < dv; i += kThreads)
    o[base + i] = __float2bfloat16(__bfloat162float(o[base + i]) * inv * w[i] *
                                   silu(__bfloat162float(z[base + i])));
}

}  // namespace

void launch_gated_rms_norm_bf16(__nv_bfloat16* o, const __nv_bfloat16* z, const float* w, float eps,
                                int rows, int dv, cudaStream_t stream) {
  if (rows == 0) return;
  gated_rms_norm_kernel<<<rows, kThreads, 0, stream>>>(o, z, w, eps, dv);
}

}  // namespace deltaserve::cuda
