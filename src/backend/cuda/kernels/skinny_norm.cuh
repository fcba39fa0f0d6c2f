// The weight-streaming GEMM's normalising form (skinny_gemm.cu): a block forms its own x =
// rms_norm(residual) (the zero-centred weights: x * rsqrt(mean(x^2) + eps) * (1 + w)) for up to
// 16 token rows straight into the shared-memory tiles its wgmma reads as B, so that no norm kernel
// runs before it and no normalised rows go through global memory.
#pragma once

#include <cuda_bf16.h>

#include <cstdint>

#include "backend/cuda/kernels/bf16x8.cuh"
#include "backend/cuda/kernels/common.cuh"
#include "backend/cuda/kernels/wgmma.cuh"

namespace deltaserve::cuda::skinny_norm {

// Rows of the B operand the normalised x fills (the wgmma N): tokens past T are zero rows.
constexpr int kRows = 16;
// A k-tile's B tile: kRows rows of 64 bf16 (one 128-byte swizzle row each).
constexpr int kTileBytes = kRows * wgmma::kRowBytes;

// Byte offset of row r's 16-byte chunk c (of 8) within a k-tile's tile: the 128-byte swizzle the
// tensor copy engine writes (chunk c of row r lands at chunk c ^ (r % 8)), which the GEMM's
// descriptors expect.
__device__ inline uint32_t chunk_offset(int r, int c) {
  return static_cast<uint32_t>(r * wgmma::kRowBytes + ((c ^ (r % 8)) * 16));
}

// Rows [0, T) of src [T, K] (bf16, 16-byte aligned rows, K % 8 == 0), normalised by w [K] (f32,
// 16-byte aligned) and rounded to bf16 as the norm kernel rounds them, into xs (1024-byte aligned):
// k-tile kt's tile at xs + kt * kTileBytes; rows T..kRows-1 and the columns from K to the last
// k-tile's edge zero. By kThreads threads (whole warps): warp j takes rows j, j + kThreads / 32, ...
// It only writes shared memory: the caller fences it for the async proxy and syncs.
template <int kThreads>
__device__ void normalise_rows(const __nv_bfloat16* src, const float* w, float eps, int T, int K,
                               int k_tiles, unsigned char* xs) {
  const int warp = static_cast<int>(threadIdx.x) / 32, lane = static_cast<int>(threadIdx.x) % 32;
  const int vecs = K / 8, chunks = 8 * k_tiles;
  for (int r = warp; r < kRows; r += kThreads / 32) {
    const __nv_bfloat16* row = src + static_cast<size_t>(r) * K;
    float inv = 0.0f;
    if (r < T) {
      float ss = 0.0f;
#pragma unroll 5
      for (int i = lane; i < vecs; i += 32) {
        const F32x8 v = load_bf16x8(row + 8 * i);
#pragma unroll
        for (int e = 0; e < 8; ++e) ss += v.v[e] * v.v[e];
      }
      inv = rsqrtf(warp_sum(ss) / static_cast<float>(K) + eps);
    }
#pragma unroll 5
    for (int i = lane; i < chunks; i += 32) {
      F32x8 y;
#pragma unroll
      for (int e = 0; e < 8; ++e) y.v[e] = 0.0f;
      if (r < T && i < vecs) {
        const F32x8 v = load_bf16x8(row + 8 * i), wv = load_f32x8(w + 8 * i);
#pragma unroll
        for (int e = 0; e < 8; ++e) y.v[e] = v.v[e] * inv * (1.0f + wv.v[e]);
      }
      store_bf16x8(reinterpret_cast<__nv_bfloat16*>(xs + (i / 8) * kTileBytes +
                                                    chunk_offset(r, i % 8)),
                   y);
    }
  }
}

}  // namespace deltaserve::cuda::skinny_norm
