// The vocabulary-parallel embedding and lm_head under TP on CPU ranks: the host-side id and row
// maps, each rank's zero-padded slice of the weights, and sampling over the gathered slices —
// greedy and seeded draws with top-k / top-p / min-p, penalties and top logprobs give the tokens
// of one rank at TP2 and TP4, also when the vocabulary (97) does not divide by the degree, and
// with TPSP forced on.
#include "dist/vocab_parallel.h"

#include <gtest/gtest.h>

#include "backend/cpu/cpu_backend.h"
#include "engine/engine.h"
#include "engine/engine_fixtures.h"
#include "model/loader.h"
#include "model/tp_shard.h"
#include "model/weights.h"
#include "tp_fixtures.h"

namespace deltaserve {
namespace {

TEST(VocabParallel, LocalIdsAndTheGatherOrder) {
  const std::vector<int32_t> ids = {0, 24, 25, 49, 50, 96};
  EXPECT_EQ(dist::local_token_ids(ids, 0, 25), (std::vector<int32_t>{0, 24, -1, -1, -1, -1}));
  EXPECT_EQ(dist::local_token_ids(ids, 1, 25), (std::vector<int32_t>{-1, -1, 0, 24, -1, -1}));
  EXPECT_EQ(dist::local_token_ids(ids, 3, 25), (std::vector<int32_t>{-1, -1, -1, -1, -1, 21}));
  // Gathered [2 shards][3 rows] -> whole rows [3 rows][2 shards].
  EXPECT_EQ(dist::vocab_gather_order(3, 2), (std::vector<int32_t>{0, 3, 1, 4, 2, 5}));
}

TEST(VocabParallel, EachRankHoldsItsZeroPaddedSliceOfTheEmbeddingAndLmHead) {
  testing::TempDir d;
  const auto dir = make_tp4_checkpoint(d);
  const model::ModelConfig cfg = model::load_model_config(dir);
  const model::Checkpoint ckpt(dir);
  backend::CpuBackend be;
  const model::ModelWeights full = model::load_weights(ckpt, cfg, be);
  const int64_t H = cfg.hidden_size, rows = model::vocab_shard_rows(cfg, 4);
  ASSERT_EQ(rows, 25);
  int64_t lm_bytes = 0;
  for (int r = 0; r < 4; ++r) {
    const model::ModelWeights w = model::load_weights(ckpt, cfg, be, {}, {4, r});
    for (const auto& [lp, gp] :
         {std::pair{&w.embed, &full.embed}, std::pair{&w.lm_head, &full.lm_head}}) {
      const Tensor& local = *lp;
      const Tensor& global = *gp;
      ASSERT_EQ(local.dim(0), rows);
      for (int64_t i = 0; i < rows; ++i) {
        const int64_t id = r * rows + i;
        for (int64_t h = 0; h < H; ++h)
          ASSERT_EQ(local.f32()[i * H + h], id < cfg.vocab_size ? global.f32()[id * H + h] : 0.0f)
              << "rank " << r << " row " << i;
      }
    }
    if (r == 0) lm_bytes = static_cast<int64_t>(w.embed.nbytes() + w.lm_head.nbytes());
  }
  EXPECT_EQ(lm_bytes, 2 * rows * H * 4) << "a quarter of the vocabulary (rounded up) per rank";
}

// weight_bytes (the per-rank table in docs/tp.md) is what the loader allocates.
TEST(VocabParallel, WeightBytesAreTheLoadersAllocation) {
  testing::TempDir d;
  const auto tp4 = make_tp4_checkpoint(d);
  backend::CpuBackend be;
  for (const auto& dir : {tp4, testing::test_data() / "tiny_real"}) {
    const model::ModelConfig cfg = model::load_model_config(dir);
    for (const int n : {1, 2, 4}) {
      if (cfg.num_kv_heads % n != 0 && n % cfg.num_kv_heads != 0) continue;
      if (cfg.lin_num_k_heads % n != 0) continue;
      for (int r = 0; r < n; ++r)
        EXPECT_EQ(model::weight_bytes(cfg, {n, r}, be.weight_dtype(2), be.weight_dtype(1)),
                  model::dummy_weights(cfg, be, 3, {n, r}).total_bytes)
            << dir << " TP" << n << " rank " << r;
    }
  }
}

std::vector<engine::GenerateRequest> sampling_requests() {
  std::vector<engine::GenerateRequest> reqs;
  for (int i = 0; i < 4; ++i) {
    engine::GenerateRequest r{engine::random_prompt(20 + 13 * i, 70 + i, 97), {}};
    r.params.max_tokens = 12;
    r.params.ignore_eos = true;
    r.params.logprobs = true;
    r.params.top_logprobs = 5;
    r.params.seed = 900 + i;
    r.params.temperature = i == 0 ? 0.0f : 0.9f;
    if (i == 2) {
      r.params.top_k = 20;
      r.params.top_p = 0.8f;
      r.params.min_p = 0.02f;
    }
    if (i == 3) {
      r.params.repetition_penalty = 1.3f;
      r.params.presence_penalty = 0.5f;
      r.params.frequency_penalty = 0.4f;
      r.params.logit_bias = {{5, 3.0f}, {96, 2.0f}};
    }
    reqs.push_back(r);
  }
  return reqs;
}

TEST(VocabParallel, SampledTokensAndLogprobsMatchOneRank) {
  testing::TempDir d;
  const std::string dir = make_tp4_checkpoint(d).string();
  const auto reqs = sampling_requests();
  std::vector<std::vector<engine::Result>> runs;
  const std::vector<std::pair<int, bool>> setups = {
      {1, false}, {2, false}, {4, false}, {2, true}, {4, true}};
  for (const auto& [n, tpsp] : setups) {
    // With TPSP forced: every step whose token count n divides (prefills, mixed, decode).
    auto exec = engine::tp_executor(dir, n, -1, 0, {tpsp, 0});
    engine::Engine e(*exec, {});
    std::vector<std::shared_ptr<engine::RequestStream>> streams;
    for (const auto& r : reqs) streams.push_back(e.submit(r));
    runs.emplace_back();
    for (auto& s : streams) runs.back().push_back(engine::collect(*s));
  }
  // Greedy tokens are comparable across layouts only away from near-ties (their rounding differs
  // by ~1e-6): the greedy request's every choice leads its runner-up by more than 1e-3.
  for (const engine::TokenLogprob& l : runs[0][0].logprobs)
    ASSERT_GT(l.top[0].second - l.top[1].second, 1e-3) << "pick a prompt without near-ties";
  for (size_t t = 1; t < runs.size(); ++t)
    for (size_t i = 0; i < reqs.size(); ++i) {
      const std::string what = "TP" + std::to_string(setups[t].first) +
                               (setups[t].second ? " TPSP" : "") + " request " + std::to_string(i);
      EXPECT_EQ(runs[t][i].tokens, runs[0][i].tokens) << what;
      ASSERT_EQ(runs[t][i].logprobs.size(), runs[0][i].logprobs.size()) << what;
      for (size_t k = 0; k < runs[0][i].logprobs.size(); ++k) {
        EXPECT_NEAR(runs[t][i].logprobs[k].logprob, runs[0][i].logprobs[k].logprob, 1e-4) << what;
        ASSERT_EQ(runs[t][i].logprobs[k].top.size(), 5u) << what;
        for (size_t j = 0; j < 5; ++j)
          EXPECT_EQ(runs[t][i].logprobs[k].top[j].first, runs[0][i].logprobs[k].top[j].first)
              << what << " token " << k;
      }
    }
}

}  // namespace
}  // namespace deltaserve
