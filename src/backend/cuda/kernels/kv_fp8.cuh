// The fp8 e4m3 KV cache's element conversions (--kv-cache-dtype fp8, scale 1): the cache write
// narrows f32 to e4m3 (round to nearest even, saturating at +-448 — core/dtype.h's
// f32_to_fp8e4m3), the attention kernels widen e4m3 exactly (every e4m3 value is an f16 value) to
// f16 — one conversion a pair; bf16 would take four — before f16 MMAs. Measured on the H200 (4B,
// context 8k): the decode kernel widening to bf16 gave B = 64 / 256 steps of 10.55 / 33.0 ms
// against 9.95 / 30.7 with f16 (d36d936); the prefill kernel's attention took 20.0 ms against
// 18.1 with f16 (a7ff838 / c534235, which also changed its copies).
#pragma once

#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include <cstdint>

namespace deltaserve::cuda::kv_fp8 {

// Two values as two e4m3 bytes (a in the low byte).
__device__ inline uint16_t narrow2(float a, float b) {
  return __nv_cvt_float2_to_fp8x2(make_float2(a, b), __NV_SATFINITE, __NV_E4M3);
}

// Two e4m3 bytes as an f16 pair, exactly, in one conversion.
__device__ inline uint32_t widen2_f16(uint16_t x) {
  const __half2_raw h = __nv_cvt_fp8x2_to_halfraw2(x, __NV_E4M3);
  return static_cast<uint32_t>(h.x) | (static_cast<uint32_t>(h.y) << 16);
}

// Eight e4m3 bytes (uint2) as eight f16 values (uint4), in order: four conversions, the bytes
// taken as 16-bit halves of the two words.
__device__ inline uint4 widen8_f16(uint2 x) {
  uint4 r;
  asm("{\n.reg .b16 a, b, c, d;\n"
      "mov.b32 {a, b}, %4;\n"
      "mov.b32 {c, d}, %5;\n"
      "cvt.rn.f16x2.e4m3x2 %0, a;\n"
      "cvt.rn.f16x2.e4m3x2 %1, b;\n"
      "cvt.rn.f16x2.e4m3x2 %2, c;\n"
      "cvt.rn.f16x2.e4m3x2 %3, d;\n"
      "}\n"
      : "=r"(r.x), "=r"(r.y), "=r"(r.z), "=r"(r.w)
      : "r"(x.x), "r"(x.y));
  return r;
}

}  // namespace deltaserve::cuda::kv_fp8
