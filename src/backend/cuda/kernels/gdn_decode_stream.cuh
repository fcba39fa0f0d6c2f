// The fused GDN decode layer's form for many sequences (gdn_decode_stream.cu): a persistent block
// an SM takes an even share of the (sequence, key head) items and streams their value heads'
// states through shared memory, the bulk copy engine keeping the next heads' loads in flight while
// the block works on one. Same results as the block-per-item forms up to f32 rounding order.
#pragma once

#include <cuda_runtime.h>

#include "backend/cuda/kernels/batch_meta.cuh"
#include "backend/cuda/kernels/gdn_decode.cuh"
#include "backend/cuda/kernels/gdn_state.cuh"

namespace deltaserve::cuda {

// Whether the stream form takes this step: more (sequence, key head) items than the device's
// `num_sms` multiprocessors (where a block an item would run more than one wave).
bool gdn_decode_stream_pays(int nk, int num_seqs, int num_sms);

// Preconditions as launch_gdn_decode's. Returns the launch's error.
cudaError_t launch_gdn_decode_stream(const BatchMeta& b, const GdnDecodeArgs& p, GdnState state,
                                     int num_sms, cudaStream_t stream);

}  // namespace deltaserve::cuda
