// The fp8 e4m3 KV cache's element conversions (--kv-cache-dtype fp8, scale 1): the cache write
// narrows f32 to e4m3 (round to nearest even, saturating at +-448 — core/dtype.h's
// f32_to_fp8e4m3), the attention kernels widen e4m3 to bf16 exactly (every e4m3 value is a bf16
// value) before their bf16 MMAs.
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

// Eight e4m3 bytes (uint2) as eight bf16 (uint4), in order.
__device__ inline uint4 widen8(uint2 x) {
  return make_uint4(widen2(static_cast<uint16_t>(x.x)), widen2(static_cast<uint16_t>(x.x >> 16)),
                    widen2(static_cast<uint16_t>(x.y)), widen2(static_cast<uint16_t>(x.y >> 16)));
}

}  // namespace deltaserve::cuda::kv_fp8
