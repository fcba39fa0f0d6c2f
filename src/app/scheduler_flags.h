// The scheduler's step flags, shared by `serve`, `bench offline` and bench/sched_sim:
//   --max-num-batched-tokens N        tokens a step (vLLM's)
//   --long-prefill-token-threshold N  a request's prefill chunk at most N tokens (vLLM's; 0: off)
//   --admission-reserve-tokens N      KV room kept at admission for up to N outputs of each
//                                     request (SchedulerConfig::admission_reserve_tokens; 0: the
//                                     prompts only)
#pragma once

#include <cstdint>

#include "app/args.h"

namespace deltaserve::app {

struct SchedulerFlags {
  int32_t max_num_batched_tokens = 0, long_prefill_token_threshold = 0,
          admission_reserve_tokens = 0;
};

// The flags' values (max_num_batched_tokens defaulting to `batched_tokens`); throws
// deltaserve::Error for values out of range.
SchedulerFlags scheduler_flags(const Args& a, int32_t batched_tokens);

}  // namespace deltaserve::app
