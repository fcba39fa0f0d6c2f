// RequestStream's reader contract: next() in order; a listener is called when a push finds no
// delta queued (and at once for deltas queued before it was set), so a reader that takes every
// queued delta when called misses none, with one call per batch of deltas that arrive before it
// runs.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <thread>
#include <vector>

#include "engine/request.h"

namespace deltaserve::engine {
namespace {

using namespace std::chrono_literals;

OutputDelta delta(int32_t token, bool finished = false) {
  OutputDelta d;
  d.token_ids = {token};
  d.finished = finished;
  return d;
}

TEST(RequestStream, NextReturnsDeltasInOrderAndTimesOut) {
  RequestStream s(7);
  s.push(delta(1));
  s.push(delta(2));
  OutputDelta d;
  ASSERT_TRUE(s.next(d, 0ms));
  EXPECT_EQ(d.token_ids, std::vector<int32_t>{1});
  ASSERT_TRUE(s.next(d, 0ms));
  EXPECT_EQ(d.token_ids, std::vector<int32_t>{2});
  EXPECT_FALSE(s.next(d, 1ms));
  EXPECT_FALSE(s.try_next(d));
}

// A reader that stays behind the producer (the queue never empties, so the taken deltas are
// dropped from the queue's front as it goes): every delta still comes, in order.
TEST(RequestStream, AReaderThatNeverCatchesUpSeesEveryDeltaInOrder) {
  RequestStream s(5);
  int32_t pushed = 0, expected = 0;
  for (; pushed < 100; ++pushed) s.push(delta(pushed));
  OutputDelta d;
  for (int i = 0; i < 1000; ++i) {
    ASSERT_TRUE(s.try_next(d));
    ASSERT_EQ(d.token_ids, std::vector<int32_t>{expected++});
    s.push(delta(pushed++));
  }
  while (s.try_next(d)) ASSERT_EQ(d.token_ids, std::vector<int32_t>{expected++});
  EXPECT_EQ(expected, pushed);
}

TEST(RequestStream, ListenerIsCalledOncePerBatchThatFindsTheQueueEmpty) {
  RequestStream s(1);
  int calls = 0;
  s.set_listener([&] { ++calls; });  // nothing queued: not called yet
  EXPECT_EQ(calls, 0);
  s.push(delta(1));
  s.push(delta(2));  // a reader has not taken 1 yet: its call covers 2 too
  EXPECT_EQ(calls, 1);
  OutputDelta d;
  while (s.try_next(d)) {
  }
  s.push(delta(3));  // the queue was empty again
  EXPECT_EQ(calls, 2);
  s.set_listener(nullptr);
  while (s.try_next(d)) {
  }
  s.push(delta(4));
  EXPECT_EQ(calls, 2);  // no listener
  int late = 0;
  s.set_listener([&] { ++late; });  // 4 is queued: called at once
  EXPECT_EQ(late, 1);
}

// A reader on another thread that drains on each call (as the HTTP session does through its
// executor) sees every delta of a producer, in order.
TEST(RequestStream, AnAsynchronousDrainingReaderMissesNoDelta) {
  RequestStream s(3);
  constexpr int kDeltas = 20000;
  std::atomic<int> pending{0};
  s.set_listener([&] { pending.fetch_add(1); });
  std::vector<int32_t> seen;
  std::atomic<bool> done{false};
  std::thread reader([&] {
    OutputDelta d;
    const auto deadline = std::chrono::steady_clock::now() + 20s;  // a missed call ends it here
    while (!done.load() && std::chrono::steady_clock::now() < deadline) {
      if (pending.load() == 0) {
        std::this_thread::yield();
        continue;
      }
      pending.fetch_sub(1);
      while (s.try_next(d)) {
        seen.push_back(d.token_ids.front());
        if (d.finished) done.store(true);
      }
    }
  });
  for (int i = 0; i < kDeltas; ++i) s.push(delta(i, i + 1 == kDeltas));
  reader.join();
  ASSERT_EQ(seen.size(), static_cast<size_t>(kDeltas));
  for (int i = 0; i < kDeltas; ++i) ASSERT_EQ(seen[static_cast<size_t>(i)], i);
}

}  // namespace
}  // namespace deltaserve::engine
