#include "backend/cuda/kernels/bf16x8.cuh"
#include "backend/cuda/kernels/common.cuh"
#include "backend/cuda/kernels/pdl.cuh"
#include "backend/cuda/kernels/rms_norm.cuh"
#include "backend/cuda/kernels/skinny_partials.cuh"

namespace deltaserve::cuda {
namespace {

constexpr int kThreads = 256;

// Rows of [rows, n] bf16 (n a multiple of 8, 16-byte aligned), as the vector kernel reads them.
struct Bf16Rows {
  const __nv_bfloat16* x;
  int n;
  __device__ void prepare() const {}
  __device__ F32x8 load(int row, int col) const {
    return load_bf16x8(x + static_cast<size_t>(row) * n + col);
  }
};
constexpr int kMaxVecs = 4;  // 16-byte vectors per thread: rows of up to 8192 values

// One block per row, n % 8 == 0 and 16-byte aligned rows: each thread keeps its (at most kMaxVecs)
// vectors of the row in registers between the sum of squares and the scaled write. With `add`,
// residual += x first (rounded to bf16, as the residual stream is). kEarly (decode-sized steps,
// launched as a programmatic dependent): the weights (never written by a kernel) are loaded into
// registers before the wait, off the step's critical path; without it (prefill-sized steps, a
// plain launch) after the sum, so that the kernel keeps four blocks an SM (79 registers with the
// early weights, 51 without).
// x's rows are Rows: bf16 rows (Bf16Rows), or a partials-only GEMM's result (skinny::PartialRows,
// decode-sized steps), whose tile table is formed before the wait.
template <bool kAdd, bool kEarly, class Rows>
__global__ void __launch_bounds__(kThreads)
    rms_norm_vec_kernel(__nv_bfloat16* __restrict__ residual, const Rows x,
                        const float* __restrict__ w, float eps, int n,
                        __nv_bfloat16* __restrict__ out) {
  pdl::allow_successor();  // a programmatic dependent may start streaming its weights
  const int vecs = n / 8;
  F32x8 wv[kMaxVecs];
  if constexpr (kEarly) {
#pragma unroll
    for (int j = 0; j < kMaxVecs; ++j) {
      const int i = threadIdx.x + j * kThreads;
      if (i >= vecs) break;
      wv[j] = load_f32x8(w + 8 * i);
    }
  }
  x.prepare();
  pdl::wait_for_predecessor();
  const int row = static_cast<int>(blockIdx.x);
  const size_t base = static_cast<size_t>(row) * n;
  F32x8 v[kMaxVecs];
  float ss = 0.0f;
#pragma unroll
  for (int j = 0; j < kMaxVecs; ++j) {
    const int i = threadIdx.x + j * kThreads;
    if (i >= vecs) break;
    v[j] = x.load(row, 8 * i);
    if (kAdd) {
      const F32x8 r = load_bf16x8(residual + base + 8 * i);
#pragma unroll
      for (int e = 0; e < 8; ++e) v[j].v[e] = round_bf16(v[j].v[e] + r.v[e]);
      store_bf16x8(residual + base + 8 * i, v[j]);
    }
#pragma unroll
    for (int e = 0; e < 8; ++e) ss += v[j].v[e] * v[j].v[e];
  }
  const float inv = rsqrtf(block_sum<kThreads>(ss) / static_cast<float>(n) + eps);
#pragma unroll
  for (int j = 0; j < kMaxVecs; ++j) {
    const int i = threadIdx.x + j * kThreads;
    if (i >= vecs) break;
    if constexpr (!kEarly) wv[j] = load_f32x8(w + 8 * i);
    F32x8 y;
#pragma unroll
    for (int e = 0; e < 8; ++e) y.v[e] = v[j].v[e] * inv * (1.0f + wv[j].v[e]);
    store_bf16x8(out + base + 8 * i, y);
  }
}

// Prefill-sized steps without the add: a warp per row (kThreads / 32 rows a block), n % 8 == 0 and
// n <= 8 * 32 * kVecs, 16-byte aligned rows. A lane issues all its row loads first and keeps them
// packed until the scaled write; the sum of squares is a warp reduction (no block barrier); the
// weights are read at the write (the same for every row: cache hits).
constexpr int kMaxWarpVecs = 16;  // rows of up to 4096 values
template <int kVecs>
__global__ void __launch_bounds__(kThreads)
    rms_norm_warp_kernel(const __nv_bfloat16* __restrict__ x, const float* __restrict__ w,
                         float eps, int rows, int n, __nv_bfloat16* __restrict__ out) {
  const int row = static_cast<int>(blockIdx.x) * (kThreads / 32) + threadIdx.x / 32;
  const int lane = threadIdx.x % 32, vecs = n / 8;
  if (row >= rows) return;
  const size_t base = static_cast<size_t>(row) * n;
  uint4 raw[kVecs];
#pragma unroll
  for (int j = 0; j < kVecs; ++j) {
    const int i = lane + 32 * j;
    if (i >= vecs) break;
    raw[j] = *reinterpret_cast<const uint4*>(x + base + 8 * i);
  }
  float ss = 0.0f;
#pragma unroll
  for (int j = 0; j < kVecs; ++j) {
    if (lane + 32 * j >= vecs) break;
    const F32x8 v = unpack_bf16x8(raw[j]);
#pragma unroll
    for (int e = 0; e < 8; ++e) ss += v.v[e] * v.v[e];
  }
  const float inv = rsqrtf(warp_sum(ss) / static_cast<float>(n) + eps);
#pragma unroll
  for (int j = 0; j < kVecs; ++j) {
    const int i = lane + 32 * j;
    if (i >= vecs) break;
    const F32x8 v = unpack_bf16x8(raw[j]), wv = load_f32x8(w + 8 * i);
    F32x8 y;
#pragma unroll
    for (int e = 0; e < 8; ++e) y.v[e] = v.v[e] * inv * (1.0f + wv.v[e]);
    store_bf16x8(out + base + 8 * i, y);
  }
}

// Any n and alignment: one block per row, one value per thread at a time.
template <bool kAdd>
__global__ void rms_norm_kernel(__nv_bfloat16* __restrict__ residual,
                                const __nv_bfloat16* __restrict__ x, const float* __restrict__ w,
                                float eps, int n, __nv_bfloat16* __restrict__ out) {
  pdl::allow_successor();  // a programmatic dependent may start streaming its weights
  pdl::wait_for_predecessor();
  const size_t row = blockIdx.x;
  __nv_bfloat16* r = residual + row * n;
  const __nv_bfloat16* xr = x + row * n;
  float ss = 0.0f;
  for (int i = threadIdx.x; i < n; i += kThreads) {
    float v = __bfloat162float(xr[i]);
    if (kAdd) {
      const __nv_bfloat16 sum = __float2bfloat16(__bfloat162float(r[i]) + v);
      r[i] = sum;
      v = __bfloat162float(sum);
    }
    ss += v * v;
  }
  const float inv = rsqrtf(block_sum<kThreads>(ss) / static_cast<float>(n) + eps);
  const __nv_bfloat16* src = kAdd ? r : xr;
  for (int i = threadIdx.x; i < n; i += kThreads)
    out[row * n + i] = __float2bfloat16(__bfloat162float(src[i]) * inv * (1.0f + w[i]));
}

template <bool kAdd>
void launch(__nv_bfloat16* residual, const __nv_bfloat16* x, const float* w, float eps, int rows,
            int n, __nv_bfloat16* out, cudaStream_t stream) {
  if (rows == 0) return;
  const bool vec =
      n % 8 == 0 && n <= 8 * kThreads * kMaxVecs && aligned16(x, w, out, kAdd ? residual : x);
  if (!kAdd && vec && rows > pdl::kDecodeSizedRows && n <= 8 * 32 * kMaxWarpVecs) {
    const int blocks = (rows + kThreads / 32 - 1) / (kThreads / 32), lane_vecs = (n / 8 + 31) / 32;
    const auto kernel = lane_vecs <= 4    ? rms_norm_warp_kernel<4>
                        : lane_vecs <= 8  ? rms_norm_warp_kernel<8>
                        : lane_vecs <= 12 ? rms_norm_warp_kernel<12>
                                          : rms_norm_warp_kernel<kMaxWarpVecs>;
    kernel<<<blocks, kThreads, 0, stream>>>(x, w, eps, rows, n, out);
  } else if (vec && rows <= pdl::kDecodeSizedRows)
    pdl::launch_dependent(rms_norm_vec_kernel<kAdd, true, Bf16Rows>, rows, kThreads, 0, stream,
                          residual, Bf16Rows{x, n}, w, eps, n, out);
  else if (vec)
    rms_norm_vec_kernel<kAdd, false, Bf16Rows>
        <<<rows, kThreads, 0, stream>>>(residual, Bf16Rows{x, n}, w, eps, n, out);
  else
    pdl::launch_dependent(rms_norm_kernel<kAdd>, rows, kThreads, 0, stream, residual, x, w, eps, n,
                          out);
}

}  // namespace

bool add_rms_norm_partials_supported(const __nv_bfloat16* residual, const SkinnyPartials& x,
                                     const float* w, int rows, const __nv_bfloat16* out) {
  const int n = x.n;
  return rows >= 1 && rows <= pdl::kDecodeSizedRows && n % 8 == 0 && n <= 8 * kThreads * kMaxVecs &&
         n <= kSkinnyTileRows * skinny::kMaxReadTiles && aligned16(residual, x.y, w, out);
}

cudaError_t launch_add_rms_norm_partials_bf16(__nv_bfloat16* residual, const SkinnyPartials& x,
                                              const float* w, float eps, int rows,
                                              __nv_bfloat16* out, cudaStream_t stream) {
  if (!add_rms_norm_partials_supported(residual, x, w, rows, out)) return cudaErrorInvalidValue;
  return pdl::launch_dependent(rms_norm_vec_kernel<true, true, skinny::PartialRows>, rows, kThreads,
                               0, stream, residual, skinny::PartialRows{x}, w, eps, x.n, out);
}

void launch_rms_norm_bf16(const __nv_bfloat16* x, const float* w, float eps, int rows, int n,
                          __nv_bfloat16* out, cudaStream_t stream) {
  launch<false>(nullptr, x, w, eps, rows, n, out, stream);
}

void launch_add_rms_norm_bf16(__nv_bfloat16* residual, const __nv_bfloat16* x, const float* w,
                              float eps, int rows, int n, __nv_bfloat16* out, cudaStream_t stream) {
  launch<true>(residual, x, w, eps, rows, n, out, stream);
}

}  // namespace deltaserve::cuda
