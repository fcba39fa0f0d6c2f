#include <algorithm>
#include <cstdint>

#include "backend/cuda/kernels/bf16x8.cuh"
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
// A cluster of two blocks takes a unit: the same output columns of two consecutive row tiles
// (block rank r the row tile 2 u + r). Each block copies its own x box and one of the two weight
// boxes of a stage — rank 0 the gate rows', rank 1 the up rows' — into both blocks' shared memory
// (TMA multicast): the weights are read from L2 once for two tiles, a third less L2 traffic a
// k-step. On the H200 with this epilogue (linear_bench --mlp, one lease, two rounds, us a call)
// pairs / one block a tile: 8,192 tokens 1,198, 1,180 / 1,195, 1,203; 16,384 2,425, 2,359 /
// 2,466, 2,503; 2,048 278, 276 / 267, 280 (L2 is not the bound: ncu has it at 53%).
// -DDS_GSM_CLUSTER_BLOCKS=1 builds the one-block form (for A/B; it passes linear_silu_mul_test).
#ifndef DS_GSM_CLUSTER_BLOCKS
#define DS_GSM_CLUSTER_BLOCKS 2
#endif
constexpr int kClusterBlocks = DS_GSM_CLUSTER_BLOCKS;
static_assert(kClusterBlocks == 1 || kClusterBlocks == 2, "a block alone or a pair");
// Units are walked in groups of this many row pairs, every column tile of a group before the next
// group: the clusters in flight share a few x row blocks and a few weight column blocks in L2.
constexpr int kGroupPairs = 8;
// A stage: x's box (128 x 64), then the gate rows' and the up rows' boxes (kTileCols x 64 each),
// which together are the 256-row B operand.
constexpr int kXBytes = kTileRows * wgmma::kRowBytes, kWBytes = kTileCols * wgmma::kRowBytes;
constexpr int kStageBytes = kXBytes + 2 * kWBytes;
constexpr int kSmemBytes = kStages * kStageBytes + 2 * kStages * 8 + wgmma::kAtomBytes;
static_assert(kSmemBytes <= 227 * 1024, "one block an SM");

struct Params {
  CUtensorMap x, w_gate, w_up;  // [T, K] in boxes of 128 rows, [I, K] in boxes of kTileCols
  bf16* act;                    // [T, I]
  int T, I, k_tiles, m_pairs, n_tiles, units;
};

// This block's first token and output column of unit u.
struct TileAt {
  int m0, n0;
};
__device__ inline TileAt tile_at(const Params& p, int u, uint32_t rank) {
  const int per_group = kGroupPairs * p.n_tiles, group = u / per_group, r = u % per_group;
  const int first = group * kGroupPairs, pairs = min(kGroupPairs, p.m_pairs - first);
  return {(kClusterBlocks * (first + r % pairs) + static_cast<int>(rank)) * kTileRows,
          (r / pairs) * kTileCols};
}

// One thread a block issues every copy of its stages, a stage as soon as the consumers of both
// blocks have released it (the partner's copy lands in it too).
__device__ void produce(const Params& p, uint32_t rank, unsigned char* stages, uint64_t* full,
                        uint64_t* empty) {
  tma::prefetch_map(&p.x);
  const CUtensorMap* w = rank == 0 ? &p.w_gate : &p.w_up;
  tma::prefetch_map(w);
  int it = 0;
  for (int u = blockIdx.x / kClusterBlocks; u < p.units; u += gridDim.x / kClusterBlocks) {
    const TileAt at = tile_at(p, u, rank);
    for (int k = 0; k < p.k_tiles; ++k, ++it) {
      const int s = it % kStages;
      if (it >= kStages) tma::wait(&empty[s], (it / kStages - 1) & 1);
      unsigned char* stage = stages + s * kStageBytes;
      tma::arrive_expect_bytes(&full[s], kStageBytes);
      tma::load_2d(stage, &p.x, k * kTileK, at.m0, &full[s]);
      if constexpr (kClusterBlocks == 1) {
        tma::load_2d(stage + kXBytes, &p.w_gate, k * kTileK, at.n0, &full[s]);
        tma::load_2d(stage + kXBytes + kWBytes, &p.w_up, k * kTileK, at.n0, &full[s]);
      } else {
        tma::load_2d_multicast(stage + kXBytes + rank * kWBytes, w, k * kTileK, at.n0, &full[s],
                               (1u << kClusterBlocks) - 1);
      }
    }
  }
}

// A consumer warp's release of a stage it has finished reading, to both blocks' producers
// (kClusterBlocks x kConsumerWarps arrivals a phase).
__device__ inline void release(uint64_t* empty, int s, uint32_t rank) {
  if (threadIdx.x % 32 == 0) {
    tma::arrive(&empty[s]);
    if constexpr (kClusterBlocks == 2) tma::arrive_in_cta(&empty[s], rank ^ 1);
  }
}

// The warpgroup's 64 tokens of a tile: act = silu(gate sum) * up sum in f32, rounded once to bf16
// (the unfused ops round both sums to bf16 first: within a bf16 ulp of theirs). Thread t holds,
// per 8-column block i, the gate sums of columns 8 i + 2 (t % 4) (+ 1) in acc[4 i ..] and their
// up sums 16 blocks later (acc[4 i + 64 ..]), for its rows t / 4 and t / 4 + 8 of its warp's 16.
// The tensor cores idle meanwhile, and the conversion / special-function pipe (a quarter of the
// FMA rate) bounds it: so the SiLU by silu_fast (an ex2 and a reciprocal) and no rounding of the
// sums (with it and the IEEE division, ncu put ~15% of the kernel's samples here; 7% less time
// a call at 8,192 tokens with the fast SiLU alone).
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
      *reinterpret_cast<__nv_bfloat162*>(out + 8 * i) =
          __floats2bfloat162_rn(silu_fast(acc[g]) * acc[u], silu_fast(acc[g + 1]) * acc[u + 1]);
    }
  }
}

__device__ void consume(const Params& p, uint32_t rank, unsigned char* stages, uint64_t* full,
                        uint64_t* empty) {
  const uint32_t x_rows = (threadIdx.x / 128) * 64 * wgmma::kRowBytes;
  float acc[128];
  int it = 0;
  for (int u = blockIdx.x / kClusterBlocks; u < p.units; u += gridDim.x / kClusterBlocks) {
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
        release(empty, (it - 1) % kStages, rank);
      }
    }
    wgmma::wait<0>();
    release(empty, (it - 1) % kStages, rank);
    store_tile(p, tile_at(p, u, rank), acc);
  }
}

__global__ void __launch_bounds__(kThreads, 1)
    gemm_silu_mul_kernel(const __grid_constant__ Params p) {
  extern __shared__ unsigned char raw[];
  unsigned char* stages = wgmma::atom_aligned<unsigned char>(raw);
  uint64_t* full = reinterpret_cast<uint64_t*>(stages + kStages * kStageBytes);
  uint64_t* empty = full + kStages;
  if (threadIdx.x == 0) {
    for (int s = 0; s < kStages; ++s) {
      tma::barrier_init(&full[s], 1);
      tma::barrier_init(&empty[s], kClusterBlocks * kConsumerWarps);
    }
    tma::barrier_init_fence();
  }
  tma::cluster_sync();  // the partner's barriers are initialised before any copy or arrival
  pdl::allow_successor();
  pdl::wait_for_predecessor();  // x is the previous kernel's output; act may be read by one before
  const uint32_t rank = tma::cluster_rank();
  if (threadIdx.x < kConsumers)
    consume(p, rank, stages, full, empty);
  else if (threadIdx.x == kConsumers)
    produce(p, rank, stages, full, empty);
  tma::cluster_sync();  // no block leaves while its partner may still copy into it or arrive
}

// Clusters of two that fit on the GPU at once (some GPCs hold an odd number of SMs).
int clusters_at_once(int sm_count) {
  static const int fit = [] {
    cudaLaunchConfig_t cfg{};
    cudaLaunchAttribute attr{};
    attr.id = cudaLaunchAttributeClusterDimension;
    attr.val.clusterDim = {kClusterBlocks, 1, 1};
    cfg.gridDim = dim3(kClusterBlocks * 256);
    cfg.blockDim = dim3(kThreads);
    cfg.dynamicSmemBytes = kSmemBytes;
    cfg.attrs = &attr;
    cfg.numAttrs = 1;
    int n = 0;
    return cudaOccupancyMaxActiveClusters(&n, gemm_silu_mul_kernel, &cfg) == cudaSuccess ? n : 0;
  }();
  const int most = std::max(1, sm_count / kClusterBlocks);
  return fit > 0 ? std::min(fit, most) : most;
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
  p.m_pairs = (T + kClusterBlocks * kTileRows - 1) / (kClusterBlocks * kTileRows);
  p.n_tiles = I / kTileCols;
  p.units = p.m_pairs * p.n_tiles;
  const cudaError_t e = cudaFuncSetAttribute(
      gemm_silu_mul_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmemBytes);
  if (e != cudaSuccess) return e;
  const int clusters = std::min(p.units, clusters_at_once(sm_count));
  return pdl::launch_clustered(pdl::dependent_launch_enabled(), dim3(kClusterBlocks, 1, 1),
                               gemm_silu_mul_kernel, kClusterBlocks * clusters, kThreads,
                               kSmemBytes, stream, p);
}

}  // namespace deltaserve::cuda
