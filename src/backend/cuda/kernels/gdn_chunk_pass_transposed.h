// The GDN state pass with the state transposed in registers (gdn_chunk_pass_transposed.cu).
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include "backend/cuda/kernels/gdn.cuh"
#include "backend/cuda/kernels/gdn_chunk_layout.cuh"

namespace deltaserve::cuda::gdn_chunk {

// What launch_state_pass does (same workspace, state and output), with a warpgroup of 64 value
// columns holding S^T: a block a (sequence, value head) of two warpgroups, or with `halves` a
// block a (sequence, value head, half of its columns) of one.
void launch_state_pass_transposed(const BatchMeta& b, const Workspace& ws, GdnState state,
                                  const GdnShape& s, bool halves, __nv_bfloat16* out,
                                  cudaStream_t stream);

}  // namespace deltaserve::cuda::gdn_chunk
