// sched_sim: runs the engine's scheduler alone (no model) over a closed-loop workload, like
// `bench serve` with fixed prompt and output lengths, and prints what it did: steps, preemptions,
// the prefill tokens recomputed after preemption, and how full the steps were. The KV pool and slot
// count are the memory plan's (pass --num-pages from `serve`'s printed plan), so a scheduling
// policy can be compared on the CPU before it is timed on a GPU. It also prints a forward-time
// estimate from a linear step cost (a fixed part, one per decode row, one per prefill token); the
// defaults are the H200's for the 4B shape at 8k context (84253db: decode 3.0 ms at B = 1 and 28.6
// at B = 256, an 8k prefill 113.8 ms), which put 2,313 steps at 117 s where serve measured 122.3.
#include <cstdio>
#include <map>
#include <memory>

#include "app/args.h"
#include "app/scheduler_flags.h"
#include "cache/cache_manager.h"
#include "core/error.h"
#include "engine/scheduler.h"

using namespace deltaserve;

namespace {

struct Workload {
  int32_t input_len = 8192, output_len = 1024, concurrency = 256, num_prompts = 512;
};

struct StepCost {
  double fixed_ms = 3.0, decode_row_ms = 0.1, prefill_token_ms = 113.76 / 8192;
};

struct Counts {
  int64_t steps = 0, preemptions = 0, prefill_tokens = 0, decode_rows = 0, max_running = 0;
  int64_t full_decode_steps = 0;  // steps with no prefill tokens
  double forward_ms = 0;          // by StepCost
};

std::unique_ptr<engine::Request> make_request(uint64_t id, const Workload& w) {
  auto r = std::make_unique<engine::Request>();
  r->id = id;
  r->num_prompt = w.input_len;
  r->tokens.assign(static_cast<size_t>(w.input_len), 5);
  r->params.max_tokens = w.output_len;
  return r;
}

Counts simulate(const engine::SchedulerConfig& cfg, int32_t num_pages, int32_t page_size,
                const Workload& w, const StepCost& cost) {
  cache::CacheManager cache({num_pages, page_size, cfg.max_num_seqs, 0});
  engine::Scheduler sched(cfg, cache);
  std::map<uint64_t, std::unique_ptr<engine::Request>> live;
  uint64_t next_id = 1;
  int32_t sent = 0;
  Counts c;
  const auto top_up = [&] {
    while (sent < w.num_prompts && static_cast<int32_t>(live.size()) < w.concurrency) {
      auto r = make_request(next_id++, w);
      sched.add(r.get());
      live[r->id] = std::move(r);
      ++sent;
    }
  };
  for (top_up(); !live.empty(); top_up()) {
    const engine::ScheduledStep plan = sched.schedule();
    DS_CHECK(!plan.empty(), "the scheduler stalled with requests waiting");
    ++c.steps;
    c.preemptions += static_cast<int64_t>(plan.preempted.size());
    int64_t prefill = 0, decode = 0;
    for (size_t i = 0; i < plan.requests.size(); ++i) {
      const engine::Request* r = plan.requests[i];
      const int32_t n = plan.batch.seq(i).num_tokens;
      const bool is_decode = n == 1 &&
                             r->num_computed + 1 == static_cast<int32_t>(r->tokens.size()) &&
                             r->num_outputs() > 0;
      if (is_decode)
        ++decode;
      else
        prefill += n;
    }
    c.decode_rows += decode;
    c.prefill_tokens += prefill;
    c.forward_ms += cost.fixed_ms + cost.decode_row_ms * static_cast<double>(decode) +
                    cost.prefill_token_ms * static_cast<double>(prefill);
    c.full_decode_steps += prefill == 0;
    c.max_running = std::max<int64_t>(c.max_running, static_cast<int64_t>(sched.num_running()));
    sched.commit(plan);
    for (size_t i = 0; i < plan.requests.size(); ++i) {
      if (plan.batch.seq(i).num_samples == 0) continue;
      engine::Request* r = plan.requests[i];
      r->tokens.push_back(7);
      if (r->num_outputs() >= r->params.max_tokens) {
        sched.remove(r);
        live.erase(r->id);
      }
    }
  }
  return c;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    const app::Args a(
        std::vector<std::string>(argv + 1, argv + argc), "sched_sim",
        {"num-pages", "page-size", "max-num-seqs", "max-num-batched-tokens",
         "long-prefill-token-threshold", "admission-reserve-tokens", "fixed-ms", "decode-row-ms",
         "prefill-token-ms", "input-len", "output-len", "concurrency", "num-prompts"});
    engine::SchedulerConfig cfg;
    cfg.max_num_seqs = static_cast<int32_t>(a.get_int("max-num-seqs", 512, 1, 1 << 16));
    const app::SchedulerFlags sched = app::scheduler_flags(a, 2048);
    cfg.max_num_batched_tokens = sched.max_num_batched_tokens;
    cfg.long_prefill_token_threshold = sched.long_prefill_token_threshold;
    cfg.admission_reserve_tokens = sched.admission_reserve_tokens;
    StepCost cost;
    cost.fixed_ms = a.get_double("fixed-ms", cost.fixed_ms, 0, 1e6);
    cost.decode_row_ms = a.get_double("decode-row-ms", cost.decode_row_ms, 0, 1e6);
    cost.prefill_token_ms = a.get_double("prefill-token-ms", cost.prefill_token_ms, 0, 1e6);
    const int32_t page_size = static_cast<int32_t>(a.get_int("page-size", 16, 1, 1024));
    cfg.snapshot_every = page_size;
    const int32_t num_pages = static_cast<int32_t>(a.get_int("num-pages", 139600, 1, 1 << 30));
    Workload w;
    w.input_len = static_cast<int32_t>(a.get_int("input-len", w.input_len, 1, 1 << 24));
    w.output_len = static_cast<int32_t>(a.get_int("output-len", w.output_len, 1, 1 << 24));
    w.concurrency = static_cast<int32_t>(a.get_int("concurrency", w.concurrency, 1, 1 << 20));
    w.num_prompts = static_cast<int32_t>(a.get_int("num-prompts", w.num_prompts, 1, 1 << 24));
    const Counts c = simulate(cfg, num_pages, page_size, w, cost);
    const int64_t needed = int64_t{w.num_prompts} * w.input_len;
    std::printf(
        "{\"steps\": %lld, \"preemptions\": %lld, \"prefill_tokens\": %lld, "
        "\"recomputed_tokens\": %lld, \"decode_rows\": %lld, \"decode_only_steps\": %lld, "
        "\"max_running\": %lld, \"estimated_forward_s\": %.1f}\n",
        static_cast<long long>(c.steps), static_cast<long long>(c.preemptions),
        static_cast<long long>(c.prefill_tokens), static_cast<long long>(c.prefill_tokens - needed),
        static_cast<long long>(c.decode_rows), static_cast<long long>(c.full_decode_steps),
        static_cast<long long>(c.max_running), c.forward_ms / 1e3);
  } catch (const Error& e) {
    std::fprintf(stderr, "sched_sim: %s\n", e.what());
    return 1;
  }
  return 0;
}
