// Reading a partials-only GEMM's result (launch_skinny_gemm_partials_bf16) as bf16 values, in
// the kernel after it: the sums the GEMM's summing blocks would have made. Its tile table comes
// from the launch's parameters alone, so a reader forms it before its wait for the GEMM; each
// 8-value vector is then one bf16 load (a whole tile) or its partials' loads, in flight together.
#pragma once

#include "backend/cuda/kernels/bf16x8.cuh"
#include "backend/cuda/kernels/skinny_gemm.cuh"
#include "backend/cuda/kernels/skinny_partition.h"
#include "backend/cuda/kernels/skinny_sums.cuh"

namespace deltaserve::cuda::skinny {

// Rows of up to 8192 values.
constexpr int kMaxReadTiles = 64;

// Partials a reader's thread loads together (two float4 of each).
constexpr int kReadParts = 8;

struct PartialRows {
  SkinnyPartials s;

  // The block's shared table of the tiles' parts.
  __device__ static TileParts* table() {
    __shared__ TileParts tiles[kMaxReadTiles];
    return tiles;
  }

  // Fills the table; by every thread of the block (a barrier at its end).
  __device__ void prepare() const {
    const int tiles = (s.n + kSkinnyTileRows - 1) / kSkinnyTileRows;
    for (int t = static_cast<int>(threadIdx.x); t < tiles; t += static_cast<int>(blockDim.x))
      table()[t] = tile_parts(t, s.units, s.blocks, s.k_tiles);
    __syncthreads();
  }

  // The 8 values of token row `row` from column col (a multiple of 8, below n).
  __device__ F32x8 load(int row, int col) const {
    const TileParts t = table()[col / kSkinnyTileRows];
    if (t.count == 1) return load_bf16x8(s.y + static_cast<size_t>(row) * s.n + col);
    const int at0 = row * kSkinnyTileRows + col % kSkinnyTileRows;
    const int at[2] = {at0, at0 + 4};
    float4 sum[2];
    const auto part = [&](int j) { return slot_floats(s.partials, part_slot(t, j)); };
    sum_partials_batched<2, kReadParts>(part, t.count, at, sum);
    F32x8 v;
    const float e[8] = {sum[0].x, sum[0].y, sum[0].z, sum[0].w,
                        sum[1].x, sum[1].y, sum[1].z, sum[1].w};
#pragma unroll
    for (int i = 0; i < 8; ++i) v.v[i] = round_bf16(e[i]);
    return v;
  }
};

}  // namespace deltaserve::cuda::skinny
