// The decode attention's wave-filling split count (attention_wave_splits.h), checked on the host:
// for every block count and cap on GPUs of 1 to 132 SMs, the choice is within 1..cap, no split
// count in 1..cap has fewer waves a split, and none smaller has as few; and the counts the 4B shape
// gets on the H200 (4 KV heads, 132 SMs) at 1 to 64 decode rows.
#include "backend/cuda/kernels/attention_wave_splits.h"

#include <gtest/gtest.h>

#include <cstdint>

namespace deltaserve::cuda {
namespace {

int64_t waves(int blocks, int splits, int sms) {
  return (static_cast<int64_t>(blocks) * splits + sms - 1) / sms;
}

TEST(AttentionWaveSplits, FewestWavesASplitThenFewestSplits) {
  for (int sms = 1; sms <= 132; sms += 7)
    for (int blocks = 1; blocks <= 600; blocks += 3)
      for (int cap = 1; cap <= 32; ++cap) {
        SCOPED_TRACE(testing::Message() << "SMs " << sms << " blocks " << blocks << " cap " << cap);
        const int best = wave_filling_splits(blocks, cap, sms);
        ASSERT_GE(best, 1);
        ASSERT_LE(best, cap);
        const int64_t w = waves(blocks, best, sms);
        for (int s = 1; s <= cap; ++s) {
          const int64_t ws = waves(blocks, s, sms);
          EXPECT_GE(ws * best, w * s) << s << " splits waste less";  // ws / s >= w / best
          if (s < best) EXPECT_GT(ws * best, w * s) << s << " splits, fewer, waste as little";
        }
      }
}

TEST(AttentionWaveSplits, TwoWavesCap) {
  EXPECT_EQ(two_wave_splits(4, 132, 32), 32);
  EXPECT_EQ(two_wave_splits(64, 132, 32), 5);
  EXPECT_EQ(two_wave_splits(256, 132, 32), 2);
  EXPECT_EQ(two_wave_splits(1024, 132, 32), 1);
}

// 4B on the H200: 4 KV heads, 132 SMs. One row keeps 32 splits; 2 / 4 / 8 rows take 16 / 8 / 4
// (one wave of 128 blocks, where the two-wave cap gave 33 -> 32 / 17 / 9); 16 rows 2 (128 blocks)
// instead of 5 (320 blocks, 2.42 waves); 32 and 64 rows one split.
TEST(AttentionWaveSplits, H200FourBShape) {
  const auto splits = [](int rows) {
    const int blocks = rows * 4;
    return wave_filling_splits(blocks, two_wave_splits(blocks, 132, 32), 132);
  };
  EXPECT_EQ(splits(1), 32);
  EXPECT_EQ(splits(2), 16);
  EXPECT_EQ(splits(4), 8);
  EXPECT_EQ(splits(8), 4);
  EXPECT_EQ(splits(16), 2);
  EXPECT_EQ(splits(32), 1);
  EXPECT_EQ(splits(64), 1);
}

}  // namespace
}  // namespace deltaserve::cuda
