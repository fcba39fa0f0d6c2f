// Latency summaries shared by the bench commands: {"name": {"mean", "p50", "p99"}} in ms.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

namespace deltaserve::app {

// `seconds` are converted to milliseconds; percentiles by nearest rank.
inline std::string stats_json(const char* name, std::vector<double> seconds) {
  double mean = 0, p50 = 0, p99 = 0;
  if (!seconds.empty()) {
    std::sort(seconds.begin(), seconds.end());
    double sum = 0;
    for (double x : seconds) sum += x;
    mean = 1e3 * sum / static_cast<double>(seconds.size());
    auto pct = [&seconds](double q) {
      return 1e3 * seconds[std::min(
                       seconds.size() - 1,
                       static_cast<size_t>(q * static_cast<double>(seconds.size() - 1) + 0.5))];
    };
    p50 = pct(0.5);
    p99 = pct(0.99);
  }
  char buf[160];
  std::snprintf(buf, sizeof buf, "\"%s\": {\"mean\": %.3f, \"p50\": %.3f, \"p99\": %.3f}", name,
                mean, p50, p99);
  return buf;
}

// What a load client measured for one request (times in seconds).
struct Outcome {
  bool ok = false;
  double ttft = 0, e2e = 0;
  std::vector<double> itl;
  int64_t output_tokens = 0;
  int64_t cached_tokens = 0;       // usage.prompt_tokens_details.cached_tokens
  std::vector<int32_t> token_ids;  // the output ids (return_token_ids)
  std::string error;
};

// Totals over the completed requests and their latency summaries as JSON fields
// ("ttft_ms": {...}, "tpot_ms": {...}, "itl_ms": {...}, "e2e_ms": {...}).
struct Summary {
  int completed = 0;
  int64_t output_tokens = 0;
  std::string first_error;
  std::string latency_json;
};

inline Summary summarize(const std::vector<Outcome>& outcomes) {
  Summary s;
  std::vector<double> ttft, tpot, itl, e2e;
  for (const Outcome& o : outcomes) {
    if (!o.ok) {
      if (s.first_error.empty()) s.first_error = o.error;
      continue;
    }
    ++s.completed;
    ttft.push_back(o.ttft);
    e2e.push_back(o.e2e);
    itl.insert(itl.end(), o.itl.begin(), o.itl.end());
    s.output_tokens += o.output_tokens;
    if (o.output_tokens > 1)
      tpot.push_back((o.e2e - o.ttft) / static_cast<double>(o.output_tokens - 1));
  }
  s.latency_json = stats_json("ttft_ms", ttft) + ", " + stats_json("tpot_ms", tpot) + ", " +
                   stats_json("itl_ms", itl) + ", " + stats_json("e2e_ms", e2e);
  return s;
}

}  // namespace deltaserve::app
