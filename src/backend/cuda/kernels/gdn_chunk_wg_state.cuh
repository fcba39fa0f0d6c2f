// The f32 GDN state of one warpgroup's kCols state columns in the state pass (gdn_chunk_pass.cu):
// two m64 x kCols wgmma accumulators, rows 0..63 and 64..127 of dk; thread t of the warpgroup holds
// rows 16 (t / 32 % 4) + t % 32 / 4 (+ 8) and, per 8-column block i, columns 8 i + 2 (t % 4) (+ 1)
// (wgmma.cuh's accumulator layout).
#pragma once

#include <cuda_bf16.h>

#include <cstdint>

#include "backend/cuda/kernels/gdn_chunk_layout.cuh"
#include "backend/cuda/kernels/gdn_state.cuh"
#include "backend/cuda/kernels/mma_bf16.cuh"
#include "backend/cuda/kernels/wgmma.cuh"

namespace deltaserve::cuda::gdn_chunk {

template <int kCols>
struct WarpgroupState {
  using Acc = float[kCols / 2];  // an m64 x kCols accumulator
  // Bytes of one 64-row SW128 block of the transposed tile (its rows = the kCols columns).
  static constexpr uint32_t kBlockBytes = kCols * wgmma::kRowBytes;

  __device__ static int warp() { return threadIdx.x / 32 % 4; }

  // f(row, column (from col0), value pair) over the state's accumulator pairs.
  template <class F>
  __device__ static void each_pair(Acc (&hs)[2], int col0, F f) {
    const int lane = threadIdx.x % 32, r0 = 16 * warp() + lane / 4, c0 = col0 + 2 * (lane % 4);
#pragma unroll
    for (int half = 0; half < 2; ++half)
#pragma unroll
      for (int i = 0; i < kCols / 8; ++i)
#pragma unroll
        for (int hf = 0; hf < 2; ++hf)
          f(64 * half + r0 + 8 * hf, c0 + 8 * i, hs[half][4 * i + 2 * hf],
            hs[half][4 * i + 2 * hf + 1]);
  }

  // The state to / from columns col0.. of a [dk][dv] state (f32 or bf16 in memory).
  template <bool kStore, class StateT>
  __device__ static void io(StateT* S, int col0, Acc (&hs)[2]) {
    each_pair(hs, col0, [&](int r, int col, float& x, float& y) {
      StateT* p = S + r * kDim + col;
      if constexpr (kStore) {
        StateIo<StateT>::store2(p, make_float2(x, y));
      } else {
        const float2 v = StateIo<StateT>::load2(p);
        x = v.x;
        y = v.y;
      }
    });
  }

  // An accumulator (rows 16 w + g (+ 8) of a 64-row block) as bf16 into the transposed SW128
  // block at `tile`, by stmatrix: matrices (i, upper / lower 8 rows), four per instruction.
  __device__ static void store_transposed(uint32_t tile, const Acc& d) {
    const int lane = threadIdx.x % 32, j = lane / 8, r = 16 * warp() + 8 * (j % 2);
#pragma unroll
    for (int i0 = 0; i0 < kCols / 8; i0 += 2) {
      const int col = 8 * (i0 + j / 2) + lane % 8;
      mma::stsm_x4_trans(tile + wgmma::sw128_offset(kCols, col, r),
                         mma::pack_bf16(d[4 * i0], d[4 * i0 + 1]),
                         mma::pack_bf16(d[4 * i0 + 2], d[4 * i0 + 3]),
                         mma::pack_bf16(d[4 * i0 + 4], d[4 * i0 + 5]),
                         mma::pack_bf16(d[4 * i0 + 6], d[4 * i0 + 7]));
    }
  }

  // d (= or +=) A B for one k-step: A in registers, B K-major in shared memory.
  __device__ static void mma(Acc& d, const uint32_t (&a)[4], uint64_t b, bool accumulate) {
    if constexpr (kCols == 32)
      wgmma::mma_64x32_rs_kmajor(d, a, b, accumulate);
    else
      wgmma::mma_64x64_rs<false>(d, a, b, accumulate);
  }

  // acc (= or +=) A B over K = 16 kSteps, issued (not waited): A = rows 16 w.. of `a` (a
  // smem_view.cuh view) by ldmatrix, B the K-major SW128 operand at `b` (64-row blocks of
  // kBlockBytes along K).
  template <int kSteps, class A>
  __device__ static void issue(Acc& acc, const A& a, uint32_t b, bool accumulate) {
    uint32_t frag[kSteps][4];  // every fragment first: the MMAs read them asynchronously
#pragma unroll
    for (int ks = 0; ks < kSteps; ++ks) mma::load_a_at(frag[ks], a, 16 * warp(), 16 * ks);
    const uint64_t bd = wgmma::desc(b, 16, wgmma::kAtomBytes);
    wgmma::fence();  // the fragments' registers, and any of acc's written since the last MMA
#pragma unroll
    for (int ks = 0; ks < kSteps; ++ks) {
      const uint32_t at = (ks / 4) * kBlockBytes + (ks % 4) * 32;
      mma(acc, frag[ks], bd + (at >> 4), accumulate || ks > 0);
    }
  }

  // S += kd^T V' (issued, not waited): A = kd^T by ldmatrix.trans from the staged kd [token][dk]
  // (half h: dk 64 h ..), B = V'^T [column][token] (an SW128 block at `vt`).
  template <class A>
  __device__ static void issue_update(Acc (&hs)[2], const A& kd, uint32_t vt) {
    uint32_t frag[2][kChunk / 16][4];  // every fragment first: the MMAs read them asynchronously
#pragma unroll
    for (int half = 0; half < 2; ++half)
#pragma unroll
      for (int ks = 0; ks < kChunk / 16; ++ks)
        mma::load_a_trans_at(frag[half][ks], kd, 16 * ks, 64 * half + 16 * warp());
    const uint64_t vd = wgmma::desc(vt, 16, wgmma::kAtomBytes);
    wgmma::fence();
#pragma unroll
    for (int half = 0; half < 2; ++half)
#pragma unroll
      for (int ks = 0; ks < kChunk / 16; ++ks)
        mma(hs[half], frag[half][ks], vd + ((ks * 32) >> 4), true);
  }

  // S^T (bf16, two SW128 blocks of 64 dk at `st`) for the next chunk's MMAs, the generic-proxy
  // writes ordered before their reads.
  __device__ static void publish(uint32_t st, Acc (&hs)[2]) {
    store_transposed(st, hs[0]);
    store_transposed(st + kBlockBytes, hs[1]);
    wgmma::fence_shared_for_async();
  }
};

}  // namespace deltaserve::cuda::gdn_chunk
