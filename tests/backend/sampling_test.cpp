// The host sampling reference (backend/sampling.h), which the CPU backend runs and the CUDA
// sampling kernel is tested against; and the engine's SamplingParams validation.
#include "backend/sampling.h"

#include <gtest/gtest.h>

#include <cmath>

#include "engine/request.h"

namespace deltaserve::backend {
namespace {

using engine::SamplingParams;

std::vector<float> logits_of(std::vector<double> probs) {
  std::vector<float> l;
  for (double p : probs) l.push_back(static_cast<float>(std::log(p)));
  return l;
}

SampleSpec temp1() {
  SampleSpec s;
  s.temperature = 1.0f;
  return s;
}

// Token counts over n draws with counters 0..n-1.
std::vector<int> histogram(const std::vector<float>& logits, SampleSpec p, int n,
                           uint64_t seed = 1) {
  std::vector<int> h(logits.size());
  p.seed = seed;
  for (int i = 0; i < n; ++i) {
    p.counter = static_cast<uint64_t>(i);
    ++h[static_cast<size_t>(sample_row(logits, static_cast<int32_t>(logits.size()), p).token)];
  }
  return h;
}

TEST(Sampling, UniformDrawIsUniformAndKeyed) {
  double sum = 0;
  int low = 0;
  for (uint64_t c = 0; c < 100000; ++c) {
    const float u = sample_uniform(7, c);
    ASSERT_GE(u, 0.0f);
    ASSERT_LT(u, 1.0f);
    sum += u;
    low += u < 0.1f;
  }
  EXPECT_NEAR(sum / 100000, 0.5, 0.005);
  EXPECT_NEAR(low / 100000.0, 0.1, 0.005);
  EXPECT_EQ(sample_uniform(7, 3), sample_uniform(7, 3));
  EXPECT_NE(sample_uniform(7, 3), sample_uniform(8, 3));
  EXPECT_NE(sample_uniform(7, 3), sample_uniform(7, 4));
}

TEST(Sampling, GreedyAndBanned) {
  SampleSpec p;
  const std::vector<float> l{0.1f, 3.0f, 2.0f, -1.0f};
  EXPECT_EQ(sample_row(l, 4, p).token, 1);
  p.banned = {1};
  EXPECT_EQ(sample_row(l, 4, p).token, 2);
  p.banned.clear();
  EXPECT_EQ(sample_row(l, 1, p).token, 0);  // ids >= vocab are never chosen
}

TEST(Sampling, LogitBiasShiftsTheChoiceButNotTheRawLogprobsAndBansWin) {
  SampleSpec p;
  const std::vector<float> l{0.1f, 3.0f, 2.0f, -1.0f};
  p.bias = {{3, 5.0f}};  // -1 + 5 = 4 > 3
  p.num_logprobs = 0;
  const Sampled s = sample_row(l, 4, p);
  EXPECT_EQ(s.token, 3);
  const double z = std::exp(0.1) + std::exp(3.0) + std::exp(2.0) + std::exp(-1.0);
  EXPECT_NEAR(s.logprob, -1.0 - std::log(z), 1e-5) << "logprobs are of the raw logits";
  p.bias = {{1, -100.0f}};
  EXPECT_EQ(sample_row(l, 4, p).token, 2);
  p.bias = {{3, 100.0f}};
  p.banned = {3};
  EXPECT_EQ(sample_row(l, 4, p).token, 1) << "a ban wins over a bias";
}

TEST(Sampling, TemperatureDistributionTopPMinPTopK) {
  const std::vector<float> l = logits_of({0.5, 0.3, 0.15, 0.05});
  SampleSpec p = temp1();
  std::vector<int> h = histogram(l, p, 20000);
  EXPECT_NEAR(h[0] / 20000.0, 0.5, 0.02);
  EXPECT_NEAR(h[3] / 20000.0, 0.05, 0.01);
  p.top_p = 0.7f;  // keeps {0, 1}: 0.5 + 0.3 >= 0.7
  h = histogram(l, p, 20000);
  EXPECT_EQ(h[2] + h[3], 0);
  EXPECT_NEAR(h[0] / 20000.0, 0.625, 0.02);
  p = temp1();
  p.min_p = 0.4f;  // floor 0.2: keeps {0, 1}
  h = histogram(l, p, 20000);
  EXPECT_EQ(h[2] + h[3], 0);
  p = temp1();
  p.top_k = 3;
  h = histogram(l, p, 20000);
  EXPECT_EQ(h[3], 0);
  EXPECT_NEAR(h[2] / 20000.0, 0.15 / 0.95, 0.02);
  p.top_k = 1;
  p.temperature = 5.0f;
  h = histogram(l, p, 1000);
  EXPECT_EQ(h[0], 1000);
  // Low temperature sharpens.
  p = temp1();
  p.temperature = 0.25f;
  h = histogram(l, p, 20000);
  EXPECT_GT(h[0] / 20000.0, 0.85);
}

TEST(Sampling, TopPOverLargeVocabularyMatchesExactCut) {
  // 5000 tokens with geometric probabilities: the windowed search must keep exactly the prefix.
  std::vector<double> probs;
  double z = 0;
  for (int i = 0; i < 5000; ++i) z += std::pow(0.999, i);
  for (int i = 0; i < 5000; ++i) probs.push_back(std::pow(0.999, i) / z);
  const std::vector<float> l = logits_of(probs);
  SampleSpec p = temp1();
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

TEST(Sampling, Penalties) {
  const std::vector<float> l{2.0f, 1.5f, -1.0f};
  SampleSpec p;
  p.prompt_tokens = {0};
  p.output_tokens = {0};
  p.repetition_penalty = 2.0f;  // 2.0 -> 1.0 < 1.5
  EXPECT_EQ(sample_row(l, 3, p).token, 1);
  p.repetition_penalty = 1.0f;
  p.frequency_penalty = 0.3f;  // output count 1: 2.0 - 0.3 = 1.7 > 1.5
  EXPECT_EQ(sample_row(l, 3, p).token, 0);
  p.presence_penalty = 0.3f;  // 2.0 - 0.6 = 1.4 < 1.5
  EXPECT_EQ(sample_row(l, 3, p).token, 1);
  p.output_tokens.clear();  // no output tokens: no presence/frequency
  EXPECT_EQ(sample_row(l, 3, p).token, 0);
  p.repetition_penalty = 3.0f;  // the prompt alone is enough for the repetition penalty
  EXPECT_EQ(sample_row(l, 3, p).token, 1);
}

TEST(Sampling, LogprobsAreRawLogSoftmax) {
  SampleSpec p;
  p.temperature = 0.7f;
  p.repetition_penalty = 1.3f;
  p.output_tokens = {1};
  p.num_logprobs = 2;
  const std::vector<float> l{1.0f, 2.0f, 0.5f};
  const Sampled r = sample_row(l, 3, p);
  double z = 0;
  for (float v : l) z += std::exp(static_cast<double>(v));
  EXPECT_NEAR(r.logprob, l[static_cast<size_t>(r.token)] - std::log(z), 1e-6);
  ASSERT_EQ(r.top.size(), 2u);
  EXPECT_EQ(r.top[0].first, 1);
  EXPECT_EQ(r.top[1].first, 0);
  EXPECT_NEAR(r.top[0].second, 2.0 - std::log(z), 1e-6);
  p.num_logprobs = -1;
  EXPECT_TRUE(sample_row(l, 3, p).top.empty());
}

TEST(Sampling, CutsKeepTiesWithTheLastKeptToken) {
  // Values 3, 2, 2, 2, 1: top-k 2 keeps every 2 (a threshold, as vLLM's mask); top-p too.
  const std::vector<float> l{3.0f, 2.0f, 2.0f, 2.0f, 1.0f};
  SampleSpec p = temp1();
  p.top_k = 2;
  auto ids = [&] {
    std::vector<int32_t> v;
    for (const auto& [id, pr] : kept_distribution(l, 5, p)) v.push_back(id);
    return v;
  };
  EXPECT_EQ(ids(), (std::vector<int32_t>{0, 1, 2, 3}));
  p.top_k = 0;
  p.top_p = 0.5f;  // the 3 holds 0.45 of the mass: the cut reaches the 2s, and all of them stay
  EXPECT_EQ(ids(), (std::vector<int32_t>{0, 1, 2, 3}));
  p.top_p = 0.4f;
  EXPECT_EQ(ids(), (std::vector<int32_t>{0}));
  p.top_p = 1.0f;
  p.min_p = std::exp(-1.0f) - 1e-4f;  // keeps values >= 3 - 1
  EXPECT_EQ(ids(), (std::vector<int32_t>{0, 1, 2, 3}));
}

TEST(Sampling, SameSeedSameDraws) {
  const std::vector<float> l = logits_of({0.25, 0.25, 0.25, 0.25});
  SampleSpec a = temp1(), c = temp1();
  a.seed = 42;
  c.seed = 43;
  std::vector<int32_t> ta, tb, tc;
  for (uint64_t i = 0; i < 50; ++i) {
    a.counter = c.counter = i;
    ta.push_back(sample_row(l, 4, a).token);
    tb.push_back(sample_row(l, 4, a).token);
    tc.push_back(sample_row(l, 4, c).token);
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
}  // namespace deltaserve::backend
