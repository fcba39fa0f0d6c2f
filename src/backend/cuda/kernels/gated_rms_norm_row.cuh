// The gated RMSNorm's math on a row of dv = 8 kLanes values held by kLanes lanes, 8 each
// (gated_rms_norm.cu's kernel, and the norm that streams behind the GDN state pass,
// gdn_norm_stream.cu): y = o * rsqrt(mean(o^2) + eps) * w * silu(z), the sum of squares added
// across the lanes by shuffles in a fixed order, so that both give the same bits.
#pragma once

#include "backend/cuda/kernels/bf16x8.cuh"
#include "backend/cuda/kernels/common.cuh"

namespace deltaserve::cuda {

// Every lane of the warp calls it (the shuffles): kLanes-lane groups, a row each.
template <int kLanes>
__device__ inline F32x8 gated_norm_lane(const F32x8& o, const F32x8& z, const F32x8& w, float eps) {
  constexpr int kDv = 8 * kLanes;
  float ss = 0.0f;
#pragma unroll
  for (int e = 0; e < 8; ++e) ss += o.v[e] * o.v[e];
#pragma unroll
  for (int off = kLanes / 2; off > 0; off >>= 1)
    ss += __shfl_xor_sync(0xffffffffu, ss, off, kLanes);
  const float inv = rsqrtf(ss / static_cast<float>(kDv) + eps);
  F32x8 y;
#pragma unroll
  for (int e = 0; e < 8; ++e) y.v[e] = o.v[e] * inv * w.v[e] * silu(z.v[e]);
  return y;
}

}  // namespace deltaserve::cuda
