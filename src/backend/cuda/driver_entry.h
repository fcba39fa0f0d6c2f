// A CUDA driver API function reached through the runtime (no link against libcuda), as the driver
// of the running machine provides it at `cuda_version` (e.g. 12040 for 12.4's signature).
#pragma once

#include <cuda_runtime.h>

#include <string>

#include "core/error.h"

namespace deltaserve::cuda {

// The function `name` cast to its PFN type; throws DeviceError where the driver lacks it.
template <typename Fn>
Fn driver_entry(const char* name, int cuda_version) {
  void* p = nullptr;
  cudaDriverEntryPointQueryResult found{};
  const cudaError_t e =
      cudaGetDriverEntryPointByVersion(name, &p, cuda_version, cudaEnableDefault, &found);
  if (e != cudaSuccess)
    throw DeviceError(std::string("the CUDA driver's ") + name + ": " + cudaGetErrorString(e));
  if (found != cudaDriverEntryPointSuccess || p == nullptr)
    throw DeviceError(std::string("the CUDA driver has no ") + name + " (needs CUDA " +
                      std::to_string(cuda_version / 1000) + "." +
                      std::to_string(cuda_version % 1000 / 10) + " or newer)");
  return reinterpret_cast<Fn>(p);
}

}  // namespace deltaserve::cuda
