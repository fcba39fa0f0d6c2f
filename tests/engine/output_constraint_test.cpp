// Forced output prefixes (the engine side of tool_choice "required" / a named function): which
// tokens the constraint allows, and the engine on the CPU with the tiny_real checkpoint keeping to
// them — from the first token, with the model's own choice between alternatives, and only after
// the token that ends the reasoning.
#include "engine/output_constraint.h"

#include <gtest/gtest.h>

#include "backend/cpu/cpu_backend.h"
#include "engine/engine.h"
#include "engine/engine_fixtures.h"
#include "model/loader.h"
#include "test_util.h"

namespace deltaserve::engine {
namespace {

using Tokens = std::vector<int32_t>;

SamplingParams forced(std::vector<Tokens> prefixes, int32_t after = -1) {
  SamplingParams p;
  p.forced_prefixes = std::move(prefixes);
  p.constrain_after = after;
  return p;
}

TEST(OutputConstraint, AllowsTheNextTokenOfEveryPrefixStillMatched) {
  const SamplingParams p = forced({{1, 2, 3}, {1, 4}, {1, 2, 5}, {6}});
  EXPECT_EQ(allowed_next_tokens(p, Tokens{}), (Tokens{1, 6}));
  EXPECT_EQ(allowed_next_tokens(p, Tokens{1}), (Tokens{2, 4}));
  EXPECT_EQ(allowed_next_tokens(p, Tokens{1, 2}), (Tokens{3, 5}));
  EXPECT_TRUE(allowed_next_tokens(p, Tokens{1, 2, 3}).empty()) << "a complete prefix frees it";
  EXPECT_TRUE(allowed_next_tokens(p, Tokens{1, 4, 9, 9}).empty());
  EXPECT_TRUE(allowed_next_tokens(p, Tokens{7}).empty()) << "off every prefix: nothing to force";
  EXPECT_TRUE(allowed_next_tokens(SamplingParams{}, Tokens{}).empty());
}

TEST(OutputConstraint, StartsAfterTheFirstConstrainAfterToken) {
  const SamplingParams p = forced({{8, 9}}, 42);
  EXPECT_TRUE(allowed_next_tokens(p, Tokens{1, 2}).empty()) << "still reasoning";
  EXPECT_EQ(allowed_next_tokens(p, Tokens{1, 42}), (Tokens{8}));
  EXPECT_EQ(allowed_next_tokens(p, Tokens{1, 42, 8}), (Tokens{9}));
  EXPECT_TRUE(allowed_next_tokens(p, Tokens{1, 42, 8, 9, 42}).empty());
}

TEST(OutputConstraint, ReplacesOnlyTokensOutsideTheAllowedSet) {
  const SamplingParams p = forced({{3, 4}, {5, 6}});
  EXPECT_EQ(constrain_token(p, Tokens{}, 5), 5);
  EXPECT_EQ(constrain_token(p, Tokens{}, 7), 3);
  EXPECT_EQ(constrain_token(p, Tokens{5}, 4), 6);
  EXPECT_EQ(constrain_token(p, Tokens{5, 6}, 4), 4);
  EXPECT_EQ(constrain_token(SamplingParams{}, Tokens{}, 4), 4);
}

class ForcedOutput : public ::testing::Test {
 protected:
  void SetUp() override {
    model_ = model::load_model((deltaserve::testing::test_data() / "tiny_real").string(),
                               model::LoadFormat::kAuto, be_, false);
  }
  Result run(const Tokens& prompt, const SamplingParams& p, EngineConfig cfg = {}) {
    Engine e(*model_, cfg);
    return collect(*e.submit({prompt, p}));
  }
  backend::CpuBackend be_;
  std::unique_ptr<model::Qwen35Model> model_;
};

TEST_F(ForcedOutput, TheOutputStartsWithThePrefixThenRunsFree) {
  const Tokens prompt = random_prompt(20, 5, 384);
  SamplingParams free;
  free.temperature = 0;
  free.max_tokens = 8;
  free.ignore_eos = true;
  const Result base = run(prompt, free);
  // A prefix the model would not write: each token differs from what greedy decoding picks.
  const Tokens prefix = {(base.tokens[0] + 1) % 384, (base.tokens[1] + 7) % 384, 11};
  for (const float temperature : {0.0f, 1.0f}) {
    SamplingParams p = free;
    p.temperature = temperature;
    p.seed = 3;
    p.forced_prefixes = {prefix};
    const Result r = run(prompt, p);
    ASSERT_EQ(r.tokens.size(), 8u);
    EXPECT_EQ(Tokens(r.tokens.begin(), r.tokens.begin() + 3), prefix) << temperature;
    if (temperature == 0) {  // afterwards greedy decoding of prompt + prefix, unconstrained
      SamplingParams cont = free;
      cont.max_tokens = 5;
      Tokens longer = prompt;
      longer.insert(longer.end(), prefix.begin(), prefix.end());
      EXPECT_EQ(Tokens(r.tokens.begin() + 3, r.tokens.end()), run(longer, cont).tokens);
    }
  }
}

TEST_F(ForcedOutput, TheModelChoosesBetweenAlternatives) {
  const Tokens prompt = random_prompt(30, 6, 384);
  SamplingParams look;
  look.temperature = 0;
  look.max_tokens = 1;
  look.logprobs = true;
  look.top_logprobs = 3;
  // After the shared first token 17, the model's 2nd and 3rd likeliest next tokens: neither is
  // what it would pick unconstrained, so only the bias (not the fallback) can choose between them.
  Tokens with = prompt;
  with.push_back(17);
  const Result l = run(with, look);
  ASSERT_EQ(l.logprobs.size(), 1u);
  ASSERT_EQ(l.logprobs[0].top.size(), 3u);
  const int32_t second = l.logprobs[0].top[1].first, third = l.logprobs[0].top[2].first;
  SamplingParams p;
  p.temperature = 0;
  p.max_tokens = 2;
  p.forced_prefixes = {{17, third}, {17, second}};  // the fallback (first) would pick `third`
  EXPECT_EQ(run(prompt, p).tokens, (Tokens{17, second}));
}

TEST_F(ForcedOutput, OnlyAfterTheReasoningEnds) {
  EngineConfig cfg;
  cfg.debug_output_script = {5, 6, 7, 8, 9, 10};  // what the "model" writes
  SamplingParams p;
  p.max_tokens = 6;
  p.forced_prefixes = {{100, 101}};
  p.constrain_after = 7;
  const Tokens prompt = random_prompt(10, 7, 384);
  EXPECT_EQ(run(prompt, p, cfg).tokens, (Tokens{5, 6, 7, 100, 101, 10}));
  p.constrain_after = 42;  // never written: nothing forced
  EXPECT_EQ(run(prompt, p, cfg).tokens, (Tokens{5, 6, 7, 8, 9, 10}));
}

}  // namespace
}  // namespace deltaserve::engine
