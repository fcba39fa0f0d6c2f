// The chunked gated delta rule in one kernel (gdn_chunk_fused.cu): a block a (sequence, value
// head) forming each chunk's products and inverse beside the state pass, for steps with enough
// sequences x value heads to fill the GPU.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include "backend/cuda/kernels/gdn.cuh"
#include "backend/cuda/kernels/gdn_chunk.cuh"
#include "backend/cuda/kernels/gdn_chunk_layout.cuh"

namespace deltaserve::cuda::gdn_chunk {

// Whether a step with q / k / v from the conv outputs y (the fused kernel does not convolve) takes
// the fused kernel: a (sequence, value head) block for at least 5/8 of the num_sms SMs;
// DS_GDN_FUSED=1 / 0 forces it on / off.
bool fused_pays(const BatchMeta& b, const GdnShape& s, int num_sms);
// Whether a step whose q / k / v come from the conv inputs u takes the conv kernel into y and then
// the fused kernel, rather than the prep with the conv inside + state pass: blocks for at least
// 7/8 of the SMs; DS_GDN_FUSED as fused_pays.
bool fused_pays_after_conv(const BatchMeta& b, const GdnShape& s, int num_sms);

// What launch_prep + launch_state_pass do, in one kernel, without the workspace.
void launch_fused(const BatchMeta& b, const GdnQkvSource& in, const __nv_bfloat16* a,
                  const __nv_bfloat16* bgate, const float* A_log, const float* dt_bias,
                  GdnState state, const GdnShape& s, __nv_bfloat16* out, cudaStream_t stream);

}  // namespace deltaserve::cuda::gdn_chunk
