// The microchunk pipeline's ordering between its two streams, checked on a backend that logs the
// stream switches and events: vector clocks per stream say which ops happen before which (an op
// after a wait on an event happens after everything before that event's record on the other
// stream). Every chunk of a stage follows the same chunk of the stage before, chunks do not wait
// for later chunks (the overlap), the join orders everything before later main-stream work, and
// an op that throws leaves the backend on the main stream.
#include "model/microchunk_pipeline.h"

#include <gtest/gtest.h>

#include <array>
#include <map>
#include <stdexcept>
#include <vector>

#include "backend/cpu/cpu_backend.h"

namespace deltaserve::model {
namespace {

using Clock = std::array<int, 2>;  // ops seen of the main (0) and side (1) stream

class StreamLog final : public backend::CpuBackend {
 public:
  void use_side_stream(bool side) override { cur_ = side ? 1 : 0; }
  void record_event(int e) override { events_[e] = clock_[cur_]; }
  void wait_event(int e) override {
    ASSERT_TRUE(events_.count(e)) << "wait on event " << e << " before any record";
    for (int s = 0; s < 2; ++s) clock_[cur_][s] = std::max(clock_[cur_][s], events_[e][s]);
  }
  // An op on the current stream: its clock.
  std::pair<int, Clock> op() {
    ++clock_[cur_][cur_];
    return {cur_, clock_[cur_]};
  }
  int stream() const { return cur_; }

 private:
  int cur_ = 0;
  std::array<Clock, 2> clock_{};
  std::map<int, Clock> events_;
};

struct Op {
  int stream;
  Clock at;
};
// a happens before b.
bool before(const Op& a, const Op& b) { return a.at[a.stream] <= b.at[a.stream]; }

TEST(MicrochunkPipeline, EachChunkFollowsItsChunkOfTheStageBeforeAndNoMore) {
  StreamLog be;
  const std::vector<dist::RowRange> chunks = {{0, 8}, {8, 16}, {16, 24}, {24, 28}};
  std::vector<std::vector<Op>> ops(5);
  {
    MicrochunkPipeline p(be, chunks);
    const auto log = [&](int stage, int stream) {
      return [&, stage, stream](dist::RowRange) {
        EXPECT_EQ(be.stream(), stream) << "stage " << stage;
        auto [s, at] = be.op();
        ops[static_cast<size_t>(stage)].push_back({s, at});
      };
    };
    p.communicate(log(0, 1));  // a collective first: waits for the main stream's position
    p.compute(log(1, 0));
    p.compute(log(2, 0));  // two stages on one stream in a row
    p.communicate(log(3, 1));
    p.compute(log(4, 0));
    p.join();
  }
  EXPECT_EQ(be.stream(), 0);
  for (size_t s = 1; s < ops.size(); ++s)
    for (size_t c = 0; c < chunks.size(); ++c) {
      ASSERT_EQ(ops[s].size(), chunks.size());
      EXPECT_TRUE(before(ops[s - 1][c], ops[s][c])) << "stage " << s << " chunk " << c;
      if (c + 1 < chunks.size() && ops[s][c].stream != ops[s - 1][c].stream)
        EXPECT_FALSE(before(ops[s - 1][c + 1], ops[s][c]))
            << "stage " << s << " chunk " << c << " waits for the next chunk: no overlap";
    }
  const auto [stream, at] = be.op();  // main-stream work after the join
  for (const auto& stage : ops)
    for (const Op& o : stage) EXPECT_TRUE(before(o, {stream, at}));
}

TEST(MicrochunkPipeline, OneChunkRunsInOrderOnTheMainStream) {
  StreamLog be;
  MicrochunkPipeline p(be, {{0, 28}});
  int calls = 0;
  p.communicate([&](dist::RowRange c) {
    EXPECT_EQ(be.stream(), 0);
    EXPECT_EQ(c.size(), 28);
    ++calls;
  });
  EXPECT_EQ(calls, 1);
}

TEST(MicrochunkPipeline, AThrowingOpLeavesTheMainStreamCurrent) {
  StreamLog be;
  EXPECT_THROW(
      {
        MicrochunkPipeline p(be, {{0, 8}, {8, 16}});
        p.compute([&](dist::RowRange) { be.op(); });
        p.communicate([&](dist::RowRange c) {
          if (c.begin == 8) throw std::runtime_error("collective failed");
        });
      },
      std::runtime_error);
  EXPECT_EQ(be.stream(), 0);
}

}  // namespace
}  // namespace deltaserve::model
