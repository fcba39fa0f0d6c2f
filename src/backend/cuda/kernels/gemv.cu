#include <cstdint>

#include "backend/cuda/kernels/gemv.cuh"

namespace deltaserve::cuda {
namespace {

constexpr int kWarpsPerBlock = 8;

// A 16-byte weight load that is not kept in L1 (each weight is used once per step).
__device__ inline uint4 load_stream(const uint4* p) {
  uint4 v;
  asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0,%1,%2,%3}, [%4];"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
               : "l"(p));
  return v;
}

__device__ inline float dot8(const uint4& a, const uint4& b) {
  const __nv_bfloat162* pa = reinterpret_cast<const __nv_bfloat162*>(&a);
  const __nv_bfloat162* pb = reinterpret_cast<const __nv_bfloat162*>(&b);
  float s = 0.0f;
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const float2 fa = __bfloat1622float2(pa[i]), fb = __bfloat1622float2(pb[i]);
    s = fmaf(fa.x, fb.x, s);
    s = fmaf(fa.y, fb.y, s);
  }
  return s;
}

// Warp per kRows consecutive output columns (weight rows); lanes stride over K in 8-element
// vectors, with kRows x 4 weight vectors in flight per lane.
constexpr int kRows = 2;

template <int T>
__device__ inline void gemv_rows(const __nv_bfloat16* __restrict__ x,
                                 const __nv_bfloat16* __restrict__ w, __nv_bfloat16* __restrict__ y,
                                 int K, int N, int block) {
  const int lane = threadIdx.x % 32;
  const int n0 = (block * kWarpsPerBlock + threadIdx.x / 32) * kRows;
  if (n0 >= N) return;
  const int kv = K / 8;
  const uint4* wr[kRows];
#pragma unroll
  for (int r = 0; r < kRows; ++r)
    wr[r] = reinterpret_cast<const uint4*>(w + static_cast<size_t>(min(n0 + r, N - 1)) * K);
  const uint4* xr = reinterpret_cast<const uint4*>(x);
  float acc[kRows][T];
#pragma unroll
  for (int r = 0; r < kRows; ++r)
#pragma unroll
    for (int t = 0; t < T; ++t) acc[r][t] = 0.0f;
  int i = lane;
  for (; i + 96 < kv; i += 128) {
    uint4 wv[kRows][4];
#pragma unroll
    for (int r = 0; r < kRows; ++r)
#pragma unroll
      for (int u = 0; u < 4; ++u) wv[r][u] = load_stream(wr[r] + i + 32 * u);
#pragma unroll
    for (int u = 0; u < 4; ++u)
#pragma unroll
      for (int t = 0; t < T; ++t) {
        const uint4 xv = __ldg(xr + static_cast<size_t>(t) * kv + i + 32 * u);
#pragma unroll
        for (int r = 0; r < kRows; ++r) acc[r][t] += dot8(wv[r][u], xv);
      }
  }
  for (; i < kv; i += 32) {
    uint4 wv[kRows];
#pragma unroll
    for (int r = 0; r < kRows; ++r) wv[r] = load_stream(wr[r] + i);
#pragma unroll
    for (int t = 0; t < T; ++t) {
      const uint4 xv = __ldg(xr + static_cast<size_t>(t) * kv + i);
#pragma unroll
      for (int r = 0; r < kRows; ++r) acc[r][t] += dot8(wv[r], xv);
    }
  }
#pragma unroll
  for (int r = 0; r < kRows; ++r)
#pragma unroll
    for (int t = 0; t < T; ++t) {
      float v = acc[r][t];
      for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
      if (lane == t && n0 + r < N) y[static_cast<size_t>(t) * N + n0 + r] = __float2bfloat16(v);
    }
}

template <int T>
__global__ void __launch_bounds__(32 * kWarpsPerBlock)
    gemv_kernel(const __nv_bfloat16* __restrict__ x, const __nv_bfloat16* __restrict__ w,
                __nv_bfloat16* __restrict__ y, int K, int N) {
  gemv_rows<T>(x, w, y, K, N, blockIdx.x);
}

constexpr int kRowsPerBlock = kWarpsPerBlock * kRows;

// Blocks [start[i], start[i+1]) serve group i.
template <int T>
__global__ void __launch_bounds__(32 * kWarpsPerBlock)
    gemv_multi_kernel(const __nv_bfloat16* __restrict__ x, GemvGroups g, int K) {
  int i = 0, first = 0;
  int blocks = (g.n[0] + kRowsPerBlock - 1) / kRowsPerBlock;
  while (static_cast<int>(blockIdx.x) >= first + blocks && i + 1 < g.count) {
    first += blocks;
    ++i;
    blocks = (g.n[i] + kRowsPerBlock - 1) / kRowsPerBlock;
  }
  gemv_rows<T>(x, g.w[i], g.y[i], K, g.n[i], static_cast<int>(blockIdx.x) - first);
}

template <int T>
void launch_multi(const __nv_bfloat16* x, const GemvGroups& g, int K, cudaStream_t stream) {
  int blocks = 0;
  for (int i = 0; i < g.count; ++i) blocks += (g.n[i] + kRowsPerBlock - 1) / kRowsPerBlock;
  gemv_multi_kernel<T><<<blocks, 32 * kWarpsPerBlock, 0, stream>>>(x, g, K);
}

template <int T>
void launch(const __nv_bfloat16* x, const __nv_bfloat16* w, __nv_bfloat16* y, int K, int N,
            cudaStream_t stream) {
  const int blocks = (N + kRowsPerBlock - 1) / kRowsPerBlock;
  gemv_kernel<T><<<blocks, 32 * kWarpsPerBlock, 0, stream>>>(x, w, y, K, N);
}

}  // namespace

bool gemv_supported(const void* x, const void* w, int T, int K) {
  const auto aligned = [](const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; };
  return T >= 1 && T <= kGemvMaxRows && K % 8 == 0 && aligned(x) && aligned(w);
}

void launch_gemv_bf16(const __nv_bfloat16* x, const __nv_bfloat16* w, __nv_bfloat16* y, int T,
                      int K, int N, cudaStream_t stream) {
  switch (T) {
    case 1:
      return launch<1>(x, w, y, K, N, stream);
    case 2:
      return launch<2>(x, w, y, K, N, stream);
    case 3:
      return launch<3>(x, w, y, K, N, stream);
    case 4:
      return launch<4>(x, w, y, K, N, stream);
    case 5:
      return launch<5>(x, w, y, K, N, stream);
    case 6:
      return launch<6>(x, w, y, K, N, stream);
    case 7:
      return launch<7>(x, w, y, K, N, stream);
    default:
      return launch<8>(x, w, y, K, N, stream);
  }
}

void launch_gemv_multi_bf16(const __nv_bfloat16* x, const GemvGroups& g, int T, int K,
                            cudaStream_t stream) {
  switch (T) {
    case 1:
      return launch_multi<1>(x, g, K, stream);
    case 2:
      return launch_multi<2>(x, g, K, stream);
    case 3:
      return launch_multi<3>(x, g, K, stream);
    case 4:
      return launch_multi<4>(x, g, K, stream);
    case 5:
      return launch_multi<5>(x, g, K, stream);
    case 6:
      return launch_multi<6>(x, g, K, stream);
    case 7:
      return launch_multi<7>(x, g, K, stream);
    default:
      return launch_multi<8>(x, g, K, stream);
  }
}

}  // namespace deltaserve::cuda
