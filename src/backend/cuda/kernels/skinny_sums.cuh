// Summing a shared tile's f32 partials (skinny_gemm.cu's split tiles) in block order, from zero:
// the GEMM's summing block and a kernel reading a partials-only launch (skinny_partials.cuh) add
// them in the same order, so that their bf16 results are the same bits.
#pragma once

#include <cuda_runtime.h>

#include "backend/cuda/kernels/skinny_gemm.cuh"
#include "backend/cuda/kernels/skinny_partition.h"

namespace deltaserve::cuda::skinny {

// A slot's partial sums: kSkinnyTileRows f32 values a token row.
template <class F>
__device__ inline F* slot_floats(F* partials, int slot) {
  return partials + static_cast<size_t>(slot) * kSkinnyTileRows * kSkinnyMaxRows;
}

__device__ inline void add4(float4& s, const float4& v) {
  s.x += v.x;
  s.y += v.y;
  s.z += v.z;
  s.w += v.w;
}

// sum[b] = the np partials' float4 at part(c) + offset + at[b], added in block order c = 0 ..
// np - 1, kParts partials' loads at a time.
template <int kBatch, int kParts, class Part>
__device__ void sum_partials(const Part& part, int np, const int (&at)[kBatch], int offset,
                             float4 (&sum)[kBatch]) {
#pragma unroll
  for (int b = 0; b < kBatch; ++b) sum[b] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
  const auto load = [&](int c, int b) {
    return __ldcg(reinterpret_cast<const float4*>(part(c) + offset + at[b]));
  };
  int c = 0;
  // One batch of kParts loads at a time (unrolled, the batches took 101 registers at 16 tokens,
  // against 54), then the remaining partials' loads together.
  constexpr int kTailUnroll = kBatch > 1 ? 1 : 4;
#pragma unroll 1
  for (; c + kParts <= np; c += kParts) {
    float4 v[kParts][kBatch];
#pragma unroll
    for (int j = 0; j < kParts; ++j)
#pragma unroll
      for (int b = 0; b < kBatch; ++b) v[j][b] = load(c + j, b);
#pragma unroll
    for (int j = 0; j < kParts; ++j)
#pragma unroll
      for (int b = 0; b < kBatch; ++b) add4(sum[b], v[j][b]);
  }
#pragma unroll kTailUnroll
  for (; c < np; ++c) {
    float4 v[kBatch];
#pragma unroll
    for (int b = 0; b < kBatch; ++b) v[b] = load(c, b);
#pragma unroll
    for (int b = 0; b < kBatch; ++b) add4(sum[b], v[b]);
  }
}

// sum_partials' sums (the same order, the same bits) with each batch's loads predicated, so that a
// batch of kParts loads is in flight even when np < kParts (a reader summing one tile's vector).
template <int kBatch, int kParts, class Part>
__device__ void sum_partials_batched(const Part& part, int np, const int (&at)[kBatch],
                                     float4 (&sum)[kBatch]) {
#pragma unroll
  for (int b = 0; b < kBatch; ++b) sum[b] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
#pragma unroll 1
  for (int c = 0; c < np; c += kParts) {
    float4 v[kParts][kBatch];
#pragma unroll
    for (int j = 0; j < kParts; ++j)
#pragma unroll
      for (int b = 0; b < kBatch; ++b)
        if (c + j < np) v[j][b] = __ldcg(reinterpret_cast<const float4*>(part(c + j) + at[b]));
#pragma unroll
    for (int j = 0; j < kParts; ++j)
#pragma unroll
      for (int b = 0; b < kBatch; ++b)
        if (c + j < np) add4(sum[b], v[j][b]);
  }
}

}  // namespace deltaserve::cuda::skinny
