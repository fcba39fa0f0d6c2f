// The fp8 e4m3 KV cache's element conversions (--kv-cache-dtype fp8, scale 1): the cache write
// narrows f32 to e4m3 (round to nearest even, saturating at +-448 — core/dtype.h's
// f32_to_fp8e4m3), the attention kernels widen e4m3 exactly (every e4m3 value is a bf16 and an f16
// value) to bf16 before bf16 MMAs, or (the decode kernel) to f16 — one conversion a pair — before
// f16 MMAs.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include <cstdint>

namespace deltaserve::cuda::kv_fp8 {

// Two values as two e4m3 bytes (a in the low byte).
__device__ inline uint16_t narrow2(float a, float b) {
  return __nv_cvt_float2_to_fp8x2(make_float2(a, b), __NV_SATFINITE, __NV_E4M3);
}

// Two e4m3 bytes (the low one first) as a bf16 pair (the first in the low half), exactly.
__device__ inline uint32_t widen2(uint16_t x) {
  const __half2 h(__nv_cvt_fp8x2_to_halfraw2(x, __NV_E4M3));
  const __nv_bfloat162 b = __float22bfloat162_rn(__half22float2(h));
  return *reinterpret_cast<const uint32_t*>(&b);
}

// Two e4m3 bytes as an f16 pair, exactly, in one conversion.
__device__ inline uint32_t widen2_f16(uint16_t x) {
  const __half2_raw h = __nv_cvt_fp8x2_to_halfraw2(x, __NV_E4M3);
  return static_cast<uint32_t>(h.x) | (static_cast<uint32_t>(h.y) << 16);
}

// Eight e4m3 bytes (uint2) as eight bf16 or (kF16) f16 values (uint4), in order.
template <bool kF16 = false>
__device__ inline uint4 widen8(uint2 x) {
  auto w = [](uint32_t pair) {
    return kF16 ? widen2_f16(static_cast<uint16_t>(pair)) : widen2(static_cast<uint16_t>(pair));
  };
  return make_uint4(w(x.x), w(x.x >> 16), w(x.y), w(x.y >> 16));
}

}  // namespace deltaserve::cuda::kv_fp8
