// The TPSP startup profile (serve --enable-tpsp without --tpsp-threshold-tokens): padding steps of
// 256, 512, ... tokens (up to the step budget) timed with TPSP off and on, on every rank in lock
// step (so the slowest rank decides); the threshold is the smallest size from which TPSP is at
// least as fast at every larger size profiled, and TPSP stays off when it never is.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "dist/parallel.h"
#include "engine/executor.h"

namespace deltaserve::engine {

struct TpspTiming {
  int32_t tokens = 0;
  double conventional_ms = 0, tpsp_ms = 0;
};

// The settings the timings call for (enabled with the threshold, or disabled).
dist::TpspConfig choose_tpsp(const std::vector<TpspTiming>& timings);

// Times padding steps on `exec` (median of `reps` after a warm-up, each mode) for the sizes up to
// `max_tokens` that the degree divides.
std::vector<TpspTiming> profile_tpsp(Executor& exec, int32_t max_tokens, int reps = 3);

// One line: the chosen threshold and the timings behind it.
std::string describe_tpsp_profile(const std::vector<TpspTiming>& timings,
                                  const dist::TpspConfig& chosen);

}  // namespace deltaserve::engine
