// CudaBackend's host <-> device transfers: allocations, weight uploads (converted on the host),
// logits downloads, and the step's small int32 uploads.
#include <cuda_runtime.h>

#include <cstring>
#include <memory>
#include <vector>

#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/cuda_backend_detail.h"
#include "core/dtype.h"

namespace deltaserve::backend {

using cuda_detail::check;

Buffer CudaBackend::alloc(DType t, std::initializer_list<int64_t> dims) {
  Tensor v(nullptr, t, dims, Device::kCuda);
  const size_t bytes = v.nbytes() ? v.nbytes() : 16;
  check(cudaMalloc(&v.data, bytes), "cudaMalloc");
  check(cudaMemsetAsync(v.data, 0, bytes, stream_), "cudaMemset");
  *allocated_ += static_cast<int64_t>(bytes);
  return Buffer(v, [counter = allocated_, bytes](void* p) {
    cudaFree(p);
    *counter -= static_cast<int64_t>(bytes);
  });
}

void CudaBackend::upload(DType src_type, const void* src, size_t n, const Tensor& dst) {
  DS_CHECK(static_cast<size_t>(dst.numel()) == n, "upload size");
  DS_CHECK(dst.dtype == DType::kF32 || dst.dtype == DType::kBF16 || dst.dtype == DType::kFP8E4M3,
           "upload: F32, BF16 or F8_E4M3 destinations");
  // Straight copies where the types match; otherwise one parallel conversion pass into an
  // uninitialised staging buffer (weights of 27B pass through here: no serial passes).
  std::unique_ptr<float[]> f;
  std::unique_ptr<uint16_t[]> b;
  std::unique_ptr<uint8_t[]> b8;
  const void* host = src;
  if (src_type != dst.dtype) {
    const float* in = static_cast<const float*>(src);
    if (src_type != DType::kF32) {
      f.reset(new float[n]);
      convert_to_f32(src_type, src, f.get(), n);
      in = f.get();
    }
    if (dst.dtype == DType::kBF16) {
      b.reset(new uint16_t[n]);
      uint16_t* out = b.get();
#pragma omp parallel for schedule(static)
      for (int64_t i = 0; i < static_cast<int64_t>(n); ++i) out[i] = f32_to_bf16(in[i]);
      host = out;
    } else if (dst.dtype == DType::kFP8E4M3) {
      b8.reset(new uint8_t[n]);
      uint8_t* out = b8.get();
#pragma omp parallel for schedule(static)
      for (int64_t i = 0; i < static_cast<int64_t>(n); ++i) out[i] = f32_to_fp8e4m3(in[i]);
      host = out;
    } else {
      host = in;
    }
  }
  check(cudaMemcpyAsync(dst.data, host, dst.nbytes(), cudaMemcpyHostToDevice, stream_), "upload");
  check(cudaStreamSynchronize(stream_), "upload sync");  // the host staging dies with this call
}

void CudaBackend::download_f32(const Tensor& src, float* dst) {
  OpTimer timer(*this, "download_logits");
  std::vector<char> host(src.nbytes());
  check(cudaMemcpyAsync(host.data(), src.data, src.nbytes(), cudaMemcpyDeviceToHost, stream_),
        "download");
  check(cudaStreamSynchronize(stream_), "download sync");
  convert_to_f32(src.dtype, host.data(), dst, static_cast<size_t>(src.numel()));
  if (profile_ && pending_.size() > 4096) account();
}

// Staged in a page-locked slot (the caller's buffer is free on return) and copied without a host
// sync; a slot is rewritten once the copy from it has completed (its event, long done in a step).
void CudaBackend::upload_i32(const int32_t* src, const Tensor& dst) {
  OpTimer timer(*this, "upload_i32");
  UploadSlot& u = upload_slots_[next_upload_];
  next_upload_ = (next_upload_ + 1) % static_cast<int>(upload_slots_.size());
  check(cudaEventSynchronize(u.done), "upload_i32 slot");
  char* staged = u.host.reserve(dst.nbytes());
  std::memcpy(staged, src, dst.nbytes());
  check(cudaMemcpyAsync(dst.data, staged, dst.nbytes(), cudaMemcpyHostToDevice, stream_),
        "upload_i32");
  check(cudaEventRecord(u.done, stream_), "upload_i32 event");
}

}  // namespace deltaserve::backend
