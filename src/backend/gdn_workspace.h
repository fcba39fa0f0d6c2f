// The size of the chunked delta rule's workspace, shared by the CUDA kernels and the memory plan
// (a plain header: CUDA sources and builds without CUDA include it).
#pragma once

#include <cstdint>

#include "core/host_device.h"

namespace deltaserve::backend {

// Bytes per token and value head of the chunked (chunk 64) delta rule of a prefill step (the CUDA
// backend's layout, bf16 unless said: W dk | U dv | decayed k dk | q dk (per key head, counted per
// value head) | P 64 | gamma f32); the memory plan counts
// max_num_batched_tokens of it.
DS_HOST_DEVICE constexpr int64_t gdn_chunk_bytes_per_token(int32_t dk, int32_t dv) {
  return 2 * (3 * static_cast<int64_t>(dk) + dv + 64) + 4;
}

}  // namespace deltaserve::backend
