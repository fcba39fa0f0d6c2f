// Prefix caching end to end on the CPU backend (tiny_real): a request resumed from cached KV
// pages and a GDN state snapshot produces exactly the tokens and logprobs of the same request on an
// engine without the cache — identical prompts, a shared system prompt, partial hits at every
// alignment, eviction, preemption, abort and two tensor-parallel ranks.
#include <gtest/gtest.h>

#include <chrono>

#include "engine/engine_fixtures.h"
#include "test_util.h"

namespace deltaserve::engine {
namespace {

using namespace std::chrono_literals;

constexpr int kVocab = 384;

std::vector<int32_t> concat(std::vector<int32_t> a, const std::vector<int32_t>& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

GenerateRequest greedy(std::vector<int32_t> prompt, int32_t max_tokens = 8) {
  GenerateRequest r{std::move(prompt), engine::greedy(max_tokens)};
  r.params.logprobs = true;
  r.params.top_logprobs = 5;
  return r;
}

// Bit-identical tokens and logprobs (top alternatives included).
void expect_identical(const Result& got, const Result& want, const std::string& what) {
  EXPECT_EQ(got.tokens, want.tokens) << what;
  ASSERT_EQ(got.logprobs.size(), want.logprobs.size()) << what;
  for (size_t t = 0; t < got.logprobs.size(); ++t) {
    EXPECT_EQ(got.logprobs[t].logprob, want.logprobs[t].logprob) << what << " token " << t;
    EXPECT_EQ(got.logprobs[t].top, want.logprobs[t].top) << what << " token " << t;
  }
}

class PrefixCacheTest : public ::testing::Test {
 protected:
  void SetUp() override {
    model_ = model::load_model((deltaserve::testing::test_data() / "tiny_real").string(),
                               model::LoadFormat::kAuto, be_, false);
  }
  static EngineConfig config(bool cached, int32_t budget = 1024) {
    EngineConfig c;
    c.max_num_seqs = 4;
    c.max_num_batched_tokens = budget;
    c.enable_prefix_caching = cached;
    c.num_snapshots = cached ? 16 : 0;
    c.mamba_block_size = 64;
    c.max_model_len = 512;
    return c;
  }
  // Each request alone on an engine without the cache.
  std::vector<Result> uncached(const std::vector<GenerateRequest>& reqs, int32_t budget = 1024) {
    Engine e(*model_, config(false, budget));
    std::vector<Result> out;
    for (const auto& r : reqs) out.push_back(collect(*e.submit(r)));
    return out;
  }
  static Result run(Engine& e, const GenerateRequest& r) { return collect(*e.submit(r)); }

  backend::CpuBackend be_;
  std::unique_ptr<model::Qwen35Model> model_;
};

TEST_F(PrefixCacheTest, IdenticalPromptsHitAndMatchTheUncachedRun) {
  for (const int len : {64, 65, 100, 128, 129, 300}) {
    GenerateRequest req = greedy(random_prompt(len, static_cast<uint32_t>(len), kVocab));
    const Result want = uncached({req})[0];
    Engine e(*model_, config(true));
    const Result first = run(e, req), second = run(e, req);
    const std::string what = "prompt of " + std::to_string(len);
    EXPECT_EQ(first.cached_tokens, 0) << what;
    // The last grid point before the prompt's end (one token is always recomputed).
    EXPECT_EQ(second.cached_tokens, (len - 1) / 64 * 64) << what;
    expect_identical(first, want, what + " (miss)");
    expect_identical(second, want, what + " (hit)");
    const MetricsSnapshot m = e.metrics();
    EXPECT_EQ(m.prefix_cache_queries, 2 * len);
    EXPECT_EQ(m.prefix_cache_hits, second.cached_tokens);
    EXPECT_EQ(m.kv_pages_used, 0);
  }
}

// With an fp8 KV cache a hit reads the same e4m3 pages the uncached run wrote and read back (the
// prefill's own keys go through the cache too): bit-identical tokens and logprobs.
TEST_F(PrefixCacheTest, Fp8KvCacheHitsMatchTheUncachedRun) {
  for (const int len : {65, 129, 300}) {
    const GenerateRequest req = greedy(random_prompt(len, static_cast<uint32_t>(len) + 7, kVocab));
    EngineConfig plain = config(false), cached = config(true);
    plain.kv_cache_fp8 = cached.kv_cache_fp8 = true;
    Engine u(*model_, plain);
    const Result want = run(u, req);
    EXPECT_NE(want.logprobs.front().logprob, uncached({req})[0].logprobs.front().logprob)
        << "the fp8 cache is in use";
    Engine e(*model_, cached);
    const Result first = run(e, req), second = run(e, req);
    const std::string what = "fp8 KV, prompt of " + std::to_string(len);
    EXPECT_EQ(second.cached_tokens, (len - 1) / 64 * 64) << what;
    expect_identical(first, want, what + " (miss)");
    expect_identical(second, want, what + " (hit)");
  }
}

// The snapshot before the prompt's end is taken inside the prefill step (the GDN ops write it),
// so caching costs no extra step: one prefill step and three decode steps, as without the cache.
TEST_F(PrefixCacheTest, TheSnapshotBeforeThePromptsEndCostsNoExtraStep) {
  const GenerateRequest req = greedy(random_prompt(100, 13, kVocab), 4);
  Engine plain(*model_, config(false)), cached(*model_, config(true));
  const Result want = run(plain, req), first = run(cached, req);
  EXPECT_EQ(plain.metrics().steps, 4);
  EXPECT_EQ(cached.metrics().steps, 4);
  expect_identical(first, want, "miss");
  const Result hit = run(cached, req);
  EXPECT_EQ(hit.cached_tokens, 64);
  expect_identical(hit, want, "hit");
}

// A budget-limited chunk ends on the 64 grid (300 -> 256 tokens), so the next chunk starts on it
// and the snapshot at 384 is taken inside it: two steps, as without the cache.
TEST_F(PrefixCacheTest, BudgetCutChunksEndOnTheGrid) {
  const GenerateRequest req = greedy(random_prompt(400, 17, kVocab), 1);
  Engine plain(*model_, config(false, 300)), cached(*model_, config(true, 300));
  run(plain, req);
  const Result miss = run(cached, req);
  EXPECT_EQ(plain.metrics().steps, 2);
  EXPECT_EQ(cached.metrics().steps, 2);
  const Result hit = run(cached, req);
  EXPECT_EQ(hit.cached_tokens, 384);
  expect_identical(hit, miss, "hit");
}

TEST_F(PrefixCacheTest, SeededSamplingWithAHitDrawsTheSameTokens) {
  GenerateRequest req = greedy(random_prompt(150, 7, kVocab), 12);
  req.params.temperature = 0.9f;
  req.params.top_p = 0.9f;
  req.params.seed = 1234;
  const Result want = uncached({req})[0];
  Engine e(*model_, config(true));
  run(e, req);
  const Result hit = run(e, req);
  EXPECT_EQ(hit.cached_tokens, 128);
  expect_identical(hit, want, "seeded");
}

// n > 1: samples submitted together that name the first as their prefill leader wait for its
// prefill, whenever they reach the engine, and resume from it (192 of 200 prompt tokens cached),
// with the tokens and logprobs of solo runs. (Unlinked, samples that reach the engine while the
// first one's prefill is under way compute the whole prompt again.)
TEST_F(PrefixCacheTest, SamplesOfOnePromptShareItsPrefill) {
  GenerateRequest req = greedy(random_prompt(200, 21, kVocab), 6);
  req.params.temperature = 0.8f;
  std::vector<GenerateRequest> samples;
  for (uint64_t i = 0; i < 3; ++i) {
    samples.push_back(req);
    samples.back().params.seed = 40 + i;
  }
  const std::vector<Result> want = uncached(samples);
  Engine e(*model_, config(true));
  std::vector<std::shared_ptr<RequestStream>> streams;
  for (GenerateRequest s : samples) {
    if (!streams.empty()) s.prefill_leader = streams.front()->id();
    streams.push_back(e.submit(s));
  }
  for (size_t i = 0; i < streams.size(); ++i) {
    const Result got = collect(*streams[i]);
    EXPECT_EQ(got.cached_tokens, i > 0 ? 192 : 0) << "sample " << i;
    expect_identical(got, want[i], "sample " + std::to_string(i));
  }
  EXPECT_EQ(e.metrics().prefix_cache_hits, 2 * 192);
}

// The first request's only snapshot (192, before its prompt's end) is past the shared part; the
// second one's KV leaves the cache at the system prompt's end, so it snapshots at the last grid
// point before it (128, the junction) and later ones resume there.
TEST_F(PrefixCacheTest, SharedSystemPromptHitsFromTheThirdRequest) {
  const std::vector<int32_t> system = random_prompt(150, 1, kVocab);
  std::vector<GenerateRequest> reqs;
  for (uint32_t i = 0; i < 4; ++i)
    reqs.push_back(greedy(concat(system, random_prompt(100, 100 + i, kVocab))));
  const std::vector<Result> want = uncached(reqs);
  Engine e(*model_, config(true));
  const int32_t expected_cached[] = {0, 0, 128, 128};
  for (size_t i = 0; i < reqs.size(); ++i) {
    const Result got = run(e, reqs[i]);
    EXPECT_EQ(got.cached_tokens, expected_cached[i]) << "request " << i;
    expect_identical(got, want[i], "request " + std::to_string(i));
  }
}

// A 300-token prompt prefilled in 64-token chunks leaves snapshots at 64, 128, 192 and 256; a
// prompt sharing its first k tokens resumes at the last of those within its cached KV.
TEST_F(PrefixCacheTest, PartialHitsAtEveryAlignment) {
  const std::vector<int32_t> base = random_prompt(300, 3, kVocab);
  for (const int k : {15, 16, 17, 63, 64, 65, 127, 128, 129, 200, 255, 256, 257, 299, 300}) {
    const std::vector<int32_t> head(base.begin(), base.begin() + k);
    const GenerateRequest req = greedy(concat(head, random_prompt(40, 500 + k, kVocab)));
    const Result want = uncached({req}, 64)[0];
    Engine e(*model_, config(true, 64));
    run(e, greedy(base));
    const Result got = run(e, req);
    EXPECT_EQ(got.cached_tokens, k / 64 * 64) << "shared " << k;
    expect_identical(got, want, "shared " + std::to_string(k));
  }
}

// 40 pages and 3 snapshots for ten 120-token prompts: the cache evicts (pages and snapshots, least
// recently released first) and what it keeps still resumes exactly.
TEST_F(PrefixCacheTest, EvictionUnderMemoryPressureKeepsTheRecentPrefixes) {
  std::vector<GenerateRequest> reqs;
  for (uint32_t i = 0; i < 10; ++i) reqs.push_back(greedy(random_prompt(120, 40 + i, kVocab)));
  const std::vector<Result> want = uncached(reqs);
  EngineConfig c = config(true);
  c.num_pages = 40;
  c.num_snapshots = 3;
  Engine e(*model_, c);
  for (size_t i = 0; i < reqs.size(); ++i) expect_identical(run(e, reqs[i]), want[i], "first pass");
  const Result old = run(e, reqs[0]), recent = run(e, reqs[9]);
  EXPECT_EQ(old.cached_tokens, 0) << "evicted long ago";
  EXPECT_EQ(recent.cached_tokens, 64);
  expect_identical(old, want[0], "evicted");
  expect_identical(recent, want[9], "kept");
  // All at once: admission takes evictable pages, and nothing any request holds is evicted.
  std::vector<std::shared_ptr<RequestStream>> streams;
  for (const auto& r : reqs) streams.push_back(e.submit(r));
  for (size_t i = 0; i < reqs.size(); ++i)
    expect_identical(collect(*streams[i]), want[i], "together " + std::to_string(i));
  EXPECT_EQ(e.metrics().kv_pages_used, 0);
}

// Too few pages for three requests sharing a cached prefix: the youngest is preempted while it
// holds shared pages, and resumes (from the cache) once the others finish. A recompute runs the
// generated tokens as a prefill instead of one at a time, so logprobs agree to rounding there.
TEST_F(PrefixCacheTest, PreemptingARequestThatHoldsSharedPages) {
  const std::vector<int32_t> prefix = random_prompt(130, 9, kVocab);
  std::vector<GenerateRequest> reqs;
  for (uint32_t i = 0; i < 3; ++i)
    reqs.push_back(greedy(concat(prefix, random_prompt(20, 200 + i, kVocab)), 60));
  const std::vector<Result> want = uncached(reqs);
  EngineConfig c = config(true);
  c.max_model_len = 256;
  c.num_pages = 22;
  c.admission_reserve_tokens = 0;  // admitted on their prompts' room: decode growth preempts
  Engine e(*model_, c);
  run(e, greedy(prefix, 1));
  std::vector<std::shared_ptr<RequestStream>> streams;
  for (const auto& r : reqs) streams.push_back(e.submit(r));
  for (size_t i = 0; i < reqs.size(); ++i) {
    const Result got = collect(*streams[i]);
    EXPECT_EQ(got.tokens, want[i].tokens) << "request " << i;
    ASSERT_EQ(got.logprobs.size(), want[i].logprobs.size());
    for (size_t t = 0; t < got.logprobs.size(); ++t)
      EXPECT_NEAR(got.logprobs[t].logprob, want[i].logprobs[t].logprob, 1e-4);
  }
  const MetricsSnapshot m = e.metrics();
  EXPECT_GT(m.preemptions, 0);
  EXPECT_GT(m.prefix_cache_hits, 0);
  EXPECT_EQ(m.kv_pages_used, 0);
}

TEST_F(PrefixCacheTest, AbortingARequestThatHoldsSharedPagesReleasesThem) {
  const std::vector<int32_t> prefix = random_prompt(140, 11, kVocab);
  const GenerateRequest keeper = greedy(concat(prefix, random_prompt(10, 1, kVocab)), 20);
  GenerateRequest doomed = greedy(concat(prefix, random_prompt(10, 2, kVocab)), 300);
  const Result want = uncached({keeper})[0];
  Engine e(*model_, config(true));
  run(e, greedy(prefix, 1));
  auto sd = e.submit(doomed);
  auto sk = e.submit(keeper);
  OutputDelta d;
  for (int i = 0; i < 3; ++i) ASSERT_TRUE(sd->next(d, 60s));
  e.abort(sd->id());
  const Result aborted = collect(*sd);
  EXPECT_EQ(aborted.reason, FinishReason::kAbort);
  EXPECT_EQ(aborted.cached_tokens, 128);
  const Result kept = collect(*sk);
  EXPECT_EQ(kept.cached_tokens, 128);
  expect_identical(kept, want, "keeper");
  EXPECT_EQ(e.metrics().kv_pages_used, 0);
  EXPECT_EQ(run(e, keeper).cached_tokens, 128);
}

TEST_F(PrefixCacheTest, NoCacheMeansNoHitsAndNoSnapshots) {
  const GenerateRequest req = greedy(random_prompt(200, 5, kVocab));
  Engine e(*model_, config(false));
  run(e, req);
  EXPECT_EQ(run(e, req).cached_tokens, 0);
  EXPECT_EQ(e.metrics().prefix_cache_queries, 0);
  EXPECT_EQ(e.metrics().prefix_cache_blocks, 0);
}

TEST(PrefixCacheTp, TwoRanksHitAndMatchTheUncachedRun) {
  const std::string dir = (deltaserve::testing::test_data() / "tiny_real").string();
  const std::vector<int32_t> system = random_prompt(150, 21, kVocab);
  std::vector<GenerateRequest> reqs;
  for (uint32_t i = 0; i < 3; ++i)
    reqs.push_back(greedy(concat(system, random_prompt(100, 300 + i, kVocab))));
  reqs.push_back(reqs[0]);  // an identical prompt
  auto run_all = [&](bool cached) {
    auto exec = tp_executor(dir, 2);
    EngineConfig c;
    c.max_num_seqs = 4;
    c.enable_prefix_caching = cached;
    c.num_snapshots = cached ? 8 : 0;
    Engine e(*exec, c);
    std::vector<Result> out;
    for (const auto& r : reqs) out.push_back(collect(*e.submit(r)));
    return out;
  };
  const std::vector<Result> want = run_all(false), got = run_all(true);
  const int32_t expected_cached[] = {0, 0, 128, 192};
  for (size_t i = 0; i < reqs.size(); ++i) {
    EXPECT_EQ(got[i].cached_tokens, expected_cached[i]) << "request " << i;
    expect_identical(got[i], want[i], "rank-parallel request " + std::to_string(i));
  }
}

TEST_F(PrefixCacheTest, RejectsABlockSizeOffThePageGrid) {
  EngineConfig c = config(true);
  c.mamba_block_size = 40;
  EXPECT_THROW(Engine(*model_, c), Error);
}

}  // namespace
}  // namespace deltaserve::engine
