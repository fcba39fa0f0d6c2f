#include "engine/scheduler_replay.h"

#include <algorithm>
#include <map>
#include <memory>

#include "cache/cache_manager.h"
#include "core/error.h"

namespace deltaserve::engine {
namespace {

std::unique_ptr<Request> make_request(uint64_t id, const ReplayWorkload& w) {
  auto r = std::make_unique<Request>();
  r->id = id;
  r->num_prompt = w.input_len;
  r->tokens.assign(static_cast<size_t>(w.input_len), 5);
  r->params.max_tokens = std::max(w.max_tokens, w.output_len);
  return r;
}

// A step's decode rows and prefill tokens into c.
void count_step(const ScheduledStep& plan, const StepCost& cost, ReplayCounts& c) {
  int64_t prefill = 0, decode = 0;
  for (size_t i = 0; i < plan.requests.size(); ++i) {
    const Request* r = plan.requests[i];
    const int32_t n = plan.batch.seq(i).num_tokens;
    const bool is_decode = n == 1 &&
                           r->num_computed + 1 == static_cast<int32_t>(r->tokens.size()) &&
                           r->num_outputs() > 0;
    if (is_decode)
      ++decode;
    else
      prefill += n;
  }
  ++c.steps;
  c.preemptions += static_cast<int64_t>(plan.preempted.size());
  c.decode_rows += decode;
  c.prefill_tokens += prefill;
  c.decode_only_steps += prefill == 0;
  c.forward_ms += cost.fixed_ms + cost.decode_row_ms * static_cast<double>(decode) +
                  cost.prefill_token_ms * static_cast<double>(prefill);
}

}  // namespace

ReplayCounts replay_closed_loop(const SchedulerConfig& cfg, int32_t num_pages, int32_t page_size,
                                const ReplayWorkload& w, const StepCost& cost) {
  cache::CacheManager cache({num_pages, page_size, cfg.max_num_seqs, 0});
  Scheduler sched(cfg, cache);
  std::map<uint64_t, std::unique_ptr<Request>> live;
  uint64_t next_id = 1;
  int32_t sent = 0;
  ReplayCounts c;
  const auto top_up = [&] {
    while (sent < w.num_prompts && static_cast<int32_t>(live.size()) < w.concurrency) {
      auto r = make_request(next_id++, w);
      sched.add(r.get());
      live[r->id] = std::move(r);
      ++sent;
    }
  };
  for (top_up(); !live.empty(); top_up()) {
    const ScheduledStep plan = sched.schedule();
    if (plan.empty()) throw Error("the scheduler stalled with requests waiting");
    count_step(plan, cost, c);
    c.max_running = std::max<int64_t>(c.max_running, static_cast<int64_t>(sched.num_running()));
    sched.commit(plan);
    for (size_t i = 0; i < plan.requests.size(); ++i) {
      if (plan.batch.seq(i).num_samples == 0) continue;
      Request* r = plan.requests[i];
      r->tokens.push_back(7);
      if (r->num_outputs() >= w.output_len) {
        sched.record_output_length(r->num_outputs());
        sched.remove(r);
        live.erase(r->id);
        ++c.finished;
      }
    }
  }
  return c;
}

}  // namespace deltaserve::engine
