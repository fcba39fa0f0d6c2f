// The TPSP flags of `serve`, `logits` and `bench offline` (dist::TpspConfig):
//   --enable-tpsp                   sequence parallelism around the row-parallel projections
//   --tpsp-threshold-tokens N       steps of fewer tokens run conventional TP (0: every step whose
//                                   token count the degree divides); without it, serve and bench
//                                   offline pick it by the startup profile (engine/tpsp_profile.h),
//                                   logits uses 1024
//   --tpsp-microchunk-tokens N      the microchunk pipeline's chunk size (a multiple of the
//                                   tensor-parallel size; 0: no pipeline); without it, the startup
//                                   profile picks it when it picks the threshold, else 0
#pragma once

#include <optional>
#include <set>
#include <string>

#include "app/args.h"
#include "dist/parallel.h"
#include "engine/tpsp_profile.h"

namespace deltaserve::app {

inline const std::set<std::string>& tpsp_value_flags() {
  static const std::set<std::string> kFlags = {"tpsp-threshold-tokens", "tpsp-microchunk-tokens"};
  return kFlags;
}

inline const std::set<std::string>& tpsp_switches() {
  static const std::set<std::string> kSwitches = {"enable-tpsp"};
  return kSwitches;
}

// Throws deltaserve::Error for an out-of-range size, a microchunk size that is not a multiple of
// --tensor-parallel-size, or either given without --enable-tpsp.
dist::TpspConfig parse_tpsp_flags(const Args& a);

// What the startup profile picks: with --enable-tpsp and without --tpsp-threshold-tokens, the
// threshold and (unless --tpsp-microchunk-tokens is given) the microchunk size. `flags`:
// parse_tpsp_flags(a).
std::optional<engine::TpspProfileRequest> tpsp_profile_request(const Args& a,
                                                               const dist::TpspConfig& flags);

}  // namespace deltaserve::app
