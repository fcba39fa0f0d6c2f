// The scheduler alone (no model) on a closed-loop workload, as `bench serve` drives a server:
// `concurrency` clients, each sending a request of input_len tokens for output_len outputs as soon
// as its previous one finished, num_prompts in all. Each step's plan is committed as if it ran and
// every sampled row gets a token. What it counts (steps, preemptions, prefill tokens, a
// forward-time estimate from a linear step cost) lets a scheduling policy be compared on the CPU
// (bench/sched_sim) and its behaviour under KV pressure be tested.
#pragma once

#include <cstdint>

#include "engine/scheduler.h"

namespace deltaserve::engine {

struct ReplayWorkload {
  int32_t input_len = 8192, output_len = 1024, concurrency = 256, num_prompts = 512;
  // Each request's max_tokens (0: output_len); above output_len it stops early, as at an EOS.
  int32_t max_tokens = 0;
};

// A step's forward time: a fixed part, one per decode row, one per prefill token. The defaults are
// the H200's for the 4B shape at 8k context (84253db: decode 3.0 ms at B = 1 and 28.6 at B = 256,
// an 8k prefill 113.8 ms).
struct StepCost {
  double fixed_ms = 3.0, decode_row_ms = 0.1, prefill_token_ms = 113.76 / 8192;
};

struct ReplayCounts {
  int64_t steps = 0, preemptions = 0, prefill_tokens = 0, decode_rows = 0, max_running = 0;
  int64_t decode_only_steps = 0;  // steps with no prefill tokens
  int64_t finished = 0;
  double forward_ms = 0;  // by StepCost
};

// Throws deltaserve::Error if the scheduler plans an empty step while requests wait (a stall).
ReplayCounts replay_closed_loop(const SchedulerConfig& cfg, int32_t num_pages, int32_t page_size,
                                const ReplayWorkload& w, const StepCost& cost = {});

}  // namespace deltaserve::engine
