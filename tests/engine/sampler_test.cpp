#include "engine/sampler.h"

#include <gtest/gtest.h>

#include <cmath>

namespace deltaserve::engine {
namespace {

std::vector<float> logits_of(std::vector<double> probs) {
  std::vector<float> l;
  for (double p : probs) l.push_back(static_cast<float>(std::log(p)));
  return l;
}

std::vector<int> histogram(const std::vector<float>& logits, const SamplingParams& p, int n,
                           uint64_t seed = 1) {
  std::mt19937_64 rng(seed);
  std::vector<int> h(logits.size());
  for (int i = 0; i < n; ++i)
    ++h[static_cast<size_t>(
        sample(logits, static_cast<int32_t>(logits.size()), p, {}, 0, {}, rng).token)];
  return h;
}

TEST(Sampler, GreedyAndBanned) {
  std::mt19937_64 rng(1);
  SamplingParams p;
  p.temperature = 0;
  const std::vector<float> l{0.1f, 3.0f, 2.0f, -1.0f};
  EXPECT_EQ(sample(l, 4, p, {}, 0, {}, rng).token, 1);
  const std::vector<int32_t> banned{1};
  EXPECT_EQ(sample(l, 4, p, {}, 0, banned, rng).token, 2);
  EXPECT_EQ(sample(l, 1, p, {}, 0, {}, rng).token, 0);  // ids >= vocab are never chosen
}

TEST(Sampler, TemperatureDistributionTopPMinPTopK) {
  const std::vector<float> l = logits_of({0.5, 0.3, 0.15, 0.05});
  SamplingParams p;
  std::vector<int> h = histogram(l, p, 20000);
  EXPECT_NEAR(h[0] / 20000.0, 0.5, 0.02);
  EXPECT_NEAR(h[3] / 20000.0, 0.05, 0.01);
  p.top_p = 0.7f;  // keeps {0, 1}: 0.5 + 0.3 >= 0.7
  h = histogram(l, p, 20000);
  EXPECT_EQ(h[2] + h[3], 0);
  EXPECT_NEAR(h[0] / 20000.0, 0.625, 0.02);
  p = SamplingParams{};
  p.min_p = 0.4f;  // floor 0.2: keeps {0, 1}
  h = histogram(l, p, 20000);
  EXPECT_EQ(h[2] + h[3], 0);
  p = SamplingParams{};
  p.top_k = 3;
  h = histogram(l, p, 20000);
  EXPECT_EQ(h[3], 0);
  EXPECT_NEAR(h[2] / 20000.0, 0.15 / 0.95, 0.02);
  p.top_k = 1;
  p.temperature = 5.0f;
  h = histogram(l, p, 1000);
  EXPECT_EQ(h[0], 1000);
  // Low temperature sharpens.
  p = SamplingParams{};
  p.temperature = 0.25f;
  h = histogram(l, p, 20000);
  EXPECT_GT(h[0] / 20000.0, 0.85);
}

TEST(Sampler, TopPOverLargeVocabularyMatchesExactCut) {
  // 5000 tokens with geometric probabilities: the windowed search must keep exactly the prefix.
  std::vector<double> probs;
  double z = 0;
  for (int i = 0; i < 5000; ++i) z += std::pow(0.999, i);
  for (int i = 0; i < 5000; ++i) probs.push_back(std::pow(0.999, i) / z);
  const std::vector<float> l = logits_of(probs);
  SamplingParams p;
  p.top_p = 0.5f;
  double cum = 0;
  int cut = 0;
  while (cum < 0.5 - 1e-6) cum += probs[static_cast<size_t>(cut++)];
  const std::vector<int> h = histogram(l, p, 4000);
  int beyond = 0;
  for (size_t i = static_cast<size_t>(cut) + 1; i < h.size(); ++i) beyond += h[i];
  EXPECT_EQ(beyond, 0);
  EXPECT_GT(h[static_cast<size_t>(cut) - 2], 0);
}

TEST(Sampler, Penalties) {
  std::mt19937_64 rng(1);
  SamplingParams p;
  p.temperature = 0;
  const std::vector<float> l{2.0f, 1.5f, -1.0f};
  const std::vector<int32_t> hist{0, 0};  // prompt [0], output [0]
  p.repetition_penalty = 2.0f;            // 2.0 -> 1.0 < 1.5
  EXPECT_EQ(sample(l, 3, p, hist, 1, {}, rng).token, 1);
  p = SamplingParams{};
  p.temperature = 0;
  p.frequency_penalty = 0.3f;  // output count 1: 2.0 - 0.3 = 1.7 > 1.5
  EXPECT_EQ(sample(l, 3, p, hist, 1, {}, rng).token, 0);
  p.presence_penalty = 0.3f;  // 2.0 - 0.6 = 1.4 < 1.5
  EXPECT_EQ(sample(l, 3, p, hist, 1, {}, rng).token, 1);
  EXPECT_EQ(sample(l, 3, p, hist, 2, {}, rng).token, 0);  // no output tokens: no presence/frequency
}

TEST(Sampler, LogprobsAreRawLogSoftmax) {
  std::mt19937_64 rng(3);
  SamplingParams p;
  p.temperature = 0.7f;
  p.repetition_penalty = 1.3f;
  p.logprobs = true;
  p.top_logprobs = 2;
  const std::vector<float> l{1.0f, 2.0f, 0.5f};
  const std::vector<int32_t> hist{1};
  const SampleResult r = sample(l, 3, p, hist, 1, {}, rng);
  double z = 0;
  for (float v : l) z += std::exp(static_cast<double>(v));
  EXPECT_NEAR(r.logprob.logprob, l[static_cast<size_t>(r.token)] - std::log(z), 1e-6);
  ASSERT_EQ(r.logprob.top.size(), 2u);
  EXPECT_EQ(r.logprob.top[0].first, 1);
  EXPECT_EQ(r.logprob.top[1].first, 0);
  EXPECT_NEAR(r.logprob.top[0].second, 2.0 - std::log(z), 1e-6);
}

TEST(Sampler, SameSeedSameDraws) {
  const std::vector<float> l = logits_of({0.25, 0.25, 0.25, 0.25});
  SamplingParams p;
  std::mt19937_64 a(42), b(42), c(43);
  std::vector<int32_t> ta, tb, tc;
  for (int i = 0; i < 50; ++i) {
    ta.push_back(sample(l, 4, p, {}, 0, {}, a).token);
    tb.push_back(sample(l, 4, p, {}, 0, {}, b).token);
    tc.push_back(sample(l, 4, p, {}, 0, {}, c).token);
  }
  EXPECT_EQ(ta, tb);
  EXPECT_NE(ta, tc);
}

TEST(SamplingParams, Validate) {
  SamplingParams p;
  EXPECT_EQ(p.validate(), "");
  p.top_p = 0;
  EXPECT_NE(p.validate(), "");
  p = SamplingParams{};
  p.temperature = -1;
  EXPECT_NE(p.validate(), "");
  p = SamplingParams{};
  p.min_tokens = 20;
  EXPECT_NE(p.validate(), "");
  p = SamplingParams{};
  p.stop = {""};
  EXPECT_NE(p.validate(), "");
}

}  // namespace
}  // namespace deltaserve::engine
