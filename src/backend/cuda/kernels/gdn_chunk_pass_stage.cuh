// What the GDN state pass's kernels (gdn_chunk_pass.cu, gdn_chunk_pass_transposed.cu) share: a
// chunk's operands staged in shared memory by the bulk tensor copy engine, and their tensor maps.
#pragma once

#include <cuda.h>

#include "backend/cuda/kernels/gdn_chunk_layout.cuh"
#include "backend/cuda/kernels/mma_bf16.cuh"
#include "backend/cuda/kernels/smem_view.cuh"
#include "backend/cuda/kernels/tma.cuh"
#include "backend/cuda/kernels/tma_map.h"
#include "backend/cuda/kernels/wgmma.cuh"

namespace deltaserve::cuda::gdn_chunk {

// A sequence of the step as the pass sees it: first token row, length, value head, key head, step
// tokens.
struct Seq {
  int base, len, h, kh, T;
};

// W, kd, U [T][nv dk], q [T][nk dk], P [T][nv 64], copied in boxes of 64 tokens x 64 columns.
struct PassMaps {
  CUtensorMap w, kd, u, q, p;
};

// A chunk's operands: SW128 tiles, 64-column blocks of the 64 rows; of U all kUCols = 128
// columns (a block of a whole head) or the 64-column half holding the block's columns (a split
// head's block reads no other).
template <int kUCols>
struct alignas(wgmma::kAtomBytes) Stage {
  __nv_bfloat16 w[kChunk * kDim];    // W
  __nv_bfloat16 kd[kChunk * kDim];   // k e^(gam_last - gam)
  __nv_bfloat16 q[kChunk * kDim];    // q (the key head's)
  __nv_bfloat16 u[kChunk * kUCols];  // U
  __nv_bfloat16 p[kChunk * kChunk];  // P
  float gam[kChunk];
  static constexpr uint32_t kTileBytes = 3 * sizeof(w) + sizeof(u) + sizeof(p);
};
using PassTile = Sw128Rows<kChunk>;

// Chunk `c`'s tiles into `st` by thread 0, completing on `full` (of U all of it, or the 64-column
// half `u_half` in a stage of half tiles); its gam (rows past the sequence zero) by the first 64
// threads, as one cp.async group of every thread.
template <int kUCols>
__device__ inline void load_chunk(Stage<kUCols>& st, uint64_t* full, const PassMaps& maps,
                                  const Seq& q, int c, const Workspace& ws, int u_half) {
  const int t0 = c * kChunk, n = min(kChunk, q.len - t0), first = q.base + t0;
  const int tid = threadIdx.x;
  if (tid == 0) {
    tma::arrive_expect_bytes(full, Stage<kUCols>::kTileBytes);
    for (int half = 0; half < 2; ++half) {
      const int at = half * kChunk * 64, col = q.h * kDim + 64 * half;
      tma::load_2d(st.w + at, &maps.w, col, first, full);
      tma::load_2d(st.kd + at, &maps.kd, col, first, full);
      if (kUCols == kDim || u_half == half)
        tma::load_2d(st.u + (kUCols == kDim ? at : 0), &maps.u, col, first, full);
      tma::load_2d(st.q + at, &maps.q, q.kh * kDim + 64 * half, first, full);
    }
    tma::load_2d(st.p, &maps.p, q.h * kChunk, first, full);
  }
  if (tid < kChunk)
    mma::cp_async4(&st.gam[tid],
                   ws.gam + static_cast<size_t>(q.h) * q.T + first + (tid < n ? tid : 0), tid < n);
  mma::cp_async_commit();
}

// The pass kernels' walk over a sequence's chunks: the stages' barriers initialised, each chunk's
// operands copied kStages - 1 chunks ahead (past the last chunk an empty cp.async group, so that
// every chunk has kStages - 2 groups after its own to leave pending); `before()` once the first
// copies are issued; then per chunk, once its gam and bulk copies landed and a block barrier saw
// every read of the chunk before's stage done (the next copies go into that stage),
// `step(stage, t0, n)`.
template <int kStages, int kUCols, class Before, class Step>
__device__ inline void walk_chunks(Stage<kUCols> (&stages)[kStages], uint64_t (&full)[kStages],
                                   const PassMaps& maps, const Seq& q, const Workspace& ws,
                                   int u_half, Before before, Step step) {
  const int chunks = (q.len + kChunk - 1) / kChunk;
  if (threadIdx.x == 0) {
    for (int i = 0; i < kStages; ++i) tma::barrier_init(&full[i], 1);
    tma::barrier_init_fence();
  }
  __syncthreads();  // the barriers initialised
  const auto load = [&](int c) {
    if (c < chunks)
      load_chunk(stages[c % kStages], &full[c % kStages], maps, q, c, ws, u_half);
    else
      mma::cp_async_commit();
  };
  for (int c = 0; c + 1 < kStages; ++c) load(c);
  before();
  for (int c = 0; c < chunks; ++c) {
    mma::cp_async_wait<kStages - 2>();
    __syncthreads();        // chunk c's gam staged, every read of chunk c - 1's stage done
    load(c + kStages - 1);  // into chunk c - 1's stage
    const int t0 = c * kChunk, n = min(kChunk, q.len - t0);
    tma::wait(&full[c % kStages], (c / kStages) & 1);
    step(stages[c % kStages], t0, n);
  }
}

// The tensor maps of the workspace's W, kd, U, q and P for a step of b.num_tokens tokens.
inline PassMaps pass_maps(const BatchMeta& b, const Workspace& ws, const GdnShape& s) {
  const int64_t T = b.num_tokens, cols = static_cast<int64_t>(s.nv) * kDim;
  return PassMaps{encode_tma_2d_bf16(ws.w, T, cols, kChunk),
                  encode_tma_2d_bf16(ws.kd, T, cols, kChunk),
                  encode_tma_2d_bf16(ws.u, T, cols, kChunk),
                  encode_tma_2d_bf16(ws.q, T, static_cast<int64_t>(s.nk) * kDim, kChunk),
                  encode_tma_2d_bf16(ws.p, T, static_cast<int64_t>(s.nv) * kChunk, kChunk)};
}

}  // namespace deltaserve::cuda::gdn_chunk
