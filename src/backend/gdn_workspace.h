// The size of the chunked delta rule's workspace, shared by the CUDA kernel and the memory plan
// (a plain header: CUDA sources and builds without CUDA include it).
#pragma once

#include <cstdint>

#ifdef __CUDACC__
#define DS_HOST_DEVICE __host__ __device__
#else
#define DS_HOST_DEVICE
#endif

namespace deltaserve::backend {

// f32 floats per token and value head of the chunked (chunk 64) delta rule of a prefill step (the
// CUDA backend's layout: U dv | W dk | P 64 | q dk | k dk | gamma, padded to 16 bytes); the memory
// plan counts max_num_batched_tokens of it.
DS_HOST_DEVICE constexpr int32_t gdn_chunk_floats_per_token(int32_t dk, int32_t dv) {
  return (dv + 3 * dk + 64 + 1 + 3) / 4 * 4;
}

}  // namespace deltaserve::backend
