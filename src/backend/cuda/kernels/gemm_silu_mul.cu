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
// row). Warps 0-7: the two consumer warpgroups (64 tokens each); warp 8: the producer; warps
// 9-11: the epilogue, which forms and stores a warpgroup's products from its sums staged in
// shared memory while the consumers go on with the next tile (the SiLU math on the consumers
// themselves left the tensor cores idle ~15% of the time: ncu's samples).
constexpr int kTileRows = 128, kTileCols = kGemmSiluMulTileCols, kTileK = 64, kStages = 4;
constexpr int kConsumers = 256, kConsumerWarps = kConsumers / 32, kEpilogueWarps = 3;
constexpr int kThreads = kConsumers + 32 + 32 * kEpilogueWarps;
// A cluster of two blocks takes a unit: the same output columns of two consecutive row tiles
// (block rank r the row tile 2 u + r). Each block copies its own x box and one of the two weight
// boxes of a stage — rank 0 the gate rows', rank 1 the up rows' — into both blocks' shared memory
// (TMA multicast): the weights are read from L2 once for two tiles, a third less L2 traffic a
// k-step (48 KB a block at one block a tile, more than L2 serves at the tensor cores' rate).
constexpr int kClusterBlocks = 2;
// Units are walked in groups of this many row pairs, every column tile of a group before the next
// group: the clusters in flight share a few x row blocks and a few weight column blocks in L2.
constexpr int kGroupPairs = 8;
// A stage: x's box (128 x 64), then the gate rows' and the up rows' boxes (kTileCols x 64 each),
// which together are the 256-row B operand.
constexpr int kXBytes = kTileRows * wgmma::kRowBytes, kWBytes = kTileCols * wgmma::kRowBytes;
constexpr int kStageBytes = kXBytes + 2 * kWBytes;
// The staged sums of one warpgroup's 64 rows of a tile (a "half"), rounded to bf16 (silu_mul_of's
// rounding) and packed in pairs: a row of kTileCols / 2 words for the gate and as many for up,
// the 16-byte chunk j of row r at chunk j ^ (r % 8), so that a consumer warp's stores (8 rows x
// 4 words) fall in distinct banks. The halves pass through it in turn: warpgroup 0's of a tile,
// then warpgroup 1's, then the next tile's; the two warpgroups drift apart by about the time the
// epilogue takes for one half (no wait in the steady state), which the pipeline's stages absorb.
constexpr int kHalfRows = kTileRows / 2, kStagedRowWords = kTileCols / 2;
struct Staged {
  uint32_t gate[kHalfRows][kStagedRowWords], up[kHalfRows][kStagedRowWords];
};
__device__ inline int staged_word(int r, int w) { return w ^ (r % 8 * 4); }
struct Barriers {
  // staged_done[w]: the epilogue has read warpgroup w's half (a phase a tile)
  uint64_t full[kStages], empty[kStages], staged_full, staged_done[2];
};
constexpr int kSmemBytes =
    kStages * kStageBytes + sizeof(Staged) + sizeof(Barriers) + wgmma::kAtomBytes;
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
      tma::load_2d_multicast(stage + kXBytes + rank * kWBytes, w, k * kTileK, at.n0, &full[s],
                             (1u << kClusterBlocks) - 1);
    }
  }
}

// A consumer warp's release of a stage it has finished reading, to both blocks' producers
// (kClusterBlocks x kConsumerWarps arrivals a phase).
__device__ inline void release(uint64_t* empty, int s, uint32_t rank) {
  if (threadIdx.x % 32 == 0) {
    tma::arrive(&empty[s]);
    tma::arrive_in_cta(&empty[s], rank ^ 1);
  }
}

// The warpgroup's 64 rows of the block's tile number `tile_no` into `st`, once the epilogue has
// read the half before: warpgroup 1's of the previous tile (for warpgroup 0) or warpgroup 0's of
// this one (for 1). Each such wait is on the barrier's next phase to complete (its previous one
// completed before this warpgroup's last half), so its parity is unambiguous. Thread t holds, per
// 8-column block i, the gate sums of columns 8 i + 2 (t % 4) (+ 1) in acc[4 i ..] and their up
// sums 16 blocks later (acc[4 i + 64 ..]), for its rows t / 4 and t / 4 + 8 of its warp's 16.
__device__ void stage_sums(const float (&acc)[128], Staged& st, Barriers& bars, int tile_no) {
  if (threadIdx.x / 128 == 1)
    tma::wait(&bars.staged_done[0], tile_no & 1);
  else if (tile_no > 0)
    tma::wait(&bars.staged_done[1], (tile_no - 1) & 1);
  const int row0 = threadIdx.x / 32 % 4 * 16 + threadIdx.x % 32 / 4, word0 = threadIdx.x % 4;
#pragma unroll
  for (int h = 0; h < 2; ++h)
#pragma unroll
    for (int i = 0; i < kTileCols / 8; ++i) {
      const int a = 4 * i + 2 * h, r = row0 + 8 * h, w = staged_word(r, 4 * i + word0);
      const __nv_bfloat162 g = __floats2bfloat162_rn(acc[a], acc[a + 1]),
                           u = __floats2bfloat162_rn(acc[a + 64], acc[a + 65]);
      st.gate[r][w] = *reinterpret_cast<const uint32_t*>(&g);
      st.up[r][w] = *reinterpret_cast<const uint32_t*>(&u);
    }
  tma::arrive(&bars.staged_full);  // every thread: each releases its own stores
}

__device__ void consume(const Params& p, uint32_t rank, unsigned char* stages, Staged& st,
                        Barriers& bars) {
  const uint32_t x_rows = (threadIdx.x / 128) * 64 * wgmma::kRowBytes;
  float acc[128];
  int it = 0, tile_no = 0;
  for (int u = blockIdx.x / kClusterBlocks; u < p.units;
       u += gridDim.x / kClusterBlocks, ++tile_no) {
    for (int k = 0; k < p.k_tiles; ++k, ++it) {
      const int s = it % kStages;
      tma::wait(&bars.full[s], (it / kStages) & 1);
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
        release(bars.empty, (it - 1) % kStages, rank);
      }
    }
    wgmma::wait<0>();
    release(bars.empty, (it - 1) % kStages, rank);
    stage_sums(acc, st, bars, tile_no);
  }
}

// The epilogue warps: each staged half's act = silu(gate) * up, 8 outputs (16 bytes) a thread and
// step, rows past T skipped.
__device__ void store_products(const Params& p, uint32_t rank, const Staged& st, Barriers& bars) {
  constexpr int kChunksPerRow = kTileCols / 8, kChunks = kHalfRows * kChunksPerRow;
  const int t = static_cast<int>(threadIdx.x) - kConsumers - 32;
  int half = 0;
  for (int u = blockIdx.x / kClusterBlocks; u < p.units; u += gridDim.x / kClusterBlocks) {
    const TileAt at = tile_at(p, u, rank);
    for (int wg = 0; wg < 2; ++wg, ++half) {
      tma::wait(&bars.staged_full, half & 1);
      const int m0 = at.m0 + wg * kHalfRows;
      for (int c = t; c < kChunks; c += 32 * kEpilogueWarps) {
        const int r = c / kChunksPerRow, j = c % kChunksPerRow, w = staged_word(r, 4 * j);
        if (m0 + r >= p.T) break;  // the rows past T come last in this thread's chunks
        const F32x8 g = unpack_bf16x8(*reinterpret_cast<const uint4*>(&st.gate[r][w])),
                    u8 = unpack_bf16x8(*reinterpret_cast<const uint4*>(&st.up[r][w]));
        F32x8 y;
#pragma unroll
        for (int e = 0; e < 8; ++e) y.v[e] = silu(g.v[e]) * u8.v[e];
        store_bf16x8(p.act + static_cast<size_t>(m0 + r) * p.I + at.n0 + 8 * j, y);
      }
      tma::arrive(&bars.staged_done[wg]);
    }
  }
}

__global__ void __launch_bounds__(kThreads, 1) gemm_silu_mul_kernel(const __grid_constant__ Params p) {
  extern __shared__ unsigned char raw[];
  unsigned char* stages = wgmma::atom_aligned<unsigned char>(raw);
  Staged& st = *reinterpret_cast<Staged*>(stages + kStages * kStageBytes);
  Barriers& bars = *reinterpret_cast<Barriers*>(&st + 1);
  if (threadIdx.x == 0) {
    for (int s = 0; s < kStages; ++s) {
      tma::barrier_init(&bars.full[s], 1);
      tma::barrier_init(&bars.empty[s], kClusterBlocks * kConsumerWarps);
    }
    tma::barrier_init(&bars.staged_full, kConsumers / 2);
    tma::barrier_init(&bars.staged_done[0], 32 * kEpilogueWarps);
    tma::barrier_init(&bars.staged_done[1], 32 * kEpilogueWarps);
    tma::barrier_init_fence();
  }
  tma::cluster_sync();  // the partner's barriers are initialised before any copy or arrival
  pdl::allow_successor();
  pdl::wait_for_predecessor();  // x is the previous kernel's output; act may be read by one before
  const uint32_t rank = tma::cluster_rank();
  if (threadIdx.x < kConsumers)
    consume(p, rank, stages, st, bars);
  else if (threadIdx.x == kConsumers)
    produce(p, rank, stages, bars.full, bars.empty);
  else if (threadIdx.x >= kConsumers + 32)
    store_products(p, rank, st, bars);
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
