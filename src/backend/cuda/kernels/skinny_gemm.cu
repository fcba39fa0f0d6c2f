#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstdlib>

#include "backend/cuda/ab_switch.h"
#include "backend/cuda/kernels/pdl.cuh"
#include "backend/cuda/kernels/skinny_gemm.cuh"
#include "backend/cuda/kernels/skinny_gemm_tile.cuh"
#include "backend/cuda/kernels/tma.cuh"
#include "backend/cuda/kernels/tma_map.h"

namespace deltaserve::cuda {
namespace {

using namespace skinny_kernel;

// One thread issues every copy: the first stages' weight tiles before waiting for the previous
// kernel (weights are never written by one), then activations and the rest as stages free up.
template <int kRows>
__device__ void produce(const Params& p, int u0, int u1, unsigned char* stages, uint64_t* full,
                        uint64_t* empty) {
  constexpr int kStageBytes = Pipe<kRows>::kStageBytes, kStages = Pipe<kRows>::kStages;
  tma::prefetch_map(&p.x);
  const auto load_w = [&](int i) {
    load_weights(p, u0 + i, stages + i % kStages * kStageBytes, &full[i % kStages]);
  };
  const auto load_x = [&](int i) {
    load_activations(p, u0 + i, stages + i % kStages * kStageBytes, &full[i % kStages]);
  };
  const int first = min(u1 - u0, kStages);
  for (int i = 0; i < first; ++i) {
    tma::arrive_expect_bytes(&full[i], kStageBytes);
    load_w(i);
  }
  pdl::wait_for_predecessor();
  for (int i = 0; i < first; ++i) load_x(i);
  for (int i = first; u0 + i < u1; ++i) {
    tma::wait(&empty[i % kStages], (i / kStages - 1) & 1);
    tma::arrive_expect_bytes(&full[i % kStages], kStageBytes);
    load_w(i);
    load_x(i);
  }
}

// A tile counter: k-tiles summed in its low bits, and kMidSegment once its mid-stream segment's
// partial is stored.
constexpr int kMidSegment = 1 << 20;

// A shared tile's segment in the middle of the block's units (skinny::mid_units, the block's
// first): its partial stored and the tile marked, without waiting for the count, so the block
// streams on; a block whose share ends in the tile sums it.
template <int kRows>
__device__ void publish_mid_segment(const Params& p, int c, int tile,
                                    const float (&acc)[kRows / 2]) {
  store_partial<kRows>(p, slot_of(p, c, tile), acc);
  consumers_sync();  // every consumer's partial stored before the mark's release
  if (threadIdx.x == 0) red_release(&p.ws.counters[tile], kMidSegment);
}

// Whether this block, whose segment [kt0, kt1) of a shared tile ends its share (so the tile is its
// last, with `mid` mid-stream units), sums the tile. Without deferral: the segment that completes
// the count. Deferred: the tile's first segment (kt0 = 0; the others only count), or with
// DS_SKINNY_FIRST_SUMS=0 the last segment that ends a share; either once every segment is counted
// and the mid-stream mark is in. By one thread.
__device__ inline bool sums_tile(const Params& p, int tile, int kt0, int kt1, int mid) {
  int* counter = &p.ws.counters[tile];
  int v = add_acq_rel(counter, kt1 - kt0) + kt1 - kt0;
  if (!p.defer_mid) return v == p.k_tiles;
  const auto counted = [&] { return (v & (kMidSegment - 1)) == p.k_tiles - mid; };
  const auto complete = [&] { return counted() && (mid == 0 || (v & kMidSegment) != 0); };
  if (!p.first_sums && !counted()) return false;
  while (!complete()) v = load_acquire(counter);
  return true;
}

// A tile's sum over k-tiles [kt0, kt1) is done: stored as bf16 when that is all of K, else left as
// a partial; the block that completes a tile's count (a counter per tile; with mid-stream segments
// deferred, the block holding the tile's first k-tile, once every other segment is counted) adds
// its partials.
template <int kRows>
__device__ void finish_segment(const Params& p, int c, int tile, int kt0, int kt1,
                               const float (&acc)[kRows / 2], BlockShared& sh) {
  if (kt0 == 0 && kt1 == p.k_tiles) return store_tile<kRows>(p, tile_ref(p, tile), acc, sh.xchg);
  store_partial<kRows>(p, slot_of(p, c, tile), acc);
  consumers_sync();               // every consumer's partial stored before the count's release
  if (p.first_sums && kt0 > 0) {  // counted without waiting: the tile's first segment sums it
    if (threadIdx.x == 0) red_release(&p.ws.counters[tile], kt1 - kt0);
    return;
  }
  if (threadIdx.x == 0) sh.last = sums_tile(p, tile, kt0, kt1, sh.last_mid);
  consumers_sync();  // the count's acquire before any consumer reads the other blocks' partials
  if (!sh.last) return;
  int np = sh.last_np;  // deferred mid-stream segments: gathered at the block's start
  if (!p.defer_mid) {
    np = gather_parts(p, tile, sh.parts);
    consumers_sync();
  }
  reduce_tile<kRows>(p, tile, sh.parts, np);
  if (threadIdx.x == 0) p.ws.counters[tile] = 0;  // ready for the next launch
}

// With mid-stream segments deferred, the only tile a block may sum is its last, where shared: its
// mid-stream units and partials' addresses, formed before the kernel waits for its predecessor
// (from the launch's parameters, into shared memory; the first consumers_sync orders them before
// any use).
__device__ inline void prepare_last_tile(const Params& p, int u0, int u1, BlockShared& sh) {
  const int last = (u1 - 1) / p.k_tiles;
  if (u1 % p.k_tiles == 0 && u1 - p.k_tiles >= u0) return;  // whole: stored, never summed
  const int np = gather_parts(p, last, sh.parts);
  if (threadIdx.x == 0) {
    sh.last_np = np;
    sh.last_mid = mid_units(p, last);
  }
}

// The consumer warpgroups over the block's units, tile segment by tile segment; each stage is
// released once the MMAs reading it have completed.
template <int kRows>
__device__ void consume(const Params& p, int c, int u0, int u1, unsigned char* stages,
                        uint64_t* full, uint64_t* empty, BlockShared& sh) {
  float acc[kRows / 2];
  for (int u = u0, i = 0; u < u1;) {
    const int tile = u / p.k_tiles, kt0 = u - tile * p.k_tiles;
    const int end = min(u1, (tile + 1) * p.k_tiles);
#pragma unroll
    for (int a = 0; a < kRows / 2; ++a) acc[a] = 0.0f;
    for (; u < end; ++u, ++i) mma_unit<kRows>(acc, stages, full, empty, i);
    if (p.defer_mid && kt0 > 0 && end < u1)  // shared, and the block streams on past it
      publish_mid_segment<kRows>(p, c, tile, acc);
    else
      finish_segment<kRows>(p, c, tile, kt0, end - tile * p.k_tiles, acc, sh);
  }
}

template <int kRows>
__global__ void __launch_bounds__(kThreads, 1)
    skinny_gemm_kernel(const __grid_constant__ Params p) {
  constexpr int kStages = Pipe<kRows>::kStages;
  extern __shared__ unsigned char raw[];
  unsigned char* stages = wgmma::atom_aligned<unsigned char>(raw);
  __shared__ uint64_t full[kStages], empty[kStages];
  __shared__ BlockShared sh;
  const int c = static_cast<int>(blockIdx.x), u0 = first_unit(p, c), u1 = first_unit(p, c + 1);
  init_pipeline<kStages>(full, empty);
  __syncthreads();
  pdl::allow_successor();  // the next kernel's blocks may start streaming their weights
  if (threadIdx.x >= kConsumers) {
    if (threadIdx.x == kConsumers) produce<kRows>(p, u0, u1, stages, full, empty);
    return;
  }
  if (threadIdx.x == 0) sh.last_mid = 0;
  if (p.defer_mid) prepare_last_tile(p, u0, u1, sh);  // shared memory only: before the wait
  pdl::wait_for_predecessor();                        // before the stores and the workspace
  consume<kRows>(p, c, u0, u1, stages, full, empty, sh);
}

template <int kRows>
cudaError_t launch(const Params& p, cudaStream_t stream) {
  const auto kernel = skinny_gemm_kernel<kRows>;
  constexpr int smem = Pipe<kRows>::kSmemBytes;
  const cudaError_t e =
      cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
  if (e != cudaSuccess) return e;
  return pdl::launch_with(true, kernel, p.grid, kThreads, smem, stream, p);
}

// Shares claimed at run time (skinny_gemm_claimed.cu) up to kClaimedMaxRows tokens: up to
// DS_SKINNY_SHARES_PER_SM shares a multiprocessor (default and most kClaimedSharesPerSm; 0: the
// static split, A/B). Their claim counters: the next launch's slot.
int claimed_shares_per_sm() {
  static const int per_sm = [] {
    const char* v = std::getenv("DS_SKINNY_SHARES_PER_SM");
    return v ? std::clamp(std::atoi(v), 0, skinny::kClaimedSharesPerSm)
             : skinny::kClaimedSharesPerSm;
  }();
  return per_sm;
}
int* next_claim_slot(const SkinnyWorkspace& ws) {
  static std::atomic<unsigned> next{0};
  return ws.counters + kSkinnyMaxTiles + 2 * (next++ % kSkinnyClaimSlots);
}

// x [T, K] and the split of p's `tiles` tiles of K between blocks, then the launch.
cudaError_t launch_tiles(Params& p, const bf16* x, int tiles, int T, int K,
                         const SkinnyWorkspace& ws, int sm_count, cudaStream_t stream) {
  if (tiles > kSkinnyMaxTiles) return cudaErrorInvalidValue;
  const int rows = T <= 16 ? 16 : T <= 32 ? 32 : 64;
  p.x = encode_tma_2d_bf16(x, T, K, rows);
  p.T = T;
  p.k_tiles = (K + kTileK - 1) / kTileK;
  p.units = tiles * p.k_tiles;
  p.ws = ws;
  p.slot_floats = kTileRows * rows;
  const int per_sm = claimed_shares_per_sm();
  if (rows <= skinny::kClaimedMaxRows && per_sm > 0 && sm_count < kSkinnyClaimSlots) {
    p.blocks = skinny::claimed_shares(p.units, p.k_tiles, sm_count, per_sm);
    p.grid = std::min(sm_count, p.blocks);
    p.claim = next_claim_slot(ws);
    return launch_claimed(p, stream);
  }
  p.blocks = p.grid = skinny::blocks_for(p.units, p.k_tiles, sm_count);
  static const bool defer_mid = ab_switch_on("DS_SKINNY_DEFER_MID");
  p.defer_mid = defer_mid;
  static const bool first_sums = ab_switch_on("DS_SKINNY_FIRST_SUMS");
  p.first_sums = defer_mid && first_sums;
  return rows == 16   ? launch<16>(p, stream)
         : rows == 32 ? launch<32>(p, stream)
                      : launch<64>(p, stream);
}

}  // namespace

// Two partial slots a share: the static split's at up to 64 tokens, or the claimed shares' at 16.
size_t skinny_workspace_floats(int sm_count) {
  constexpr int kRowsOfSlots =
      std::max(kSkinnyMaxRows, skinny::kClaimedSharesPerSm * skinny::kClaimedMaxRows);
  return static_cast<size_t>(2 * sm_count) * kTileRows * kRowsOfSlots;
}

bool skinny_supported(const void* x, const void* w, const void* y, int T, int K) {
  const auto aligned = [](const void* p, uintptr_t a) {
    return reinterpret_cast<uintptr_t>(p) % a == 0;
  };
  return T >= 1 && T <= kSkinnyMaxRows && K % 8 == 0 && K > 0 && aligned(x, 16) && aligned(w, 16) &&
         aligned(y, 8);
}

cudaError_t launch_skinny_gemm_bf16(const bf16* x, const SkinnyGroup* groups, int count, int T,
                                    int K, const SkinnyWorkspace& ws, int sm_count,
                                    cudaStream_t stream) {
  if (T < 1 || T > kSkinnyMaxRows) return cudaErrorInvalidValue;
  Params p{};
  int tiles = 0;
  for (int g = 0; g < count; ++g) {
    p.w[g] = encode_tma_2d_bf16(groups[g].w, groups[g].n, K, kTileRows);
    p.y[g] = groups[g].y;
    p.n[g] = groups[g].n;
    p.first_tile[g] = tiles;
    tiles += (groups[g].n + kTileRows - 1) / kTileRows;
  }
  p.count = count;
  return launch_tiles(p, x, tiles, T, K, ws, sm_count, stream);
}

cudaError_t launch_skinny_gemm_silu_mul_bf16(const bf16* x, const bf16* gate, const bf16* up,
                                             bf16* act, int T, int K, int I,
                                             const SkinnyWorkspace& ws, int sm_count,
                                             cudaStream_t stream) {
  if (T < 1 || T > kSkinnySiluMulMaxRows) return cudaErrorInvalidValue;
  Params p{};
  p.paired = true;
  p.w[0] = encode_tma_2d_bf16(gate, I, K, kPairRows);
  p.w[1] = encode_tma_2d_bf16(up, I, K, kPairRows);
  p.y[0] = act;
  p.n[0] = I;
  p.count = 1;
  return launch_tiles(p, x, (I + kPairRows - 1) / kPairRows, T, K, ws, sm_count, stream);
}

}  // namespace deltaserve::cuda
