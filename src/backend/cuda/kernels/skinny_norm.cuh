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

// A consumer thread's share of the norm: 16-byte chunks i = thread + j * kThreads of every row
// (j < kVecs, K <= kMaxK), its norm weights loaded before the kernel waits for its predecessor
// (weights are never written by a kernel).
template <int kThreads, int kMaxK>
struct RowNorm {
  static constexpr int kVecs = (kMaxK / 8 + kThreads - 1) / kThreads;
  F32x8 w[kVecs];

  __device__ void load_weights(const float* norm_w, int K) {
#pragma unroll
    for (int j = 0; j < kVecs; ++j) {
      const int i = static_cast<int>(threadIdx.x) + j * kThreads;
      if (i < K / 8) w[j] = load_f32x8(norm_w + 8 * i);
    }
  }

  // Rows [0, T) of src [T, K] (bf16, 16-byte aligned rows, K % 8 == 0), normalised (rsqrt of the
  // mean square plus eps, times 1 + w) and rounded to bf16 as the norm kernel rounds them, into
  // xs (1024-byte aligned): k-tile kt's tile at xs + kt * kTileBytes; rows T..kRows-1 and the
  // columns from K to the last k-tile's edge zero. Every row's loads are in flight at once; the
  // sums of squares meet in `sums` (shared, [kThreads / 32][kRows]) behind the `sync` barrier of
  // the kThreads threads. Writes shared memory only: the caller fences it for the async proxy and
  // syncs.
  template <typename Sync>
  __device__ void normalise(const __nv_bfloat16* src, float eps, int T, int K, int k_tiles,
                            float (*sums)[kRows], unsigned char* xs, Sync sync) const {
    const int tid = static_cast<int>(threadIdx.x), vecs = K / 8;
    float ss[kRows];
#pragma unroll
    for (int r = 0; r < kRows; ++r) {
      ss[r] = 0.0f;
#pragma unroll
      for (int j = 0; j < kVecs; ++j) {
        const int i = tid + j * kThreads;
        if (r >= T || i >= vecs) continue;
        const F32x8 v = load_bf16x8(src + static_cast<size_t>(r) * K + 8 * i);
#pragma unroll
        for (int e = 0; e < 8; ++e) ss[r] += v.v[e] * v.v[e];
      }
    }
#pragma unroll
    for (int r = 0; r < kRows; ++r) {
      const float total = warp_sum(ss[r]);
      if (tid % 32 == 0) sums[tid / 32][r] = total;
    }
    sync();
    const int chunks = 8 * k_tiles;
#pragma unroll
    for (int r = 0; r < kRows; ++r) {
      float sum = 0.0f;  // the warps' sums in a fixed order: every thread gets the same inv
#pragma unroll
      for (int k = 0; k < kThreads / 32; ++k) sum += sums[k][r];
      const float inv = rsqrtf(sum / static_cast<float>(K) + eps);
#pragma unroll
      for (int j = 0; j < kVecs; ++j) {
        const int i = tid + j * kThreads;
        if (i >= chunks) continue;
        F32x8 y;
#pragma unroll
        for (int e = 0; e < 8; ++e) y.v[e] = 0.0f;
        if (r < T && i < vecs) {
          const F32x8 v = load_bf16x8(src + static_cast<size_t>(r) * K + 8 * i);
#pragma unroll
          for (int e = 0; e < 8; ++e) y.v[e] = v.v[e] * inv * (1.0f + w[j].v[e]);
        }
        store_bf16x8(
            reinterpret_cast<__nv_bfloat16*>(xs + (i / 8) * kTileBytes + chunk_offset(r, i % 8)),
            y);
      }
    }
  }
};

}  // namespace deltaserve::cuda::skinny_norm
