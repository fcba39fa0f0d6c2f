// The model runner's state seam: a snapshot of a sequence's GDN state taken with copy_state, and
// a second sequence resumed from it (StateSource::kSnapshot, sharing the prefix's KV pages),
// continue exactly like the original sequence.
#include "runtime/model_runner.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>

#include "backend/cpu/cpu_backend.h"
#include "model/loader.h"
#include "runner_fixture.h"
#include "test_util.h"

namespace deltaserve::runtime {
namespace {

TEST(ModelRunner, ResumingFromASnapshotEqualsContinuing) {
  backend::CpuBackend be;
  auto m = model::load_model((testing::test_data() / "tiny_real").string(),
                             model::LoadFormat::kAuto, be, false);
  auto runner_ptr = testing::make_runner(*m, 8, 16, 2, 64, 1);
  ModelRunner& runner = *runner_ptr;
  const MemoryPlan& plan = runner.plan();
  std::vector<int32_t> prompt(32), next{17, 250, 3};
  for (size_t i = 0; i < prompt.size(); ++i) prompt[i] = static_cast<int32_t>((i * 37 + 5) % 384);
  const std::vector<int32_t> prefix_pages{0, 1};
  // Sequence A: the prompt on slot 0 (pages 0, 1), its state snapshotted, then three tokens.
  runner.forward(StepBatchBuilder(16).add(1, prompt, 0, 0, prefix_pages, 1).build());
  const int32_t snap = plan.snapshot_slot(0);
  runner.copy_state(0, snap);
  const std::vector<int32_t> a_pages{0, 1, 2};
  std::vector<std::vector<float>> a;
  for (int32_t k = 0; k < 3; ++k)
    a.push_back(runner.forward(
        StepBatchBuilder(16).add(1, std::vector<int32_t>{next[k]}, 32 + k, 0, a_pages, 1).build()));
  // Sequence B on slot 1: the same prefix from the snapshot and A's prefix pages, its own page 3.
  const std::vector<int32_t> b_pages{0, 1, 3};
  for (int32_t k = 0; k < 3; ++k) {
    StepBatchBuilder b(16);
    if (k == 0)
      b.add(2, std::vector<int32_t>{next[0]}, 32, 1, b_pages, 1, StateSource::kSnapshot, snap);
    else
      b.add(2, std::vector<int32_t>{next[k]}, 32 + k, 1, b_pages, 1);
    const std::vector<float> got = runner.forward(b.build());
    ASSERT_EQ(got.size(), a[k].size());
    EXPECT_EQ(testing::max_abs_diff(got.data(), a[k].data(), got.size()), 0.0f) << "token " << k;
  }
}

// An in-step snapshot (StepBatchBuilder::save_snapshot_at) holds exactly the state a prefill
// ending there leaves: a sequence resumed from it continues exactly like one resumed from a
// snapshot copied after a 64-token prefill.
TEST(ModelRunner, AnInStepSnapshotEqualsOneTakenAtTheChunkEnd) {
  backend::CpuBackend be;
  auto m = model::load_model((testing::test_data() / "tiny_real").string(),
                             model::LoadFormat::kAuto, be, false);
  auto runner_ptr = testing::make_runner(*m, 16, 16, 3, 128, 2);
  ModelRunner& runner = *runner_ptr;
  const MemoryPlan& plan = runner.plan();
  std::vector<int32_t> prompt(100);
  for (size_t i = 0; i < prompt.size(); ++i) prompt[i] = static_cast<int32_t>((i * 29 + 3) % 384);
  const std::vector<int32_t> head(prompt.begin(), prompt.begin() + 64),
      tail(prompt.begin() + 64, prompt.end()), pages{0, 1, 2, 3, 4, 5, 6};
  const int32_t in_step = plan.snapshot_slot(0), at_end = plan.snapshot_slot(1);
  runner.forward(
      StepBatchBuilder(16).add(1, prompt, 0, 0, pages, 1).save_snapshot_at(64, in_step).build());
  runner.forward(StepBatchBuilder(16).add(2, head, 0, 1, pages, 0).save_snapshot(at_end).build());
  std::vector<std::vector<float>> got;
  for (const int32_t snap : {in_step, at_end})
    got.push_back(runner.forward(
        StepBatchBuilder(16).add(3, tail, 64, 2, pages, 1, StateSource::kSnapshot, snap).build()));
  EXPECT_EQ(testing::max_abs_diff(got[0].data(), got[1].data(), got[0].size()), 0.0f);
  EXPECT_DEATH(StepBatchBuilder(16).add(1, prompt, 0, 0, pages, 1).save_snapshot_at(60, in_step),
               "64-token boundary");
}

// Teacher-forced logits of a tiny model: a 150-token prefill (three chunks) then 60 decode steps
// of the same tokens, with the GDN state in `state` and the KV cache in fp8 when `kv_fp8`.
std::vector<std::vector<float>> teacher_forced_logits(model::Qwen35Model& m, DType state,
                                                      bool kv_fp8) {
  const int32_t vocab = static_cast<int32_t>(m.config().vocab_size);
  std::vector<int32_t> tokens(210);
  for (size_t i = 0; i < tokens.size(); ++i)
    tokens[i] = static_cast<int32_t>((i * 7919 + 11) % static_cast<size_t>(vocab));
  std::vector<int32_t> pages(14);
  for (int32_t p = 0; p < 14; ++p) pages[static_cast<size_t>(p)] = p;
  auto runner = testing::make_runner(m, 14, 16, 1, 150, 0, state, kv_fp8);
  const std::vector<int32_t> prompt(tokens.begin(), tokens.begin() + 150);
  std::vector<std::vector<float>> out{
      runner->forward(StepBatchBuilder(16).add(1, prompt, 0, 0, pages, 1).build())};
  for (int32_t k = 150; k < 210; ++k)
    out.push_back(runner->forward(
        StepBatchBuilder(16)
            .add(1, std::vector<int32_t>{tokens[static_cast<size_t>(k)]}, k, 0, pages, 1)
            .build()));
  return out;
}

// A cache option's drift from the f32 reference on tiny_real and tiny_odd (printed): the largest
// logit difference is not zero (the option is really used) and at most max|logit| / `bound_div`,
// with the argmax agreeing on >= `min_agree` of the steps.
void expect_small_drift(const char* what, DType state, bool kv_fp8, float bound_div,
                        double min_agree) {
  for (const char* name : {"tiny_real", "tiny_odd"}) {
    SCOPED_TRACE(name);
    backend::CpuBackend be;
    auto m = model::load_model((testing::test_data() / name).string(), model::LoadFormat::kAuto, be,
                               false);
    const auto ref = teacher_forced_logits(*m, DType::kF32, false),
               got = teacher_forced_logits(*m, state, kv_fp8);
    float err = 0, scale = 0;
    int agree = 0;
    for (size_t s = 0; s < ref.size(); ++s) {
      err = std::max(err, testing::max_abs_diff(ref[s].data(), got[s].data(), ref[s].size()));
      scale = std::max(scale, testing::max_abs(ref[s]));
      agree += std::max_element(ref[s].begin(), ref[s].end()) - ref[s].begin() ==
               std::max_element(got[s].begin(), got[s].end()) - got[s].begin();
    }
    std::printf(
        "  %s: %s vs f32 over %zu steps: max|dlogit| %.3e of max|logit| %.3f, "
        "argmax agreement %d / %zu\n",
        name, what, ref.size(), err, scale, agree, ref.size());
    EXPECT_GT(err, 0.0f);
    EXPECT_LE(err, scale / bound_div);
    EXPECT_GE(agree, static_cast<int>(min_agree * static_cast<double>(ref.size())));
  }
}

// --mamba-ssm-cache-dtype bfloat16 against float32 (measured 0.9% and 2.0% of the largest logit,
// every argmax equal): within 2^-5 of the largest logit — 8 bf16 roundings at that magnitude, the
// bound style of gdn_chunk_test — with the argmax agreeing on >= 95% of the steps.
TEST(ModelRunner, Bf16GdnStateDriftsLittleFromF32) {
  expect_small_drift("bf16 GDN state", DType::kBF16, false, 32, 0.95);
}

// --kv-cache-dtype fp8 against the f32 cache, every K and V rounded to e4m3 (relative error up to
// 2^-4; measured 0.6% and 4.1% of the largest logit, argmax 61 / 61 and 59 / 61): within 2^-3 of
// the largest logit — the K and the V rounding at that magnitude — with the argmax agreeing on
// >= 90% of the steps.
TEST(ModelRunner, Fp8KvCacheDriftsLittleFromF32) {
  expect_small_drift("fp8 KV cache", DType::kF32, true, 8, 0.90);
}

}  // namespace
}  // namespace deltaserve::runtime
