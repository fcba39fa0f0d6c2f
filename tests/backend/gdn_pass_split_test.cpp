// The GDN state pass's column parts a head (gdn_pass_split.h), checked on the host: at the
// published value-head counts (16, 32, 48, 64, and their tensor-parallel shares) on GPUs of 1 to
// 132 multiprocessors, the parts are 1, 2 or 4; split blocks all fit at once and one more doubling
// would not; and the measured H200 cases (4B: one sequence in quarter heads, two in halves, more
// in whole heads).
#include "backend/cuda/kernels/gdn_pass_split.h"

#include <gtest/gtest.h>

namespace deltaserve::cuda::gdn_chunk {
namespace {

TEST(GdnPassSplit, TheMostPartsWhoseBlocksAllFit) {
  for (const int nv : {1, 2, 4, 6, 8, 12, 16, 24, 32, 48, 64})
    for (int sms = 1; sms <= 132; ++sms)
      for (int seqs = 1; seqs <= 40; ++seqs) {
        const int parts = state_pass_parts(seqs, nv, sms);
        SCOPED_TRACE(testing::Message() << "nv " << nv << " SMs " << sms << " seqs " << seqs);
        ASSERT_TRUE(parts == 1 || parts == 2 || parts == 4);
        if (parts > 1) EXPECT_LE(seqs * nv * parts, sms);
        if (parts < kMaxPassParts) EXPECT_GT(seqs * nv * 2 * parts, sms);
      }
}

TEST(GdnPassSplit, H200Shapes) {
  EXPECT_EQ(state_pass_parts(1, 32, 132), 4);  // 4B, one sequence: 128 quarter-head blocks
  EXPECT_EQ(state_pass_parts(2, 32, 132), 2);
  EXPECT_EQ(state_pass_parts(3, 32, 132), 1);
  EXPECT_EQ(state_pass_parts(8, 32, 132), 1);  // 8 x 1024: whole heads (splitting adds waves)
  EXPECT_EQ(state_pass_parts(1, 48, 132), 2);  // 27B: 96 half-head blocks
  EXPECT_EQ(state_pass_parts(2, 16, 132), 4);  // 0.8B / 2B, or 4B at TP2
}

}  // namespace
}  // namespace deltaserve::cuda::gdn_chunk
