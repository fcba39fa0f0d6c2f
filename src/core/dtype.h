// Element types and the scalar conversions between them (bf16/f16 <-> f32).
#pragma once

#include <bit>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <optional>
#include <string_view>

namespace deltaserve {

enum class DType : uint8_t { kF32, kBF16, kF16, kI32, kI64 };

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

// Converts n elements of type `src_type` at `src` to f32. Precondition: src_type is a float type.
void convert_to_f32(DType src_type, const void* src, float* dst, size_t n);

}  // namespace deltaserve
