// Communicator: the collectives tensor parallelism needs between ranks (all_reduce, reduce_scatter,
// all_gather, broadcast, barrier). LocalGroup connects CPU ranks that are threads of one process
// through host memory. Fail-stop: every wait is bounded, and once a rank fails (or a wait times
// out) the group is poisoned and every collective on every rank throws deltaserve::Error.
#pragma once

#include <chrono>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "core/tensor.h"

namespace deltaserve::dist {

class Communicator {
 public:
  virtual ~Communicator() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  // In place: t = sum over ranks of t. Precondition: same shape on every rank, F32.
  virtual void all_reduce_sum(const Tensor& t) = 0;
  // out = this rank's 1/size slice (along the flattened elements) of the sum of `in`. In place
  // when `out` is that slice of `in`.
  virtual void reduce_scatter_sum(const Tensor& in, const Tensor& out) = 0;
  // out = the concatenation of every rank's `in`, in rank order. In place when `in` is this
  // rank's slice of `out`.
  virtual void all_gather(const Tensor& in, const Tensor& out) = 0;
  // t = root's t.
  virtual void broadcast(const Tensor& t, int root) = 0;
  virtual void barrier() = 0;
  // Releases every rank blocked in a collective of this group (fail-stop); may be called from
  // another thread. Later collectives throw. The in-process group is released by poisoning instead.
  virtual void abort() {}
};

class LocalGroup {
 public:
  LocalGroup(int size, std::chrono::milliseconds timeout = std::chrono::seconds(60));
  int size() const { return size_; }
  // The communicator of `rank`; each is used by one thread.
  std::unique_ptr<Communicator> communicator(int rank);
  // Marks the group failed: waiting and later collectives throw with `why`.
  void poison(const std::string& why);
  bool poisoned() const;

  // Internal: rendezvous of all ranks; throws when poisoned or on timeout.
  void wait();
  // Internal: per-rank buffer pointers published for the current collective.
  std::vector<void*> slots;

 private:
  int size_;
  std::chrono::milliseconds timeout_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  int arrived_ = 0;
  uint64_t generation_ = 0;
  bool poisoned_ = false;
  std::string why_;
};

}  // namespace deltaserve::dist
