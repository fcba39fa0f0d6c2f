#include "app/tpsp_flags.h"

#include "core/error.h"

namespace deltaserve::app {

dist::TpspConfig parse_tpsp_flags(const Args& a) {
  dist::TpspConfig c;
  c.enabled = a.has("enable-tpsp");
  for (const std::string& f : tpsp_value_flags())
    if (a.has(f) && !c.enabled) throw Error("--" + f + " needs --enable-tpsp");
  c.threshold_tokens = a.get_int("tpsp-threshold-tokens", c.threshold_tokens, 0, 1 << 24);
  c.microchunk_tokens = a.get_int("tpsp-microchunk-tokens", 0, 0, 1 << 24);
  const int64_t tp = a.get_int("tensor-parallel-size", 1, 1, 1024);
  if (c.microchunk_tokens % tp != 0)
    throw Error("--tpsp-microchunk-tokens must be a multiple of --tensor-parallel-size (" +
                std::to_string(tp) + ")");
  return c;
}

std::optional<engine::TpspProfileRequest> tpsp_profile_request(const Args& a,
                                                               const dist::TpspConfig& flags) {
  if (!flags.enabled || a.has("tpsp-threshold-tokens")) return std::nullopt;
  engine::TpspProfileRequest r;
  if (a.has("tpsp-microchunk-tokens")) r.microchunk_tokens = flags.microchunk_tokens;
  return r;
}

}  // namespace deltaserve::app
