#include "core/dtype.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>

namespace deltaserve {
namespace {

TEST(DType, Bf16RoundTripAndRounding) {
  for (float f : {0.0f, 1.0f, -2.5f, 3.140625f, 65536.0f, -0.0078125f})  // bf16-exact values
    EXPECT_EQ(bf16_to_f32(f32_to_bf16(f)), f);
  EXPECT_EQ(bf16_to_f32(f32_to_bf16(1.0f)), 1.0f);
  EXPECT_EQ(f32_to_bf16(1.0f), 0x3f80);
  // 1 + 2^-8 is halfway between 1 and 1 + 2^-7: ties to even (1.0).
  EXPECT_EQ(bf16_to_f32(f32_to_bf16(1.0f + 1.0f / 256)), 1.0f);
  // 1 + 3 * 2^-8 is halfway between 1 + 2^-7 and 1 + 2^-6: ties to even (1 + 2^-6).
  EXPECT_EQ(bf16_to_f32(f32_to_bf16(1.0f + 3.0f / 256)), 1.0f + 1.0f / 64);
  EXPECT_TRUE(std::isnan(bf16_to_f32(f32_to_bf16(std::numeric_limits<float>::quiet_NaN()))));
}

TEST(DType, F16Decoding) {
  EXPECT_EQ(f16_to_f32(0x3c00), 1.0f);
  EXPECT_EQ(f16_to_f32(0xc000), -2.0f);
  EXPECT_EQ(f16_to_f32(0x7bff), 65504.0f);
  EXPECT_EQ(f16_to_f32(0x0001), std::ldexp(1.0f, -24));  // smallest subnormal
  EXPECT_EQ(f16_to_f32(0x03ff), std::ldexp(1023.0f, -24));
  EXPECT_EQ(f16_to_f32(0x8000), -0.0f);
  EXPECT_TRUE(std::isinf(f16_to_f32(0x7c00)));
  EXPECT_TRUE(std::isnan(f16_to_f32(0x7e00)));
}

TEST(DType, Fp8E4m3Decoding) {
  EXPECT_EQ(fp8e4m3_to_f32(0x38), 1.0f);
  EXPECT_EQ(fp8e4m3_to_f32(0x39), 1.125f);
  EXPECT_EQ(fp8e4m3_to_f32(0xc0), -2.0f);
  EXPECT_EQ(fp8e4m3_to_f32(0x7e), 448.0f);                // largest finite
  EXPECT_EQ(fp8e4m3_to_f32(0x08), std::ldexp(1.0f, -6));  // smallest normal
  EXPECT_EQ(fp8e4m3_to_f32(0x01), std::ldexp(1.0f, -9));  // smallest subnormal
  EXPECT_EQ(fp8e4m3_to_f32(0x07), std::ldexp(7.0f, -9));  // largest subnormal
  EXPECT_TRUE(std::signbit(fp8e4m3_to_f32(0x80)));
  EXPECT_TRUE(std::isnan(fp8e4m3_to_f32(0x7f)));
  EXPECT_TRUE(std::isnan(fp8e4m3_to_f32(0xff)));
}

TEST(DType, Fp8E4m3RoundsToNearestEvenAndSaturates) {
  for (int x = 0; x < 256; ++x) {  // every finite code comes back as itself
    if ((x & 0x7f) == 0x7f) continue;
    EXPECT_EQ(f32_to_fp8e4m3(fp8e4m3_to_f32(static_cast<uint8_t>(x))), x) << x;
  }
  EXPECT_EQ(f32_to_fp8e4m3(1.0625f), 0x38);  // halfway 1 / 1.125: even (1)
  EXPECT_EQ(f32_to_fp8e4m3(1.1875f), 0x3a);  // halfway 1.125 / 1.25: even (1.25)
  EXPECT_EQ(f32_to_fp8e4m3(1.07f), 0x39);
  EXPECT_EQ(f32_to_fp8e4m3(std::ldexp(1.0f, -10)), 0x00);   // halfway 0 / 2^-9: even (0)
  EXPECT_EQ(f32_to_fp8e4m3(std::ldexp(3.0f, -10)), 0x02);   // halfway 2^-9 / 2^-8: even
  EXPECT_EQ(f32_to_fp8e4m3(std::ldexp(15.0f, -10)), 0x08);  // rounds up into the normals
  EXPECT_EQ(f32_to_fp8e4m3(440.0f), 0x7e);
  EXPECT_EQ(f32_to_fp8e4m3(1.0e6f), 0x7e);
  EXPECT_EQ(f32_to_fp8e4m3(-1.0e6f), 0xfe);
  EXPECT_EQ(f32_to_fp8e4m3(std::numeric_limits<float>::infinity()), 0x7e);
  EXPECT_EQ(f32_to_fp8e4m3(std::numeric_limits<float>::quiet_NaN()) & 0x7f, 0x7f);
  // Nearest: no finite code is closer than the chosen one.
  for (float f = -500.0f; f < 500.0f; f += 0.37f) {
    const float got = fp8e4m3_to_f32(f32_to_fp8e4m3(f));
    for (int x = 0; x < 256; ++x) {
      if ((x & 0x7f) == 0x7f) continue;
      EXPECT_LE(std::fabs(got - f), std::fabs(fp8e4m3_to_f32(static_cast<uint8_t>(x)) - f)) << f;
    }
  }
}

TEST(DType, ConvertToF32) {
  const uint16_t bf[] = {0x3f80, 0xc020};
  float out[2];
  convert_to_f32(DType::kBF16, bf, out, 2);
  EXPECT_EQ(out[0], 1.0f);
  EXPECT_EQ(out[1], -2.5f);
  const uint16_t h[] = {0x3800, 0x4500};
  convert_to_f32(DType::kF16, h, out, 2);
  EXPECT_EQ(out[0], 0.5f);
  EXPECT_EQ(out[1], 5.0f);
  const uint8_t f8[] = {0x38, 0xc4};
  convert_to_f32(DType::kFP8E4M3, f8, out, 2);
  EXPECT_EQ(out[0], 1.0f);
  EXPECT_EQ(out[1], -3.0f);
  EXPECT_EQ(dtype_size(DType::kBF16), 2u);
  EXPECT_EQ(dtype_size(DType::kFP8E4M3), 1u);
  EXPECT_EQ(parse_safetensors_dtype("F64"), std::nullopt);
  EXPECT_EQ(parse_safetensors_dtype("BF16"), DType::kBF16);
}

}  // namespace
}  // namespace deltaserve
