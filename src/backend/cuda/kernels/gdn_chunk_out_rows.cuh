// A warp's 16 x 64 piece of a chunk's output as the kernels that form it hold it (gdn_chunk_out.cu,
// gdn_chunk_pass.cu): rows r0 + g (+ 8) of the chunk, columns col0 + 8 nt + 2c (+ 1) of the value
// head in o[4 nt + 2 hf + e] (g = lane / 4, c = lane % 4, hf: the row + 8) — the mma / wgmma
// accumulator layout. Its store, and the gated RMSNorm applied on the way out.
#pragma once

#include <cuda_bf16.h>

#include "backend/cuda/kernels/bf16x8.cuh"
#include "backend/cuda/kernels/common.cuh"
#include "backend/cuda/kernels/gdn_chunk.cuh"
#include "backend/cuda/kernels/gdn_chunk_layout.cuh"

namespace deltaserve::cuda::gdn_chunk {

// Where a chunk's output rows go: row i at token row tok0 + i of out [T, nv, dv], value head h;
// rows from n on are not the sequence's.
struct OutRows {
  int tok0, n, nv, h;
  // The first element of row i (the last valid row's for rows past n: reads stay in bounds).
  __device__ size_t at(int i) const {
    return (static_cast<size_t>(tok0 + min(i, n - 1)) * nv + h) * kDim;
  }
};

// The piece's rows below n, as bf16.
__device__ inline void store_out_piece(const float (&o)[32], int r0, int col0, const OutRows& rows,
                                       __nv_bfloat16* out) {
  const int lane = threadIdx.x % 32, g = lane / 4, c = lane % 4;
#pragma unroll
  for (int hf = 0; hf < 2; ++hf) {
    const int i = r0 + g + 8 * hf;
    if (i >= rows.n) continue;
    __nv_bfloat16* row = out + rows.at(i) + col0 + 2 * c;
#pragma unroll
    for (int nt = 0; nt < 8; ++nt)
      *reinterpret_cast<__nv_bfloat162*>(row + 8 * nt) =
          __floats2bfloat162_rn(o[4 * nt + 2 * hf], o[4 * nt + 2 * hf + 1]);
  }
}

// o <- bf16(o) / rms * w * silu(z) per row, the rms over the row's dv = 128 columns: this piece's
// 64 (`part` 0 or 1 of the row) reduced in the quad, then the two parts through `ss` in shared
// memory; `sync()` must be a barrier of every thread holding a part of these rows. The output is
// rounded to bf16 first, as the unfused path (the rule's output stored, then normed) sees it.
template <class Sync>
__device__ void norm_out_piece(float (&o)[32], int r0, int col0, int part, const OutRows& rows,
                               const GdnOutNorm& norm, float (&ss)[2][kChunk], Sync sync) {
  const int lane = threadIdx.x % 32, g = lane / 4, c = lane % 4;
  float sq[2] = {0.0f, 0.0f};
#pragma unroll
  for (int e = 0; e < 32; ++e) {
    o[e] = round_bf16(o[e]);
    sq[e % 4 / 2] = fmaf(o[e], o[e], sq[e % 4 / 2]);
  }
#pragma unroll
  for (int hf = 0; hf < 2; ++hf) {
    sq[hf] += __shfl_xor_sync(0xffffffffu, sq[hf], 1);
    sq[hf] += __shfl_xor_sync(0xffffffffu, sq[hf], 2);
    if (c == 0) ss[part][r0 + g + 8 * hf] = sq[hf];
  }
  sync();
#pragma unroll
  for (int hf = 0; hf < 2; ++hf) {
    const int i = r0 + g + 8 * hf;
    const float inv = rsqrtf((ss[0][i] + ss[1][i]) / static_cast<float>(kDim) + norm.eps);
    const __nv_bfloat16* z = norm.z + rows.at(i) + col0 + 2 * c;
#pragma unroll
    for (int nt = 0; nt < 8; ++nt) {
      const float2 zv = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(z + 8 * nt));
      const float2 wv = *reinterpret_cast<const float2*>(norm.w + col0 + 8 * nt + 2 * c);
      o[4 * nt + 2 * hf] = o[4 * nt + 2 * hf] * inv * wv.x * silu(zv.x);
      o[4 * nt + 2 * hf + 1] = o[4 * nt + 2 * hf + 1] * inv * wv.y * silu(zv.y);
    }
  }
}

}  // namespace deltaserve::cuda::gdn_chunk
