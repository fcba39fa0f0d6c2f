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

TEST(TpspProfile, ChoosesTheFastestMicrochunkAmongItsCandidates) {
  EXPECT_EQ(choose_microchunk({{0, 8.0}, {4096, 7.5}, {2048, 7.1}, {1024, 7.3}}), 2048);
  EXPECT_EQ(choose_microchunk({{0, 7.0}, {4096, 7.5}}), 0) << "no pipeline when it never helps";
  EXPECT_EQ(choose_microchunk({{0, 7.0}, {512, 7.0}}), 0) << "the first of equals";
  EXPECT_EQ(choose_microchunk({}), 0);
  EXPECT_EQ(microchunk_candidates(8192, 2), (std::vector<int64_t>{0, 4096, 2048, 1024}));
  EXPECT_EQ(microchunk_candidates(256, 4), (std::vector<int64_t>{0, 128, 64}));
  // Multiples of the degree only, and at least 64 tokens.
  EXPECT_EQ(microchunk_candidates(384, 3), (std::vector<int64_t>{0, 192, 96}));
  EXPECT_EQ(microchunk_candidates(320, 4), (std::vector<int64_t>{0, 160, 80}));
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
  cfg.profile_tpsp = TpspProfileRequest{};
  Engine e(*two, cfg);
  const std::string& d = e.tpsp_profile();
  // The microchunk sizes at the largest step (512: none, 256, 128, 64), then the sizes 256, 512.
  const size_t by_chunk = d.find("at 512 tokens by microchunk:"), by_size = d.find("TPSP: 256: ");
  ASSERT_NE(by_chunk, std::string::npos) << d;
  ASSERT_NE(by_size, std::string::npos) << d;
  ASSERT_LT(by_chunk, by_size) << d;
  const std::string chunks = d.substr(by_chunk, by_size - by_chunk), sizes = d.substr(by_size);
  for (const char* m : {": 0: ", " 256: ", " 128: ", " 64: "})
    EXPECT_NE(chunks.find(m), std::string::npos) << m << " in " << chunks;
  EXPECT_NE(sizes.find(" 512: "), std::string::npos) << sizes;
  EXPECT_EQ(d.find("1024:"), std::string::npos) << "beyond the step budget: " << d;
  EXPECT_EQ(collect(*e.submit(req)).tokens, want.tokens);
  // The microchunk size given (--tpsp-microchunk-tokens): only the threshold is profiled, with it.
  const TpspProfile q = profile_tpsp(*two, 300, {64});
  ASSERT_EQ(q.timings.size(), 1u);
  EXPECT_GT(q.timings[0].conventional_ms, 0);
  EXPECT_GT(q.timings[0].tpsp_ms, 0);
  EXPECT_TRUE(q.microchunks.empty());
  EXPECT_EQ(q.chosen.microchunk_tokens, 64);
}

}  // namespace
}  // namespace deltaserve::engine
