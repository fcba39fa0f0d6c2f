// The fused GDN decode layer's form for a few sequences (gdn_decode_split.cu): a cluster of
// blocks a (sequence, key head), a block a quarter of a value head's state columns. Same results
// as the two-head form up to f32 rounding order.
#pragma once

#include <cuda_runtime.h>

#include "backend/cuda/kernels/batch_meta.cuh"
#include "backend/cuda/kernels/gdn_decode.cuh"
#include "backend/cuda/kernels/gdn_state.cuh"

namespace deltaserve::cuda {

// Whether the split form takes this step: at most 2 value heads a key head (a cluster of up to 8
// blocks) and a grid of key-head blocks filling at most an eighth of the device's `num_sms`
// multiprocessors.
bool gdn_decode_split_pays(int nk, int nv, int num_seqs, int num_sms);

// Preconditions as launch_gdn_decode's, and gdn_decode_split_pays. Returns the launch's error.
cudaError_t launch_gdn_decode_split(const BatchMeta& b, const GdnDecodeArgs& p, GdnState state,
                                    cudaStream_t stream);

}  // namespace deltaserve::cuda
