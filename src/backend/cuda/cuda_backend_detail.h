// Helpers shared by CudaBackend's source files (not part of its interface): CUDA error checks,
// typed device pointers of tensors, and the per-op timer of DS_CUDA_PROFILE.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <string>

#include "backend/cuda/cuda_backend.h"
#include "core/error.h"

namespace deltaserve::backend {

namespace cuda_detail {

inline void check(cudaError_t e, const char* what) {
  if (e != cudaSuccess)
    throw DeviceError(std::string("CUDA ") + what + ": " + cudaGetErrorString(e));
}

inline __nv_bfloat16* bf(const Tensor& t) {
  DS_CHECK(t.dtype == DType::kBF16 && t.device == Device::kCuda,
           "expected a bf16 CUDA tensor " + t.shape_str());
  return static_cast<__nv_bfloat16*>(t.data);
}

inline uint8_t* fp8(const Tensor& t) {
  DS_CHECK(t.dtype == DType::kFP8E4M3 && t.device == Device::kCuda,
           "expected an fp8 e4m3 CUDA tensor " + t.shape_str());
  return static_cast<uint8_t*>(t.data);
}

inline float* f32(const Tensor& t) {
  DS_CHECK(t.dtype == DType::kF32 && t.device == Device::kCuda,
           "expected an f32 CUDA tensor " + t.shape_str());
  return static_cast<float*>(t.data);
}

}  // namespace cuda_detail

// Records CUDA events around one op when profiling is on.
class CudaBackend::OpTimer {
 public:
  OpTimer(CudaBackend& be, const char* op) : be_(be), on_(be.profile_ && !be.capturing_) {
    if (!on_) return;
    t_.op = op;
    cudaEventCreate(&t_.start);
    cudaEventCreate(&t_.stop);
    cudaEventRecord(t_.start, be_.stream_);
  }
  ~OpTimer() {
    if (!on_) return;
    cudaEventRecord(t_.stop, be_.stream_);
    be_.pending_.push_back(t_);
  }

 private:
  CudaBackend& be_;
  bool on_;
  Timed t_{};
};

}  // namespace deltaserve::backend
