// The TPSP startup profile: the threshold chosen from timings, and the profile run on two CPU
// ranks inside an engine (it measures every size the step budget allows, leaves a choice the
// engine reports, and serving afterwards gives the tokens of one rank).
#include "engine/tpsp_profile.h"

#include <gtest/gtest.h>

#include "engine/engine_fixtures.h"
#include "test_util.h"

namespace deltaserve::engine {
namespace {

TEST(TpspProfile, ChoosesTheSmallestSizeFromWhichTpspAlwaysWins) {
  EXPECT_EQ(choose_tpsp({{256, 1.0, 1.2}, {512, 2.0, 1.9}, {1024, 4.0, 3.5}}).threshold_tokens,
            512);
  EXPECT_TRUE(choose_tpsp({{256, 1.0, 1.2}, {512, 2.0, 1.9}}).enabled);
  // A win below a loss does not count: from 2048 only.
  const dist::TpspConfig c = choose_tpsp({{256, 1.0, 0.9}, {1024, 4.0, 4.4}, {2048, 8.0, 7.0}});
  EXPECT_EQ(c.threshold_tokens, 2048);
  EXPECT_FALSE(choose_tpsp({{256, 1.0, 1.1}, {512, 2.0, 2.5}}).enabled) << "never faster: off";
  EXPECT_FALSE(choose_tpsp({}).enabled);
}

TEST(TpspProfile, RunsOnTheRanksAndServingStillMatchesOneRank) {
  const std::string dir = (deltaserve::testing::test_data() / "tiny_real").string();
  SamplingParams p = greedy(6);
  p.logprobs = true;
  p.top_logprobs = 2;
  const GenerateRequest req{random_prompt(300, 9, 384), p};
  auto one = tp_executor(dir, 1);
  const Result want = collect(*Engine(*one, {}).submit(req));
  // Greedy tokens are comparable across TP layouts only away from near-ties (rounding differs by
  // ~1e-6): this prompt's every choice leads its runner-up by more than 1e-3.
  for (const TokenLogprob& l : want.logprobs)
    ASSERT_GT(l.top[0].second - l.top[1].second, 1e-3) << "pick a prompt without near-ties";
  auto two = tp_executor(dir, 2);
  EngineConfig cfg;
  cfg.max_num_batched_tokens = 600;
  cfg.profile_tpsp = true;
  Engine e(*two, cfg);
  EXPECT_NE(e.tpsp_profile().find("256:"), std::string::npos) << e.tpsp_profile();
  EXPECT_NE(e.tpsp_profile().find("512:"), std::string::npos) << e.tpsp_profile();
  EXPECT_EQ(e.tpsp_profile().find("1024:"), std::string::npos) << "beyond the step budget";
  EXPECT_EQ(collect(*e.submit(req)).tokens, want.tokens);
  const std::vector<TpspTiming> t = profile_tpsp(*two, 300);
  ASSERT_EQ(t.size(), 1u);
  EXPECT_GT(t[0].conventional_ms, 0);
  EXPECT_GT(t[0].tpsp_ms, 0);
}

}  // namespace
}  // namespace deltaserve::engine
