// Gated DeltaNet for the CUDA backend: the causal depthwise conv (+ SiLU) with slot-indexed conv
// state, and the gated delta rule run token by token per (sequence, value head) with f32 state in
// the slot.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include "backend/cuda/kernels/batch_meta.cuh"
#include "backend/cuda/kernels/gdn_state.cuh"

namespace deltaserve::cuda {

struct GdnShape {
  int nk, nv, dk, dv;
};

// u [T, C] pre-conv inputs, w [C, K], conv_state [slots, C, K-1] (oldest first; ignored when a
// sequence starts at 0, then updated); y [T, C] = silu(conv). All bf16. Precondition: K <= 8.
void launch_gdn_conv(const BatchMeta& b, const __nv_bfloat16* u, const __nv_bfloat16* w,
                     __nv_bfloat16* conv_state, int C, int K, __nv_bfloat16* y,
                     cudaStream_t stream);
// As launch_gdn_conv for the batch's sequences from `first` on, where the first `first` are one
// token each (a mixed step's leading decode rows, rows 0 .. first - 1, which it leaves alone: their
// y rows are not written, their conv states not updated).
void launch_gdn_conv_from(const BatchMeta& b, int first, const __nv_bfloat16* u,
                          const __nv_bfloat16* w, __nv_bfloat16* conv_state, int C, int K,
                          __nv_bfloat16* y, cudaStream_t stream);
// The conv state update of launch_gdn_conv alone (and the in-step snapshots): for kernels that
// read the old conv state themselves (the chunked delta rule with the conv fused in), after them.
void launch_gdn_conv_state(const BatchMeta& b, const __nv_bfloat16* u, __nv_bfloat16* conv_state,
                           int C, int K, cudaStream_t stream);

// y [T, 2*nk*dk + nv*dv] bf16 (q | k | v); a, b [T, nv] bf16; A_log, dt_bias [nv] f32; state
// [slots, nv, dk, dv] f32 or bf16 (zeroed when a sequence starts at 0; f32 math, a bf16 state
// rounded when stored); out [T, nv, dv] bf16.
// Decode-only steps run the recurrence token by token (a head per block for dv = 128, else
// 32-column slices); steps with a prefill and dk = dv = 128 run the chunked form on bf16 tensor
// cores with f32 accumulation and f32 state (chunks of 64 in parallel, then the chunk-to-chunk
// pass) with `ws` (gdn_chunk_workspace_floats(T, s) floats; null: the recurrence for every step);
// `num_sms`, the device's SM count, picks the state pass's form (gdn_chunk_layout.cuh).
// Other head shapes run the recurrence. Precondition: dk <= 256, dv <= 256.
void launch_gated_delta_rule(const BatchMeta& b, const __nv_bfloat16* y, const __nv_bfloat16* a,
                             const __nv_bfloat16* bgate, const float* A_log, const float* dt_bias,
                             GdnState state, const GdnShape& s, float* ws, int num_sms,
                             __nv_bfloat16* out, cudaStream_t stream);
size_t gdn_chunk_workspace_floats(int num_tokens, const GdnShape& s);

}  // namespace deltaserve::cuda
