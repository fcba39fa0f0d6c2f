// The weight-streaming GEMM's kernel and launches (skinny_gemm.cuh; its parts in
// skinny_gemm_parts.cuh).
#include "backend/cuda/kernels/pdl.cuh"
#include "backend/cuda/kernels/skinny_gemm_parts.cuh"
#include "backend/cuda/kernels/tma_map.h"

namespace deltaserve::cuda {
namespace {

using namespace skinny;

// One thread issues every copy: the first stages' weight tiles before waiting for the previous
// kernel (weights are never written by one), then activations and the rest as stages free up.
template <int kRows>
__device__ void produce(const Params& p, int u0, int u1, unsigned char* stages, uint64_t* full,
                        uint64_t* empty) {
  constexpr int kStageBytes = Pipe<kRows>::kStageBytes, kStages = Pipe<kRows>::kStages;
  tma::prefetch_map(&p.x);
  const auto load_w = [&](int i) { load_w_unit<kRows>(p, u0 + i, i % kStages, stages, full); };
  const auto load_x = [&](int i) { load_x_unit<kRows>(p, u0 + i, i % kStages, stages, full); };
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
  pdl::allow_successor();  // the next kernel's blocks may start streaming their weights
  if (threadIdx.x >= kConsumers) {
    if (threadIdx.x == kConsumers) produce<kRows>(p, u0, u1, stages, full, empty);
    return;
  }
  pdl::wait_for_predecessor();  // before the stores and the workspace
  consume_units<kRows>(p, c, u0, u1, 0, stages, full, empty, sh, [](int) {});
}

template <int kRows>
cudaError_t launch(const Params& p, cudaStream_t stream) {
  const auto kernel = skinny_gemm_kernel<kRows>;
  constexpr int smem = Pipe<kRows>::kSmemBytes;
  const cudaError_t e =
      cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
  if (e != cudaSuccess) return e;
  return pdl::launch_with(true, kernel, p.blocks, kThreads, smem, stream, p);
}

// x [T, K] and the split of p's `tiles` tiles of K between blocks, then the launch.
cudaError_t launch_tiles(Params& p, const bf16* x, int tiles, int T, int K,
                         const SkinnyWorkspace& ws, int sm_count, cudaStream_t stream) {
  if (tiles > kSkinnyMaxTiles) return cudaErrorInvalidValue;
  const int rows = T <= 16 ? 16 : T <= 32 ? 32 : 64;
  plan_units(p, x, tiles, T, K, rows);
  p.blocks = skinny::blocks_for(p.units, p.k_tiles, sm_count);
  p.ws = ws;
  return rows == 16   ? launch<16>(p, stream)
         : rows == 32 ? launch<32>(p, stream)
                      : launch<64>(p, stream);
}

}  // namespace

size_t skinny_workspace_floats(int sm_count) {
  return static_cast<size_t>(2 * sm_count) * kTileRows * kSkinnyMaxRows;
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
  Params p = silu_mul_params(gate, up, act, K, I);
  return launch_tiles(p, x, (I + kPairRows - 1) / kPairRows, T, K, ws, sm_count, stream);
}

}  // namespace deltaserve::cuda
