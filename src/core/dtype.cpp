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
    case DType::kFP8E4M3:
      return 1;
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
    case DType::kFP8E4M3:
      return "F8_E4M3";
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

float fp8e4m3_to_f32(uint8_t x) {
  const uint32_t sign = static_cast<uint32_t>(x & 0x80u) << 24;
  const uint32_t exp = (x >> 3) & 0xfu, mant = x & 0x7u;
  if (exp == 0xf && mant == 0x7) return std::bit_cast<float>(sign | 0x7fc00000u);  // NaN
  if (exp != 0) return std::bit_cast<float>(sign | ((exp + 120) << 23) | (mant << 20));
  const float sub = static_cast<float>(mant) * 0x1p-9f;  // subnormal: mant * 2^-9
  return sign ? -sub : sub;
}

uint8_t f32_to_fp8e4m3(float f) {
  const uint32_t u = std::bit_cast<uint32_t>(f);
  const uint8_t sign = static_cast<uint8_t>((u >> 24) & 0x80u);
  const float a = std::bit_cast<float>(u & 0x7fffffffu);
  if (a != a) return sign | 0x7fu;
  if (a >= 448.0f) return sign | 0x7eu;  // saturate (448 = 1.75 * 2^8)
  if (a < 0x1p-6f) {  // subnormal range: multiples of 2^-9, round to nearest even
    const float q = a * 0x1p9f;
    float r = static_cast<float>(static_cast<int>(q));
    const float frac = q - r;
    if (frac > 0.5f || (frac == 0.5f && static_cast<int>(r) % 2 == 1)) r += 1.0f;
    return sign | static_cast<uint8_t>(r);  // r == 8 is the smallest normal's code
  }
  // Normal: keep 3 mantissa bits of the f32, rounding to nearest even on the 20 dropped ones.
  uint32_t bits = u & 0x7fffffffu;
  bits += 0x7ffffu + ((bits >> 20) & 1u);
  const uint32_t exp = (bits >> 23) - 120, mant = (bits >> 20) & 0x7u;
  if (exp > 15 || (exp == 15 && mant == 7)) return sign | 0x7eu;  // rounded past 448
  return sign | static_cast<uint8_t>((exp << 3) | mant);
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
    case DType::kFP8E4M3:
      for (size_t i = 0; i < n; ++i) dst[i] = fp8e4m3_to_f32(static_cast<const uint8_t*>(src)[i]);
      return;
    default:
      DS_CHECK(false, "convert_to_f32: not a float dtype");
  }
}

}  // namespace deltaserve
