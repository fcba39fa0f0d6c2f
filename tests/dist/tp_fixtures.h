// Shared by the CPU and GPU tensor-parallel tests: a dummy checkpoint whose head counts allow TP4
// and a step scenario (prefills, a mixed step, decode rows) over three sequences.
#pragma once

#include <exception>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "backend/cpu/cpu_backend.h"
#include "dist/communicator.h"
#include "model/config.h"
#include "model/qwen35.h"
#include "model/safetensors.h"
#include "model/weights.h"
#include "test_util.h"

namespace deltaserve {

// A dummy checkpoint whose head counts allow TP4 (KV heads replicated 2x at TP4), untied.
inline std::filesystem::path make_tp4_checkpoint(const testing::TempDir& d) {
  const std::string cfg =
      R"({"model_type": "qwen3_5", "tie_word_embeddings": false, "text_config": {
    "model_type": "qwen3_5_text", "vocab_size": 97, "hidden_size": 64, "intermediate_size": 96,
    "num_hidden_layers": 4, "layer_types": ["linear_attention", "full_attention", "linear_attention", "full_attention"],
    "num_attention_heads": 8, "num_key_value_heads": 2, "head_dim": 32, "linear_num_key_heads": 4,
    "linear_num_value_heads": 8, "linear_key_head_dim": 16, "linear_value_head_dim": 24,
    "linear_conv_kernel_dim": 4, "max_position_embeddings": 1024,
    "rope_parameters": {"rope_theta": 10000.0, "partial_rotary_factor": 0.5}}})";
  std::ofstream(d.path() / "config.json") << cfg;
  const model::ModelConfig c = model::parse_model_config(cfg, "cfg");
  backend::CpuBackend be;
  const model::ModelWeights w = model::dummy_weights(c, be, 11);
  model::ModelWeights names;
  const auto specs = model::weight_specs(c, names);
  std::vector<model::TensorToWrite> tw;
  for (size_t i = 0; i < specs.size(); ++i) {
    const std::string name =
        specs[i].name == "lm_head.weight" ? specs[i].name : "model.language_model." + specs[i].name;
    tw.push_back({name, DType::kF32, specs[i].shape, w.by_spec[i].data});
  }
  model::write_safetensors(d.path() / "model.safetensors", tw);
  return d.path();
}

// One part of a step: `n` tokens of sequence `seq` after `start` cached ones.
struct StepPart {
  int seq, n, start;
};

// The steps of `plan` (every row's logits sampled) with random ids from `seed`.
inline std::vector<StepBatch> steps_of(int vocab, const std::vector<std::vector<StepPart>>& plan,
                                       uint32_t seed) {
  std::mt19937 gen(seed);
  auto ids = [&](int n) {
    std::vector<int32_t> v(static_cast<size_t>(n));
    for (auto& x : v) x = static_cast<int32_t>(gen() % static_cast<uint32_t>(vocab));
    return v;
  };
  std::vector<StepBatch> steps;
  for (const auto& parts : plan) {
    StepBatchBuilder b(16);
    for (const StepPart& p : parts) {
      std::vector<int32_t> pages;
      for (int q = 0; q * 16 < p.start + p.n; ++q) pages.push_back(p.seq * 16 + q);
      b.add(0, ids(p.n), p.start, p.seq, pages, p.n);
    }
    steps.push_back(b.build());
  }
  return steps;
}

// Prefill chunks, decode rows and mixed steps over three sequences (all rows' logits).
inline std::vector<StepBatch> scenario(int vocab) {
  return steps_of(vocab,
                  {
                      {{0, 40, 0}, {1, 7, 0}},              // two prefills
                      {{0, 1, 40}, {1, 30, 7}, {2, 5, 0}},  // decode + chunked + new prefill
                      {{0, 1, 41}, {1, 1, 37}, {2, 1, 5}},  // decode rows only
                  },
                  5);
}

// Steps whose token counts TP2 and TP4 divide: two prefills (48), a mixed step of decode rows,
// a chunked prefill and a new prefill (36), decode rows only (4).
inline std::vector<StepBatch> divisible_scenario(int vocab) {
  return steps_of(vocab,
                  {
                      {{0, 40, 0}, {1, 8, 0}},
                      {{0, 1, 40}, {1, 30, 8}, {2, 5, 0}},
                      {{0, 1, 41}, {1, 1, 38}, {2, 1, 5}, {3, 1, 0}},
                  },
                  9);
}

// Runs rank(r, group) on N threads of an in-process group; the first exception poisons the group
// (releasing ranks waiting in a collective) and is rethrown after every thread joined.
template <class RankFn>
void run_ranks(int N, RankFn&& rank) {
  dist::LocalGroup g(N);
  std::vector<std::thread> ts;
  std::exception_ptr err;
  std::mutex mu;
  for (int r = 0; r < N; ++r)
    ts.emplace_back([&, r] {
      try {
        rank(r, g);
      } catch (...) {
        std::lock_guard<std::mutex> lock(mu);
        if (!err) err = std::current_exception();
        g.poison("rank failed");
      }
    });
  for (auto& t : ts) t.join();
  if (err) std::rethrow_exception(err);
}

}  // namespace deltaserve
