#include <cooperative_groups.h>

#include <algorithm>
#include <cstdint>

#include "backend/cuda/kernels/skinny_gemm.cuh"
#include "backend/cuda/kernels/tma.cuh"
#include "backend/cuda/kernels/tma_map.h"
#include "backend/cuda/kernels/wgmma.cuh"

namespace deltaserve::cuda {
namespace {

namespace cg = cooperative_groups;
using bf16 = __nv_bfloat16;

// A block: one consumer warpgroup (warps 0-3) multiplying 64 weight rows, one producer warp
// (warp 4) issuing the copies. A k-tile is 64 columns of K: one SW128 atom row per matrix row.
constexpr int kTileRows = 64, kTileK = 64, kConsumers = 128, kThreads = kConsumers + 32;
constexpr int kMaxSplit = 8;  // the portable cluster size
// Shared memory for the pipeline (two blocks an SM).
constexpr int kPipelineBytes = 96 * 1024;

struct Params {
  CUtensorMap x;                    // [T, K], boxes of kTpad rows x 64
  CUtensorMap w[kSkinnyMaxGroups];  // [n, K], boxes of 64 x 64
  bf16* y[kSkinnyMaxGroups];        // [T, n]
  int n[kSkinnyMaxGroups];
  int first_tile[kSkinnyMaxGroups];  // group g's 64-row tiles start here
  int count, T, k_tiles, split;
};

template <int kTpad>
struct Layout {
  static constexpr int kWBytes = kTileRows * wgmma::kRowBytes, kXBytes = kTpad * wgmma::kRowBytes;
  static constexpr int kStageBytes = kWBytes + kXBytes;
  static constexpr int kStages = kPipelineBytes / kStageBytes;
  // The partial sums [kTpad][kPartStride] f32 overlay the drained pipeline; the row padding keeps
  // the accumulator stores of a warp on distinct banks.
  static constexpr int kPartStride = kTileRows + 4;
  static_assert(kTpad * kPartStride * 4 <= kStages * kStageBytes, "partials fit the pipeline");
  static constexpr int kSmem = kStages * kStageBytes + wgmma::kAtomBytes;
};

// The block's work: group g's weight rows [n0, n0 + 64), k-tiles [kt0, kt0 + nk).
struct Work {
  int g, n0, kt0, nk, rank;
};

__device__ Work block_work(const Params& p) {
  Work w;
  w.rank = static_cast<int>(blockIdx.x) % p.split;
  const int tile = static_cast<int>(blockIdx.x) / p.split;
  w.g = 0;
  while (w.g + 1 < p.count && tile >= p.first_tile[w.g + 1]) ++w.g;
  w.n0 = (tile - p.first_tile[w.g]) * kTileRows;
  w.kt0 = w.rank * p.k_tiles / p.split;
  w.nk = (w.rank + 1) * p.k_tiles / p.split - w.kt0;
  return w;
}

// One thread issues every copy: the first stages' weight tiles before waiting for the previous
// kernel (weights are never written by one), then activations and the rest as stages free up.
template <int kTpad>
__device__ void produce(const Params& p, const Work& w, unsigned char* stages, uint64_t* full,
                        uint64_t* empty) {
  using L = Layout<kTpad>;
  tma::prefetch_map(&p.w[w.g]);
  tma::prefetch_map(&p.x);
  const int first = min(w.nk, L::kStages);
  for (int i = 0; i < first; ++i) {
    tma::arrive_expect_bytes(&full[i], L::kStageBytes);
    tma::load_2d(stages + i * L::kStageBytes, &p.w[w.g], (w.kt0 + i) * kTileK, w.n0, &full[i]);
  }
  tma::wait_for_predecessor();
  for (int i = 0; i < first; ++i)
    tma::load_2d(stages + i * L::kStageBytes + L::kWBytes, &p.x, (w.kt0 + i) * kTileK, 0, &full[i]);
  for (int i = first; i < w.nk; ++i) {
    const int s = i % L::kStages;
    tma::wait(&empty[s], (i / L::kStages - 1) & 1);
    unsigned char* stage = stages + s * L::kStageBytes;
    tma::arrive_expect_bytes(&full[s], L::kStageBytes);
    tma::load_2d(stage, &p.w[w.g], (w.kt0 + i) * kTileK, w.n0, &full[s]);
    tma::load_2d(stage + L::kWBytes, &p.x, (w.kt0 + i) * kTileK, 0, &full[s]);
  }
}

// The consumer warpgroup: acc (64 weight rows x kTpad tokens) over the block's k-tiles, each
// stage released once the MMAs reading it have completed.
template <int kTpad>
__device__ void consume(const Work& w, unsigned char* stages, uint64_t* full, uint64_t* empty,
                        float (&acc)[kTpad / 2]) {
  using L = Layout<kTpad>;
  const uint32_t base = tma::smem_addr(stages);
  constexpr uint32_t kStep = 32 >> 4;  // 16 bf16 along K, in the descriptor's 16-byte units
#pragma unroll
  for (int i = 0; i < kTpad / 2; ++i) acc[i] = 0.0f;
  for (int i = 0; i < w.nk; ++i) {
    const int s = i % L::kStages;
    tma::wait(&full[s], (i / L::kStages) & 1);
    const uint32_t ws = base + s * L::kStageBytes;
    const uint64_t wd = wgmma::desc(ws, 16, wgmma::kAtomBytes),
                   xd = wgmma::desc(ws + L::kWBytes, 16, wgmma::kAtomBytes);
    wgmma::fence();
#pragma unroll
    for (int kk = 0; kk < kTileK / 16; ++kk)
      wgmma::mma_ss<kTpad>(acc, wd + kk * kStep, xd + kk * kStep, true);
    wgmma::commit();
    wgmma::wait<1>();
    if (i > 0) tma::arrive(&empty[(i - 1) % L::kStages]);
  }
  wgmma::wait<0>();
}

// The accumulator fragment into part [kTpad][kPartStride] (token-major).
template <int kTpad>
__device__ void store_partial(const float (&acc)[kTpad / 2], float* part) {
  constexpr int S = Layout<kTpad>::kPartStride;
  const int lane = threadIdx.x % 32, r = 16 * (threadIdx.x / 32) + lane / 4, c = 2 * (lane % 4);
#pragma unroll
  for (int i = 0; i < kTpad / 8; ++i) {
    const int t = 8 * i + c;
    part[t * S + r] = acc[4 * i];
    part[(t + 1) * S + r] = acc[4 * i + 1];
    part[t * S + r + 8] = acc[4 * i + 2];
    part[(t + 1) * S + r + 8] = acc[4 * i + 3];
  }
}

// This block's share of the tokens: the sum of the cluster's partials (in rank order) as bf16.
template <int kTpad>
__device__ void reduce_partials(const Params& p, const Work& w, float* part) {
  constexpr int S = Layout<kTpad>::kPartStride;
  cg::cluster_group cluster = cg::this_cluster();
  const int per = (p.T + p.split - 1) / p.split, t0 = w.rank * per;
  const int t1 = min(p.T, t0 + per), n = p.n[w.g];
  bf16* y = p.y[w.g];
  for (int item = static_cast<int>(threadIdx.x); item < (t1 - t0) * (kTileRows / 4);
       item += kThreads) {
    const int t = t0 + item / (kTileRows / 4), c = 4 * (item % (kTileRows / 4));
    float4 sum = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    for (int src = 0; src < p.split; ++src) {
      const float4 v = *reinterpret_cast<const float4*>(
          cluster.map_shared_rank(part + t * S + c, static_cast<unsigned>(src)));
      sum.x += v.x;
      sum.y += v.y;
      sum.z += v.z;
      sum.w += v.w;
    }
    const int col = w.n0 + c;
    bf16* out = y + static_cast<size_t>(t) * n + col;
    if (n % 4 == 0 && col + 3 < n) {
      const __nv_bfloat162 lo = __floats2bfloat162_rn(sum.x, sum.y),
                           hi = __floats2bfloat162_rn(sum.z, sum.w);
      uint2 packed;
      packed.x = *reinterpret_cast<const uint32_t*>(&lo);
      packed.y = *reinterpret_cast<const uint32_t*>(&hi);
      *reinterpret_cast<uint2*>(out) = packed;
    } else {
      const float v[4] = {sum.x, sum.y, sum.z, sum.w};
      for (int j = 0; j < 4 && col + j < n; ++j) out[j] = __float2bfloat16(v[j]);
    }
  }
}

template <int kTpad>
__global__ void __launch_bounds__(kThreads) skinny_gemm_kernel(const __grid_constant__ Params p) {
  using L = Layout<kTpad>;
  extern __shared__ unsigned char raw[];
  unsigned char* stages = wgmma::atom_aligned<unsigned char>(raw);
  __shared__ uint64_t full[L::kStages], empty[L::kStages];
  const Work w = block_work(p);
  if (threadIdx.x == 0) {
    for (int s = 0; s < L::kStages; ++s) {
      tma::barrier_init(&full[s], 1);
      tma::barrier_init(&empty[s], kConsumers);
    }
    tma::barrier_init_fence();
  }
  __syncthreads();
  float* part = reinterpret_cast<float*>(stages);
  if (threadIdx.x >= kConsumers) {
    if (threadIdx.x == kConsumers) produce<kTpad>(p, w, stages, full, empty);
  } else {
    tma::wait_for_predecessor();  // before this block's stores
    float acc[kTpad / 2];
    consume<kTpad>(w, stages, full, empty, acc);
    asm volatile("bar.sync 1, %0;\n" ::"n"(kConsumers) : "memory");  // all MMAs drained
    store_partial<kTpad>(acc, part);
  }
  __syncwarp();
  tma::allow_successor();
  cg::this_cluster().sync();
  reduce_partials<kTpad>(p, w, part);
  cg::this_cluster().sync();  // no block leaves while another reads its partials
}

// Splits K over a cluster so that the tiles fill the GPU's two block slots an SM once; at least
// two k-tiles a block.
int split_for(int tiles, int k_tiles, int sms) {
  const int split = std::max(1, std::min({kMaxSplit, 2 * sms / std::max(tiles, 1), k_tiles / 2}));
  return split;
}

template <int kTpad>
cudaError_t launch(const Params& p, int blocks, cudaStream_t stream) {
  const auto kernel = skinny_gemm_kernel<kTpad>;
  constexpr int smem = Layout<kTpad>::kSmem;
  const cudaError_t e =
      cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
  if (e != cudaSuccess) return e;
  cudaLaunchAttribute attrs[2];
  attrs[0].id = cudaLaunchAttributeClusterDimension;
  attrs[0].val.clusterDim.x = static_cast<unsigned>(p.split);
  attrs[0].val.clusterDim.y = 1;
  attrs[0].val.clusterDim.z = 1;
  attrs[1].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attrs[1].val.programmaticStreamSerializationAllowed = 1;
  cudaLaunchConfig_t cfg{};
  cfg.gridDim = dim3(static_cast<unsigned>(blocks));
  cfg.blockDim = dim3(kThreads);
  cfg.dynamicSmemBytes = smem;
  cfg.stream = stream;
  cfg.attrs = attrs;
  cfg.numAttrs = 2;
  return cudaLaunchKernelEx(&cfg, kernel, p);
}

int padded_rows(int T) { return T <= 16 ? 16 : T <= 32 ? 32 : T <= 64 ? 64 : 128; }

}  // namespace

bool skinny_supported(const void* x, const void* w, const void* y, int T, int K) {
  const auto aligned = [](const void* p, uintptr_t a) {
    return reinterpret_cast<uintptr_t>(p) % a == 0;
  };
  return T >= 1 && T <= kSkinnyMaxRows && K % 8 == 0 && K > 0 && aligned(x, 16) && aligned(w, 16) &&
         aligned(y, 8);
}

cudaError_t launch_skinny_gemm_bf16(const bf16* x, const SkinnyGroup* groups, int count, int T,
                                    int K, int sm_count, cudaStream_t stream) {
  const int tpad = padded_rows(T);
  Params p{};
  p.x = encode_tma_2d_bf16(x, T, K, tpad);
  int tiles = 0;
  for (int g = 0; g < count; ++g) {
    p.w[g] = encode_tma_2d_bf16(groups[g].w, groups[g].n, K, kTileRows);
    p.y[g] = groups[g].y;
    p.n[g] = groups[g].n;
    p.first_tile[g] = tiles;
    tiles += (groups[g].n + kTileRows - 1) / kTileRows;
  }
  p.count = count;
  p.T = T;
  p.k_tiles = (K + kTileK - 1) / kTileK;
  p.split = split_for(tiles, p.k_tiles, sm_count);
  const int blocks = tiles * p.split;
  switch (tpad) {
    case 16:
      return launch<16>(p, blocks, stream);
    case 32:
      return launch<32>(p, blocks, stream);
    case 64:
      return launch<64>(p, blocks, stream);
    default:
      return launch<128>(p, blocks, stream);
  }
}

}  // namespace deltaserve::cuda
