// The warp-specialized form of the bf16 prefill attention (attention_prefill_ws.cu): a copying
// warpgroup and two computing ones a block. launch_attention_prefill (bf16 cache) runs it unless
// DS_ATTN_WS=0 (the single-role kernel, for A/B).
#pragma once

#include "backend/cuda/kernels/attention.cuh"

namespace deltaserve::cuda {

// As launch_attention_prefill over a bf16 cache (head sizes 64, 128, 256).
void launch_attention_prefill_ws(const BatchMeta& b, const __nv_bfloat16* q,
                                 const __nv_bfloat16* gate, const __nv_bfloat16* k_cache,
                                 const __nv_bfloat16* v_cache, const AttnShape& s, int min_len,
                                 __nv_bfloat16* out, cudaStream_t stream);

}  // namespace deltaserve::cuda
