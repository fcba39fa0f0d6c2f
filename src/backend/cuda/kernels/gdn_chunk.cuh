// The chunked gated delta rule of prefill steps (gdn_chunk.cu), run by launch_gated_delta_rule.
#pragma once

#include "backend/cuda/kernels/gdn.cuh"

namespace deltaserve::cuda {

// Whether the chunked form handles these head shapes (else the token recurrence runs).
bool gdn_chunked_supported(const GdnShape& s);

// As launch_gated_delta_rule, for a step with a prefill; `ws` holds
// gdn_chunk_workspace_floats(b.num_tokens, s) floats.
void launch_gdn_chunked(const BatchMeta& b, const __nv_bfloat16* y, const __nv_bfloat16* a,
                        const __nv_bfloat16* bgate, const float* A_log, const float* dt_bias,
                        GdnState state, const GdnShape& s, float* ws, int num_sms,
                        __nv_bfloat16* out, cudaStream_t stream);

}  // namespace deltaserve::cuda
