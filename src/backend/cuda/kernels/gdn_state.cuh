// The GDN recurrent state as the kernels see it: f32 or bf16 in memory (--mamba-ssm-cache-dtype),
// always f32 in registers — loads widen, stores round.
#pragma once

#include <cuda_bf16.h>

#include <cstdint>

namespace deltaserve::cuda {

// A [slots, nv, dk, dv] state buffer and its element type.
struct GdnState {
  void* data;
  bool bf16;
};

template <class T>
struct StateIo;

template <>
struct StateIo<float> {
  __device__ static float load(const float* p) { return *p; }
  __device__ static void store(float* p, float v) { *p = v; }
  __device__ static float2 load2(const float* p) { return *reinterpret_cast<const float2*>(p); }
  __device__ static void store2(float* p, float2 v) { *reinterpret_cast<float2*>(p) = v; }
  __device__ static float4 load4(const float* p) { return *reinterpret_cast<const float4*>(p); }
  __device__ static void store4(float* p, float4 v) { *reinterpret_cast<float4*>(p) = v; }
};

template <>
struct StateIo<__nv_bfloat16> {
  using bf16 = __nv_bfloat16;
  __device__ static float load(const bf16* p) { return __bfloat162float(*p); }
  __device__ static void store(bf16* p, float v) { *p = __float2bfloat16(v); }
  __device__ static float2 load2(const bf16* p) {
    return __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(p));
  }
  __device__ static void store2(bf16* p, float2 v) {
    *reinterpret_cast<__nv_bfloat162*>(p) = __floats2bfloat162_rn(v.x, v.y);
  }
  __device__ static float4 load4(const bf16* p) {  // 8-byte aligned
    const uint2 raw = *reinterpret_cast<const uint2*>(p);
    const float2 lo = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&raw.x));
    const float2 hi = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&raw.y));
    return make_float4(lo.x, lo.y, hi.x, hi.y);
  }
  __device__ static void store4(bf16* p, float4 v) {
    uint2 raw;
    *reinterpret_cast<__nv_bfloat162*>(&raw.x) = __floats2bfloat162_rn(v.x, v.y);
    *reinterpret_cast<__nv_bfloat162*>(&raw.y) = __floats2bfloat162_rn(v.z, v.w);
    *reinterpret_cast<uint2*>(p) = raw;
  }
};

}  // namespace deltaserve::cuda
