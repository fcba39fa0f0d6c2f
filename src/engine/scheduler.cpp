#include "engine/scheduler.h"

#include <algorithm>

#include "core/error.h"

namespace deltaserve::engine {

namespace {

bool by_id(const Request* a, const Request* b) { return a->id < b->id; }

int32_t remaining(const Request* r) {
  return static_cast<int32_t>(r->tokens.size()) - r->num_computed;
}

}  // namespace

Scheduler::Scheduler(SchedulerConfig cfg, cache::CacheManager& cache) : cfg_(cfg), cache_(cache) {
  DS_CHECK(cfg.max_num_seqs > 0 && cfg.max_num_batched_tokens > 0 && cfg.snapshot_every > 0 &&
               cfg.admission_reserve_tokens >= 0 && cfg.snapshot_every % cache.page_size() == 0,
           "bad scheduler config");
}

void Scheduler::add(Request* r) {
  r->status = RequestStatus::kWaiting;
  waiting_.insert(std::upper_bound(waiting_.begin(), waiting_.end(), r, by_id), r);
}

void Scheduler::remove(Request* r) {
  std::erase(running_, r);
  std::erase(waiting_, r);
  release_restore(r);
  cache_.release_pages(r->pages);
  if (r->slot >= 0) cache_.release_slot(r->slot);
  r->slot = -1;
  r->status = RequestStatus::kFinished;
}

void Scheduler::preempt(Request* r, ScheduledStep& plan) {
  std::erase(running_, r);
  cache_.release_pages(r->pages);
  cache_.release_slot(r->slot);
  r->slot = -1;
  r->num_computed = 0;
  r->num_indexed = 0;
  ++r->num_preemptions;
  plan.preempted.push_back(r->id);
  add(r);
}

bool Scheduler::reserve(Request* r, int64_t tokens, bool may_preempt, ScheduledStep& plan) {
  while (!cache_.grow_pages(r->pages, tokens)) {
    if (!may_preempt) return false;
    Request* victim = nullptr;
    for (auto it = running_.rbegin(); it != running_.rend(); ++it) {
      if ((*it)->id <= r->id) break;
      if (std::find(scheduled_.begin(), scheduled_.end(), *it) == scheduled_.end()) {
        victim = *it;
        break;
      }
    }
    if (!victim) return false;
    preempt(victim, plan);
  }
  return true;
}

int32_t Scheduler::add_seq(Request* r, int32_t n, StepBatchBuilder& b, ScheduledStep& step) {
  const ChunkPlan chunk = plan_chunk(r, n);
  n = chunk.tokens;
  const int32_t end = r->num_computed + n;
  const bool last = end == static_cast<int32_t>(r->tokens.size());
  const StateSource source = r->restore_snapshot >= 0 ? StateSource::kSnapshot
                             : r->num_computed == 0   ? StateSource::kFresh
                                                      : StateSource::kSlot;
  b.add(r->id, std::span<const int32_t>(r->tokens.data() + r->num_computed, static_cast<size_t>(n)),
        r->num_computed, r->slot, r->pages, last ? 1 : 0, source, r->restore_snapshot);
  if (chunk.mid_at > 0)
    if (const int32_t snap = snapshot_slot_at(r, r->num_computed + chunk.mid_at); snap >= 0)
      b.save_snapshot_at(chunk.mid_at, snap);
  if (const int32_t snap = snapshot_slot_at(r, end); snap >= 0) b.save_snapshot(snap);
  step.requests.push_back(r);
  scheduled_.push_back(r);
  return n;
}

ScheduledStep Scheduler::schedule() {
  ScheduledStep plan;
  StepBatchBuilder builder(cache_.page_size());
  // The last step's page table grows by up to a page a running sequence (a decode row crossing a
  // page) plus the pages of the token budget's new chunks: reserved with that headroom, the ~150k
  // entries of 256 long sequences are allocated once a step rather than regrown and copied.
  const int64_t page_size = cache_.page_size();
  builder.reserve(last_batch_.tokens, last_batch_.seqs,
                  last_batch_.pages + last_batch_.seqs +
                      (cfg_.max_num_batched_tokens + page_size - 1) / page_size + 1);
  scheduled_.clear();
  int32_t budget = cfg_.max_num_batched_tokens;

  // 1. Decode rows of running requests, oldest first. One that cannot get a page even by
  // preempting younger ones is preempted itself.
  for (size_t i = 0; i < running_.size() && budget > 0;) {
    Request* r = running_[i];
    if (remaining(r) != 1) {
      ++i;
      continue;
    }
    if (!reserve(r, r->num_computed + 1, true, plan)) {
      preempt(r, plan);
      continue;  // running_[i] is now the next request
    }
    add_seq(r, 1, builder, plan);
    --budget;
    ++i;
  }

  // 2. Prefill chunks of running requests, oldest first, as far as budget and pages allow.
  for (size_t i = 0; i < running_.size() && budget > 0; ++i) {
    Request* r = running_[i];
    if (remaining(r) <= 1) continue;
    int32_t n = prefill_chunk(r, budget);
    if (!reserve(r, r->num_computed + n, true, plan)) {
      // Take what the free pages allow (possibly nothing this step).
      const int64_t coverable =
          static_cast<int64_t>(r->pages.size() +
                               static_cast<size_t>(cache_.num_available_pages())) *
              cache_.page_size() -
          r->num_computed;
      n = static_cast<int32_t>(std::min<int64_t>(n, coverable));
      if (n <= 0 || !reserve(r, r->num_computed + n, false, plan)) continue;
    }
    budget -= add_seq(r, n, builder, plan);
  }

  // 3. Admit waiting requests (FCFS) while a slot, sequence room, budget and pages remain, the
  // pages covering what the running requests and the new one need to finish (into an empty batch
  // a request is admitted on room for its first chunk). A request waiting for its prefill leader
  // (n > 1) is passed over; the rest keep their order.
  int64_t committed = 0;  // summed only when someone waits (not on every decode step)
  if (!waiting_.empty())
    for (const Request* r : running_) committed += pages_to_finish(r);
  for (size_t w = 0; w < waiting_.size() && budget > 0 &&
                     static_cast<int32_t>(running_.size()) < cfg_.max_num_seqs;) {
    Request* r = waiting_[w];
    if (awaits_leader(r)) {
      ++w;
      continue;
    }
    const bool just_preempted =
        std::find(plan.preempted.begin(), plan.preempted.end(), r->id) != plan.preempted.end();
    if (cache_.num_free_slots() == 0 || just_preempted) break;
    if (r->num_computed == 0) resume_from_cache(r);
    const int64_t coverable =
        static_cast<int64_t>(cache_.num_available_pages()) * cache_.page_size();
    const int32_t n = static_cast<int32_t>(std::min<int64_t>(prefill_chunk(r, budget), coverable));
    const bool room =
        running_.empty() || cache_.num_available_pages() - committed >= pages_to_finish(r);
    if (n <= 0 || !room) {
      forget_resume(r);
      break;
    }
    r->slot = cache_.acquire_slot();
    DS_CHECK(cache_.grow_pages(r->pages, r->num_computed + n), "pages counted free");
    waiting_.erase(waiting_.begin() + static_cast<std::ptrdiff_t>(w));
    if (!r->admitted_once) {
      r->admitted_once = true;
      r->num_cached_tokens = r->num_computed;
      if (cache_.prefix_caching()) {
        plan.prefix_queried += r->num_prompt;
        plan.prefix_hit += r->num_computed;
      }
    }
    r->status = RequestStatus::kRunning;
    running_.insert(std::upper_bound(running_.begin(), running_.end(), r, by_id), r);
    budget -= add_seq(r, n, builder, plan);
    committed += pages_to_finish(r);
  }
  plan.batch = builder.build();
  last_batch_ = {plan.batch.num_tokens(), plan.batch.num_seqs(),
                 static_cast<int64_t>(plan.batch.page_ids().size())};
  return plan;
}

int64_t Scheduler::pages_to_finish(const Request* r) const {
  // Expected to reach the longest recent output (before any finished: max_tokens).
  const int64_t expected =
      finished_outputs_.empty()
          ? r->params.max_tokens
          : std::min<int64_t>(finished_outputs_.longest(), r->params.max_tokens);
  const int64_t outputs =
      std::clamp<int64_t>(expected - r->num_outputs(), 0, cfg_.admission_reserve_tokens);
  const int64_t held = static_cast<int64_t>(r->pages.size());
  return std::max<int64_t>(
      cache_.pages_for(static_cast<int64_t>(r->tokens.size()) + outputs) - held, 0);
}

int32_t Scheduler::prefill_chunk(const Request* r, int32_t budget) const {
  const int32_t n = std::min(remaining(r), budget);
  const int32_t cap = cfg_.long_prefill_token_threshold;
  return cap > 0 ? std::min(n, cap) : n;
}

bool Scheduler::awaits_leader(const Request* r) const {
  if (r->prefill_leader == 0 || r->num_computed > 0 || !cache_.prefix_caching() ||
      r->num_prompt <= cfg_.snapshot_every)  // nothing a leader's prefill could leave to resume
    return false;
  const auto is_leader = [&](const Request* q) { return q->id == r->prefill_leader; };
  const auto run = std::find_if(running_.begin(), running_.end(), is_leader);
  if (run != running_.end()) return (*run)->num_computed < (*run)->num_prompt;
  return std::any_of(waiting_.begin(), waiting_.end(), is_leader);  // else finished or aborted
}

void Scheduler::commit(const ScheduledStep& step) {
  DS_CHECK(static_cast<size_t>(step.batch.num_seqs()) == step.requests.size(),
           "commit: batch and requests differ");
  for (size_t i = 0; i < step.requests.size(); ++i) {
    step.requests[i]->num_computed += step.batch.seq(i).num_tokens;
    commit_prefix(step.requests[i], step.batch.seq(i));
  }
}

}  // namespace deltaserve::engine
