// `deltaserve bench serve`: a load client in the spirit of `vllm bench serve`. Random token-id
// prompts of a given length go to /v1/completions with streaming, at a fixed concurrency or a
// Poisson request rate; TTFT, TPOT and ITL are measured from the SSE events. One JSON line.
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <limits>
#include <mutex>
#include <nlohmann/json.hpp>
#include <random>
#include <thread>
#include <utility>

#include "app/args.h"
#include "app/bench_client.h"
#include "app/bench_multiturn.h"
#include "app/bench_stats.h"
#include "app/commands.h"
#include "core/error.h"

namespace deltaserve::app {

namespace {

using clock = std::chrono::steady_clock;

}  // namespace

int cmd_bench_serve(const std::vector<std::string>& argv) {
  Args a(argv, "bench serve",
         {"host", "port", "model", "api-key", "num-prompts", "input-len", "output-len",
          "max-concurrency", "request-rate", "seed", "vocab", "workload", "num-clients", "turns",
          "system-len", "turn-len"});
  const std::string workload = a.get("workload", "random");
  if (workload == "multi-turn") return run_multi_turn(a);
  if (workload != "random") throw Error("--workload must be random or multi-turn");
  const std::string host = a.get("host", "127.0.0.1"), port = a.get("port", "8000");
  const int n = static_cast<int>(a.get_int("num-prompts", 64, 1, 1000000));
  const int in_len = static_cast<int>(a.get_int("input-len", 128, 1, 1 << 20));
  const int out_len = static_cast<int>(a.get_int("output-len", 32, 1, 1 << 20));
  const int concurrency = static_cast<int>(a.get_int("max-concurrency", 16, 1, 100000));
  const double rate = a.get("request-rate", "inf") == "inf"
                          ? std::numeric_limits<double>::infinity()
                          : a.get_double("request-rate", 0, 0, 1e9, true);
  const int vocab =
      static_cast<int>(a.get_int("vocab", 100000, 2, 1 << 30));  // ids drawn from [0, vocab)
  std::mt19937 g(static_cast<uint32_t>(a.get_int("seed", 0, 0, 1LL << 32)));
  std::vector<std::string> bodies;
  for (int i = 0; i < n; ++i) {
    nlohmann::json j = {{"prompt", nlohmann::json::array()},
                        {"max_tokens", out_len},
                        {"temperature", 0},
                        {"ignore_eos", true},
                        {"stream", true},
                        {"stream_options", {{"include_usage", true}}}};
    if (a.has("model")) j["model"] = a.get("model", "");
    for (int t = 0; t < in_len; ++t)
      j["prompt"].push_back(static_cast<int>(g() % static_cast<uint32_t>(vocab)));
    bodies.push_back(j.dump());
  }
  std::vector<Outcome> outcomes(static_cast<size_t>(n));
  std::atomic<int> next{0};
  std::vector<double> arrival(static_cast<size_t>(n),
                              0.0);  // seconds after start (Poisson when a rate is set)
  if (std::isfinite(rate)) {
    std::exponential_distribution<double> gap(rate);
    for (int i = 1; i < n; ++i)
      arrival[static_cast<size_t>(i)] = arrival[static_cast<size_t>(i - 1)] + gap(g);
  }
  const auto t0 = clock::now();
  std::vector<std::thread> workers;
  for (int w = 0; w < std::min(concurrency, n); ++w) {
    workers.emplace_back([&] {
      for (int i; (i = next++) < n;) {
        std::this_thread::sleep_until(
            t0 + std::chrono::duration_cast<clock::duration>(
                     std::chrono::duration<double>(arrival[static_cast<size_t>(i)])));
        outcomes[static_cast<size_t>(i)] =
            stream_completion(host, port, bodies[static_cast<size_t>(i)], a.get("api-key", ""));
      }
    });
  }
  for (auto& t : workers) t.join();
  const double dur = std::chrono::duration<double>(clock::now() - t0).count();

  const Summary sum = summarize(outcomes);
  const int ok = sum.completed;
  std::printf(
      "{\"bench\": \"serve\", \"num_prompts\": %d, \"completed\": %d, \"input_len\": %d, "
      "\"output_len\": %d, "
      "\"max_concurrency\": %d, \"request_rate\": %s, \"duration_s\": %.3f, \"requests_per_s\": "
      "%.3f, "
      "\"input_tok_per_s\": %.1f, \"output_tok_per_s\": %.1f, \"total_tok_per_s\": %.1f, %s%s}\n",
      n, ok, in_len, out_len, concurrency,
      std::isfinite(rate) ? std::to_string(rate).c_str() : "\"inf\"", dur, ok / dur,
      static_cast<double>(ok) * in_len / dur, static_cast<double>(sum.output_tokens) / dur,
      (static_cast<double>(ok) * in_len + static_cast<double>(sum.output_tokens)) / dur,
      sum.latency_json.c_str(),
      sum.first_error.empty()
          ? ""
          : (", \"first_error\": " + nlohmann::json(sum.first_error).dump()).c_str());
  return ok == n ? 0 : 1;
}

}  // namespace deltaserve::app
