#include "dist/communicator.h"

#include <algorithm>
#include <cstring>

#include "core/error.h"

namespace deltaserve::dist {

LocalGroup::LocalGroup(int size, std::chrono::milliseconds timeout)
    : slots(static_cast<size_t>(size), nullptr), size_(size), timeout_(timeout) {
  DS_CHECK(size >= 1, "group size");
}

void LocalGroup::poison(const std::string& why) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!poisoned_) why_ = why;
    poisoned_ = true;
  }
  cv_.notify_all();
}

bool LocalGroup::poisoned() const {
  std::lock_guard<std::mutex> lock(mu_);
  return poisoned_;
}

void LocalGroup::wait() {
  std::unique_lock<std::mutex> lock(mu_);
  if (poisoned_) throw DeviceError("tensor-parallel group failed: " + why_);
  const uint64_t gen = generation_;
  if (++arrived_ == size_) {
    arrived_ = 0;
    ++generation_;
    cv_.notify_all();
    return;
  }
  if (!cv_.wait_for(lock, timeout_, [&] { return generation_ != gen || poisoned_; })) {
    if (!poisoned_) why_ = "a collective timed out (a rank did not arrive)";
    poisoned_ = true;
    cv_.notify_all();
  }
  if (poisoned_) throw DeviceError("tensor-parallel group failed: " + why_);
}

namespace {

class LocalCommunicator final : public Communicator {
 public:
  LocalCommunicator(LocalGroup& g, int rank) : g_(g), rank_(rank) {}
  int rank() const override { return rank_; }
  int size() const override { return g_.size(); }

  void all_reduce_sum(const Tensor& t) override {
    const int64_t n = t.numel(), N = g_.size();
    float* mine = t.f32();
    publish(mine);
    // Rank r sums chunk r over all ranks (in rank order, so every rank gets identical bits) into
    // its own buffer; then every rank copies the other chunks from their owners.
    const auto chunk = [&](int64_t r) { return std::make_pair(n * r / N, n * (r + 1) / N); };
    const auto [b, e] = chunk(rank_);
    for (int64_t i = b; i < e; ++i) {
      float s = 0;
      for (int64_t r = 0; r < N; ++r) s += static_cast<float*>(g_.slots[static_cast<size_t>(r)])[i];
      mine[i] = s;
    }
    g_.wait();
    for (int64_t r = 0; r < N; ++r) {
      if (r == rank_) continue;
      const auto [rb, re] = chunk(r);
      std::memcpy(mine + rb, static_cast<float*>(g_.slots[static_cast<size_t>(r)]) + rb,
                  sizeof(float) * static_cast<size_t>(re - rb));
    }
    g_.wait();
  }

  void reduce_scatter_sum(const Tensor& in, const Tensor& out) override {
    const int64_t n = out.numel(), N = g_.size();
    DS_CHECK(in.numel() == n * N, "reduce_scatter: out must be 1/size of in");
    publish(in.f32());
    for (int64_t i = 0; i < n; ++i) {
      float s = 0;
      for (int64_t r = 0; r < N; ++r)
        s += static_cast<float*>(g_.slots[static_cast<size_t>(r)])[rank_ * n + i];
      out.f32()[i] = s;
    }
    g_.wait();
  }

  void all_gather(const Tensor& in, const Tensor& out) override {
    const int64_t n = in.numel(), N = g_.size();
    DS_CHECK(out.numel() == n * N, "all_gather: out must be size x in");
    publish(in.f32());
    for (int64_t r = 0; r < N; ++r)  // (in place, this rank's part is already there)
      if (out.f32() + r * n != g_.slots[static_cast<size_t>(r)])
        std::memcpy(out.f32() + r * n, g_.slots[static_cast<size_t>(r)],
                    sizeof(float) * static_cast<size_t>(n));
    g_.wait();
  }

  void broadcast(const Tensor& t, int root) override {
    publish(t.data);
    if (rank_ != root) std::memcpy(t.data, g_.slots[static_cast<size_t>(root)], t.nbytes());
    g_.wait();
  }

  void barrier() override { g_.wait(); }

 private:
  // Publishes this rank's buffer and waits until every rank has.
  void publish(void* p) {
    g_.wait();  // nobody still reads the previous collective's slots
    g_.slots[static_cast<size_t>(rank_)] = p;
    g_.wait();
  }

  LocalGroup& g_;
  int rank_;
};

}  // namespace

std::unique_ptr<Communicator> LocalGroup::communicator(int rank) {
  DS_CHECK(rank >= 0 && rank < size_, "rank out of range");
  return std::make_unique<LocalCommunicator>(*this, rank);
}

}  // namespace deltaserve::dist
