// Shared by the engine tests: collecting a request's stream, random prompts, and an engine
// executor over CPU tensor-parallel ranks (optionally with a rank whose collectives fail).
#pragma once

#include <gtest/gtest.h>

#include <chrono>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "backend/cpu/cpu_backend.h"
#include "dist/faulty_comm.h"
#include "engine/engine.h"
#include "model/loader.h"

namespace deltaserve::engine {

struct Result {
  std::vector<int32_t> tokens;
  std::vector<TokenLogprob> logprobs;
  std::string text;
  FinishReason reason = FinishReason::kNone;
  int deltas = 0;
  int32_t cached_tokens = 0;
};

inline Result collect(RequestStream& s) {
  Result r;
  OutputDelta d;
  while (true) {
    EXPECT_TRUE(s.next(d, std::chrono::seconds(60))) << "engine stalled";
    ++r.deltas;
    r.tokens.insert(r.tokens.end(), d.token_ids.begin(), d.token_ids.end());
    r.logprobs.insert(r.logprobs.end(), d.logprobs.begin(), d.logprobs.end());
    r.text += d.text;
    if (d.finished) {
      r.reason = d.finish_reason;
      r.cached_tokens = d.cached_tokens;
      return r;
    }
  }
}

// Greedy decoding of exactly max_tokens tokens (EOS ignored).
inline SamplingParams greedy(int32_t max_tokens) {
  SamplingParams p;
  p.temperature = 0;
  p.ignore_eos = true;
  p.max_tokens = max_tokens;
  return p;
}

inline std::vector<int32_t> random_prompt(int n, uint32_t seed, int vocab) {
  std::mt19937 g(seed);
  std::vector<int32_t> v(static_cast<size_t>(n));
  for (int32_t& x : v) x = static_cast<int32_t>(g() % static_cast<uint32_t>(vocab));
  return v;
}

// Fault-injecting communicators must outlive the executor's models.
inline std::vector<std::unique_ptr<deltaserve::testing::FaultyComm>> g_faults;

inline std::unique_ptr<TpExecutor> tp_executor(const std::string& dir, int n, int faulty_rank = -1,
                                               int fail_at = 0, dist::TpspConfig tpsp = {}) {
  auto* faults = &g_faults;
  return std::make_unique<TpExecutor>(
      n, [](int) { return std::make_unique<backend::CpuBackend>(); },
      [=](int rank, backend::Backend& be, dist::Communicator* comm) {
        if (rank == faulty_rank) {
          faults->push_back(std::make_unique<deltaserve::testing::FaultyComm>(comm, fail_at));
          comm = faults->back().get();
        }
        auto m = model::load_model(dir, model::LoadFormat::kAuto, be, false, {n, rank}, comm);
        m->set_tpsp(tpsp);
        return m;
      },
      std::chrono::seconds(20));
}

}  // namespace deltaserve::engine
