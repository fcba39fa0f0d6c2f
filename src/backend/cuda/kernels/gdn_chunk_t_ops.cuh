// What the kernels that keep a warpgroup's 64 value columns of the GDN state transposed in
// registers share (gdn_chunk_pass_transposed.cu, gdn_chunk_fused.cu): S^T as an m64 x n128 f32
// wgmma accumulator (rows = the warpgroup's value columns, columns = dk), turned into bf16 A
// fragments for the MMAs that take the state, and its loads and stores.
#pragma once

#include <cuda_bf16.h>

#include "backend/cuda/kernels/gdn_chunk_layout.cuh"
#include "backend/cuda/kernels/gdn_state.cuh"
#include "backend/cuda/kernels/mma_bf16.cuh"
#include "backend/cuda/kernels/wgmma.cuh"

namespace deltaserve::cuda::gdn_chunk {

__device__ inline int warp4() { return threadIdx.x / 32 % 4; }

// The accumulator's 16-column block pair kk as bf16 A fragments (K = 16 columns 16 kk ..).
template <int N>
__device__ inline void to_a(const float (&d)[N], int kk, uint32_t (&a)[4]) {
#pragma unroll
  for (int i = 0; i < 4; ++i)
    a[i] = mma::pack_bf16(d[4 * (2 * kk + i / 2) + 2 * (i % 2)],
                          d[4 * (2 * kk + i / 2) + 2 * (i % 2) + 1]);
}

// The state's fragments (S^T as bf16 A operands over dk).
__device__ inline void state_fragments(const float (&hs)[64], uint32_t (&as)[8][4]) {
#pragma unroll
  for (int kk = 0; kk < 8; ++kk) to_a(hs, kk, as[kk]);
}

// d (= or +=) A B^T over K = dk (8 steps): A the state's fragments, B a K-major [token][dk] tile.
__device__ inline void issue_over_dk(float (&d)[32], const uint32_t (&as)[8][4], uint32_t tile) {
  const uint64_t bd = wgmma::desc(tile, 16, wgmma::kAtomBytes);
#pragma unroll
  for (int kk = 0; kk < kDim / 16; ++kk) {
    const uint32_t at = (kk / 4) * kChunk * wgmma::kRowBytes + (kk % 4) * 32;
    wgmma::mma_64x64_rs<false>(d, as[kk], bd + (at >> 4), kk > 0);
  }
}

// S^T <- decay S^T + A B, issued as one group: A the fragments of a 64 x 64 accumulator over the
// chunk's tokens (4 steps of 16), B the chunk's [token][dk] SW128 tile at shared address `tile`,
// read MN-major.
__device__ inline void issue_state_update_t(float (&hs)[64], const uint32_t (&a)[4][4],
                                            uint32_t tile, float decay) {
#pragma unroll
  for (int e = 0; e < 64; ++e) hs[e] *= decay;
  wgmma::fence();
  const uint64_t bd = wgmma::desc(tile, kChunk * wgmma::kRowBytes, wgmma::kAtomBytes);
#pragma unroll
  for (int ks = 0; ks < 4; ++ks)
    wgmma::mma_64x128_rs(hs, a[ks], bd + ((ks * 16 * wgmma::kRowBytes) >> 4));
  wgmma::commit();
}

// The state (f32 or bf16 [dk][dv] in memory) to / from the thread's S^T elements.
template <bool kStore, class StateT>
__device__ inline void io_t(StateT* S, int v0, float (&hs)[64]) {
  const int lane = threadIdx.x % 32, r = v0 + 16 * warp4() + lane / 4, c = 2 * (lane % 4);
#pragma unroll
  for (int i = 0; i < 16; ++i)
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      StateT* p = S + static_cast<size_t>(8 * i + c + e % 2) * kDim + r + 8 * (e / 2);
      if constexpr (kStore)
        StateIo<StateT>::store(p, hs[4 * i + e]);
      else
        hs[4 * i + e] = StateIo<StateT>::load(p);
    }
}

// O^T (the accumulator of the warpgroup's columns v0.. x the chunk's tokens) to the output rows of
// its first `n` tokens: `first` the first token's row of the head, nv value heads a token.
__device__ inline void store_out_t(const float (&o)[32], __nv_bfloat16* first, int nv, int n,
                                   int v0) {
  const int lane = threadIdx.x % 32, v = v0 + 16 * warp4() + lane / 4, c2 = 2 * (lane % 4);
#pragma unroll
  for (int blk = 0; blk < 8; ++blk)
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int tok = 8 * blk + c2 + e % 2;
      if (tok < n)
        first[static_cast<size_t>(tok) * nv * kDim + v + 8 * (e / 2)] =
            __float2bfloat16(o[4 * blk + e]);
    }
}

// O^T (the accumulator of the warpgroup's columns v0.. x the chunk's tokens, its MMAs done) with
// each token's column times scale(token), plus V'^T P^T (A = V'^T's fragments av over the tokens;
// B = P [i][j], a K-major SW128 tile at shared address p), then stored as store_out_t does.
template <class Scale>
__device__ inline void finish_output_t(float (&o)[32], const uint32_t (&av)[4][4], uint32_t p,
                                       Scale scale, __nv_bfloat16* first, int nv, int n, int v0) {
  const int c2 = 2 * (threadIdx.x % 4);
#pragma unroll
  for (int blk = 0; blk < 8; ++blk) {
    const float e0 = scale(8 * blk + c2), e1 = scale(8 * blk + c2 + 1);
    o[4 * blk] *= e0;
    o[4 * blk + 1] *= e1;
    o[4 * blk + 2] *= e0;
    o[4 * blk + 3] *= e1;
  }
  wgmma::fence();
  const uint64_t pd = wgmma::desc(p, 16, wgmma::kAtomBytes);
#pragma unroll
  for (int ks = 0; ks < 4; ++ks) wgmma::mma_64x64_rs<false>(o, av[ks], pd + ((ks * 32) >> 4), true);
  wgmma::commit();
  wgmma::wait<0>();
  store_out_t(o, first, nv, n, v0);
}

}  // namespace deltaserve::cuda::gdn_chunk
