// The decode MLP in one launch of the weight-streaming GEMM (launch_skinny_mlp_bf16): phase 1 is
// the SiLU-mul form (gate / up into act), phase 2 the down projection of act. Each block takes its
// stream-K share of phase 1's units, then of phase 2's, through one pipeline: its producer copies
// phase 2's first weight tiles while its consumers finish phase 1, instead of the down GEMM's
// blocks starting only as the gate / up GEMM's leave their SMs.
//
// Phase 1's tile j is act's columns [64 j, 64 j + 64), exactly phase 2's k-tile j. The block that
// stores tile j (whole, or as the one completing its stream-K sum) then sets ready[j]; a phase-2
// unit of k-tile j copies its act tile only once ready[j] is set, its producer streaming further
// weight tiles meanwhile. Each of the down projection's tiles reads k-tile j once, so the last of
// those reads (counted in taken[j]) clears both for the next launch.
//
// The flags make blocks wait on other blocks' phase 1, so every block of the grid must be resident
// at once: at most one block an SM (the pipeline takes more than half an SM's shared memory) and no
// more blocks than SMs (skinny::blocks_for).
#include <algorithm>

#include "backend/cuda/kernels/grid_flag.cuh"
#include "backend/cuda/kernels/pdl.cuh"
#include "backend/cuda/kernels/skinny_gemm_parts.cuh"

namespace deltaserve::cuda {
namespace {

using namespace skinny;

constexpr int kRows = kSkinnySiluMulMaxRows;  // the wgmma N: up to 16 tokens
constexpr int kStages = Pipe<kRows>::kStages, kStageBytes = Pipe<kRows>::kStageBytes;

struct MlpParams {
  Params up;    // phase 1: silu(x gate^T) * (x up^T) into act
  Params down;  // phase 2: act down^T into y
  int* ready;   // a flag an act column tile (phase 1's tiles)
  int* taken;   // phase-2 reads of each act column tile so far
  int down_tiles;
};

// Block c's units: [a0, a1) of phase 1, then [b0, b1) of phase 2.
struct Share {
  int a0, a1, b0, b1;
};
__device__ inline Share share_of(const MlpParams& m, int c) {
  return {first_unit(m.up, c), first_unit(m.up, c + 1), first_unit(m.down, c),
          first_unit(m.down, c + 1)};
}

// Waits for act column tile kt, then counts the read; the tile's last reader clears its flag.
__device__ void take_act_tile(const MlpParams& m, int kt) {
  grid_flag::wait_set(&m.ready[kt]);
  if (atomicAdd(&m.taken[kt], 1) == m.down_tiles - 1) {
    m.taken[kt] = 0;
    m.ready[kt] = 0;
  }
}

// After the block stored act column tile `tile` (every consumer thread calls it).
__device__ void publish_act_tile(const MlpParams& m, int tile) {
  grid_flag::proxy_fence();
  consumers_sync();
  if (threadIdx.x == 0) grid_flag::set(&m.ready[tile]);
}

// The producer thread: a unit's weight copies as soon as its stage is free (the first stages'
// before waiting for the previous kernel), its activation copy after them, a phase-2 unit's once
// its act tile is published; while one waits for that, the weight copies run ahead over every
// stage.
__device__ void produce(const MlpParams& m, const Share& sh, unsigned char* stages, uint64_t* full,
                        uint64_t* empty) {
  tma::prefetch_map(&m.up.x);
  tma::prefetch_map(&m.down.x);
  const int n1 = sh.a1 - sh.a0, n = n1 + sh.b1 - sh.b0;
  int issued = 0;  // units whose weight copies are issued
  const auto issue_weights_to = [&](int end) {
    for (; issued < min(n, end); ++issued) {
      const int i = issued, s = i % kStages;
      if (i >= kStages) tma::wait(&empty[s], (i / kStages - 1) & 1);
      tma::arrive_expect_bytes(&full[s], kStageBytes);
      if (i < n1)
        load_w_unit<kRows>(m.up, sh.a0 + i, s, stages, full);
      else
        load_w_unit<kRows>(m.down, sh.b0 + i - n1, s, stages, full);
    }
  };
  issue_weights_to(kStages);
  pdl::wait_for_predecessor();
  for (int i = 0; i < n; ++i) {
    issue_weights_to(i + 1);
    if (i < n1) {
      load_x_unit<kRows>(m.up, sh.a0 + i, i % kStages, stages, full);
      continue;
    }
    const int u = sh.b0 + i - n1, kt = u % m.down.k_tiles;
    if (!grid_flag::is_set(&m.ready[kt])) issue_weights_to(i + kStages);
    take_act_tile(m, kt);
    load_x_unit<kRows>(m.down, u, i % kStages, stages, full);
  }
}

__global__ void __launch_bounds__(kThreads, 1)
    skinny_mlp_kernel(const __grid_constant__ MlpParams m) {
  extern __shared__ unsigned char raw[];
  unsigned char* stages = wgmma::atom_aligned<unsigned char>(raw);
  __shared__ uint64_t full[kStages], empty[kStages];
  __shared__ BlockShared sh;
  const int c = static_cast<int>(blockIdx.x);
  const Share share = share_of(m, c);
  init_pipeline<kStages>(full, empty);
  pdl::allow_successor();  // the next kernel's blocks may start streaming their weights
  if (threadIdx.x >= kConsumers) {
    if (threadIdx.x == kConsumers) produce(m, share, stages, full, empty);
    return;
  }
  pdl::wait_for_predecessor();  // before the stores and the workspace
  const int i = consume_units<kRows>(m.up, c, share.a0, share.a1, 0, stages, full, empty, sh,
                                     [&](int tile) { publish_act_tile(m, tile); });
  consume_units<kRows>(m.down, c, share.b0, share.b1, i, stages, full, empty, sh, [](int) {});
}

// The tiles of phase 1 (act's 64-column tiles) and of phase 2 (the down projection's 128 rows).
int act_tiles(int I) { return (I + kPairRows - 1) / kPairRows; }
int down_tiles(int H) { return (H + kTileRows - 1) / kTileRows; }

}  // namespace

bool skinny_mlp_supported(const void* x, const void* gate, const void* up, const void* down,
                          const void* act, const void* y, int T, int H, int I) {
  return T <= kRows && skinny_supported(x, gate, act, T, H) && skinny_supported(x, up, act, T, H) &&
         skinny_supported(act, down, y, T, I) &&
         3 * act_tiles(I) + down_tiles(H) <= kSkinnyMaxTiles;
}

cudaError_t launch_skinny_mlp_bf16(const bf16* x, const bf16* gate, const bf16* up,
                                   const bf16* down, bf16* act, bf16* y, int T, int H, int I,
                                   const SkinnyWorkspace& ws, int sm_count, cudaStream_t stream) {
  if (!skinny_mlp_supported(x, gate, up, down, act, y, T, H, I)) return cudaErrorInvalidValue;
  MlpParams m{};
  const int tiles = act_tiles(I);
  m.down_tiles = down_tiles(H);
  m.up = silu_mul_params(gate, up, act, H, I);
  plan_units(m.up, x, tiles, T, H, kRows);
  m.down.w[0] = encode_tma_2d_bf16(down, H, I, kTileRows);
  m.down.y[0] = y;
  m.down.n[0] = H;
  m.down.count = 1;
  plan_units(m.down, act, m.down_tiles, T, I, kRows);
  const int blocks = std::min(blocks_for(m.up.units, m.up.k_tiles, sm_count),
                              blocks_for(m.down.units, m.down.k_tiles, sm_count));
  m.up.blocks = m.down.blocks = blocks;
  // The phases' partial sums in disjoint parts of each slot (phase 1 uses T x kTileRows floats);
  // their tile counters, then the flags, apart.
  m.up.ws = ws;
  m.down.ws = {ws.partials + kRows * kTileRows, ws.counters + tiles};
  m.ready = ws.counters + tiles + m.down_tiles;
  m.taken = m.ready + tiles;
  constexpr int smem = Pipe<kRows>::kSmemBytes;
  const cudaError_t e =
      cudaFuncSetAttribute(skinny_mlp_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
  if (e != cudaSuccess) return e;
  return pdl::launch_with(true, skinny_mlp_kernel, blocks, kThreads, smem, stream, m);
}

}  // namespace deltaserve::cuda
