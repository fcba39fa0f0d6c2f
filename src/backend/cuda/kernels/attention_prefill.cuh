// Causal flash attention of the prefill sequences of a step over the paged KV cache, with the
// sigmoid output gate, run by launch_paged_attention (attention_prefill.cu: bf16 wgmma on sm_90a,
// the softmax in registers under the next tile's P V, a cp.async pipeline; on a bf16 cache the
// warp-specialized form in attention_prefill_ws.cu).
#pragma once

#include "backend/cuda/kernels/attention.cuh"

namespace deltaserve::cuda {

// Whether the prefill kernel has this head size (64, 128 or 256).
bool attention_prefill_supported(const AttnShape& s);

// out rows of every sequence with at least min_len tokens in the step: sigmoid(gate) *
// softmax(q k^T / sqrt(hd)) v over the keys at positions [0, pos] (its cached pages and this
// step's). Other sequences' rows are left alone. Never allocates or syncs.
void launch_attention_prefill(const BatchMeta& b, const __nv_bfloat16* q, const __nv_bfloat16* gate,
                              const __nv_bfloat16* k_cache, const __nv_bfloat16* v_cache,
                              const AttnShape& s, int min_len, __nv_bfloat16* out,
                              cudaStream_t stream);
// The same over an fp8 e4m3 cache (each key / value tile widened to f16 in shared memory, Q and P
// in f16, f16 MMAs).
void launch_attention_prefill(const BatchMeta& b, const __nv_bfloat16* q, const __nv_bfloat16* gate,
                              const uint8_t* k_cache, const uint8_t* v_cache, const AttnShape& s,
                              int min_len, __nv_bfloat16* out, cudaStream_t stream);

}  // namespace deltaserve::cuda
