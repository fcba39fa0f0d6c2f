// The longest output among the last kSize requests that finished on their own (a stop condition or
// max_tokens, not an abort): how many outputs the scheduler expects a request to reach when it
// keeps KV room at admission. Outputs that stop well before max_tokens (an EOS) then reserve what
// recent requests used instead of their whole max_tokens; a request that outgrows every recent one
// can still be met by preemption.
#pragma once

#include <algorithm>
#include <array>
#include <cstdint>

namespace deltaserve::engine {

class OutputLengthWindow {
 public:
  static constexpr int kSize = 128;

  void record(int32_t outputs) {
    lengths_[static_cast<size_t>(next_)] = outputs;
    next_ = (next_ + 1) % kSize;
    if (count_ < kSize) ++count_;
    longest_ = 0;  // once a finish, so that longest() is a read per admission check
    for (int i = 0; i < count_; ++i)
      longest_ = std::max(longest_, lengths_[static_cast<size_t>(i)]);
  }
  bool empty() const { return count_ == 0; }
  // The longest recorded output (0 when empty).
  int32_t longest() const { return longest_; }

 private:
  std::array<int32_t, kSize> lengths_{};
  int next_ = 0, count_ = 0;
  int32_t longest_ = 0;
};

}  // namespace deltaserve::engine
