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

Scheduler::Scheduler(SchedulerConfig cfg, cache::PagePool& pages, cache::StateSlots& slots)
    : cfg_(cfg), pages_(pages), slots_(slots) {
  DS_CHECK(cfg.max_num_seqs > 0 && cfg.max_num_batched_tokens > 0, "bad scheduler config");
}

void Scheduler::add(Request* r) {
  r->status = RequestStatus::kWaiting;
  waiting_.insert(std::upper_bound(waiting_.begin(), waiting_.end(), r, by_id), r);
}

void Scheduler::remove(Request* r) {
  std::erase(running_, r);
  std::erase(waiting_, r);
  pages_.release(r->pages);
  if (r->slot >= 0) slots_.release(r->slot);
  r->slot = -1;
  r->status = RequestStatus::kFinished;
}

void Scheduler::preempt(Request* r, StepPlan& plan) {
  std::erase(running_, r);
  pages_.release(r->pages);
  slots_.release(r->slot);
  r->slot = -1;
  r->num_computed = 0;
  ++r->num_preemptions;
  plan.preempted.push_back(r->id);
  add(r);
}

bool Scheduler::reserve(Request* r, int64_t tokens, bool may_preempt, StepPlan& plan) {
  while (!pages_.grow(r->pages, tokens)) {
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

StepSeq Scheduler::make_seq(const Request* r, int32_t n) const {
  StepSeq s;
  s.request_id = r->id;
  s.token_ids.assign(r->tokens.begin() + r->num_computed, r->tokens.begin() + r->num_computed + n);
  s.start_pos = r->num_computed;
  s.slot = r->slot;
  s.pages = r->pages;
  s.sample = r->num_computed + n == static_cast<int32_t>(r->tokens.size());
  return s;
}

StepPlan Scheduler::schedule() {
  StepPlan plan;
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
    plan.seqs.push_back(make_seq(r, 1));
    scheduled_.push_back(r);
    --budget;
    ++i;
  }

  // 2. Prefill chunks of running requests, oldest first, as far as budget and pages allow.
  for (size_t i = 0; i < running_.size() && budget > 0; ++i) {
    Request* r = running_[i];
    if (remaining(r) <= 1) continue;
    int32_t n = std::min(remaining(r), budget);
    if (!reserve(r, r->num_computed + n, true, plan)) {
      // Take what the free pages allow (possibly nothing this step).
      const int64_t coverable =
          static_cast<int64_t>(r->pages.size() + static_cast<size_t>(pages_.num_free())) *
              pages_.page_size() -
          r->num_computed;
      n = static_cast<int32_t>(std::min<int64_t>(n, coverable));
      if (n <= 0 || !reserve(r, r->num_computed + n, false, plan)) continue;
    }
    plan.seqs.push_back(make_seq(r, n));
    scheduled_.push_back(r);
    budget -= n;
  }

  // 3. Admit waiting requests (FCFS) while a slot, sequence room, budget and pages remain.
  while (!waiting_.empty() && budget > 0 &&
         static_cast<int32_t>(running_.size()) < cfg_.max_num_seqs) {
    Request* r = waiting_.front();
    const int64_t coverable = static_cast<int64_t>(pages_.num_free()) * pages_.page_size();
    const int32_t n = static_cast<int32_t>(std::min<int64_t>({remaining(r), budget, coverable}));
    const bool just_preempted =
        std::find(plan.preempted.begin(), plan.preempted.end(), r->id) != plan.preempted.end();
    if (n <= 0 || slots_.num_free() == 0 || just_preempted) break;
    r->slot = slots_.acquire();
    DS_CHECK(pages_.grow(r->pages, r->num_computed + n), "pages counted free");
    waiting_.pop_front();
    r->status = RequestStatus::kRunning;
    running_.insert(std::upper_bound(running_.begin(), running_.end(), r, by_id), r);
    plan.seqs.push_back(make_seq(r, n));
    scheduled_.push_back(r);
    budget -= n;
  }

  for (const StepSeq& s : plan.seqs) plan.num_tokens += static_cast<int32_t>(s.token_ids.size());
  return plan;
}

void Scheduler::commit(const StepPlan& plan, const std::vector<Request*>& reqs) {
  DS_CHECK(plan.seqs.size() == reqs.size(), "commit: plan and requests differ");
  for (size_t i = 0; i < reqs.size(); ++i)
    reqs[i]->num_computed += static_cast<int32_t>(plan.seqs[i].token_ids.size());
}

}  // namespace deltaserve::engine
