// Scheduler: decides each step's work. Running decode rows first (oldest first), then prefill
// chunks of running requests, then new requests (FCFS), within max_num_batched_tokens tokens and
// max_num_seqs sequences; pages and slots are taken here and never overcommitted. When a running
// request needs a page and none is free, the youngest unscheduled running request younger than it
// is preempted (freed, recomputed later). The result is an immutable StepPlan.
#pragma once

#include <cstdint>
#include <deque>
#include <vector>

#include "cache/page_pool.h"
#include "engine/request.h"

namespace deltaserve::engine {

struct SchedulerConfig {
  int32_t max_num_seqs = 64;
  int32_t max_num_batched_tokens = 2048;
};

// One sequence's share of a step: its new tokens at [start_pos, start_pos + size).
struct StepSeq {
  uint64_t request_id = 0;
  std::vector<int32_t> token_ids;
  int32_t start_pos = 0;
  int32_t slot = 0;
  std::vector<int32_t> pages;
  bool sample =
      false;  // the chunk reaches the end of the request's tokens: sample from its last row
};

struct StepPlan {
  std::vector<StepSeq> seqs;  // decode rows first, then prefill chunks
  int32_t num_tokens = 0;
  std::vector<uint64_t> preempted;  // requests preempted while planning this step
  bool empty() const { return seqs.empty(); }
};

class Scheduler {
 public:
  Scheduler(SchedulerConfig cfg, cache::PagePool& pages, cache::StateSlots& slots);

  // Queues a new request (status kWaiting). Requests are ordered by id (= arrival).
  void add(Request* r);
  // Drops a finished or aborted request from the queues and frees its pages and slot.
  void remove(Request* r);
  // Plans the next step, taking pages and slots for it.
  StepPlan schedule();
  // Records that `plan` ran: each sequence's tokens are now in the cache.
  void commit(const StepPlan& plan, const std::vector<Request*>& requests_in_plan_order);

  size_t num_running() const { return running_.size(); }
  size_t num_waiting() const { return waiting_.size(); }

 private:
  // Frees `r`'s pages and slot and puts it back in the waiting queue for recompute.
  void preempt(Request* r, StepPlan& plan);
  // Grows r's page table to `tokens` positions, preempting younger unscheduled running requests
  // when needed (and allowed). False when the pages cannot be had.
  bool reserve(Request* r, int64_t tokens, bool may_preempt, StepPlan& plan);
  StepSeq make_seq(const Request* r, int32_t n) const;

  SchedulerConfig cfg_;
  cache::PagePool& pages_;
  cache::StateSlots& slots_;
  std::vector<Request*> running_;    // ascending id
  std::deque<Request*> waiting_;     // ascending id
  std::vector<Request*> scheduled_;  // this step's requests (not preemptible)
};

}  // namespace deltaserve::engine
