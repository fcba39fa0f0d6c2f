#include "app/tpsp_flags.h"

#include "core/error.h"

namespace deltaserve::app {

dist::TpspConfig parse_tpsp_flags(const Args& a) {
  dist::TpspConfig c;
  c.enabled = a.has("enable-tpsp");
  if (a.has("tpsp-threshold-tokens") && !c.enabled)
    throw Error("--tpsp-threshold-tokens needs --enable-tpsp");
  c.threshold_tokens = a.get_int("tpsp-threshold-tokens", c.threshold_tokens, 0, 1 << 24);
  return c;
}

}  // namespace deltaserve::app
