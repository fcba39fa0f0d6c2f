// Causal flash attention of the prefill sequences of a step over the paged KV cache, with the
// sigmoid output gate, run by launch_paged_attention. Two kernels: the first WMMA one
// (attention_prefill_wmma.cu, the default) and an FA2-style mma.sync one with a cp.async pipeline
// (attention_prefill.cu), chosen by DS_PREFILL_ATTENTION=wmma|fa2 until the second has passed the
// GPU gates on the H200 (it has not run on a GPU yet).
#pragma once

#include "backend/cuda/kernels/attention.cuh"

namespace deltaserve::cuda {

enum class PrefillAttention { kWmma, kFa2 };

// The kernel DS_PREFILL_ATTENTION names (read at each call; unset or unknown: kWmma).
PrefillAttention prefill_attention_kernel();

// Whether the prefill kernels have this head size (64, 128 or 256).
bool attention_prefill_supported(const AttnShape& s);

// out rows of every sequence with at least min_len tokens in the step: sigmoid(gate) *
// softmax(q k^T / sqrt(hd)) v over the keys at positions [0, pos] (its cached pages and this
// step's). Other sequences' rows are left alone. Never allocates or syncs.
void launch_attention_prefill(const BatchMeta& b, const __nv_bfloat16* q, const __nv_bfloat16* gate,
                              const __nv_bfloat16* k_cache, const __nv_bfloat16* v_cache,
                              const AttnShape& s, int min_len, __nv_bfloat16* out,
                              cudaStream_t stream);

// The WMMA kernel alone (attention_prefill_wmma.cu).
void launch_attention_prefill_wmma(const BatchMeta& b, const __nv_bfloat16* q,
                                   const __nv_bfloat16* gate, const __nv_bfloat16* k_cache,
                                   const __nv_bfloat16* v_cache, const AttnShape& s, int min_len,
                                   __nv_bfloat16* out, cudaStream_t stream);

}  // namespace deltaserve::cuda
