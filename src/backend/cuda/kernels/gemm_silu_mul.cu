#include <algorithm>
#include <cstdint>

#include "backend/cuda/kernels/common.cuh"
#include "backend/cuda/kernels/gemm_silu_mul.cuh"
#include "backend/cuda/kernels/pdl.cuh"
#include "backend/cuda/kernels/tma.cuh"
#include "backend/cuda/kernels/tma_map.h"
#include "backend/cuda/kernels/wgmma.cuh"

namespace deltaserve::cuda {
namespace {

using bf16 = __nv_bfloat16;

// A tile: 128 tokens x kTileCols outputs, K in steps of 64 columns (one SW128 atom row a matrix
// row). Warps 0-7: the two consumer warpgroups (64 tokens each); warp 8: the producer.
constexpr int kTileRows = 128, kTileCols = kGemmSiluMulTileCols, kTileK = 64, kStages = 4;
constexpr int kConsumers = 256, kThreads = kConsumers + 32, kConsumerWarps = kConsumers / 32;
// Tiles are walked in groups of this many row tiles, every column tile of a group before the next
// group: the blocks in flight share a few x row blocks and a few weight column blocks in L2.
constexpr int kGroupRows = 16;
// A stage: x's box (128 x 64), then the gate rows' and the up rows' boxes (kTileCols x 64 each),
// which together are the 256-row B operand.
constexpr int kXBytes = kTileRows * wgmma::kRowBytes, kWBytes = kTileCols * wgmma::kRowBytes;
constexpr int kStageBytes = kXBytes + 2 * kWBytes;
constexpr int kSmemBytes = kStages * kStageBytes + 2 * kStages * 8 + wgmma::kAtomBytes;
static_assert(kSmemBytes <= 227 * 1024, "one block an SM");

struct Params {
  CUtensorMap x, w_gate, w_up;  // [T, K] in boxes of 128 rows, [I, K] in boxes of kTileCols
  bf16* act;                    // [T, I]
  int T, I, k_tiles, m_tiles, n_tiles, tiles;
};

// The first token and output column of tile t.
struct TileAt {
  int m0, n0;
};
__device__ inline TileAt tile_at(const Params& p, int t) {
  const int per_group = kGroupRows * p.n_tiles, group = t / per_group, r = t % per_group;
  const int first = group * kGroupRows, rows = min(kGroupRows, p.m_tiles - first);
  return {(first + r % rows) * kTileRows, (r / rows) * kTileCols};
}

// One thread issues every copy, a stage as soon as the consumers have released it.
__device__ void produce(const Params& p, unsigned char* stages, uint64_t* full, uint64_t* empty) {
  tma::prefetch_map(&p.x);
  tma::prefetch_map(&p.w_gate);
  tma::prefetch_map(&p.w_up);
  int it = 0;
  for (int t = blockIdx.x; t < p.tiles; t += gridDim.x) {
    const TileAt at = tile_at(p, t);
    for (int k = 0; k < p.k_tiles; ++k, ++it) {
      const int s = it % kStages;
      if (it >= kStages) tma::wait(&empty[s], (it / kStages - 1) & 1);
      unsigned char* stage = stages + s * kStageBytes;
      tma::arrive_expect_bytes(&full[s], kStageBytes);
      tma::load_2d(stage, &p.x, k * kTileK, at.m0, &full[s]);
      tma::load_2d(stage + kXBytes, &p.w_gate, k * kTileK, at.n0, &full[s]);
      tma::load_2d(stage + kXBytes + kWBytes, &p.w_up, k * kTileK, at.n0, &full[s]);
    }
  }
}

// A consumer warp's release of a stage it has finished reading (kConsumerWarps arrivals a phase).
__device__ inline void release(uint64_t* empty, int s) {
  if (threadIdx.x % 32 == 0) tma::arrive(&empty[s]);
}

// The warpgroup's 64 tokens of a tile: act = silu_mul_of(gate sum, up sum). Thread t holds, per
// 8-column block i, the gate sums of columns 8 i + 2 (t % 4) (+ 1) in acc[4 i ..] and their up
// sums 16 blocks later (acc[4 i + 64 ..]), for its rows t / 4 and t / 4 + 8 of its warp's 16.
__device__ void store_tile(const Params& p, TileAt at, const float (&acc)[128]) {
  const int wg = threadIdx.x / 128, warp = threadIdx.x / 32 % 4, lane = threadIdx.x % 32;
  const int row0 = at.m0 + wg * 64 + warp * 16 + lane / 4, col0 = at.n0 + 2 * (lane % 4);
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int row = row0 + 8 * h;
    if (row >= p.T) continue;
    bf16* out = p.act + static_cast<size_t>(row) * p.I + col0;
#pragma unroll
    for (int i = 0; i < kTileCols / 8; ++i) {
      const int g = 4 * i + 2 * h, u = g + 64;
      *reinterpret_cast<__nv_bfloat162*>(out + 8 * i) = __floats2bfloat162_rn(
          silu_mul_of(acc[g], acc[u]), silu_mul_of(acc[g + 1], acc[u + 1]));
    }
  }
}

__device__ void consume(const Params& p, unsigned char* stages, uint64_t* full, uint64_t* empty) {
  const uint32_t x_rows = (threadIdx.x / 128) * 64 * wgmma::kRowBytes;
  float acc[128];
  int it = 0;
  for (int t = blockIdx.x; t < p.tiles; t += gridDim.x) {
    for (int k = 0; k < p.k_tiles; ++k, ++it) {
      const int s = it % kStages;
      tma::wait(&full[s], (it / kStages) & 1);
      const uint32_t stage = tma::smem_addr(stages + s * kStageBytes);
      const uint64_t ad = wgmma::desc(stage + x_rows, 16, wgmma::kAtomBytes),
                     bd = wgmma::desc(stage + kXBytes, 16, wgmma::kAtomBytes);
      wgmma::fence();
#pragma unroll
      for (int ks = 0; ks < kTileK / 16; ++ks)  // 16 columns = 32 bytes along the atom row
        wgmma::mma_64x256_ss(acc, ad + 2 * ks, bd + 2 * ks, k > 0 || ks > 0);
      wgmma::commit();
      if (k > 0) {
        wgmma::wait<1>();
        release(empty, (it - 1) % kStages);
      }
    }
    wgmma::wait<0>();
    release(empty, (it - 1) % kStages);
    store_tile(p, tile_at(p, t), acc);
  }
}

__global__ void __launch_bounds__(kThreads, 1) gemm_silu_mul_kernel(const __grid_constant__ Params p) {
  extern __shared__ unsigned char raw[];
  unsigned char* stages = wgmma::atom_aligned<unsigned char>(raw);
  uint64_t* full = reinterpret_cast<uint64_t*>(stages + kStages * kStageBytes);
  uint64_t* empty = full + kStages;
  if (threadIdx.x == 0) {
    for (int s = 0; s < kStages; ++s) {
      tma::barrier_init(&full[s], 1);
      tma::barrier_init(&empty[s], kConsumerWarps);
    }
    tma::barrier_init_fence();
  }
  __syncthreads();
  pdl::allow_successor();
  pdl::wait_for_predecessor();  // x is the previous kernel's output; act may be read by one before
  if (threadIdx.x >= kConsumers) {
    if (threadIdx.x == kConsumers) produce(p, stages, full, empty);
    return;
  }
  consume(p, stages, full, empty);
}

}  // namespace

bool gemm_silu_mul_supported(const void* x, const void* w_gate, const void* w_up, const void* act,
                             int64_t T, int64_t K, int64_t I) {
  return T >= 1 && T < (int64_t{1} << 30) && K > 0 && K % 8 == 0 && I > 0 && I % kTileCols == 0 &&
         I < (int64_t{1} << 24) && aligned16(x, w_gate, w_up, act);
}

cudaError_t launch_gemm_silu_mul_bf16(const bf16* x, const bf16* w_gate, const bf16* w_up,
                                      bf16* act, int T, int K, int I, int sm_count,
                                      cudaStream_t stream) {
  if (!gemm_silu_mul_supported(x, w_gate, w_up, act, T, K, I) || sm_count < 1)
    return cudaErrorInvalidValue;
  Params p{};
  p.x = encode_tma_2d_bf16(x, T, K, kTileRows);
  p.w_gate = encode_tma_2d_bf16(w_gate, I, K, kTileCols);
  p.w_up = encode_tma_2d_bf16(w_up, I, K, kTileCols);
  p.act = act;
  p.T = T;
  p.I = I;
  p.k_tiles = (K + kTileK - 1) / kTileK;
  p.m_tiles = (T + kTileRows - 1) / kTileRows;
  p.n_tiles = I / kTileCols;
  p.tiles = p.m_tiles * p.n_tiles;
  const cudaError_t e = cudaFuncSetAttribute(
      gemm_silu_mul_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmemBytes);
  if (e != cudaSuccess) return e;
  return pdl::launch_dependent(gemm_silu_mul_kernel, std::min(p.tiles, sm_count), kThreads,
                               kSmemBytes, stream, p);
}

}  // namespace deltaserve::cuda
