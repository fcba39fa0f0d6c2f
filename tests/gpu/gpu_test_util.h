// Helpers shared by the GPU tests.
#pragma once

#include <cuda_runtime.h>

#include <cstring>
#include <vector>

#include "model/safetensors.h"

namespace deltaserve::testing {

// True when a CUDA device is visible (GPU tests skip otherwise).
inline bool have_gpu() {
  int n = 0;
  return cudaGetDeviceCount(&n) == cudaSuccess && n > 0;
}

// The elements of a safetensors tensor as a vector of T (the file's dtype must be T's).
template <class T>
std::vector<T> read_tensor(const model::TensorInfo& t) {
  std::vector<T> v(static_cast<size_t>(t.numel()));
  std::memcpy(v.data(), t.data, t.nbytes);
  return v;
}

}  // namespace deltaserve::testing
