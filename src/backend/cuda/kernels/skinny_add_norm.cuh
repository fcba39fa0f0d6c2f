// The add-norm form's epilogue pieces of the weight-streaming GEMM (skinny_gemm.cu): a finished
// tile's outputs added into the residual stream, and the rows' RMSNorm once every tile is in —
// the values the unfused GEMM + launch_add_rms_norm_bf16 give (the residual bit for bit; the norm
// summed in another order).
#pragma once

#include <cuda_bf16.h>

#include "backend/cuda/kernels/bf16x8.cuh"
#include "backend/cuda/kernels/common.cuh"
#include "backend/cuda/kernels/skinny_gemm.cuh"

namespace deltaserve::cuda {

// residual = bf16(residual + bf16(v)): the projection rounded as the unfused GEMM stores it.
__device__ inline void add_to_residual(__nv_bfloat16* r, float v) {
  *r = __float2bfloat16(__bfloat162float(*r) + round_bf16(v));
}

// The same for the four columns col .. col + 3 of a row of n (those below n).
__device__ inline void add4_to_residual(__nv_bfloat16* r, int col, int n, const float4& v) {
  const float e[4] = {v.x, v.y, v.z, v.w};
  for (int j = 0; j < 4 && col + j < n; ++j) add_to_residual(r + j, e[j]);
}

// out = rms_norm(residual) * (1 + w) of T rows of n (n % 8 == 0, 16-byte aligned rows), a warp a
// row, by the first `threads` threads of the block. The residual rows are read past L1: other
// blocks wrote them (the caller acquired their release).
__device__ inline void norm_rows(const SkinnyAddNorm& an, int T, int n, int threads) {
  const int lane = static_cast<int>(threadIdx.x) % 32, warps = threads / 32;
  const int vecs = n / 8;
  for (int row = static_cast<int>(threadIdx.x) / 32; row < T; row += warps) {
    const __nv_bfloat16* r = an.residual + static_cast<size_t>(row) * n;
    float ss = 0.0f;
    for (int i = lane; i < vecs; i += 32) {
      const uint4 raw = __ldcg(reinterpret_cast<const uint4*>(r + 8 * i));
      const F32x8 v = unpack_bf16x8(raw);
#pragma unroll
      for (int e = 0; e < 8; ++e) ss += v.v[e] * v.v[e];
    }
    const float inv = rsqrtf(warp_sum(ss) / static_cast<float>(n) + an.eps);
    for (int i = lane; i < vecs; i += 32) {
      const F32x8 v = unpack_bf16x8(__ldcg(reinterpret_cast<const uint4*>(r + 8 * i)));
      const F32x8 w = load_f32x8(an.norm_w + 8 * i);
      F32x8 y;
#pragma unroll
      for (int e = 0; e < 8; ++e) y.v[e] = v.v[e] * inv * (1.0f + w.v[e]);
      store_bf16x8(an.out + static_cast<size_t>(row) * n + 8 * i, y);
    }
  }
}

}  // namespace deltaserve::cuda
