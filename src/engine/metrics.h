// Engine metrics for the server's /metrics: counters, gauges and latency histograms. Written by
// the engine thread, read by any thread through snapshot().
#pragma once

#include <array>
#include <cstdint>
#include <mutex>
#include <vector>

namespace deltaserve::engine {

// A fixed-bucket latency histogram in seconds (Prometheus style: cumulative on export).
struct Histogram {
  static constexpr std::array<double, 14> kBounds = {0.001, 0.0025, 0.005, 0.01, 0.02, 0.04, 0.08,
                                                     0.16,  0.32,   0.64,  1.28, 2.56, 5.12, 10.24};
  std::array<uint64_t, kBounds.size() + 1> counts{};  // last: +Inf
  double sum = 0;
  uint64_t count = 0;
  void observe(double seconds);
};

struct MetricsSnapshot {
  int64_t running = 0, waiting = 0;
  int64_t kv_pages_used = 0, kv_pages_total = 0;
  int64_t prompt_tokens = 0, generation_tokens = 0;
  int64_t requests_finished = 0, requests_aborted = 0, preemptions = 0, steps = 0;
  int64_t prefix_cache_queries = 0, prefix_cache_hits = 0;  // prompt tokens (first admissions)
  int64_t prefix_cache_blocks = 0;                          // KV pages indexed by the cache
  // The engine thread's seconds over the steps that ran: in the forwards (the backend's staging,
  // the device's work and the tokens' way back: a forward returns with its sampled tokens), and
  // around them (taking in requests, scheduling, output processing) — time the device idles.
  double forward_seconds = 0, host_seconds = 0;
  Histogram ttft, itl, e2e;
};

class Metrics {
 public:
  MetricsSnapshot snapshot() const {
    std::lock_guard<std::mutex> lock(mu_);
    return s_;
  }
  template <class F>
  void update(F&& f) {
    std::lock_guard<std::mutex> lock(mu_);
    f(s_);
  }

 private:
  mutable std::mutex mu_;
  MetricsSnapshot s_;
};

}  // namespace deltaserve::engine
