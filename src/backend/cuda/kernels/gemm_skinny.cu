#include <cooperative_groups.h>

#include <algorithm>
#include <cstdint>

#include "backend/cuda/kernels/gemm_skinny.cuh"
#include "backend/cuda/kernels/mma_bf16.cuh"

namespace deltaserve::cuda {
namespace {

namespace cg = cooperative_groups;

constexpr int kTileRows = 128, kChunk = 64, kLd = kChunk + 8, kStages = 4;
constexpr int kWarps = kTileRows / 16, kThreads = 32 * kWarps;
constexpr int kMinChunksPerSplit = 4, kBlocksPerSm = 2, kMaxSplits = 8;  // a portable cluster

struct SkinnyArgs {
  const __nv_bfloat16* x;
  const __nv_bfloat16* w;
  __nv_bfloat16* y;
  int T, K, N, splits;
};

constexpr size_t smem_bytes(int nt) {
  return static_cast<size_t>(kStages) * (kTileRows + 8 * nt) * kLd * sizeof(__nv_bfloat16);
}

// Chunk `chunk` (64 columns of K) of the block's weight rows and of x into pipeline stage `st`
// (rows past N or T zero-filled).
template <int NT>
__device__ inline void load_chunk(const SkinnyArgs& a, __nv_bfloat16* ws, __nv_bfloat16* xs, int n0,
                                  int chunk) {
  const int k0 = chunk * kChunk;
  for (int i = threadIdx.x; i < kTileRows * 8; i += kThreads) {
    const int r = i / 8, part = i % 8, n = n0 + r;
    mma::cp_async16(ws + r * kLd + part * 8,
                    a.w + static_cast<size_t>(min(n, a.N - 1)) * a.K + k0 + part * 8, n < a.N);
  }
  for (int i = threadIdx.x; i < 8 * NT * 8; i += kThreads) {
    const int t = i / 8, part = i % 8;
    mma::cp_async16(xs + t * kLd + part * 8,
                    a.x + static_cast<size_t>(min(t, a.T - 1)) * a.K + k0 + part * 8, t < a.T);
  }
}

// Block (128-row tile, K split). Warp w computes rows 16w .. 16w + 15 of the tile for all T.
template <int NT>
__global__ void __launch_bounds__(kThreads) skinny_gemm_kernel(SkinnyArgs a) {
  extern __shared__ __align__(16) unsigned char smem[];
  __nv_bfloat16* ws = reinterpret_cast<__nv_bfloat16*>(smem);  // [kStages][kTileRows][kLd]
  __nv_bfloat16* xs = ws + kStages * kTileRows * kLd;          // [kStages][8 NT][kLd]
  const int tile = blockIdx.x, split = blockIdx.y, n0 = tile * kTileRows;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int chunks = a.K / kChunk, per = (chunks + a.splits - 1) / a.splits;
  const int c0 = split * per, nc = max(0, min(chunks, c0 + per) - c0);
  const auto stage_w = [&](int s) { return ws + s * kTileRows * kLd; };
  const auto stage_x = [&](int s) { return xs + s * 8 * NT * kLd; };
#pragma unroll
  for (int s = 0; s < kStages - 1; ++s) {
    if (s < nc) load_chunk<NT>(a, stage_w(s), stage_x(s), n0, c0 + s);
    mma::cp_async_commit();
  }
  float acc[NT][4] = {};
  for (int c = 0; c < nc; ++c) {
    mma::cp_async_wait<kStages - 2>();
    __syncthreads();  // chunk c landed; every warp is done with the stage refilled below
    if (const int next = c + kStages - 1; next < nc)
      load_chunk<NT>(a, stage_w(next % kStages), stage_x(next % kStages), n0, c0 + next);
    mma::cp_async_commit();
    const __nv_bfloat16* wt = stage_w(c % kStages) + 16 * warp * kLd;
    const __nv_bfloat16* xt = stage_x(c % kStages);
#pragma unroll
    for (int kk = 0; kk < kChunk / 16; ++kk) {
      uint32_t af[4];
      mma::load_a(af, wt + 16 * kk, kLd);
#pragma unroll
      for (int np = 0; np < NT / 2; ++np) {
        uint32_t bf[4];
        mma::load_b_trans(bf, xt + 16 * np * kLd + 16 * kk, kLd);
        mma::mma(acc[2 * np], af, bf[0], bf[1]);
        mma::mma(acc[2 * np + 1], af, bf[2], bf[3]);
      }
    }
  }
  // acc[j]: rows n0 + 16 warp + lane / 4 (+ 8), tokens 8 j + 2 (lane % 4) (+ 1).
  const int nl = 16 * warp + lane / 4, tc = 2 * (lane % 4);
  if (a.splits == 1) {
#pragma unroll
    for (int j = 0; j < NT; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int n = n0 + nl + 8 * (e / 2), t = 8 * j + tc + e % 2;
        if (n < a.N && t < a.T) a.y[static_cast<size_t>(t) * a.N + n] = __float2bfloat16(acc[j][e]);
      }
    return;
  }
  // Split K: the cluster's blocks (one per split) leave their f32 partial tiles [8 NT][128] in
  // shared memory; block r then adds every block's partials, in split order, for its 1/splits of
  // the tile's elements, over distributed shared memory.
  mma::cp_async_wait<0>();
  __syncthreads();  // the pipeline's buffers are free
  float* part = reinterpret_cast<float*>(smem);
#pragma unroll
  for (int j = 0; j < NT; ++j)
#pragma unroll
    for (int e = 0; e < 4; ++e)
      part[(8 * j + tc + e % 2) * kTileRows + nl + 8 * (e / 2)] = acc[j][e];
  cg::cluster_group cluster = cg::this_cluster();
  cluster.sync();
  const int elems = a.T * kTileRows, per_rank = (elems + a.splits - 1) / a.splits;
  const int rank = static_cast<int>(cluster.block_rank());
  for (int i = rank * per_rank + threadIdx.x; i < min(elems, (rank + 1) * per_rank);
       i += kThreads) {
    const int t = i / kTileRows, n = n0 + i % kTileRows;
    float ps[kMaxSplits];  // every load in flight at once, then the sum in split order
#pragma unroll
    for (int s = 0; s < kMaxSplits; ++s)
      ps[s] = s < a.splits ? cluster.map_shared_rank(part, s)[i] : 0.0f;
    float v = 0.0f;
#pragma unroll
    for (int s = 0; s < kMaxSplits; ++s) v += ps[s];
    if (n < a.N) a.y[static_cast<size_t>(t) * a.N + n] = __float2bfloat16(v);
  }
  cluster.sync();  // no block leaves while another still reads its partials
}

int splits_for(int N, int K, int num_sms) {
  const int tiles = (N + kTileRows - 1) / kTileRows, chunks = K / kChunk;
  return std::max(
      1, std::min({kMaxSplits, chunks / kMinChunksPerSplit, kBlocksPerSm * num_sms / tiles}));
}

template <int NT>
cudaError_t allow_smem() {
  return cudaFuncSetAttribute(skinny_gemm_kernel<NT>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                              static_cast<int>(smem_bytes(NT)));
}

template <int NT>
void launch(const SkinnyArgs& a, cudaStream_t stream) {
  cudaLaunchConfig_t cfg{};
  cfg.gridDim = dim3((a.N + kTileRows - 1) / kTileRows, a.splits);
  cfg.blockDim = dim3(kThreads);
  cfg.dynamicSmemBytes = smem_bytes(NT);
  cfg.stream = stream;
  cudaLaunchAttribute cluster{};
  cluster.id = cudaLaunchAttributeClusterDimension;
  cluster.val.clusterDim.x = 1;
  cluster.val.clusterDim.y = static_cast<unsigned>(a.splits);
  cluster.val.clusterDim.z = 1;
  cfg.attrs = &cluster;
  cfg.numAttrs = a.splits > 1 ? 1 : 0;
  cudaLaunchKernelEx(&cfg, skinny_gemm_kernel<NT>, a);
}

}  // namespace

cudaError_t skinny_gemm_init() {
  for (const cudaError_t e : {allow_smem<2>(), allow_smem<4>(), allow_smem<8>()})
    if (e != cudaSuccess) return e;
  return cudaSuccess;
}

bool skinny_gemm_supported(const void* x, const void* w, int T, int K) {
  const auto aligned = [](const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; };
  return T >= 1 && T <= kSkinnyMaxRows && K % kChunk == 0 && K > 0 && aligned(x) && aligned(w);
}

void launch_skinny_gemm(const __nv_bfloat16* x, const __nv_bfloat16* w, __nv_bfloat16* y, int T,
                        int K, int N, int num_sms, cudaStream_t stream) {
  const SkinnyArgs a{x, w, y, T, K, N, splits_for(N, K, num_sms)};
  if (T <= 16)
    launch<2>(a, stream);
  else if (T <= 32)
    launch<4>(a, stream);
  else
    launch<8>(a, stream);
}

}  // namespace deltaserve::cuda
