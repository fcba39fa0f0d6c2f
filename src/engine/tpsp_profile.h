// The TPSP startup profile (serve --enable-tpsp without --tpsp-threshold-tokens), on every rank in
// lock step so that the slowest rank decides:
// - the microchunk size: padding steps of the largest size profiled timed under TPSP without the
//   pipeline and with microchunks of 1/2, 1/4 and 1/8 of it (multiples of the degree, >= 64
//   tokens); the fastest wins;
// - the threshold: padding steps of 256, 512, ... tokens (up to the step budget) timed with TPSP
//   off and on (with that microchunk size); the threshold is the smallest size from which TPSP is
//   at least as fast at every larger size profiled, and TPSP stays off when it never is.
// What the flags set is kept. One decision for the whole model (every projection group): the
// residual stream's layout between two row-parallel points must be the same on both sides.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "dist/parallel.h"
#include "engine/executor.h"

namespace deltaserve::engine {

struct TpspTiming {
  int32_t tokens = 0;
  double conventional_ms = 0, tpsp_ms = 0;
};

struct MicrochunkTiming {
  int64_t microchunk_tokens = 0;  // 0: no pipeline
  double ms = 0;
};

// The profile always picks the threshold, and the microchunk size unless it is given.
struct TpspProfileRequest {
  std::optional<int64_t> microchunk_tokens;  // --tpsp-microchunk-tokens
};

struct TpspProfile {
  int32_t microchunk_step_tokens = 0;         // the step size the microchunk sizes were timed at
  std::vector<MicrochunkTiming> microchunks;  // empty when the flag set it
  std::vector<TpspTiming> timings;
  dist::TpspConfig chosen;
};

// The settings the timings call for (enabled with the threshold, or disabled).
dist::TpspConfig choose_tpsp(const std::vector<TpspTiming>& timings);
// The fastest microchunk size (the first of equals); 0 without timings.
int64_t choose_microchunk(const std::vector<MicrochunkTiming>& timings);
// The microchunk sizes profiled for steps of `tokens`: 0 (no pipeline), then tokens / 2, / 4, / 8
// where that is a multiple of `degree` and at least 64.
std::vector<int64_t> microchunk_candidates(int32_t tokens, int degree);

// Times padding steps on `exec` (median of `reps` after a warm-up, each setting) for the sizes up
// to `max_tokens` that the degree divides, and leaves `exec` on the chosen settings.
TpspProfile profile_tpsp(Executor& exec, int32_t max_tokens, const TpspProfileRequest& request,
                         int reps = 3);

// One line: the chosen settings and the timings behind them.
std::string describe_tpsp_profile(const TpspProfile& profile);

}  // namespace deltaserve::engine
