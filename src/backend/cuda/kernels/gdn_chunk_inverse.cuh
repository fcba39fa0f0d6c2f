// T = (I + L)^-1 of a chunk's strictly lower 64 x 64 L, by 16 x 16 blocks, as the prep kernel
// (gdn_chunk_prep.cu) and the fused kernel (gdn_chunk_fused.cu) form it: the four diagonal blocks
// by forward substitution, a column per thread in registers (their upper entries come out zero);
// the blocks below on tf32 tensor cores, as the inverse of a 2 x 2 block lower triangle
// [[A, 0], [C, B]]^-1 = [[A^-1, 0], [-B^-1 C A^-1, B^-1]]. L and T are f32 rows of kLdF in shared
// memory; blocks of T above the diagonal are never written.
#pragma once

#include "backend/cuda/kernels/gdn_chunk_layout.cuh"
#include "backend/cuda/kernels/mma_tf32.cuh"

namespace deltaserve::cuda::gdn_chunk {

constexpr int kLdF = kChunk + 4;  // f32 rows of 64, padded: tf32 A fragments hit 32 banks
constexpr int kLdX = 16 + 8;      // f32 rows of 16, padded: tf32 B fragments hit 32 banks

// L, T and a scratch of four 16 x 16 blocks of products.
struct InverseTiles {
  float (*l)[kLdF];
  float (*t)[kLdF];
  float (*x)[16][kLdX];
};

// The diagonal blocks, by threads 0..63 (a column of a block each); the others return. Column by
// column of L: once entry k of the thread's column of T is final, its term leaves every row below
// at once (each row's terms still added in the order k = 0, 1, ...), so that the chain from one
// entry to the next is one FMA and L's loads need not wait for T's stores, which come last.
__device__ inline void invert_diagonal(const InverseTiles& m) {
  if (threadIdx.x >= kChunk) return;
  const int o = 16 * (threadIdx.x / 16), c = threadIdx.x % 16;
  float col[16];
#pragma unroll
  for (int r = 0; r < 16; ++r) col[r] = r == c ? 1.0f : 0.0f;
#pragma unroll
  for (int k = 0; k < 15; ++k)
#pragma unroll
    for (int r = k + 1; r < 16; ++r) col[r] = fmaf(-m.l[o + r][o + k], col[k], col[r]);
#pragma unroll
  for (int r = 0; r < 16; ++r) m.t[o + r][o + c] = col[r];
}

// The blocks below the diagonal, by warps 0..3, after the diagonal ones: first the 32 x 32
// diagonal halves (warps 0, 1: T_{2w+1, 2w}), then the lower-left 32 x 32 (one 16 x 16 block a
// warp). `sync` is a barrier of every calling thread (at least warps 0..3); it ends with one.
template <class Sync>
__device__ inline void invert_below_diagonal(const InverseTiles& m, Sync sync) {
  const int warp = threadIdx.x / 32;
  if (warp < 2) {
    const int i = 16 * (2 * warp + 1), j = 16 * (2 * warp);
    float x[2][4] = {}, tij[2][4] = {};
    mma::tile_16x16_tf32<16>(x, &m.l[i][j], kLdF, &m.t[j][j], kLdF);
    mma::store_16x16(m.x[warp][0], kLdX, x, 1.0f);
    __syncwarp();
    mma::tile_16x16_tf32<16>(tij, &m.t[i][i], kLdF, m.x[warp][0], kLdX);
    mma::store_16x16(&m.t[i][j], kLdF, tij, -1.0f);
  }
  sync();
  const int ri = warp / 2, cj = warp % 2;  // block (2 + ri, cj) of T
  if (warp < 4) {                          // X = C A^-1 (A^-1's upper-right block is zero)
    float x[2][4] = {};
    if (cj == 0)
      mma::tile_16x16_tf32<32>(x, &m.l[32 + 16 * ri][0], kLdF, &m.t[0][0], kLdF);
    else
      mma::tile_16x16_tf32<16>(x, &m.l[32 + 16 * ri][16], kLdF, &m.t[16][16], kLdF);
    mma::store_16x16(m.x[warp][0], kLdX, x, 1.0f);
  }
  sync();
  if (warp < 4) {  // -B^-1 X
    float tij[2][4] = {};
    for (int mb = 0; mb <= ri; ++mb)
      mma::tile_16x16_tf32<16>(tij, &m.t[32 + 16 * ri][32 + 16 * mb], kLdF, m.x[2 * mb + cj][0],
                               kLdX);
    mma::store_16x16(&m.t[32 + 16 * ri][16 * cj], kLdF, tij, -1.0f);
  }
  sync();
}

}  // namespace deltaserve::cuda::gdn_chunk
