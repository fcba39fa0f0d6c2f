// Scheduler: decides each step's work. Running decode rows first (oldest first), then prefill
// chunks of running requests, then new requests (FCFS; an n > 1 sibling waits for its leader's
// prefill and resumes from the cache it leaves), within max_num_batched_tokens tokens and
// max_num_seqs sequences, each prefill chunk at most long_prefill_token_threshold tokens when set;
// pages and slots are taken here and never overcommitted. A waiting request is admitted only while
// the available pages cover what it and every running request still need to finish: the rest of
// the prompt and its expected remaining output — up to the longest output of the last requests that
// finished (OutputLengthWindow), at most its max_tokens and admission_reserve_tokens: waiting
// costs a request its queueing time, being admitted and then preempted costs it all it had
// computed. When a running request needs a page and none is free (its output outgrew the
// reserve), the youngest unscheduled running request younger than it is preempted (freed,
// recomputed later). The result is the step's immutable StepBatch, built here once, with the
// requests it serves in sequence order.
//
// With prefix caching (scheduler_prefix.cpp), a request admitted with nothing computed resumes from
// the longest cached prefix that has a GDN snapshot (its KV pages shared, the snapshot restored in
// its first step); its state is saved at the last grid point before the prompt's end and where its
// KV diverges from the cache (inside a step when that point is a chunk multiple from the step's
// start, else by ending the chunk there), and any step that leaves a sequence at a multiple of
// snapshot_every tokens saves a snapshot there (a request keeps only its latest decode snapshot).
// Computed full pages are indexed after each step.
#pragma once

#include <cstdint>
#include <deque>
#include <vector>

#include "cache/cache_manager.h"
#include "core/step_batch.h"
#include "engine/output_length_window.h"
#include "engine/request.h"

namespace deltaserve::engine {

struct SchedulerConfig {
  int32_t max_num_seqs = 64;
  int32_t max_num_batched_tokens = 2048;
  int32_t snapshot_every = 64;  // snapshot grid (tokens; a multiple of the page size)
  // vLLM's long_prefill_token_threshold: > 0 caps each request's prefill chunk of a step at this
  // many tokens, so a long prompt shares the step budget with the prompts behind it.
  int32_t long_prefill_token_threshold = 0;
  // Output tokens of each request (at most its max_tokens left) that admission keeps KV room for.
  // 0: room for the prompts only (decode growth then preempts, as in vLLM).
  int32_t admission_reserve_tokens = 4096;
};

// One step: decode rows first, then prefill chunks. A chunk that reaches the end of its
// request's tokens samples its last row.
struct ScheduledStep {
  StepBatch batch;
  std::vector<Request*> requests;              // batch.seqs()[i] serves requests[i]
  std::vector<uint64_t> preempted;             // requests preempted while planning this step
  int64_t prefix_queried = 0, prefix_hit = 0;  // prompt tokens looked up / found (first admissions)
  bool empty() const { return requests.empty(); }
};

class Scheduler {
 public:
  Scheduler(SchedulerConfig cfg, cache::CacheManager& cache);

  // Queues a new request (status kWaiting). Requests are ordered by id (= arrival).
  void add(Request* r);
  // Drops a finished or aborted request from the queues and frees its pages and slot.
  void remove(Request* r);
  // Plans the next step, taking pages and slots for it.
  ScheduledStep schedule();
  // Records how many outputs a request that finished on its own (not aborted) produced: admission
  // expects the next requests to reach as far as the longest of the recent ones.
  void record_output_length(int32_t outputs) { finished_outputs_.record(outputs); }
  // Records that `step` ran: each sequence's tokens are now in the cache (and indexed, with the
  // snapshots it saved, when prefix caching is on).
  void commit(const ScheduledStep& step);

  size_t num_running() const { return running_.size(); }
  size_t num_waiting() const { return waiting_.size(); }

 private:
  // Whether `r` waits for its prefill leader (GenerateRequest::prefill_leader) to finish its
  // prefill, so as to resume from the cache it leaves.
  bool awaits_leader(const Request* r) const;
  // Frees `r`'s pages and slot and puts it back in the waiting queue for recompute.
  void preempt(Request* r, ScheduledStep& step);
  // Grows r's page table to `tokens` positions, preempting younger unscheduled running requests
  // when needed (and allowed). False when the pages cannot be had.
  bool reserve(Request* r, int64_t tokens, bool may_preempt, ScheduledStep& step);
  // Pages r still needs for its prompt and expected outputs (at most admission_reserve_tokens
  // more).
  int64_t pages_to_finish(const Request* r) const;
  // r's prefill chunk this step: its remaining tokens within `budget` and the long-prefill cap.
  int32_t prefill_chunk(const Request* r, int32_t budget) const;
  // Adds up to `n` of r's tokens from num_computed to the step being built (fewer when a snapshot
  // point must end the chunk); returns how many.
  int32_t add_seq(Request* r, int32_t n, StepBatchBuilder& b, ScheduledStep& step);
  // Prefix caching (scheduler_prefix.cpp).
  // Resumes a request with nothing computed from the cache (pages shared, snapshot pinned) and
  // plans its snapshot cuts.
  void resume_from_cache(Request* r);
  // Undoes resume_from_cache for a request that could not be admitted after all.
  void forget_resume(Request* r);
  // r's next chunk of at most `n` tokens: how many it takes, and the snapshot point inside it
  // (an offset, 0: none) that the step's GDN ops save. A chunk of 256+ tokens that stops short of
  // r's tokens ends on a multiple of kSnapshotChunk (the rest of the budget goes to others). A
  // snapshot point is an in-step snapshot when it is a chunk multiple from the chunk's start and
  // the only one inside; otherwise the chunk ends there.
  struct ChunkPlan {
    int32_t tokens = 0, mid_at = 0;
  };
  ChunkPlan plan_chunk(Request* r, int32_t n);
  // Whether the cache holds a snapshot at r's position `end` (a multiple of the page size).
  bool snapshot_exists(Request* r, int32_t end);
  // A snapshot slot when r's state at position `end` should be saved, else -1.
  int32_t snapshot_slot_at(Request* r, int32_t end);
  // After a step: releases r's restored snapshot, indexes its computed pages, files `saved`.
  void commit_prefix(Request* r, const StepSeq& s);
  void release_restore(Request* r);

  SchedulerConfig cfg_;
  // The last step's sizes: the next one's builder reserves as much (its page table with what a
  // step can add to it).
  struct {
    int64_t tokens = 0, seqs = 0, pages = 0;
  } last_batch_;
  cache::CacheManager& cache_;
  std::vector<Request*> running_;    // ascending id
  std::deque<Request*> waiting_;     // ascending id
  std::vector<Request*> scheduled_;  // this step's requests (not preemptible)
  OutputLengthWindow finished_outputs_;
};

}  // namespace deltaserve::engine
