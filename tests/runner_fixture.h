// Test helpers for running a model directly: a ModelRunner with a fixed number of KV pages and
// state slots (its step buffers grow to whatever step a test runs).
#pragma once

#include <memory>

#include "engine/executor.h"
#include "runtime/model_runner.h"

namespace deltaserve::testing {

inline std::unique_ptr<runtime::ModelRunner> make_runner(
    model::Qwen35Model& m, int32_t pages, int32_t page_size, int32_t slots, int32_t max_tokens = 64,
    int32_t snapshots = 0, DType state_dtype = DType::kF32, bool kv_cache_fp8 = false) {
  runtime::PlanLimits limits;
  limits.num_snapshots = snapshots;
  limits.state_dtype = state_dtype;
  limits.kv_cache_fp8 = kv_cache_fp8;
  limits.max_num_seqs = slots;
  limits.max_num_batched_tokens = max_tokens;
  limits.max_model_len = page_size;  // any request fits: pages are the test's bookkeeping
  limits.page_size = page_size;
  runtime::MemoryBudget budget;
  budget.pages = pages;
  return std::make_unique<runtime::ModelRunner>(m, runtime::plan_for(m, limits, budget));
}

// The same plan for every rank of an executor.
inline void configure_executor(engine::Executor& ex, int32_t pages, int32_t page_size,
                               int32_t slots, int32_t max_tokens = 64,
                               DType state_dtype = DType::kF32, bool kv_cache_fp8 = false) {
  runtime::PlanLimits limits;
  limits.state_dtype = state_dtype;
  limits.kv_cache_fp8 = kv_cache_fp8;
  limits.max_num_seqs = slots;
  limits.max_num_batched_tokens = max_tokens;
  limits.max_model_len = page_size;
  limits.page_size = page_size;
  runtime::MemoryBudget budget;
  budget.pages = pages;
  ex.configure(ex.plan_memory(limits, budget));
}

}  // namespace deltaserve::testing
