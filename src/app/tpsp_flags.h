// The TPSP flags of `serve`, `logits` and `bench offline` (dist::TpspConfig):
//   --enable-tpsp                   sequence parallelism around the row-parallel projections
//   --tpsp-threshold-tokens N       steps of fewer tokens run conventional TP (0: every step whose
//                                   token count the degree divides); without it, serve and bench
//                                   offline pick it by the startup profile (engine/tpsp_profile.h),
//                                   logits uses 1024
#pragma once

#include <set>
#include <string>

#include "app/args.h"
#include "dist/parallel.h"

namespace deltaserve::app {

inline const std::set<std::string>& tpsp_value_flags() {
  static const std::set<std::string> kFlags = {"tpsp-threshold-tokens"};
  return kFlags;
}

inline const std::set<std::string>& tpsp_switches() {
  static const std::set<std::string> kSwitches = {"enable-tpsp"};
  return kSwitches;
}

// Throws deltaserve::Error for an out-of-range threshold, or one given without --enable-tpsp.
dist::TpspConfig parse_tpsp_flags(const Args& a);

}  // namespace deltaserve::app
