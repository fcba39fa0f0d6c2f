// Element types and the scalar conversions between them (bf16/f16/fp8 e4m3 <-> f32).
#pragma once

#include <bit>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <optional>
#include <string_view>

namespace deltaserve {

// kFP8E4M3: OCP fp8 e4m3 (bias 7, max 448, no infinities; 0x7f / 0xff are NaN), only for the
// KV cache (--kv-cache-dtype fp8).
enum class DType : uint8_t { kF32, kBF16, kF16, kI32, kI64, kFP8E4M3 };

size_t dtype_size(DType t);
std::string_view dtype_name(DType t);
// Parses a safetensors dtype string ("BF16", "F32", ...); nullopt when unsupported.
std::optional<DType> parse_safetensors_dtype(std::string_view s);

inline float bf16_to_f32(uint16_t h) {
  return std::bit_cast<float>(static_cast<uint32_t>(h) << 16);
}

// Round to nearest even; NaN stays NaN.
inline uint16_t f32_to_bf16(float f) {
  uint32_t u = std::bit_cast<uint32_t>(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x40);
  u += 0x7fffu + ((u >> 16) & 1u);
  return static_cast<uint16_t>(u >> 16);
}

float f16_to_f32(uint16_t h);

// fp8 e4m3 <-> f32: exact widening; narrowing rounds to nearest even and saturates finite values
// to +-448 (as CUDA's __NV_SATFINITE, the cache write's conversion); NaN stays NaN.
float fp8e4m3_to_f32(uint8_t x);
uint8_t f32_to_fp8e4m3(float f);

// Converts n elements of type `src_type` at `src` to f32. Precondition: src_type is a float type.
void convert_to_f32(DType src_type, const void* src, float* dst, size_t n);

}  // namespace deltaserve
