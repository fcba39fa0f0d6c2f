// Latency summaries shared by the bench commands: {"name": {"mean", "p50", "p99"}} in ms.
#pragma once

#include <algorithm>
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

}  // namespace deltaserve::app
