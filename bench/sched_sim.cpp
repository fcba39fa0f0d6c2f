// sched_sim: runs the engine's scheduler alone (no model) over a closed-loop workload, like
// `bench serve` with fixed prompt and output lengths, and prints what it did: steps, preemptions,
// the prefill tokens recomputed after preemption, and how full the steps were. The KV pool and slot
// count are the memory plan's (pass --num-pages from `serve`'s printed plan), so a scheduling
// policy can be compared on the CPU before it is timed on a GPU (engine/scheduler_replay.h). It
// also prints a forward-time estimate from a linear step cost (engine::StepCost; the H200's figures
// by default put 2,313 steps at 117.6 s where serve measured 2,314 steps and 120.5 s at 8eab62b).
#include <cstdio>

#include "app/args.h"
#include "app/scheduler_flags.h"
#include "core/error.h"
#include "engine/scheduler_replay.h"

using namespace deltaserve;

int main(int argc, char** argv) {
  try {
    const app::Args a(std::vector<std::string>(argv + 1, argv + argc), "sched_sim",
                      {"num-pages", "page-size", "max-num-seqs", "max-num-batched-tokens",
                       "long-prefill-token-threshold", "admission-reserve-tokens", "fixed-ms",
                       "decode-row-ms", "prefill-token-ms", "input-len", "output-len", "max-tokens",
                       "concurrency", "num-prompts"});
    engine::SchedulerConfig cfg;
    cfg.max_num_seqs = static_cast<int32_t>(a.get_int("max-num-seqs", 512, 1, 1 << 16));
    const app::SchedulerFlags sched = app::scheduler_flags(a, 2048);
    cfg.max_num_batched_tokens = sched.max_num_batched_tokens;
    cfg.long_prefill_token_threshold = sched.long_prefill_token_threshold;
    cfg.admission_reserve_tokens = sched.admission_reserve_tokens;
    engine::StepCost cost;
    cost.fixed_ms = a.get_double("fixed-ms", cost.fixed_ms, 0, 1e6);
    cost.decode_row_ms = a.get_double("decode-row-ms", cost.decode_row_ms, 0, 1e6);
    cost.prefill_token_ms = a.get_double("prefill-token-ms", cost.prefill_token_ms, 0, 1e6);
    const int32_t page_size = static_cast<int32_t>(a.get_int("page-size", 16, 1, 1024));
    cfg.snapshot_every = page_size;
    const int32_t num_pages = static_cast<int32_t>(a.get_int("num-pages", 139217, 1, 1 << 30));
    engine::ReplayWorkload w;
    w.input_len = static_cast<int32_t>(a.get_int("input-len", w.input_len, 1, 1 << 24));
    w.output_len = static_cast<int32_t>(a.get_int("output-len", w.output_len, 1, 1 << 24));
    w.max_tokens = static_cast<int32_t>(a.get_int("max-tokens", 0, 0, 1 << 24));
    w.concurrency = static_cast<int32_t>(a.get_int("concurrency", w.concurrency, 1, 1 << 20));
    w.num_prompts = static_cast<int32_t>(a.get_int("num-prompts", w.num_prompts, 1, 1 << 24));
    const engine::ReplayCounts c = engine::replay_closed_loop(cfg, num_pages, page_size, w, cost);
    const int64_t needed = int64_t{w.num_prompts} * w.input_len;
    std::printf(
        "{\"steps\": %lld, \"preemptions\": %lld, \"prefill_tokens\": %lld, "
        "\"recomputed_tokens\": %lld, \"decode_rows\": %lld, \"decode_only_steps\": %lld, "
        "\"max_running\": %lld, \"estimated_forward_s\": %.1f}\n",
        static_cast<long long>(c.steps), static_cast<long long>(c.preemptions),
        static_cast<long long>(c.prefill_tokens), static_cast<long long>(c.prefill_tokens - needed),
        static_cast<long long>(c.decode_rows), static_cast<long long>(c.decode_only_steps),
        static_cast<long long>(c.max_running), c.forward_ms / 1e3);
  } catch (const Error& e) {
    std::fprintf(stderr, "sched_sim: %s\n", e.what());
    return 1;
  }
  return 0;
}
