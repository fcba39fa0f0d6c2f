// The step batches and plans of the model-level GPU benches (gpu_bench, overlap_bench): decode
// rows on pages of their own, fresh prefills, serving's mixed steps; list flags, timed steps and
// medians.
#pragma once

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

#include "core/step_batch.h"
#include "runtime/memory_plan.h"

namespace deltaserve::bench {

inline std::vector<int32_t> parse_list(const std::string& s) {
  std::vector<int32_t> v;
  size_t i = 0;
  while (i < s.size()) {
    const size_t j = s.find(',', i);
    v.push_back(std::stoi(s.substr(i, j == std::string::npos ? std::string::npos : j - i)));
    if (j == std::string::npos) break;
    i = j + 1;
  }
  return v;
}

inline double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0.0 : v[v.size() / 2];
}

// The wall milliseconds of `step()` (a step that waits for its results, e.g. forward_sample).
template <class Step>
double elapsed_ms(Step&& step) {
  const auto t0 = std::chrono::steady_clock::now();
  step();
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
}

// The median of `n` timed calls of `step()` after `warmup` untimed ones.
template <class Step>
double median_ms(Step&& step, int n, int warmup) {
  for (int i = 0; i < warmup; ++i) step();
  std::vector<double> t;
  for (int i = 0; i < n; ++i) t.push_back(elapsed_ms(step));
  return median(t);
}

// The plan of the bench runs: maxB decode sequences of pps pages and one prefill of ppp pages on
// slot maxB; steps of up to `tokens` tokens; graphs up to maxB.
inline runtime::PlanLimits bench_limits(int32_t page, int32_t maxB, int32_t tokens, int32_t pps,
                                        int32_t ppp, DType state = DType::kF32,
                                        bool kv_fp8 = false) {
  runtime::PlanLimits l;
  l.state_dtype = state;
  l.kv_cache_fp8 = kv_fp8;
  l.max_num_seqs = maxB + 1;
  l.max_num_batched_tokens = tokens;
  l.max_model_len = page * std::max(pps, ppp);
  l.page_size = page;
  l.max_graph_batch = maxB;
  return l;
}

inline runtime::MemoryBudget bench_budget(int32_t pages) {
  runtime::MemoryBudget b;
  b.pages = pages;
  return b;
}

// Adds B decode rows at context `ctx`: sequence r on slot r with pages [r * pps, (r + 1) * pps).
inline void add_decode_rows(StepBatchBuilder& b, int32_t B, int32_t V, int32_t ctx, int32_t pps) {
  for (int32_t r = 0; r < B; ++r) {
    std::vector<int32_t> pages;
    for (int32_t q = 0; q < pps; ++q) pages.push_back(r * pps + q);
    b.add(0, std::vector<int32_t>{(r * 7919 + 11) % V}, ctx, r, pages, 1);
  }
}

inline StepBatch decode_batch(int32_t B, int32_t V, int32_t ctx, int32_t page, int32_t pps) {
  StepBatchBuilder b(page);
  add_decode_rows(b, B, V, ctx, pps);
  return b.build();
}

// Adds one fresh prefill of N tokens on `slot` with pages [first, first + ppp), its last row
// sampled.
inline void add_prefill(StepBatchBuilder& b, int32_t N, int32_t V, int32_t slot, int32_t first,
                        int32_t ppp) {
  std::vector<int32_t> ids, pages;
  for (int32_t i = 0; i < N; ++i)  // 64-bit: i * 104729 overflows int32 past 20,504 tokens
    ids.push_back(static_cast<int32_t>((int64_t{i} * 104729 + 7) % V));
  for (int32_t q = 0; q < ppp; ++q) pages.push_back(first + q);
  b.add(0, ids, 0, slot, pages, 1);
}

inline StepBatch prefill_batch(int32_t N, int32_t V, int32_t page, int32_t slot, int32_t first,
                               int32_t ppp) {
  StepBatchBuilder b(page);
  add_prefill(b, N, V, slot, first, ppp);
  return b.build();
}

// A step of serving under load: B decode rows at context ctx (as decode_batch), then a fresh
// prefill chunk of N - B tokens (as prefill_batch).
inline StepBatch mixed_batch(int32_t B, int32_t N, int32_t V, int32_t ctx, int32_t page,
                             int32_t pps, int32_t ppp) {
  StepBatchBuilder b(page);
  add_decode_rows(b, B, V, ctx, pps);
  add_prefill(b, N - B, V, B, B * pps, ppp);
  return b.build();
}

}  // namespace deltaserve::bench
