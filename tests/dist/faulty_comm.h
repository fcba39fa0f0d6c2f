// Fault injection for tensor-parallel tests: a Communicator that throws on its n-th all-reduce,
// once (after calling `on_fail`, e.g. to poison the group as a real failing rank's executor
// would); every other call passes through.
#pragma once

#include <atomic>
#include <functional>
#include <string>

#include "core/error.h"
#include "dist/communicator.h"

namespace deltaserve::testing {

class FaultyComm final : public dist::Communicator {
 public:
  FaultyComm(dist::Communicator* inner, int fail_at, std::function<void()> on_fail = {})
      : inner_(inner), fail_at_(fail_at), on_fail_(std::move(on_fail)) {}
  // Moves the fault to the `more`-th all-reduce from now (e.g. after decode graphs were captured:
  // a graph replay makes no host call, so the fault fires in the next eager step).
  void fail_after(int more) { fail_at_ = calls_ + more; }
  int calls() const { return calls_; }
  int rank() const override { return inner_->rank(); }
  int size() const override { return inner_->size(); }
  void all_reduce_sum(const Tensor& t) override {
    if (++calls_ >= fail_at_ && !fired_.exchange(true)) {
      if (on_fail_) on_fail_();
      throw DeviceError("injected fault in rank " + std::to_string(rank()));
    }
    inner_->all_reduce_sum(t);
  }
  void reduce_scatter_sum(const Tensor& a, const Tensor& b) override {
    inner_->reduce_scatter_sum(a, b);
  }
  void all_gather(const Tensor& a, const Tensor& b) override { inner_->all_gather(a, b); }
  void broadcast(const Tensor& t, int root) override { inner_->broadcast(t, root); }
  void barrier() override { inner_->barrier(); }
  void abort() override { inner_->abort(); }

 private:
  dist::Communicator* inner_;
  std::atomic<int> fail_at_, calls_{0};
  std::atomic<bool> fired_{false};
  std::function<void()> on_fail_;
};

}  // namespace deltaserve::testing
