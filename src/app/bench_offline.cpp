// `deltaserve bench offline`: N random-prompt requests straight into the engine (no HTTP), at
// most --max-concurrency in flight, measured like `bench serve` so the two can be compared.
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <random>
#include <thread>

#include "app/args.h"
#include "app/bench_stats.h"
#include "app/cache_flags.h"
#include "app/commands.h"
#include "app/runtime.h"
#include "app/scheduler_flags.h"
#include "app/tpsp_flags.h"
#include "backend/cpu/cpu_backend.h"
#include "core/error.h"
#include "engine/engine.h"
#include "model/loader.h"

namespace deltaserve::app {

namespace {

using clock = std::chrono::steady_clock;

Outcome run_one(engine::Engine& eng, const engine::GenerateRequest& req) {
  Outcome o;
  const auto start = clock::now();
  auto stream = eng.submit(req);
  auto last = start;
  bool first = true;
  engine::OutputDelta d;
  while (stream->next(d, std::chrono::hours(1))) {
    const auto now = clock::now();
    if (!d.token_ids.empty()) {
      if (first)
        o.ttft = std::chrono::duration<double>(now - start).count();
      else
        o.itl.push_back(std::chrono::duration<double>(now - last).count());
      first = false;
      last = now;
    }
    o.output_tokens = d.completion_tokens;
    if (d.finished) {
      o.ok = d.finish_reason != engine::FinishReason::kError;
      o.error = d.error;
      break;
    }
  }
  o.e2e = std::chrono::duration<double>(clock::now() - start).count();
  return o;
}

}  // namespace

int cmd_bench(const std::vector<std::string>& argv) {
  if (!argv.empty() && argv[0] == "serve") return cmd_bench_serve({argv.begin() + 1, argv.end()});
  if (argv.empty() || argv[0] != "offline")
    throw Error("usage: deltaserve bench offline|serve [flags] (see --help)");
  const std::vector<std::string> rest(argv.begin() + 1, argv.end());
  Args a(rest, "bench offline",
         {"model",
          "load-format",
          "device",
          "num-prompts",
          "input-len",
          "output-len",
          "max-concurrency",
          "max-num-seqs",
          "max-num-batched-tokens",
          "max-model-len",
          "num-pages",
          "seed",
          "tensor-parallel-size",
          "num-snapshots",
          "tpsp-threshold-tokens",
          "tpsp-microchunk-tokens",
          "mamba-ssm-cache-dtype",
          "long-prefill-token-threshold",
          "admission-reserve-tokens",
          "kv-cache-dtype"},
         {"enforce-eager", "enable-prefix-caching", "enable-tpsp"});
  check_device(a);
  const DType ssm_state = ssm_state_dtype_flag(a);
  const bool kv_fp8 = kv_cache_fp8_flag(a);
  const dist::TpspConfig tpsp = parse_tpsp_flags(a);
  const int n = static_cast<int>(a.get_int("num-prompts", 32, 1, 100000));
  const int in_len = static_cast<int>(a.get_int("input-len", 128, 1, 1 << 20));
  const int out_len = static_cast<int>(a.get_int("output-len", 32, 1, 1 << 20));
  ModelRuntime rt =
      make_runtime(a.get("model", ""), model::parse_load_format(a.get("load-format", "auto")),
                   static_cast<int>(a.get_int("tensor-parallel-size", 1, 1, 1024)), true,
                   a.get("device", "cpu"), tpsp);
  const model::ModelConfig& mc = rt.exec->config();
  engine::EngineConfig cfg;
  cfg.max_num_seqs = static_cast<int32_t>(a.get_int("max-num-seqs", 16, 1, 4096));
  const SchedulerFlags sched = scheduler_flags(a, 1024);
  cfg.max_num_batched_tokens = sched.max_num_batched_tokens;
  cfg.long_prefill_token_threshold = sched.long_prefill_token_threshold;
  cfg.admission_reserve_tokens = sched.admission_reserve_tokens;
  cfg.max_model_len =
      static_cast<int32_t>(a.get_count("max-model-len", in_len + out_len, 1, 1 << 24));
  // Default: KV room for max_num_seqs requests of max_model_len (no preemption needed).
  runtime::MemoryBudget budget;
  budget.kind = runtime::MemoryBudget::Kind::kRequests;
  budget.requests = cfg.max_num_seqs;
  if (a.has("num-pages")) {
    budget.kind = runtime::MemoryBudget::Kind::kPages;
    budget.pages = static_cast<int32_t>(a.get_int("num-pages", 0, 1, 1 << 30));
  }
  cfg.budget = budget;
  const int concurrency = static_cast<int>(a.get_int("max-concurrency", n, 1, 100000));
  cfg.enforce_eager = a.has("enforce-eager");
  cfg.ssm_state_dtype = ssm_state;
  cfg.kv_cache_fp8 = kv_fp8;
  cfg.enable_prefix_caching = a.has("enable-prefix-caching");
  if (cfg.enable_prefix_caching)
    cfg.num_snapshots =
        static_cast<int32_t>(a.get_int("num-snapshots", 4 * cfg.max_num_seqs, 1, 1 << 20));
  cfg.profile_tpsp = tpsp_profile_request(a, tpsp);
  engine::Engine eng(*rt.exec, cfg);
  if (!eng.tpsp_profile().empty()) std::fprintf(stderr, "%s\n", eng.tpsp_profile().c_str());

  std::mt19937 g(static_cast<uint32_t>(a.get_int("seed", 0, 0, 1LL << 32)));
  std::vector<engine::GenerateRequest> reqs;
  for (int i = 0; i < n; ++i) {
    engine::GenerateRequest r;
    for (int t = 0; t < in_len; ++t)
      r.prompt_ids.push_back(static_cast<int32_t>(g() % static_cast<uint32_t>(mc.vocab_size)));
    r.params.temperature = 0;
    r.params.ignore_eos = true;
    r.params.max_tokens = out_len;
    reqs.push_back(std::move(r));
  }
  std::vector<Outcome> outcomes(static_cast<size_t>(n));
  std::atomic<int> next{0};
  const auto t0 = clock::now();
  std::vector<std::thread> workers;
  for (int w = 0; w < std::min(concurrency, n); ++w)
    workers.emplace_back([&] {
      for (int i; (i = next++) < n;)
        outcomes[static_cast<size_t>(i)] = run_one(eng, reqs[static_cast<size_t>(i)]);
    });
  for (auto& t : workers) t.join();
  const double dur = std::chrono::duration<double>(clock::now() - t0).count();
  const Summary sum = summarize(outcomes);
  const engine::MetricsSnapshot ms = eng.metrics();
  std::printf(
      "{\"bench\": \"offline\", \"device\": \"%s\", \"num_prompts\": %d, \"input_len\": %d, "
      "\"output_len\": %d, "
      "\"max_concurrency\": %d, \"max_num_seqs\": %d, \"max_num_batched_tokens\": %d, "
      "\"duration_s\": %.3f, "
      "\"requests_per_s\": %.3f, \"input_tok_per_s\": %.1f, \"output_tok_per_s\": %.1f, "
      "\"total_tok_per_s\": %.1f, "
      "%s, \"steps\": %lld, \"engine_forward_s\": %.3f, \"engine_host_s\": %.3f, "
      "\"preemptions\": %lld, \"prefix_caching\": %s}\n",
      a.get("device", "cpu").c_str(), n, in_len, out_len, concurrency, cfg.max_num_seqs,
      cfg.max_num_batched_tokens, dur, n / dur, static_cast<double>(n) * in_len / dur,
      static_cast<double>(sum.output_tokens) / dur,
      (static_cast<double>(n) * in_len + static_cast<double>(sum.output_tokens)) / dur,
      sum.latency_json.c_str(), static_cast<long long>(ms.steps), ms.forward_seconds,
      ms.host_seconds, static_cast<long long>(ms.preemptions),
      eng.config().enable_prefix_caching ? "true" : "false");
  return sum.completed == n ? 0 : 1;
}

}  // namespace deltaserve::app
