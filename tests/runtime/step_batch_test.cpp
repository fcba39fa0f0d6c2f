// StepBatch: the one description of a step — rows, positions, the CSR page table, state sources,
// sampled rows, padding for graph buckets.
#include "core/step_batch.h"

#include <gtest/gtest.h>

namespace deltaserve {
namespace {

TEST(StepBatch, BuildsRowsPositionsPagesAndSamples) {
  const std::vector<int32_t> a{5, 6, 7}, b{9};
  const std::vector<int32_t> pa{4}, pb{1, 2};
  const StepBatch s = StepBatchBuilder(16)
                          .add(11, a, 0, 0, pa, 1)
                          .add(12, b, 20, 2, pb, 1, StateSource::kSnapshot, 7)
                          .build();
  EXPECT_EQ(s.num_tokens(), 4);
  EXPECT_EQ(s.token_ids(), (std::vector<int32_t>{5, 6, 7, 9}));
  EXPECT_EQ(s.positions(), (std::vector<int32_t>{0, 1, 2, 20}));
  EXPECT_EQ(s.page_offsets(), (std::vector<int32_t>{0, 1, 3}));
  EXPECT_EQ(std::vector<int32_t>(s.pages(1).begin(), s.pages(1).end()), pb);
  EXPECT_EQ(s.sample_rows(), (std::vector<int32_t>{2, 3}));
  EXPECT_TRUE(s.seq(0).fresh());
  EXPECT_EQ(s.seq(1).source, StateSource::kSnapshot);
  EXPECT_EQ(s.seq(1).snapshot, 7);
  EXPECT_EQ(s.seq(1).token_begin, 3);
  EXPECT_EQ(s.seq(1).request_id, 12u);
  EXPECT_FALSE(s.is_decode());
  const StepBatch t = StepBatchBuilder(16).build();
  EXPECT_NE(s.id(), t.id()) << "every batch has its own id";
}

TEST(StepBatch, SeveralSampledRowsAndExplicitRows) {
  const std::vector<int32_t> ids{1, 2, 3, 4, 5};
  const std::vector<int32_t> pages{0};
  // k + 1 verify rows: the last three rows of a sequence.
  const StepBatch v = StepBatchBuilder(16).add(1, ids, 10, 0, pages, 3).build();
  EXPECT_EQ(v.sample_rows(), (std::vector<int32_t>{2, 3, 4}));
  EXPECT_EQ(v.seq(0).num_samples, 3);
  const std::vector<int32_t> rows{0, 3};
  const StepBatch e = StepBatchBuilder(16).add_rows(1, ids, 0, 0, pages, rows).build();
  EXPECT_EQ(e.sample_rows(), rows);
}

TEST(StepBatch, DecodePaddingForGraphBuckets) {
  const std::vector<int32_t> p0{3}, p1{8};
  const StepBatch d = StepBatchBuilder(16)
                          .add(1, std::vector<int32_t>{42}, 5, 0, p0, 1)
                          .add(2, std::vector<int32_t>{43}, 9, 1, p1, 1)
                          .build();
  EXPECT_TRUE(d.is_decode());
  const StepBatch padded = d.padded(2, /*slot=*/9, /*page=*/30);
  EXPECT_EQ(padded.num_tokens(), 4);
  EXPECT_TRUE(padded.is_decode());
  EXPECT_EQ(padded.token_ids(), (std::vector<int32_t>{42, 43, 0, 0}));
  EXPECT_EQ(padded.seq(3).slot, 9);
  EXPECT_TRUE(padded.seq(3).fresh());
  EXPECT_EQ(padded.pages(2)[0], 30);
  EXPECT_EQ(padded.positions()[1], 9);
  EXPECT_NE(padded.id(), d.id());
}

}  // namespace
}  // namespace deltaserve
