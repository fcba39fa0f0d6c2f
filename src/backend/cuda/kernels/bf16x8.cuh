// Eight bf16 values moved as one 16-byte access, unpacked to f32 for the math of the memory-bound
// kernels (norms, SiLU-mul, the GDN conv).
#pragma once

#include <cuda_bf16.h>

#include <cstdint>

namespace deltaserve::cuda {

struct F32x8 {
  float v[8];
};

// x rounded to the nearest bf16, as f32.
__device__ inline float round_bf16(float x) { return __bfloat162float(__float2bfloat16(x)); }

// 8 bf16 packed in 16 bytes as f32.
__device__ inline F32x8 unpack_bf16x8(const uint4& raw) {
  const __nv_bfloat162* h = reinterpret_cast<const __nv_bfloat162*>(&raw);
  F32x8 r;
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const float2 f = __bfloat1622float2(h[i]);
    r.v[2 * i] = f.x;
    r.v[2 * i + 1] = f.y;
  }
  return r;
}

// 8 bf16 at p (16-byte aligned) as f32.
__device__ inline F32x8 load_bf16x8(const __nv_bfloat16* p) {
  return unpack_bf16x8(*reinterpret_cast<const uint4*>(p));
}

// 8 f32 rounded to bf16 at p (16-byte aligned).
__device__ inline void store_bf16x8(__nv_bfloat16* p, const F32x8& x) {
  uint4 raw;
  __nv_bfloat162* h = reinterpret_cast<__nv_bfloat162*>(&raw);
#pragma unroll
  for (int i = 0; i < 4; ++i) h[i] = __floats2bfloat162_rn(x.v[2 * i], x.v[2 * i + 1]);
  *reinterpret_cast<uint4*>(p) = raw;
}

// 8 f32 at p (16-byte aligned).
__device__ inline F32x8 load_f32x8(const float* p) {
  const float4 a = reinterpret_cast<const float4*>(p)[0], b = reinterpret_cast<const float4*>(p)[1];
  return {{a.x, a.y, a.z, a.w, b.x, b.y, b.z, b.w}};
}

// Whether every pointer is 16-byte aligned (the vector kernels' precondition, with row lengths
// that are multiples of 8).
inline bool aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }
template <class... P>
inline bool aligned16(const void* p, P... rest) {
  return aligned16(p) && aligned16(rest...);
}

}  // namespace deltaserve::cuda
