#include "backend/cuda/kernels/bf16x8.cuh"
#include "backend/cuda/kernels/common.cuh"
#include "backend/cuda/kernels/gated_rms_norm.cuh"

namespace deltaserve::cuda {
namespace {

constexpr int kThreads = 128, kVecThreads = 256;

// kLanes lanes per row of dv = 8 kLanes values (16-byte rows), kVecThreads / kLanes rows per
// block; the row's sum of squares reduced across its lanes by shuffles.
template <int kLanes>
__global__ void __launch_bounds__(kVecThreads)
    gated_rms_norm_vec_kernel(__nv_bfloat16* __restrict__ o, const __nv_bfloat16* __restrict__ z,
                              const float* __restrict__ w, float eps, int rows) {
  constexpr int kDv = 8 * kLanes;
  const int row = blockIdx.x * (kVecThreads / kLanes) + threadIdx.x / kLanes;
  const int lane = threadIdx.x % kLanes;
  // Rows past the end repeat the last one (every lane joins the shuffles) and store nothing.
  const size_t at = static_cast<size_t>(min(row, rows - 1)) * kDv + 8 * lane;
  const F32x8 ov = load_bf16x8(o + at), zv = load_bf16x8(z + at), wv = load_f32x8(w + 8 * lane);
  float ss = 0.0f;
#pragma unroll
  for (int e = 0; e < 8; ++e) ss += ov.v[e] * ov.v[e];
#pragma unroll
  for (int off = kLanes / 2; off > 0; off >>= 1)
    ss += __shfl_xor_sync(0xffffffffu, ss, off, kLanes);
  const float inv = rsqrtf(ss / static_cast<float>(kDv) + eps);
  F32x8 y;
#pragma unroll
  for (int e = 0; e < 8; ++e) y.v[e] = ov.v[e] * inv * wv.v[e] * silu(zv.v[e]);
  if (row < rows) store_bf16x8(o + at, y);
}

// Any dv: a block per row.
__global__ void gated_rms_norm_kernel(__nv_bfloat16* __restrict__ o,
                                      const __nv_bfloat16* __restrict__ z,
                                      const float* __restrict__ w, float eps, int dv) {
  const size_t base = static_cast<size_t>(blockIdx.x) * dv;
  float ss = 0.0f;
  for (int i = threadIdx.x; i < dv; i += kThreads) {
    const float v = __bfloat162float(o[base + i]);
    ss += v * v;
  }
  const float inv = rsqrtf(block_sum<kThreads>(ss) / static_cast<float>(dv) + eps);
  for (int i = threadIdx.x; i < dv; i += kThreads)
    o[base + i] = __float2bfloat16(__bfloat162float(o[base + i]) * inv * w[i] *
                                   silu(__bfloat162float(z[base + i])));
}

template <int kLanes>
void launch_vec(__nv_bfloat16* o, const __nv_bfloat16* z, const float* w, float eps, int rows,
                cudaStream_t stream) {
  constexpr int kRowsPerBlock = kVecThreads / kLanes;
  gated_rms_norm_vec_kernel<kLanes>
      <<<(rows + kRowsPerBlock - 1) / kRowsPerBlock, kVecThreads, 0, stream>>>(o, z, w, eps, rows);
}

}  // namespace

void launch_gated_rms_norm_bf16(__nv_bfloat16* o, const __nv_bfloat16* z, const float* w, float eps,
                                int rows, int dv, cudaStream_t stream) {
  if (rows == 0) return;
  const bool vec = aligned16(o, z, w);
  if (vec && dv == 64) return launch_vec<8>(o, z, w, eps, rows, stream);
  if (vec && dv == 128) return launch_vec<16>(o, z, w, eps, rows, stream);
  if (vec && dv == 256) return launch_vec<32>(o, z, w, eps, rows, stream);
  gated_rms_norm_kernel<<<rows, kThreads, 0, stream>>>(o, z, w, eps, dv);
}

}  // namespace deltaserve::cuda
