// A share of one GPU's SMs: a CUDA green context. Kernels on its streams run on its SMs only; the
// memory is the device's, shared with every other context of the process. Two kinds of work can so
// hold SMs of their own instead of taking turns on all of them — a prefill's tensor-core GEMMs and
// decode steps' bandwidth-bound kernels (overlap_bench --decode-sms). A CudaBackend made on a share
// creates its streams there and sizes its grids by the share's SM count.
#pragma once

#include <cuda.h>
#include <cuda_runtime.h>

#include <utility>

namespace deltaserve::cuda {

class SmPartition {
 public:
  // Splits `device`'s SMs in two: the first share at least `sms` SMs (rounded up to the GPU's
  // partition granularity), the second the rest. Throws DeviceError where the driver has no green
  // contexts, Error where `sms` leaves no SM for the second share.
  static std::pair<SmPartition, SmPartition> split(int device, int sms);

  SmPartition(SmPartition&& o) noexcept : ctx_(o.ctx_), sm_count_(o.sm_count_) { o.ctx_ = nullptr; }
  SmPartition& operator=(SmPartition&&) = delete;
  SmPartition(const SmPartition&) = delete;
  SmPartition& operator=(const SmPartition&) = delete;
  // Its streams must be gone first (a backend made on it destroyed before it).
  ~SmPartition();

  int sm_count() const { return sm_count_; }
  // A new non-blocking stream on this share's SMs at `priority` (lower is higher, as
  // cudaDeviceGetStreamPriorityRange gives them). Throws DeviceError.
  cudaStream_t create_stream(int priority = 0) const;

 private:
  SmPartition(CUgreenCtx ctx, int sm_count) : ctx_(ctx), sm_count_(sm_count) {}
  CUgreenCtx ctx_ = nullptr;
  int sm_count_ = 0;
};

}  // namespace deltaserve::cuda
