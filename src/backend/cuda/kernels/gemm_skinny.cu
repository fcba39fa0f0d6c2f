#include <algorithm>
#include <cstdint>

#include "backend/cuda/kernels/gemm_skinny.cuh"
#include "backend/cuda/kernels/mma_bf16.cuh"

namespace deltaserve::cuda {
namespace {

constexpr int kTileRows = 128, kChunk = 64, kLd = kChunk + 8, kStages = 4;
constexpr int kWarps = kTileRows / 16, kThreads = 32 * kWarps;
constexpr int kMinChunksPerSplit = 4, kBlocksPerSm = 2;

struct SkinnyArgs {
  const __nv_bfloat16* x;
  const __nv_bfloat16* w;
  __nv_bfloat16* y;
  float* partial;  // [splits, T, N]
  int* counters;   // [tiles]
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
  const int nr = n0 + 16 * warp + lane / 4, tc = 2 * (lane % 4);
  const auto each = [&](auto&& f) {
#pragma unroll
    for (int j = 0; j < NT; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int n = nr + 8 * (e / 2), t = 8 * j + tc + e % 2;
        if (n < a.N && t < a.T) f(t, n, acc[j][e]);
      }
  };
  if (a.splits == 1) {
    each([&](int t, int n, float v) {
      a.y[static_cast<size_t>(t) * a.N + n] = __float2bfloat16(v);
    });
    return;
  }
  float* mine = a.partial + static_cast<size_t>(split) * a.T * a.N;
  each([&](int t, int n, float v) { mine[static_cast<size_t>(t) * a.N + n] = v; });
  __threadfence();
  __syncthreads();
  __shared__ bool last;
  if (threadIdx.x == 0) last = atomicAdd(a.counters + tile, 1) == a.splits - 1;
  __syncthreads();
  if (!last) return;
  __threadfence();  // the other splits' partials are visible
  const int rows = min(kTileRows, a.N - n0);
  for (int i = threadIdx.x; i < a.T * rows; i += kThreads) {
    const int t = i / rows, n = n0 + i % rows;
    float v = 0.0f;
    for (int s = 0; s < a.splits; ++s)
      v += __ldcg(a.partial + (static_cast<size_t>(s) * a.T + t) * a.N + n);
    a.y[static_cast<size_t>(t) * a.N + n] = __float2bfloat16(v);
  }
  if (threadIdx.x == 0) a.counters[tile] = 0;  // ready for the next launch
}

int splits_for(int N, int K, int num_sms) {
  const int tiles = (N + kTileRows - 1) / kTileRows, chunks = K / kChunk;
  return std::max(1, std::min(chunks / kMinChunksPerSplit, kBlocksPerSm * num_sms / tiles));
}

template <int NT>
cudaError_t allow_smem() {
  return cudaFuncSetAttribute(skinny_gemm_kernel<NT>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                              static_cast<int>(smem_bytes(NT)));
}

template <int NT>
void launch(const SkinnyArgs& a, cudaStream_t stream) {
  const dim3 grid((a.N + kTileRows - 1) / kTileRows, a.splits);
  skinny_gemm_kernel<NT><<<grid, kThreads, smem_bytes(NT), stream>>>(a);
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

size_t skinny_partial_bytes(int num_sms) {
  // splits x tiles <= kBlocksPerSm x SMs (or one split), each tile kTileRows x T partials.
  const size_t blocks = static_cast<size_t>(kBlocksPerSm) * num_sms;
  return blocks * kTileRows * kSkinnyMaxRows * sizeof(float);
}

int skinny_counters(int max_n) { return (max_n + kTileRows - 1) / kTileRows; }

void launch_skinny_gemm(const __nv_bfloat16* x, const __nv_bfloat16* w, __nv_bfloat16* y, int T,
                        int K, int N, int num_sms, float* partial, int* counters,
                        cudaStream_t stream) {
  const SkinnyArgs a{x, w, y, partial, counters, T, K, N, splits_for(N, K, num_sms)};
  if (T <= 16)
    launch<2>(a, stream);
  else if (T <= 32)
    launch<4>(a, stream);
  else
    launch<8>(a, stream);
}

}  // namespace deltaserve::cuda
