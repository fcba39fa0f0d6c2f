// When the chunked GDN rule takes the fused kernel (gdn_fused_split.h), checked on the host: the
// cover test against the plain count of blocks on GPUs of 1 to 132 multiprocessors, the mixer's
// route (after the conv kernel) never taken where the rule from y would not take the kernel, no
// overflow at large steps, and the measured H200 cases (4B, 32 value heads, 132 SMs: the rule
// from 3 sequences, 96 blocks; the mixer's route from 4, 128 blocks).
#include "backend/cuda/kernels/gdn_fused_split.h"

#include <gtest/gtest.h>

#include <cstdint>

namespace deltaserve::cuda::gdn_chunk {
namespace {

TEST(GdnFusedSplit, CoverIsAShareOfTheSms) {
  for (const int nv : {8, 16, 24, 32, 48, 64})
    for (int sms = 1; sms <= 132; ++sms)
      for (int seqs = 1; seqs <= 40; ++seqs)
        for (const int eighths : {kFusedEighthsFromY, kFusedEighthsAfterConv}) {
          SCOPED_TRACE(testing::Message() << "nv " << nv << " SMs " << sms << " seqs " << seqs);
          // blocks / SMs >= eighths / 8, in exact arithmetic
          const double share = static_cast<double>(seqs * nv) / sms;
          EXPECT_EQ(fused_blocks_cover(seqs, nv, sms, eighths), share * 8 >= eighths);
        }
}

TEST(GdnFusedSplit, TheMixersRouteNeedsMoreThanTheRule) {
  static_assert(kFusedEighthsFromY < kFusedEighthsAfterConv);
  for (const int nv : {16, 32, 48})
    for (int seqs = 1; seqs <= 16; ++seqs)
      if (fused_blocks_cover(seqs, nv, 132, kFusedEighthsAfterConv))
        EXPECT_TRUE(fused_blocks_cover(seqs, nv, 132, kFusedEighthsFromY));
}

TEST(GdnFusedSplit, NoOverflowAtLargeSteps) {
  const int64_t seqs = int64_t{1} << 40;  // blocks x 8 past 2^31 many times over
  EXPECT_TRUE(fused_blocks_cover(seqs, 64, 132, kFusedEighthsAfterConv));
  EXPECT_FALSE(fused_blocks_cover(0, 64, 132, kFusedEighthsFromY));
}

TEST(GdnFusedSplit, H200Shapes) {
  EXPECT_FALSE(fused_blocks_cover(2, 32, 132, kFusedEighthsFromY));      // 64 blocks: prep + pass
  EXPECT_TRUE(fused_blocks_cover(3, 32, 132, kFusedEighthsFromY));       // 96: 0.283 vs 0.305 ms
  EXPECT_FALSE(fused_blocks_cover(3, 32, 132, kFusedEighthsAfterConv));  // mixer 0.4305 vs 0.400
  EXPECT_TRUE(fused_blocks_cover(4, 32, 132, kFusedEighthsAfterConv));   // 128: 0.367 vs 0.3945
  EXPECT_TRUE(fused_blocks_cover(8, 32, 132, kFusedEighthsAfterConv));   // 8 x 1024
}

}  // namespace
}  // namespace deltaserve::cuda::gdn_chunk
