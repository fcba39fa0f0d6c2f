// The CUDA backend's A/B switches: environment variables that turn one of its forms off (set to
// 0) so that a same-lease benchmark can time both, e.g. DS_PDL, DS_SKINNY_GEMM, DS_GEMM_TUNE.
#pragma once

#include <cstdlib>
#include <cstring>

namespace deltaserve::cuda {

// Whether the switch `name` leaves its form on: unset, or set to anything but 0.
inline bool ab_switch_on(const char* name) {
  const char* v = std::getenv(name);
  return !(v && std::strcmp(v, "0") == 0);
}

// A switch that forces a form on or off where a heuristic picks by default: -1 unset (the
// heuristic), 0 set to 0 (off), 1 set to anything else (on).
inline int ab_switch_forced(const char* name) {
  const char* v = std::getenv(name);
  return v == nullptr ? -1 : std::strcmp(v, "0") == 0 ? 0 : 1;
}

}  // namespace deltaserve::cuda
