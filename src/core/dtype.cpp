#include "core/dtype.h"

#include "core/error.h"

namespace deltaserve {

size_t dtype_size(DType t) {
  switch (t) {
    case DType::kF32:
    case DType::kI32:
      return 4;
    case DType::kBF16:
    case DType::kF16:
      return 2;
    case DType::kI64:
      return 8;
  }
  DS_CHECK(false, "unknown dtype");
}

std::string_view dtype_name(DType t) {
  switch (t) {
    case DType::kF32:
      return "F32";
    case DType::kBF16:
      return "BF16";
    case DType::kF16:
      return "F16";
    case DType::kI32:
      return "I32";
    case DType::kI64:
      return "I64";
  }
  return "?";
}

std::optional<DType> parse_safetensors_dtype(std::string_view s) {
  if (s == "F32") return DType::kF32;
  if (s == "BF16") return DType::kBF16;
  if (s == "F16") return DType::kF16;
  if (s == "I32") return DType::kI32;
  if (s == "I64") return DType::kI64;
  return std::nullopt;
}

float f16_to_f32(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  uint32_t exp = (h >> 10) & 0x1fu;
  uint32_t mant = h & 0x3ffu;
  uint32_t bits;
  if (exp == 0x1f) {
    bits = sign | 0x7f800000u | (mant << 13);  // inf / nan
  } else if (exp != 0) {
    bits = sign | ((exp + 112) << 23) | (mant << 13);
  } else if (mant == 0) {
    bits = sign;
  } else {  // subnormal: normalise
    int e = -1;
    do {
      ++e;
      mant <<= 1;
    } while ((mant & 0x400u) == 0);
    bits = sign | (static_cast<uint32_t>(112 - e) << 23) | ((mant & 0x3ffu) << 13);
  }
  return std::bit_cast<float>(bits);
}

void convert_to_f32(DType src_type, const void* src, float* dst, size_t n) {
  switch (src_type) {
    case DType::kF32:
      std::memcpy(dst, src, n * sizeof(float));
      return;
    case DType::kBF16: {
      uint16_t v;
      for (size_t i = 0; i < n; ++i) {
        std::memcpy(&v, static_cast<const char*>(src) + 2 * i, 2);
        dst[i] = bf16_to_f32(v);
      }
      return;
    }
    case DType::kF16: {
      uint16_t v;
      for (size_t i = 0; i < n; ++i) {
        std::memcpy(&v, static_cast<const char*>(src) + 2 * i, 2);
        dst[i] = f16_to_f32(v);
      }
      return;
    }
    default:
      DS_CHECK(false, "convert_to_f32: not a float dtype");
  }
}

}  // namespace deltaserve
