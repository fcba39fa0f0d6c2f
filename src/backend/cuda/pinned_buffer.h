// A grow-only page-locked host buffer (cudaMallocHost): copies between it and the device run as
// DMA at full speed, without the driver's staging through pinned memory that pageable memory
// takes on every copy.
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <cstddef>
#include <string>

#include "core/error.h"

namespace deltaserve::cuda {

class PinnedBuffer {
 public:
  PinnedBuffer() = default;
  ~PinnedBuffer() {
    if (data_) cudaFreeHost(data_);
  }
  PinnedBuffer(const PinnedBuffer&) = delete;
  PinnedBuffer& operator=(const PinnedBuffer&) = delete;

  // At least `bytes` (contents not kept when it grows). Throws DeviceError when the allocation
  // fails.
  char* reserve(size_t bytes) {
    if (bytes <= cap_) return data_;
    const size_t want = std::max(bytes, 2 * cap_);
    if (data_) cudaFreeHost(data_);
    data_ = nullptr;
    cap_ = 0;
    void* p = nullptr;
    if (const cudaError_t e = cudaMallocHost(&p, want); e != cudaSuccess)
      throw DeviceError(std::string("cudaMallocHost (") + std::to_string(want) +
                        " bytes): " + cudaGetErrorString(e));
    data_ = static_cast<char*>(p);
    cap_ = want;
    return data_;
  }

 private:
  char* data_ = nullptr;
  size_t cap_ = 0;
};

}  // namespace deltaserve::cuda
