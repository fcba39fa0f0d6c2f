#include "backend/cuda/l2_prefetcher.h"

#include "backend/cuda/cuda_backend_detail.h"
#include "backend/cuda/kernels/l2_prefetch.cuh"

namespace deltaserve::cuda {

using backend::cuda_detail::check;

L2Prefetcher::L2Prefetcher() {
  check(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking), "cudaStreamCreate (prefetch)");
  check(cudaEventCreateWithFlags(&fork_, cudaEventDisableTiming), "cudaEventCreate (prefetch)");
  check(cudaEventCreateWithFlags(&done_, cudaEventDisableTiming), "cudaEventCreate (prefetch)");
}

L2Prefetcher::~L2Prefetcher() {
  if (stream_) cudaStreamSynchronize(stream_);
  if (done_) cudaEventDestroy(done_);
  if (fork_) cudaEventDestroy(fork_);
  if (stream_) cudaStreamDestroy(stream_);
}

bool L2Prefetcher::prefetch(const void* p, size_t bytes, cudaStream_t from) {
  if (!l2_prefetch_supported(p, bytes)) return false;
  check(cudaEventRecord(fork_, from), "prefetch fork record");
  check(cudaStreamWaitEvent(stream_, fork_, 0), "prefetch fork wait");
  check(launch_l2_prefetch(p, bytes, stream_), "L2 prefetch launch");
  check(cudaEventRecord(done_, stream_), "prefetch done record");
  pending_ = true;
  return true;
}

void L2Prefetcher::join(cudaStream_t into) {
  if (!pending_) return;
  check(cudaStreamWaitEvent(into, done_, 0), "prefetch join");
  pending_ = false;
}

void L2Prefetcher::forget() {
  check(cudaStreamSynchronize(stream_), "prefetch stream synchronize");
  pending_ = false;
}

}  // namespace deltaserve::cuda
