// Full attention for the CUDA backend: q/k norm + partial NeoX RoPE + paged KV write, and causal
// GQA attention over each sequence's pages with the sigmoid output gate. Straightforward kernels
// (one block per token and head); the tuned split-KV decode and tensor-core prefill come later.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include "backend/cuda/kernels/batch_meta.cuh"

namespace deltaserve::cuda {

struct AttnShape {
  int nh, nkv, hd, rotary_dim;
  float rope_theta, eps;
};

// qg [T, nh, 2*hd] -> q, gate [T, nh, hd]; k [T, nkv, hd] normed+roped in place and written with
// v [T, nkv, hd] to k_cache / v_cache [pages, page_size, nkv, hd]. Norm weights f32 [hd].
// Preconditions: hd <= 512, hd even. Never allocates or syncs.
void launch_attn_prep(const BatchMeta& b, const __nv_bfloat16* qg, __nv_bfloat16* k,
                      const __nv_bfloat16* v, const float* q_norm, const float* k_norm,
                      const AttnShape& s, __nv_bfloat16* q, __nv_bfloat16* gate,
                      __nv_bfloat16* k_cache, __nv_bfloat16* v_cache, cudaStream_t stream);

// out [T, nh, hd] = softmax(q k^T / sqrt(hd)) v over positions [0, pos], times sigmoid(gate).
// Precondition: hd <= 256 and a multiple of 32. Never allocates or syncs.
void launch_paged_attention(const BatchMeta& b, const __nv_bfloat16* q, const __nv_bfloat16* gate,
                            const __nv_bfloat16* k_cache, const __nv_bfloat16* v_cache,
                            const AttnShape& s, __nv_bfloat16* out, cudaStream_t stream);

}  // namespace deltaserve::cuda
