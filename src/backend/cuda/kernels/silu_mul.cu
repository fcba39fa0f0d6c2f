#include <algorithm>

#include "backend/cuda/kernels/bf16x8.cuh"
#include "backend/cuda/kernels/common.cuh"
#include "backend/cuda/kernels/pdl.cuh"
#include "backend/cuda/kernels/silu_mul.cuh"

namespace deltaserve::cuda {
namespace {

// out [rows, width] = silu(g) * u, where g's and u's rows are `stride` elements apart (the flat
// form: one row of n; the halves form: g and u the two column halves of [rows, 2 width]).
struct SiluMulRows {
  const __nv_bfloat16 *g, *u;
  __nv_bfloat16* out;
  int64_t rows, width, stride;
  // The input offset of output element e (32-bit division where e fits).
  __device__ int64_t in_at(int64_t e) const {
    if (rows == 1) return e;
    if (e < (int64_t{1} << 32)) {
      const uint32_t e32 = static_cast<uint32_t>(e), w = static_cast<uint32_t>(width);
      return static_cast<int64_t>(e32 / w) * stride + e32 % w;
    }
    return e / width * stride + e % width;
  }
};

// Elements [from, rows x width), one at a time (any alignment; also the tail of the vector kernel).
__global__ void silu_mul_kernel(SiluMulRows a, int64_t from) {
  pdl::allow_successor();  // a programmatic dependent may start streaming its weights
  pdl::wait_for_predecessor();
  for (int64_t e = from + blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
       e < a.rows * a.width; e += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t at = a.in_at(e);
    a.out[e] = __float2bfloat16(silu(__bfloat162float(a.g[at])) * __bfloat162float(a.u[at]));
  }
}

// Eight elements per thread and step, 16-byte aligned: vectors [0, vecs) (width a multiple of 8,
// or one row).
__global__ void silu_mul_vec_kernel(SiluMulRows a, int64_t vecs) {
  pdl::allow_successor();  // a programmatic dependent may start streaming its weights
  pdl::wait_for_predecessor();
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < vecs;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t at = a.in_at(8 * i);
    const F32x8 gv = load_bf16x8(a.g + at), uv = load_bf16x8(a.u + at);
    F32x8 y;
#pragma unroll
    for (int e = 0; e < 8; ++e) y.v[e] = silu(gv.v[e]) * uv.v[e];
    store_bf16x8(a.out + 8 * i, y);
  }
}

int blocks_for(int64_t items) {
  return static_cast<int>(std::min<int64_t>((items + 255) / 256, 132 * 16));
}

void launch_rows(const SiluMulRows& a, cudaStream_t stream) {
  const int64_t n = a.rows * a.width;
  if (n == 0) return;
  int64_t done = 0;
  if (aligned16(a.g, a.u, a.out) && (a.rows == 1 || (a.width % 8 == 0 && a.stride % 8 == 0)) &&
      n >= 8) {
    const int64_t vecs = n / 8;
    pdl::launch_dependent(silu_mul_vec_kernel, blocks_for(vecs), 256, 0, stream, a, vecs);
    done = 8 * vecs;
  }
  if (done < n) silu_mul_kernel<<<blocks_for(n - done), 256, 0, stream>>>(a, done);
}

}  // namespace

void launch_silu_mul_bf16(const __nv_bfloat16* gate, const __nv_bfloat16* up, int64_t n,
                          __nv_bfloat16* out, cudaStream_t stream) {
  launch_rows({gate, up, out, 1, n, n}, stream);
}

void launch_silu_mul_halves_bf16(const __nv_bfloat16* gate_up, int64_t rows, int64_t width,
                                 __nv_bfloat16* out, cudaStream_t stream) {
  launch_rows({gate_up, gate_up + width, out, rows, width, 2 * width}, stream);
}

}  // namespace deltaserve::cuda
