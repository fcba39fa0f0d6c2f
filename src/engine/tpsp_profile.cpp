#include "engine/tpsp_profile.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <limits>

namespace deltaserve::engine {

dist::TpspConfig choose_tpsp(const std::vector<TpspTiming>& timings) {
  dist::TpspConfig c;
  c.threshold_tokens = std::numeric_limits<int32_t>::max();
  for (auto t = timings.rbegin(); t != timings.rend() && t->tpsp_ms <= t->conventional_ms; ++t)
    c.threshold_tokens = t->tokens;  // TPSP wins here and at every larger size
  c.enabled = c.threshold_tokens != std::numeric_limits<int32_t>::max();
  return c;
}

namespace {

double median_step_ms(Executor& exec, int32_t tokens, int reps) {
  exec.run_padding_step(tokens);  // warm-up
  std::vector<double> ms;
  for (int i = 0; i < reps; ++i) {
    const auto t0 = std::chrono::steady_clock::now();
    exec.run_padding_step(tokens);
    ms.push_back(
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
  }
  std::sort(ms.begin(), ms.end());
  return ms[ms.size() / 2];
}

}  // namespace

std::vector<TpspTiming> profile_tpsp(Executor& exec, int32_t max_tokens, int reps) {
  std::vector<TpspTiming> out;
  for (int32_t t = 256; t <= max_tokens; t *= 2) {
    if (t % exec.degree() != 0) continue;
    TpspTiming timing{t, 0, 0};
    exec.set_tpsp({false, 0});
    timing.conventional_ms = median_step_ms(exec, t, reps);
    exec.set_tpsp({true, 0});
    timing.tpsp_ms = median_step_ms(exec, t, reps);
    out.push_back(timing);
  }
  exec.set_tpsp({false, 0});
  return out;
}

std::string describe_tpsp_profile(const std::vector<TpspTiming>& timings,
                                  const dist::TpspConfig& chosen) {
  std::string s = chosen.enabled
                      ? "TPSP from " + std::to_string(chosen.threshold_tokens) + " tokens a step"
                      : "TPSP off (never faster)";
  s += " — profiled ms conventional / TPSP:";
  char buf[96];
  for (const TpspTiming& t : timings) {
    std::snprintf(buf, sizeof buf, " %d: %.2f / %.2f;", t.tokens, t.conventional_ms, t.tpsp_ms);
    s += buf;
  }
  return s;
}

}  // namespace deltaserve::engine
