// The gated RMSNorm of the chunked rule's output (HF's Qwen3NextRMSNormGated over a value head's
// 128 values), applied by the slice pass's output kernel as it stores it (gdn_chunk_out.cu):
//   y = o * rsqrt(mean(o^2) + eps) * w * silu(z)
// with o rounded to bf16 first, the value the unfused path stores and gated_rms_norm reads.
// A thread holds 16 x 64 of O in the mma accumulator layout: frag[4 nt + 2 hf + e] is row
// 16 m + lane / 4 + 8 hf, column 64 half + 8 nt + 2 (lane % 4) + e. A row's two column halves
// belong to two warps, whose sums of squares meet in shared memory.
#pragma once

#include "backend/cuda/kernels/bf16x8.cuh"
#include "backend/cuda/kernels/common.cuh"
#include "backend/cuda/kernels/gdn_chunk_layout.cuh"

namespace deltaserve::cuda::gdn_chunk {

struct RowSums {
  float ss[2][kChunk];  // per column half and row: the sum of squares of its 64 values
};

// Rounds the fragment to bf16 and leaves its rows' sums of squares over this half in `sums`. Both
// halves' writes must be complete (a barrier) before gated_norm reads them.
__device__ inline void half_row_sums(float* frag, int m, int half, RowSums& sums) {
  const int lane = threadIdx.x % 32;
#pragma unroll
  for (int hf = 0; hf < 2; ++hf) {
    float ss = 0.0f;
#pragma unroll
    for (int nt = 0; nt < 8; ++nt)
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        float& v = frag[4 * nt + 2 * hf + e];
        v = round_bf16(v);
        ss += v * v;
      }
    ss += __shfl_xor_sync(0xffffffffu, ss, 1);
    ss += __shfl_xor_sync(0xffffffffu, ss, 2);
    if (lane % 4 == 0) sums.ss[half][16 * m + lane / 4 + 8 * hf] = ss;
  }
}

// The fragment normed and gated: z_pair(hf, nt) gives z at the fragment's row of hf and its
// columns of nt (a pair).
template <class ZPair>
__device__ inline void gated_norm(float* frag, int m, int half, const RowSums& sums,
                                  const GatedNorm& norm, ZPair z_pair) {
  const int lane = threadIdx.x % 32;
#pragma unroll
  for (int hf = 0; hf < 2; ++hf) {
    const int row = 16 * m + lane / 4 + 8 * hf;
    const float inv = rsqrtf((sums.ss[0][row] + sums.ss[1][row]) / kDim + norm.eps);
#pragma unroll
    for (int nt = 0; nt < 8; ++nt) {
      const int col = 64 * half + 8 * nt + 2 * (lane % 4);
      const float2 z = z_pair(hf, nt);
      const float2 w = __ldg(reinterpret_cast<const float2*>(norm.w + col));
      float* v = &frag[4 * nt + 2 * hf];
      v[0] = v[0] * inv * w.x * silu(z.x);  // gated_rms_norm's order of products
      v[1] = v[1] * inv * w.y * silu(z.y);
    }
  }
}

}  // namespace deltaserve::cuda::gdn_chunk
