#include <cstdint>
#include <type_traits>

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

// `split` warps (1, 2 or 4) per kRows consecutive output columns (weight rows): each strides over
// K in 8-element vectors (kRows x 4 weight vectors in flight per lane); the split partials are
// summed through shared memory. The order of the sums depends on (N, K) only, never on T.
constexpr int kRows = 2;

template <int T>
__device__ inline void gemv_rows(const __nv_bfloat16* __restrict__ x,
                                 const __nv_bfloat16* __restrict__ w, __nv_bfloat16* __restrict__ y,
                                 int K, int N, int block, int split) {
  __shared__ float red[kWarpsPerBlock][kRows][T];
  const int lane = threadIdx.x % 32, wib = threadIdx.x / 32;
  const int group = wib / split, sub = wib % split;
  const int n0 = (block * (kWarpsPerBlock / split) + group) * kRows;
  const bool active = n0 < N;
  const int kv = K / 8, step = 32 * split;
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
  int i = active ? lane + 32 * sub : kv;
  for (; i + 3 * step < kv; i += 4 * step) {
    uint4 wv[kRows][4];
#pragma unroll
    for (int r = 0; r < kRows; ++r)
#pragma unroll
      for (int u = 0; u < 4; ++u) wv[r][u] = load_stream(wr[r] + i + step * u);
#pragma unroll
    for (int u = 0; u < 4; ++u)
#pragma unroll
      for (int t = 0; t < T; ++t) {
        const uint4 xv = __ldg(xr + static_cast<size_t>(t) * kv + i + step * u);
#pragma unroll
        for (int r = 0; r < kRows; ++r) acc[r][t] += dot8(wv[r][u], xv);
      }
  }
  for (; i < kv; i += step) {
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
      acc[r][t] = v;
    }
  if (split > 1) {
    if (lane == 0)
#pragma unroll
      for (int r = 0; r < kRows; ++r)
#pragma unroll
        for (int t = 0; t < T; ++t) red[wib][r][t] = acc[r][t];
    __syncthreads();
    if (sub != 0) return;
#pragma unroll
    for (int r = 0; r < kRows; ++r)
#pragma unroll
      for (int t = 0; t < T; ++t) {
        float v = 0.0f;
        for (int q = 0; q < split; ++q) v += red[wib + q][r][t];
        acc[r][t] = v;
      }
  }
  if (!active) return;
#pragma unroll
  for (int r = 0; r < kRows; ++r)
#pragma unroll
    for (int t = 0; t < T; ++t)
      if (lane == t && n0 + r < N)
        y[static_cast<size_t>(t) * N + n0 + r] = __float2bfloat16(acc[r][t]);
}

// Warps per row group: enough warps in flight (~4k) for long rows of few outputs.
int split_for(int rows, int K) {
  int split = 1;
  while (split < 4 && (rows + kRows - 1) / kRows * split < 4096 && K / 8 / (64 * split) >= 4)
    split *= 2;
  return split;
}

// Blocks [start[i], start[i+1]) serve group i.
template <int T>
__global__ void __launch_bounds__(32 * kWarpsPerBlock)
    gemv_multi_kernel(const __nv_bfloat16* __restrict__ x, GemvGroups g, int K, int split) {
  const int per_block = kWarpsPerBlock / split * kRows;
  int i = 0, first = 0;
  int blocks = (g.n[0] + per_block - 1) / per_block;
  while (static_cast<int>(blockIdx.x) >= first + blocks && i + 1 < g.count) {
    first += blocks;
    ++i;
    blocks = (g.n[i] + per_block - 1) / per_block;
  }
  gemv_rows<T>(x, g.w[i], g.y[i], K, g.n[i], static_cast<int>(blockIdx.x) - first, split);
}

template <int T>
void launch_multi(const __nv_bfloat16* x, const GemvGroups& g, int K, cudaStream_t stream) {
  int rows = 0;
  for (int i = 0; i < g.count; ++i) rows += g.n[i];
  const int split = split_for(rows, K), per_block = kWarpsPerBlock / split * kRows;
  int blocks = 0;
  for (int i = 0; i < g.count; ++i) blocks += (g.n[i] + per_block - 1) / per_block;
  gemv_multi_kernel<T><<<blocks, 32 * kWarpsPerBlock, 0, stream>>>(x, g, K, split);
}

// Calls f(std::integral_constant<int, T>) for the row count T in [1, kGemvMaxRows].
template <class F>
void with_rows(int T, F&& f) {
  switch (T) {
    case 1:
      return f(std::integral_constant<int, 1>{});
    case 2:
      return f(std::integral_constant<int, 2>{});
    case 3:
      return f(std::integral_constant<int, 3>{});
    case 4:
      return f(std::integral_constant<int, 4>{});
    case 5:
      return f(std::integral_constant<int, 5>{});
    case 6:
      return f(std::integral_constant<int, 6>{});
    case 7:
      return f(std::integral_constant<int, 7>{});
    default:
      return f(std::integral_constant<int, 8>{});
  }
}

}  // namespace

bool gemv_supported(const void* x, const void* w, int T, int K) {
  const auto aligned = [](const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; };
  return T >= 1 && T <= kGemvMaxRows && K % 8 == 0 && aligned(x) && aligned(w);
}

void launch_gemv_multi_bf16(const __nv_bfloat16* x, const GemvGroups& g, int T, int K,
                            cudaStream_t stream) {
  with_rows(T, [&](auto t) { launch_multi<decltype(t)::value>(x, g, K, stream); });
}

}  // namespace deltaserve::cuda
