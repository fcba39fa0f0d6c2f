#include <algorithm>
#include <chrono>
#include <cstdio>
#include <random>
#include <thread>

#include "app/args.h"
#include "app/commands.h"
#include "backend/cpu/cpu_backend.h"
#include "core/error.h"
#include "engine/engine.h"
#include "model/loader.h"

namespace deltaserve::app {

namespace {

using clock = std::chrono::steady_clock;

struct Stats {
  double mean = 0, p50 = 0, p99 = 0;
};

Stats stats_ms(std::vector<double> v) {
  Stats s;
  if (v.empty()) return s;
  std::sort(v.begin(), v.end());
  double sum = 0;
  for (double x : v) sum += x;
  s.mean = 1e3 * sum / static_cast<double>(v.size());
  auto pct = [&v](double q) {
    return 1e3 * v[std::min(v.size() - 1,
                            static_cast<size_t>(q * static_cast<double>(v.size() - 1) + 0.5))];
  };
  s.p50 = pct(0.5);
  s.p99 = pct(0.99);
  return s;
}

std::string json(const char* name, const Stats& s) {
  char buf[160];
  std::snprintf(buf, sizeof buf, "\"%s\": {\"mean\": %.3f, \"p50\": %.3f, \"p99\": %.3f}", name,
                s.mean, s.p50, s.p99);
  return buf;
}

}  // namespace

int cmd_bench(const std::vector<std::string>& argv) {
  if (argv.empty() || argv[0] != "offline")
    throw Error("usage: deltaserve bench offline [flags] (see --help)");
  const std::vector<std::string> rest(argv.begin() + 1, argv.end());
  Args a(rest, "bench offline",
         {"model", "load-format", "device", "num-prompts", "input-len", "output-len",
          "max-num-seqs", "max-num-batched-tokens", "max-model-len", "num-pages", "seed"});
  check_device(a);
  const int n = static_cast<int>(a.get_int("num-prompts", 32, 1, 100000));
  const int in_len = static_cast<int>(a.get_int("input-len", 128, 1, 1 << 20));
  const int out_len = static_cast<int>(a.get_int("output-len", 32, 1, 1 << 20));
  backend::CpuBackend be;
  auto m = model::load_model(a.get("model", ""),
                             model::parse_load_format(a.get("load-format", "auto")), be, true);
  engine::EngineConfig cfg;
  cfg.max_num_seqs = static_cast<int32_t>(a.get_int("max-num-seqs", 16, 1, 4096));
  cfg.max_num_batched_tokens =
      static_cast<int32_t>(a.get_int("max-num-batched-tokens", 1024, 1, 1 << 20));
  cfg.max_model_len =
      static_cast<int32_t>(a.get_int("max-model-len", in_len + out_len, 1, 1 << 24));
  // Default: KV room for max_num_seqs requests of max_model_len (no preemption needed).
  const int64_t per_request = (cfg.max_model_len + cfg.page_size - 1) / cfg.page_size;
  cfg.num_pages =
      static_cast<int32_t>(a.get_int("num-pages", per_request * cfg.max_num_seqs, 1, 1 << 30));
  engine::Engine eng(*m, cfg);

  std::mt19937 g(static_cast<uint32_t>(a.get_int("seed", 0, 0, 1LL << 32)));
  std::vector<engine::GenerateRequest> reqs;
  for (int i = 0; i < n; ++i) {
    engine::GenerateRequest r;
    for (int t = 0; t < in_len; ++t)
      r.prompt_ids.push_back(
          static_cast<int32_t>(g() % static_cast<uint32_t>(m->config().vocab_size)));
    r.params.temperature = 0;
    r.params.ignore_eos = true;
    r.params.max_tokens = out_len;
    reqs.push_back(std::move(r));
  }
  std::vector<double> ttft(static_cast<size_t>(n)), e2e(static_cast<size_t>(n)), tpot;
  std::vector<std::vector<double>> itl(static_cast<size_t>(n));
  std::vector<int> out_tokens(static_cast<size_t>(n));
  const auto t0 = clock::now();
  std::vector<std::thread> readers;
  for (int i = 0; i < n; ++i) {
    auto stream = eng.submit(reqs[static_cast<size_t>(i)]);
    readers.emplace_back([&, i, stream, start = clock::now()] {
      auto last = start;
      engine::OutputDelta d;
      bool first = true;
      while (stream->next(d, std::chrono::hours(1))) {
        const auto now = clock::now();
        if (!d.token_ids.empty()) {
          if (first)
            ttft[static_cast<size_t>(i)] = std::chrono::duration<double>(now - start).count();
          else
            itl[static_cast<size_t>(i)].push_back(
                std::chrono::duration<double>(now - last).count());
          first = false;
          last = now;
        }
        out_tokens[static_cast<size_t>(i)] = d.completion_tokens;
        if (d.finished) break;
      }
      e2e[static_cast<size_t>(i)] = std::chrono::duration<double>(clock::now() - start).count();
    });
  }
  for (auto& t : readers) t.join();
  const double dur = std::chrono::duration<double>(clock::now() - t0).count();
  std::vector<double> all_itl;
  int64_t total_out = 0;
  for (int i = 0; i < n; ++i) {
    all_itl.insert(all_itl.end(), itl[static_cast<size_t>(i)].begin(),
                   itl[static_cast<size_t>(i)].end());
    total_out += out_tokens[static_cast<size_t>(i)];
    if (out_tokens[static_cast<size_t>(i)] > 1)
      tpot.push_back((e2e[static_cast<size_t>(i)] - ttft[static_cast<size_t>(i)]) /
                     (out_tokens[static_cast<size_t>(i)] - 1));
  }
  const engine::MetricsSnapshot ms = eng.metrics();
  std::printf(
      "{\"bench\": \"offline\", \"device\": \"cpu\", \"num_prompts\": %d, \"input_len\": %d, "
      "\"output_len\": %d, "
      "\"max_num_seqs\": %d, \"max_num_batched_tokens\": %d, \"duration_s\": %.3f, "
      "\"requests_per_s\": %.3f, "
      "\"input_tok_per_s\": %.1f, \"output_tok_per_s\": %.1f, \"total_tok_per_s\": %.1f, %s, %s, "
      "%s, %s, "
      "\"steps\": %lld, \"preemptions\": %lld}\n",
      n, in_len, out_len, cfg.max_num_seqs, cfg.max_num_batched_tokens, dur, n / dur,
      static_cast<double>(n) * in_len / dur, static_cast<double>(total_out) / dur,
      (static_cast<double>(n) * in_len + static_cast<double>(total_out)) / dur,
      json("ttft_ms", stats_ms(ttft)).c_str(), json("tpot_ms", stats_ms(tpot)).c_str(),
      json("itl_ms", stats_ms(all_itl)).c_str(), json("e2e_ms", stats_ms(e2e)).c_str(),
      static_cast<long long>(ms.steps), static_cast<long long>(ms.preemptions));
  return 0;
}

}  // namespace deltaserve::app
