// The GDN's causal depthwise conv of width 4 (+ SiLU) on 8 channels at a time, shared by the conv
// kernel (gdn_conv.cu) and the chunked delta rule's prep kernel (the conv fused in,
// gdn_chunk_prep.cu).
#pragma once

#include <cuda_bf16.h>

#include "backend/cuda/kernels/bf16x8.cuh"
#include "backend/cuda/kernels/common.cuh"

namespace deltaserve::cuda {

constexpr int kConvK = 4;

// The taps of channels c .. c + 7 of w [C][kConvK] (16-byte aligned rows of 8 channels): w[i][e]
// is tap i of channel c + e.
struct ConvTaps {
  float w[kConvK][8];
};

__device__ inline ConvTaps load_conv_taps(const __nv_bfloat16* w, int c) {
  ConvTaps t;
#pragma unroll
  for (int m = 0; m < kConvK; ++m) {  // [8 channels][K taps] = K vectors of 8
    const F32x8 v = load_bf16x8(w + static_cast<size_t>(c) * kConvK + 8 * m);
#pragma unroll
    for (int e = 0; e < 8; ++e) t.w[(8 * m + e) % kConvK][(8 * m + e) / kConvK] = v.v[e];
  }
  return t;
}

// silu(sum_i w_i in(t - 3 + i)) for the inputs t - 3, t - 2, t - 1 (`win`, oldest first) and t.
__device__ inline F32x8 conv_silu(const ConvTaps& t, const F32x8 (&win)[kConvK - 1],
                                  const F32x8& cur) {
  F32x8 out;
#pragma unroll
  for (int e = 0; e < 8; ++e) {
    float acc = 0.0f;
#pragma unroll
    for (int i = 0; i < kConvK - 1; ++i) acc += t.w[i][e] * win[i].v[e];
    acc += t.w[kConvK - 1][e] * cur.v[e];
    out.v[e] = silu_fast(acc);
  }
  return out;
}

// The window moved on by one input.
__device__ inline void conv_shift(F32x8 (&win)[kConvK - 1], const F32x8& cur) {
#pragma unroll
  for (int i = 0; i + 1 < kConvK - 1; ++i) win[i] = win[i + 1];
  win[kConvK - 2] = cur;
}

}  // namespace deltaserve::cuda
