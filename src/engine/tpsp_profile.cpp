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

int64_t choose_microchunk(const std::vector<MicrochunkTiming>& timings) {
  const auto best = std::min_element(timings.begin(), timings.end(),
                                     [](const auto& a, const auto& b) { return a.ms < b.ms; });
  return best == timings.end() ? 0 : best->microchunk_tokens;
}

std::vector<int64_t> microchunk_candidates(int32_t tokens, int degree) {
  std::vector<int64_t> sizes{0};
  for (int64_t div : {2, 4, 8})
    if (const int64_t m = tokens / div; tokens % div == 0 && m >= 64 && m % degree == 0)
      sizes.push_back(m);
  return sizes;
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

// TPSP on every step of `tokens` with microchunks of `microchunk` tokens.
double tpsp_ms(Executor& exec, int32_t tokens, int64_t microchunk, int reps) {
  exec.set_tpsp({true, 0, microchunk});
  return median_step_ms(exec, tokens, reps);
}

}  // namespace

TpspProfile profile_tpsp(Executor& exec, int32_t max_tokens, const TpspProfileRequest& request,
                         int reps) {
  TpspProfile p;
  std::vector<int32_t> sizes;
  for (int32_t t = 256; t <= max_tokens; t *= 2)
    if (t % exec.degree() == 0) sizes.push_back(t);
  int64_t microchunk = request.microchunk_tokens.value_or(0);
  if (!request.microchunk_tokens && !sizes.empty()) {
    p.microchunk_step_tokens = sizes.back();
    for (const int64_t m : microchunk_candidates(sizes.back(), exec.degree()))
      p.microchunks.push_back({m, tpsp_ms(exec, sizes.back(), m, reps)});
    microchunk = choose_microchunk(p.microchunks);
  }
  for (const int32_t t : sizes) {
    TpspTiming timing{t, 0, 0};
    exec.set_tpsp({false, 0, 0});
    timing.conventional_ms = median_step_ms(exec, t, reps);
    timing.tpsp_ms = tpsp_ms(exec, t, microchunk, reps);
    p.timings.push_back(timing);
  }
  p.chosen = choose_tpsp(p.timings);
  p.chosen.microchunk_tokens = microchunk;
  exec.set_tpsp(p.chosen);
  return p;
}

std::string describe_tpsp_profile(const TpspProfile& p) {
  const dist::TpspConfig& c = p.chosen;
  std::string s = c.enabled ? "TPSP from " + std::to_string(c.threshold_tokens) + " tokens a step"
                            : "TPSP off (never faster)";
  s += c.microchunk_tokens > 0
           ? ", microchunks of " + std::to_string(c.microchunk_tokens) + " tokens"
           : ", no microchunk pipeline";
  char buf[96];
  if (!p.microchunks.empty()) {
    s += " — profiled ms at " + std::to_string(p.microchunk_step_tokens) + " tokens by microchunk:";
    for (const MicrochunkTiming& m : p.microchunks) {
      std::snprintf(buf, sizeof buf, " %lld: %.2f;", static_cast<long long>(m.microchunk_tokens),
                    m.ms);
      s += buf;
    }
  }
  if (!p.timings.empty()) {
    s += " — profiled ms conventional / TPSP:";
    for (const TpspTiming& t : p.timings) {
      std::snprintf(buf, sizeof buf, " %d: %.2f / %.2f;", t.tokens, t.conventional_ms, t.tpsp_ms);
      s += buf;
    }
  }
  return s;
}

}  // namespace deltaserve::engine
