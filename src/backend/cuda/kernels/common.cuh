// Shared device helpers for the CUDA kernels (block reductions, bf16 <-> f32).
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

namespace deltaserve::cuda {

// Sum over a warp; every lane gets the total.
__device__ inline float warp_sum(float v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

// Sum over a block of kThreads threads; every thread gets the total. Uses 33 floats of shared
// memory.
template <int kThreads>
__device__ inline float block_sum(float v) {
  __shared__ float partial[kThreads / 32];
  __shared__ float total;
  v = warp_sum(v);
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  if (lane == 0) partial[warp] = v;
  __syncthreads();
  if (warp == 0) {
    v = warp_sum(lane < kThreads / 32 ? partial[lane] : 0.0f);
    if (lane == 0) total = v;
  }
  __syncthreads();
  const float t = total;
  __syncthreads();  // `partial` / `total` may be reused by a following call
  return t;
}

__device__ inline float silu(float x) { return x / (1.0f + __expf(-x)); }

// silu with the fast reciprocal for the GDN conv, where it is most of the instructions (an IEEE
// division is ~10 of them; a large negative x gives e^-x = inf and 0), and for the epilogue of the
// prefill GEMM + SiLU-mul. Outputs rounded to bf16 after it; the ops whose SiLU goes on in f32
// (the SiLU-mul kernel, the gated norm) keep the division. The exponential and reciprocal flush
// denormal results to zero, which saves __expf's three range instructions (of ~15 an output in the
// chunk prep's conv) and changes no result: e^-x below 2^-126 adds nothing to 1.
__device__ inline float silu_fast(float x) {
  float e, r;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(e) : "f"(x * -1.4426950408889634f));
  asm("rcp.approx.ftz.f32 %0, %1;" : "=f"(r) : "f"(1.0f + e));
  return x * r;
}

}  // namespace deltaserve::cuda
