// Weights pulled into L2 from a stream beside the step's. A pull starts once the step's stream has
// reached the point where it was asked for, and the step's stream never waits for it: its kernels
// only find those lines in L2 sooner. Inside a graph capture the pulls form a branch that the
// captured stream joins before the capture ends.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>

namespace deltaserve::cuda {

class L2Prefetcher {
 public:
  L2Prefetcher();  // throws DeviceError when its stream or events cannot be made
  ~L2Prefetcher();
  L2Prefetcher(const L2Prefetcher&) = delete;
  L2Prefetcher& operator=(const L2Prefetcher&) = delete;

  // Pulls [p, p + bytes) into L2 after the work issued to `from` so far; false (nothing issued)
  // where the range is not 16-byte aligned and sized.
  bool prefetch(const void* p, size_t bytes, cudaStream_t from);
  // Makes the later work of `into` wait for every pull asked for since the last join or forget.
  void join(cudaStream_t into);
  // Waits for the pulls issued so far and forgets them (a capture starts with none pending).
  void forget();

 private:
  cudaStream_t stream_ = nullptr;
  cudaEvent_t fork_ = nullptr, done_ = nullptr;
  bool pending_ = false;  // pulls were asked for since the last join or forget
};

}  // namespace deltaserve::cuda
