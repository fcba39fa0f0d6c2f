// The host side of how the CUDA backend divides a step between its decode and prefill kernels
// (step_split.h): the leading decode rows a mixed step gives the fused GDN decode kernel, the rows
// the split-KV attention kernel covers, and where the prefill attention kernel's grid starts.
#include "backend/cuda/step_split.h"

#include <gtest/gtest.h>

#include <vector>

namespace deltaserve::backend {
namespace {

constexpr int32_t kShort = 16;  // the prefill attention kernel's minimum step tokens

// A step of sequences of the given token counts, in order (fresh, one page each).
StepBatch step(const std::vector<int32_t>& lengths) {
  StepBatchBuilder b(1 << 14);
  int32_t slot = 0;
  for (int32_t n : lengths) {
    const std::vector<int32_t> pages{slot};
    b.add(0, std::vector<int32_t>(static_cast<size_t>(n), 1), 0, slot, pages);
    ++slot;
  }
  return b.build();
}

TEST(StepSplit, DecodeStepIsAllLeadingDecodeRows) {
  const StepBatch b = step({1, 1, 1, 1});
  EXPECT_EQ(leading_single_token_seqs(b), 4);
  EXPECT_EQ(rows_through_short_seqs(b, kShort), 4);
  EXPECT_EQ(leading_short_seqs(b, kShort), 4);
}

TEST(StepSplit, DecodeRowsBeforeAPrefill) {
  const StepBatch b = step({1, 1, 1, 300});
  EXPECT_EQ(leading_single_token_seqs(b), 3);
  EXPECT_EQ(rows_through_short_seqs(b, kShort), 3);  // the prefill's 300 rows are not covered
  EXPECT_EQ(leading_short_seqs(b, kShort), 3);       // the prefill kernel's grid starts at it
}

TEST(StepSplit, ShortSequencesAfterLongOnesExtendTheSplitRows) {
  const StepBatch b = step({1, 200, 1, 40, 9});
  EXPECT_EQ(leading_single_token_seqs(b), 1);  // only the run before the first longer sequence
  EXPECT_EQ(rows_through_short_seqs(b, kShort), 1 + 200 + 1 + 40 + 9);
  const StepBatch c = step({1, 200, 15, 400});
  EXPECT_EQ(rows_through_short_seqs(c, kShort), 1 + 200 + 15);
  EXPECT_EQ(leading_short_seqs(b, kShort), 1);  // the short ones after the first long one stay
  EXPECT_EQ(leading_short_seqs(c, kShort), 1);
  EXPECT_EQ(leading_short_seqs(step({15, 2, 16, 1}), kShort), 2);
}

TEST(StepSplit, PrefillOnlySteps) {
  const StepBatch one = step({8192});
  EXPECT_EQ(leading_single_token_seqs(one), 0);
  EXPECT_EQ(rows_through_short_seqs(one, kShort), 0);
  const StepBatch first_longer = step({2, 1, 1});  // a 2-token chunk first: no leading decode rows
  EXPECT_EQ(leading_single_token_seqs(first_longer), 0);
  EXPECT_EQ(rows_through_short_seqs(first_longer, kShort), 4);
  EXPECT_EQ(rows_through_short_seqs(step({16, 17}), kShort), 0);  // 16 tokens: the prefill kernel's
  EXPECT_EQ(leading_short_seqs(one, kShort), 0);
  EXPECT_EQ(leading_short_seqs(step({16, 17}), kShort), 0);
}

}  // namespace
}  // namespace deltaserve::backend
