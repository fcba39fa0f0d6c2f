// Scheduler traces as tables: arrivals -> the rows of every step ("A:p8@0" = request A, a prefill
// chunk of 8 tokens from position 0; "d1" = a decode row; "!B" = B preempted while planning).
#include "engine/scheduler.h"

#include <gtest/gtest.h>

#include <map>

#include "cache/cache_manager.h"
#include "engine/scheduler_replay.h"

namespace deltaserve::engine {
namespace {

struct Arrival {
  int step;  // 1-based step before which it arrives
  char name;
  int prompt;
  int max_tokens;
};

std::vector<std::string> trace(SchedulerConfig cfg, int num_pages, int page_size,
                               std::vector<Arrival> arrivals, int max_steps = 50) {
  cache::CacheManager cache({num_pages, page_size, cfg.max_num_seqs, 0});
  Scheduler s(cfg, cache);
  std::map<uint64_t, std::unique_ptr<Request>> reqs;
  std::map<uint64_t, char> names;
  std::vector<std::string> out;
  uint64_t next_id = 1;
  for (int step = 1; step <= max_steps; ++step) {
    for (const Arrival& a : arrivals) {
      if (a.step != step) continue;
      auto r = std::make_unique<Request>();
      r->id = next_id++;
      r->num_prompt = a.prompt;
      r->tokens.assign(static_cast<size_t>(a.prompt), 5);
      r->params.max_tokens = a.max_tokens;
      names[r->id] = a.name;
      s.add(r.get());
      reqs[r->id] = std::move(r);
    }
    const ScheduledStep plan = s.schedule();
    if (plan.empty() && reqs.empty()) break;
    std::string row;
    for (size_t i = 0; i < plan.requests.size(); ++i) {
      const StepSeq& q = plan.batch.seq(i);
      Request* r = reqs.at(q.request_id).get();
      EXPECT_EQ(plan.requests[i], r);
      const bool decode = q.num_tokens == 1 &&
                          r->num_computed == static_cast<int32_t>(r->tokens.size()) - 1 &&
                          r->num_outputs() > 0;
      row += std::string(row.empty() ? "" : " ") + names[q.request_id] + ":" +
             (decode ? "d" : "p") + std::to_string(q.num_tokens) + "@" +
             std::to_string(q.start_pos);
      EXPECT_EQ(static_cast<int64_t>(plan.batch.pages(i).size()) * page_size >=
                    q.start_pos + static_cast<int64_t>(q.num_tokens),
                true);
    }
    for (uint64_t id : plan.preempted) row += std::string(" !") + names[id];
    out.push_back(row);
    s.commit(plan);
    for (size_t i = 0; i < plan.requests.size(); ++i) {
      if (plan.batch.seq(i).num_samples == 0) continue;
      Request* r = plan.requests[i];
      r->tokens.push_back(7);
      if (r->num_outputs() >= r->params.max_tokens) {
        s.remove(r);
        reqs.erase(r->id);
      }
    }
    EXPECT_LE(cache.num_free_pages(), num_pages);
  }
  EXPECT_TRUE(reqs.empty()) << "unfinished requests";
  EXPECT_EQ(cache.num_free_pages(), num_pages);
  EXPECT_EQ(cache.num_free_slots(), cfg.max_num_seqs);
  return out;
}

TEST(Scheduler, ChunkedPrefillThenDecodeRowsFirst) {
  const auto t = trace({4, 8}, 32, 4, {{1, 'A', 10, 3}, {1, 'B', 3, 2}});
  EXPECT_EQ(t, (std::vector<std::string>{
                   "A:p8@0",          // budget 8: A's first chunk; B waits
                   "A:p2@8 B:p3@0",   // A finishes its prompt (samples), B is admitted
                   "A:d1@10 B:d1@3",  // decode rows; B reaches max_tokens
                   "A:d1@11",
               }));
}

// --long-prefill-token-threshold 4: each prefill chunk is at most 4 tokens, so the short prompt
// behind a long one is admitted in the first step instead of waiting for the budget to free up.
TEST(Scheduler, LongPrefillThresholdSharesTheBudget) {
  SchedulerConfig cfg{4, 8};
  cfg.long_prefill_token_threshold = 4;
  const auto t = trace(cfg, 32, 4, {{1, 'A', 10, 2}, {1, 'B', 3, 2}});
  EXPECT_EQ(t, (std::vector<std::string>{
                   "A:p4@0 B:p3@0",  // A capped at 4; B's whole prompt fits beside it
                   "B:d1@3 A:p4@4",  // B's decode row first
                   "A:p2@8",         // A's prompt ends (samples); B done
                   "A:d1@10",
               }));
  // Without the cap A takes the budget and B waits a step (ChunkedPrefillThenDecodeRowsFirst).
  const auto uncapped = trace({4, 8}, 32, 4, {{1, 'A', 10, 2}, {1, 'B', 3, 2}});
  EXPECT_EQ(uncapped.front(), "A:p8@0");
}

TEST(Scheduler, DecodeRowsBeforePrefillAndSeqLimit) {
  // max_num_seqs 2: C waits for a slot until A finishes.
  const auto t = trace({2, 6}, 64, 4, {{1, 'A', 2, 2}, {1, 'B', 9, 1}, {2, 'C', 4, 1}});
  EXPECT_EQ(t, (std::vector<std::string>{
                   "A:p2@0 B:p4@0",
                   "A:d1@2 B:p5@4",  // A's decode row comes first; A done, B samples and is done
                   "C:p4@0",
               }));
}

TEST(Scheduler, PreemptsYoungestAndRecomputes) {
  // 4 pages of 4 tokens: two requests of 6 + 6 tokens cannot both finish. With no output room
  // reserved (vLLM's policy) both are admitted on their prompts' room.
  SchedulerConfig cfg{4, 16};
  cfg.admission_reserve_tokens = 0;
  const auto t = trace(cfg, 4, 4, {{1, 'A', 6, 6}, {1, 'B', 6, 6}});
  EXPECT_EQ(t, (std::vector<std::string>{
                   "A:p6@0 B:p6@0",
                   "A:d1@6 B:d1@6",
                   "A:d1@7 B:d1@7",
                   "A:d1@8 !B",  // A needs a 3rd page: B (younger) is preempted
                   "A:d1@9",     // B's 6 prompt + 3 output tokens need 3 pages; 1 is free
                   "A:d1@10",    // A finishes
                   "B:p9@0",     // B recomputes
                   "B:d1@9",
                   "B:d1@10",
               }));
}

TEST(Scheduler, AdmissionKeepsRoomForTheOutputs) {
  // The same two requests with output room reserved (the default): B waits for A's pages instead
  // of being admitted, preempted and recomputed.
  const auto t = trace({4, 16}, 4, 4, {{1, 'A', 6, 6}, {1, 'B', 6, 6}});
  EXPECT_EQ(t, (std::vector<std::string>{
                   "A:p6@0",
                   "A:d1@6",
                   "A:d1@7",
                   "A:d1@8",
                   "A:d1@9",
                   "A:d1@10",  // A done
                   "B:p6@0",
                   "B:d1@6",
                   "B:d1@7",
                   "B:d1@8",
                   "B:d1@9",
                   "B:d1@10",
               }));
  // Room is kept for at most admission_reserve_tokens outputs: with 2, both are admitted (6 + 2
  // tokens each fill the 4 pages) and B is preempted when A outgrows its reserve.
  SchedulerConfig two{4, 16};
  two.admission_reserve_tokens = 2;
  const auto clipped = trace(two, 4, 4, {{1, 'A', 6, 6}, {1, 'B', 6, 6}});
  ASSERT_GE(clipped.size(), 4u);
  EXPECT_EQ(clipped[0], "A:p6@0 B:p6@0");
  EXPECT_EQ(clipped[3], "A:d1@8 !B");
}

// A request that alone needs more than the pool (prompt + reserve) still runs when nothing else
// does: admission needs room only for its first chunk then.
TEST(Scheduler, AnEmptyBatchAdmitsOnFirstChunkRoom) {
  const auto t = trace({4, 16}, 3, 4, {{1, 'A', 6, 4}});
  EXPECT_EQ(t, (std::vector<std::string>{"A:p6@0", "A:d1@6", "A:d1@7", "A:d1@8"}));
}

// A closed loop of 32 clients (96 requests of 256 + 64 tokens, 20 pages each at most) against 540
// pages, 100 short of the 640 that 32 running requests reach: with the default reserve requests
// queue and nothing is recomputed; with none (vLLM's policy) the same load preempts.
TEST(Scheduler, ClosedLoopOnAShortPoolQueuesInsteadOfRecomputing) {
  const ReplayWorkload w{256, 64, 32, 96};
  SchedulerConfig cfg{64, 2048};
  const ReplayCounts reserved = replay_closed_loop(cfg, 540, 16, w);
  EXPECT_EQ(reserved.finished, 96);
  EXPECT_EQ(reserved.preemptions, 0);
  EXPECT_EQ(reserved.prefill_tokens, 96 * 256) << "every prompt prefilled once";
  EXPECT_EQ(reserved.decode_rows, 96 * 63);  // the first output comes from the prefill
  EXPECT_LE(reserved.max_running, 540 / 20);
  cfg.admission_reserve_tokens = 0;
  const ReplayCounts unreserved = replay_closed_loop(cfg, 540, 16, w);
  EXPECT_EQ(unreserved.finished, 96);
  EXPECT_GT(unreserved.preemptions, 0);
  EXPECT_GT(unreserved.prefill_tokens, 96 * 256);
}

// Requests that stop long before max_tokens (256 + 32 tokens used of 256 + 512 allowed): before any
// finished, admission keeps room for max_tokens (48 pages a request: 11 of them in 540 pages); once
// some have, for the longest recent output (18 pages: 30), without preempting anything.
TEST(Scheduler, AdmissionLearnsHowLongOutputsRun) {
  ReplayWorkload w{256, 32, 40, 200};
  w.max_tokens = 512;
  const ReplayCounts c = replay_closed_loop({64, 2048}, 540, 16, w);
  EXPECT_EQ(c.finished, 200);
  EXPECT_EQ(c.preemptions, 0);
  EXPECT_EQ(c.prefill_tokens, 200 * 256);
  EXPECT_GE(c.max_running, 28);
  EXPECT_LE(c.max_running, 30);
}

TEST(OutputLengthWindow, LongestOfTheLastRecorded) {
  OutputLengthWindow win;
  EXPECT_TRUE(win.empty());
  EXPECT_EQ(win.longest(), 0);
  win.record(700);
  for (int i = 0; i < OutputLengthWindow::kSize - 1; ++i) win.record(10 + i % 5);
  EXPECT_EQ(win.longest(), 700);
  win.record(20);  // 700 drops out of the window
  EXPECT_EQ(win.longest(), 20);
  EXPECT_FALSE(win.empty());
}

TEST(PagePool, GrowReleaseAndLowestFirst) {
  cache::PagePool p(5, 16);
  std::vector<int32_t> a, b;
  EXPECT_TRUE(p.grow(a, 17));  // 2 pages
  EXPECT_EQ(a, (std::vector<int32_t>{0, 1}));
  EXPECT_TRUE(p.grow(b, 48));
  EXPECT_EQ(p.num_free(), 0);
  EXPECT_FALSE(p.grow(a, 33));
  EXPECT_EQ(a.size(), 2u);  // unchanged on failure
  p.release(a);
  EXPECT_TRUE(a.empty());
  EXPECT_EQ(p.num_free(), 2);
  std::vector<int32_t> c;
  EXPECT_TRUE(p.grow(c, 1));
  EXPECT_EQ(c, (std::vector<int32_t>{0}));
  cache::StateSlots s(2);
  EXPECT_EQ(s.acquire(), 0);
  EXPECT_EQ(s.acquire(), 1);
  EXPECT_EQ(s.acquire(), -1);
  s.release(0);
  EXPECT_EQ(s.acquire(), 0);
}

TEST(PagePool, SharedPagesAreFreedByTheirLastHolder) {
  cache::PagePool p(4, 16);
  std::vector<int32_t> a, b;
  ASSERT_TRUE(p.grow(a, 32));  // pages 0, 1
  p.retain(a[0]);              // b shares page 0 (a cached prefix)
  b.push_back(a[0]);
  ASSERT_TRUE(p.grow(b, 32));  // b's own second page: 2
  EXPECT_EQ(b, (std::vector<int32_t>{0, 2}));
  EXPECT_EQ(p.refcount(0), 2);
  EXPECT_EQ(p.num_free(), 1);
  p.release(a);
  EXPECT_EQ(p.refcount(0), 1) << "b still holds the shared page";
  EXPECT_EQ(p.num_free(), 2);  // page 1 only
  std::vector<int32_t> c;
  ASSERT_TRUE(p.grow(c, 32));
  EXPECT_EQ(c, (std::vector<int32_t>{1, 3})) << "page 0 is not handed out while b holds it";
  p.release(b);
  EXPECT_EQ(p.refcount(0), 0);
  EXPECT_EQ(p.num_free(), 2);
}

TEST(CacheManager, SlotsSnapshotsAndSharing) {
  cache::CacheManager m({8, 16, 2, 3});
  EXPECT_EQ(m.acquire_slot(), 0);
  EXPECT_EQ(m.acquire_slot(), 1);
  EXPECT_EQ(m.acquire_slot(), -1);
  // Snapshots are state slots after the request slots.
  EXPECT_EQ(m.acquire_snapshot(), 2);
  EXPECT_EQ(m.acquire_snapshot(), 3);
  EXPECT_EQ(m.acquire_snapshot(), 4);
  EXPECT_EQ(m.acquire_snapshot(), -1);
  m.release_snapshot(3);
  EXPECT_EQ(m.num_free_snapshots(), 1);
  EXPECT_EQ(m.acquire_snapshot(), 3);
  std::vector<int32_t> a, b;
  ASSERT_TRUE(m.grow_pages(a, 40));  // 3 pages
  m.share_pages(b, std::span<const int32_t>(a.data(), 2));
  EXPECT_EQ(m.page_refcount(a[0]), 2);
  EXPECT_EQ(m.num_free_pages(), 5);
  m.release_pages(a);
  EXPECT_EQ(m.num_free_pages(), 6);  // the unshared third page only
  m.release_pages(b);
  EXPECT_EQ(m.num_free_pages(), 8);
}

}  // namespace
}  // namespace deltaserve::engine
