// Row copies across many tensors in one launch: the GDN state of a slot (conv and recurrent, every
// layer) moved to another slot for prefix-cache snapshots, instead of two copies per layer.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace deltaserve::cuda {

constexpr int kCopyMaxTensors = 128, kCopyMaxMoves = 16;

struct RowCopies {
  char* base[kCopyMaxTensors];
  int64_t row_bytes[kCopyMaxTensors];
  int32_t src[kCopyMaxMoves], dst[kCopyMaxMoves];
  int tensors = 0, moves = 0;
};

// Row src[m] -> row dst[m] of every tensor, for every move m. Never allocates or syncs.
void launch_copy_rows(const RowCopies& c, cudaStream_t stream);

}  // namespace deltaserve::cuda
