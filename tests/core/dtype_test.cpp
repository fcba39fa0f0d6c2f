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
  EXPECT_EQ(dtype_size(DType::kBF16), 2u);
  EXPECT_EQ(parse_safetensors_dtype("F64"), std::nullopt);
  EXPECT_EQ(parse_safetensors_dtype("BF16"), DType::kBF16);
}

}  // namespace
}  // namespace deltaserve
