// The engine end to end on the CPU backend with the tiny_real checkpoint (and, for text and stop
// strings, the embedded default model with the real Qwen3 tokenizer).
#include "engine/engine.h"

#include <gtest/gtest.h>

#include <random>
#include <thread>

#include "backend/cpu/cpu_backend.h"
#include "core/error.h"
#include "engine/engine_fixtures.h"
#include "model/loader.h"
#include "test_util.h"
#include "tokenizer/tokenizer.h"

namespace deltaserve::engine {
namespace {

using namespace std::chrono_literals;

class EngineTest : public ::testing::Test {
 protected:
  void SetUp() override {
    model_ = model::load_model((deltaserve::testing::test_data() / "tiny_real").string(),
                               model::LoadFormat::kAuto, be_, false);
  }
  // Runs each request alone (one at a time through one engine) and returns the results.
  std::vector<Result> alone(const std::vector<GenerateRequest>& reqs, EngineConfig cfg = {}) {
    std::vector<Result> out;
    Engine e(*model_, cfg);
    for (const GenerateRequest& r : reqs) out.push_back(collect(*e.submit(r)));
    return out;
  }
  std::vector<Result> together(const std::vector<GenerateRequest>& reqs, EngineConfig cfg,
                               MetricsSnapshot* m = nullptr) {
    Engine e(*model_, cfg);
    std::vector<std::shared_ptr<RequestStream>> streams;
    for (const GenerateRequest& r : reqs) streams.push_back(e.submit(r));
    std::vector<Result> out;
    for (auto& s : streams) out.push_back(collect(*s));
    if (m) *m = e.metrics();
    return out;
  }

  backend::CpuBackend be_;
  std::unique_ptr<model::Qwen35Model> model_;
};

std::vector<GenerateRequest> mixed_requests(const SamplingParams& p) {
  std::vector<GenerateRequest> reqs;
  int i = 0;
  for (int len : {5, 40, 130, 3, 77, 200, 1, 64}) {
    GenerateRequest r{random_prompt(len, 100 + static_cast<uint32_t>(i), 384), p};
    r.params.max_tokens = 6 + i % 5;
    if (p.seed) r.params.seed = *p.seed + static_cast<uint64_t>(i);
    reqs.push_back(r);
    ++i;
  }
  return reqs;
}

TEST_F(EngineTest, GreedyIsBatchInvariantAndMixedLogitsMatchAlone) {
  SamplingParams p;
  p.temperature = 0;
  p.ignore_eos = true;
  p.top_logprobs = 5;
  const auto reqs = mixed_requests(p);
  const auto ref = alone(reqs);
  EngineConfig busy;
  busy.max_num_batched_tokens = 48;  // long prompts chunk-prefill while others decode
  busy.max_num_seqs = 3;             // slots are reused
  MetricsSnapshot m;
  const auto got = together(reqs, busy, &m);
  for (size_t i = 0; i < reqs.size(); ++i) {
    EXPECT_EQ(got[i].tokens, ref[i].tokens) << "request " << i;
    EXPECT_EQ(got[i].reason, FinishReason::kLength);
    ASSERT_EQ(got[i].logprobs.size(), ref[i].logprobs.size());
    for (size_t t = 0; t < got[i].logprobs.size(); ++t)
      for (size_t k = 0; k < 5; ++k) {
        EXPECT_EQ(got[i].logprobs[t].top[k].first, ref[i].logprobs[t].top[k].first);
        EXPECT_NEAR(got[i].logprobs[t].top[k].second, ref[i].logprobs[t].top[k].second, 1e-4);
      }
  }
  EXPECT_GT(m.steps, 10);
  EXPECT_EQ(m.requests_finished, static_cast<int64_t>(reqs.size()));
  EXPECT_EQ(m.kv_pages_used, 0);
}

TEST_F(EngineTest, SeededSamplingIsReproducibleAcrossBatchCompositions) {
  SamplingParams p;
  p.temperature = 0.9f;
  p.top_p = 0.9f;
  p.top_k = 50;
  p.ignore_eos = true;
  p.seed = 1234;
  const auto reqs = mixed_requests(p);
  const auto ref = alone(reqs);
  EngineConfig busy;
  busy.max_num_batched_tokens = 32;
  busy.max_num_seqs = 4;
  const auto got = together(reqs, busy);
  for (size_t i = 0; i < reqs.size(); ++i)
    EXPECT_EQ(got[i].tokens, ref[i].tokens) << "request " << i;
  // A different seed changes the output (the test can fail).
  auto other = reqs;
  for (auto& r : other) r.params.seed = *r.params.seed + 1000;
  const auto diff = together(other, busy);
  int same = 0;
  for (size_t i = 0; i < reqs.size(); ++i) same += diff[i].tokens == ref[i].tokens;
  EXPECT_LT(same, static_cast<int>(reqs.size()));
}

// Eight requests of up to 10 pages each against 20 pages.
std::vector<GenerateRequest> pressure_requests() {
  SamplingParams p;
  p.temperature = 0;
  p.ignore_eos = true;
  std::vector<GenerateRequest> reqs;
  for (int i = 0; i < 8; ++i) {
    GenerateRequest r{random_prompt(60 + 10 * i, 500 + static_cast<uint32_t>(i), 384), p};
    r.params.max_tokens = 40;
    reqs.push_back(r);
  }
  return reqs;
}

EngineConfig pressure_config() {
  EngineConfig cfg;
  cfg.max_model_len = 256;
  cfg.page_size = 16;
  cfg.num_pages = 20;  // one request needs up to 10 pages; eight want ~60
  cfg.max_num_seqs = 8;
  cfg.max_num_batched_tokens = 256;
  return cfg;
}

// With no output room reserved at admission (vLLM's policy), decode growth preempts and the
// preempted requests recompute to the same tokens.
TEST_F(EngineTest, MorePressureThanPagesStillCompletesCorrectly) {
  const std::vector<GenerateRequest> reqs = pressure_requests();
  EngineConfig cfg = pressure_config();
  cfg.admission_reserve_tokens = 0;
  const auto ref = alone(reqs, cfg);
  MetricsSnapshot m;
  const auto got = together(reqs, cfg, &m);
  for (size_t i = 0; i < reqs.size(); ++i) {
    EXPECT_EQ(got[i].tokens, ref[i].tokens) << "request " << i;
    EXPECT_EQ(got[i].tokens.size(), 40u);
  }
  EXPECT_GT(m.preemptions, 0);
  EXPECT_EQ(m.kv_pages_used, 0);
}

// With the default reserve the same pressure is met by waiting: nothing is preempted.
TEST_F(EngineTest, AdmissionRoomAvoidsPreemptionUnderPressure) {
  const std::vector<GenerateRequest> reqs = pressure_requests();
  const EngineConfig cfg = pressure_config();
  const auto ref = alone(reqs, cfg);
  MetricsSnapshot m;
  const auto got = together(reqs, cfg, &m);
  for (size_t i = 0; i < reqs.size(); ++i) EXPECT_EQ(got[i].tokens, ref[i].tokens) << i;
  EXPECT_EQ(m.preemptions, 0);
  EXPECT_EQ(m.kv_pages_used, 0);
}

TEST_F(EngineTest, AbortMidPrefillAndMidDecodeFreesEverything) {
  EngineConfig cfg;
  cfg.max_num_batched_tokens = 16;  // a 1,000-token prompt takes ~60 steps to prefill
  Engine e(*model_, cfg);
  SamplingParams p;
  p.ignore_eos = true;
  p.max_tokens = 2000;
  auto decoding = e.submit({random_prompt(8, 2, 384), p});  // first: FCFS admits it first
  auto prefilling = e.submit({random_prompt(1000, 1, 384), p});
  OutputDelta d;
  for (int i = 0; i < 3; ++i) ASSERT_TRUE(decoding->next(d, 60s));  // decoding for sure
  EXPECT_FALSE(d.finished);
  e.abort(prefilling->id());
  e.abort(decoding->id());
  const Result a = collect(*prefilling), b = collect(*decoding);
  EXPECT_EQ(a.reason, FinishReason::kAbort);
  EXPECT_TRUE(a.tokens.empty());  // aborted before its first token
  EXPECT_EQ(b.reason, FinishReason::kAbort);
  const MetricsSnapshot m = e.metrics();
  EXPECT_EQ(m.kv_pages_used, 0);
  EXPECT_EQ(m.running + m.waiting, 0);
  EXPECT_EQ(m.requests_aborted, 2);
  e.abort(12345);  // unknown ids are ignored
  // The engine still serves, and a reused slot shows no stale state.
  SamplingParams g;
  g.temperature = 0;
  g.ignore_eos = true;
  g.max_tokens = 8;
  const GenerateRequest probe{random_prompt(30, 3, 384), g};
  EXPECT_EQ(collect(*e.submit(probe)).tokens, alone({probe})[0].tokens);
}

TEST_F(EngineTest, RejectsBadRequestsUpFront) {
  EngineConfig cfg;
  cfg.max_model_len = 64;
  Engine e(*model_, cfg);
  SamplingParams p;
  p.max_tokens = 10;
  EXPECT_THROW(e.submit({random_prompt(60, 1, 384), p}), Error);  // 60 + 10 > 64
  EXPECT_THROW(e.submit({{}, p}), Error);
  EXPECT_THROW(e.submit({{1, 384}, p}), Error);
  p.top_p = 2;
  EXPECT_THROW(e.submit({{1, 2}, p}), Error);
  p = SamplingParams{};
  p.stop = {"x"};
  EXPECT_THROW(e.submit({{1, 2}, p}), Error);  // no tokenizer
  EngineConfig tiny;
  tiny.max_model_len = 256;
  tiny.num_pages = 3;
  tiny.page_size = 16;
  EXPECT_THROW(Engine(*model_, tiny), Error);  // one request of 256 tokens needs 16 pages
  EngineConfig negative_reserve;
  negative_reserve.admission_reserve_tokens = -1;
  EXPECT_THROW(Engine(*model_, negative_reserve), Error);
}

// serve's default (--max-model-len auto): the model's context (tiny_real: 4,096) where memory
// holds one such request, else what the KV pages hold, with requests checked against it.
TEST_F(EngineTest, FittedMaxModelLenIsTheContextOrWhatThePagesHold) {
  EngineConfig cfg;
  cfg.max_model_len = kFitMaxModelLen;
  runtime::MemoryBudget bytes;
  bytes.kind = runtime::MemoryBudget::Kind::kHostBytes;
  bytes.kv_bytes = 10 * runtime::page_bytes(model_->config(), DType::kF32, cfg.page_size);
  cfg.budget = bytes;
  Engine small(*model_, cfg);
  EXPECT_EQ(small.config().max_model_len, 10 * cfg.page_size);
  EXPECT_EQ(small.memory_plan().num_pages, 10);
  SamplingParams p = greedy(10);
  EXPECT_THROW(small.submit({random_prompt(151, 3, 384), p}), Error);  // 161 > 160
  EXPECT_EQ(collect(*small.submit({random_prompt(150, 3, 384), p})).tokens.size(), 10u);
  cfg.budget->kv_bytes = int64_t{1} << 30;
  EXPECT_EQ(Engine(*model_, cfg).config().max_model_len, model_->config().max_position_embeddings);
  cfg.max_model_len = -2;
  EXPECT_THROW(Engine(*model_, cfg), Error);
}

TEST_F(EngineTest, MaxTokensEosAndMetrics) {
  const auto started = std::chrono::steady_clock::now();
  Engine e(*model_, {});
  SamplingParams p = greedy(5);
  const auto prompt = random_prompt(12, 9, 384);
  const Result r = collect(*e.submit({prompt, p}));
  ASSERT_EQ(r.tokens.size(), 5u);
  // Make the 3rd generated token a stop token: generation ends there, the token included.
  p.stop_token_ids = {r.tokens[2]};
  p.max_tokens = 50;
  const Result s = collect(*e.submit({prompt, p}));
  EXPECT_EQ(s.reason, FinishReason::kStop);
  EXPECT_EQ(s.tokens, std::vector<int32_t>(r.tokens.begin(), r.tokens.begin() + 3));
  // min_tokens keeps it from stopping early.
  p.stop_token_ids = {r.tokens[0]};
  p.min_tokens = 4;
  p.max_tokens = 4;
  const Result t = collect(*e.submit({prompt, p}));
  EXPECT_EQ(t.tokens.size(), 4u);
  EXPECT_NE(t.tokens[0], r.tokens[0]);
  const MetricsSnapshot m = e.metrics();
  EXPECT_EQ(m.requests_finished, 3);
  EXPECT_EQ(m.prompt_tokens, 36);
  EXPECT_EQ(m.generation_tokens, 5 + 3 + 4);
  EXPECT_EQ(m.ttft.count, 3u);
  EXPECT_EQ(m.itl.count, 4u + 2u + 3u);
  // The engine thread's time splits into forwards and the work around them, within the wall time.
  const double wall =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
  EXPECT_GT(m.steps, 0);
  EXPECT_GT(m.forward_seconds, 0.0);
  EXPECT_GT(m.host_seconds, 0.0);
  EXPECT_LT(m.forward_seconds + m.host_seconds, wall);
}

TEST(EngineText, StopStringsAndStreamingTextWithRealTokenizer) {
  backend::CpuBackend be;
  auto m = model::load_model("", model::LoadFormat::kDummy, be, false);  // embedded default
  const auto tok =
      tokenizer::Tokenizer::from_file(deltaserve::testing::qwen3_tokenizer() / "tokenizer.json");
  EngineConfig cfg;
  cfg.max_model_len = 512;
  Engine e(*m, cfg, tok.get());
  SamplingParams p = greedy(24);
  const std::vector<int32_t> prompt = tok->encode("Hello there, how are you today?");
  const Result full = collect(*e.submit({prompt, p}));
  ASSERT_EQ(full.tokens.size(), 24u);
  EXPECT_EQ(full.text, tok->decode(full.tokens, true));  // streamed pieces == full decode
  EXPECT_GT(full.deltas, 1);
  // A stop string taken from the middle of that text.
  const std::string& text = full.text;
  size_t cut = text.size() / 2;
  while (cut < text.size() && (static_cast<unsigned char>(text[cut]) & 0xC0) == 0x80) ++cut;
  size_t len = 1;
  while (cut + len < text.size() && (static_cast<unsigned char>(text[cut + len]) & 0xC0) == 0x80)
    ++len;
  const std::string stop = text.substr(cut, len + 1 <= text.size() - cut ? len + 1 : len);
  p.stop = {stop};
  const Result s = collect(*e.submit({prompt, p}));
  EXPECT_EQ(s.reason, FinishReason::kStop);
  EXPECT_EQ(s.text, text.substr(0, text.find(stop)));
  EXPECT_EQ(s.text.find(stop), std::string::npos);
}

}  // namespace
}  // namespace deltaserve::engine

namespace deltaserve::engine {
namespace {

// The TP issue's lifecycle scenario on CPU ranks: a long request chunk-prefills while others
// decode, one is aborted mid-decode, a new request reuses its slot, and every output matches its
// solo run.
TEST(EngineTp, MixedLifecycleOnTwoRanksMatchesSoloRuns) {
  const std::string dir = (deltaserve::testing::test_data() / "tiny_real").string();
  SamplingParams p = greedy(10);
  const GenerateRequest longreq{random_prompt(300, 1, 384), p}, a{random_prompt(9, 2, 384), p},
      b{random_prompt(17, 3, 384), p}, late{random_prompt(33, 4, 384), p};
  GenerateRequest doomed{random_prompt(12, 5, 384), p};
  doomed.params.max_tokens = 500;
  backend::CpuBackend be;
  auto solo_model = model::load_model(dir, model::LoadFormat::kAuto, be, false);
  std::vector<std::vector<int32_t>> solo;
  {
    Engine e(*solo_model, {});
    for (const auto* r : {&longreq, &a, &b, &late}) solo.push_back(collect(*e.submit(*r)).tokens);
  }
  auto exec = tp_executor(dir, 2);
  EngineConfig cfg;
  cfg.max_num_seqs = 4;
  cfg.max_num_batched_tokens = 32;
  Engine e(*exec, cfg);
  auto sa = e.submit(a), sb = e.submit(b), sd = e.submit(doomed), sl = e.submit(longreq);
  OutputDelta d;
  for (int i = 0; i < 4; ++i)
    ASSERT_TRUE(sd->next(d, 60s));  // decoding while the long one prefills
  e.abort(sd->id());
  EXPECT_EQ(collect(*sd).reason, FinishReason::kAbort);
  auto sn = e.submit(late);  // takes the freed slot
  EXPECT_EQ(collect(*sl).tokens, solo[0]);
  EXPECT_EQ(collect(*sa).tokens, solo[1]);
  EXPECT_EQ(collect(*sb).tokens, solo[2]);
  EXPECT_EQ(collect(*sn).tokens, solo[3]);
  EXPECT_EQ(e.metrics().kv_pages_used, 0);
}

// A step failing mid-run: every in-flight request gets exactly one error naming the fault, later
// submissions fail at once (EngineFailedError), and shutdown does not hang.
void expect_fail_stop(Engine& e, const std::string& fault) {
  SamplingParams p;
  p.ignore_eos = true;
  p.max_tokens = 200;
  std::vector<std::shared_ptr<RequestStream>> streams;
  for (uint32_t i = 0; i < 3; ++i) streams.push_back(e.submit({random_prompt(20, 10 + i, 384), p}));
  for (auto& s : streams) {
    int finals = 0;
    OutputDelta d;
    FinishReason why = FinishReason::kNone;
    while (s->next(d, 60s)) {
      if (d.finished) {
        ++finals;
        why = d.finish_reason;
        EXPECT_NE(d.error.find(fault), std::string::npos) << d.error;
        break;
      }
    }
    EXPECT_EQ(finals, 1);
    EXPECT_EQ(why, FinishReason::kError);
    EXPECT_FALSE(s->next(d, 100ms)) << "more than one final delta";
  }
  EXPECT_NE(e.failure(), "");
  EXPECT_THROW(e.submit({{1, 2, 3}, p}), EngineFailedError);
}

// max_num_seqs 0 (serve without --max-num-seqs) with a budget that is no device share: the
// fallback, 64. And a plan that cannot fit is the caller's error, not a rank failure: the TP group
// serves afterwards.
TEST(EngineTp, DefaultMaxNumSeqsAndAPlanThatDoesNotFitLeaveTheGroupUsable) {
  const std::string dir = (deltaserve::testing::test_data() / "tiny_real").string();
  auto exec = tp_executor(dir, 2);
  runtime::PlanLimits too_long;
  too_long.max_model_len = 4096;
  runtime::MemoryBudget one_page;
  one_page.pages = 1;
  EXPECT_THROW(exec->plan_memory(too_long, one_page), Error);
  EngineConfig cfg;
  cfg.max_num_seqs = 0;
  cfg.max_model_len = 512;
  Engine e(*exec, cfg);
  EXPECT_EQ(e.config().max_num_seqs, runtime::kFallbackMaxNumSeqs);
  EXPECT_EQ(collect(*e.submit({random_prompt(20, 9, 384), greedy(4)})).tokens.size(), 4u);
}

// --max-model-len auto under TP: the rank with the fewest pages decides, and the engine serves
// requests up to the length its plan holds.
TEST(EngineTp, FittedMaxModelLenIsWhatEveryRankHolds) {
  const std::string dir = (deltaserve::testing::test_data() / "tiny_real").string();
  auto exec = tp_executor(dir, 2);
  EngineConfig cfg;
  cfg.max_model_len = kFitMaxModelLen;
  runtime::MemoryBudget bytes;
  bytes.kind = runtime::MemoryBudget::Kind::kHostBytes;
  bytes.kv_bytes = int64_t{64} << 10;
  cfg.budget = bytes;
  Engine e(*exec, cfg);
  EXPECT_EQ(e.config().max_model_len, e.memory_plan().num_pages * cfg.page_size);
  EXPECT_LT(e.config().max_model_len, 4096);
  const int32_t prompt = e.config().max_model_len - 4;
  EXPECT_EQ(collect(*e.submit({random_prompt(prompt, 5, 384), greedy(4)})).tokens.size(), 4u);
  EXPECT_THROW(e.submit({random_prompt(prompt + 1, 5, 384), greedy(4)}), Error);
}

TEST(EngineTp, RankFaultFailsEveryRequestOnceAndRefusesNewWork) {
  const std::string dir = (deltaserve::testing::test_data() / "tiny_real").string();
  auto exec = tp_executor(dir, 2, /*faulty_rank=*/1, /*fail_at=*/40);  // a few steps in
  {
    Engine e(*exec, {});
    expect_fail_stop(e, "injected fault");
  }
  EXPECT_THROW(exec->execute({}), DeviceError);  // the executor stays poisoned
}

// A CPU backend whose n-th SiLU-mul raises a device fault (as a CUDA error would).
class FaultyCpuBackend final : public backend::CpuBackend {
 public:
  explicit FaultyCpuBackend(int fail_at) : left_(fail_at) {}
  void silu_mul(const Tensor& gate, const Tensor& up, const Tensor& out) override {
    if (--left_ == 0) throw DeviceError("injected device fault");
    CpuBackend::silu_mul(gate, up, out);
  }

 private:
  int left_;
};

// The local executor fails the same way as the tensor-parallel one.
TEST(EngineLocal, DeviceFaultFailsEveryRequestOnceAndRefusesNewWork) {
  FaultyCpuBackend be(/*fail_at=*/40);
  auto model = model::load_model((deltaserve::testing::test_data() / "tiny_real").string(),
                                 model::LoadFormat::kAuto, be, false);
  Engine e(*model, {});
  expect_fail_stop(e, "injected device fault");
}

}  // namespace
}  // namespace deltaserve::engine
