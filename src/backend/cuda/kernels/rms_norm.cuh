// Zero-centred RMSNorm (y = x * rsqrt(mean(x^2) + eps) * (1 + w)) over bf16 rows with f32
// accumulation, alone or fused with the residual add.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

namespace deltaserve::cuda {

// x, out: [rows, n] bf16; w: [n] f32. Never allocates or syncs.
void launch_rms_norm_bf16(const __nv_bfloat16* x, const float* w, float eps, int rows, int n,
                          __nv_bfloat16* out, cudaStream_t stream);

// residual = bf16(residual + x) in place, then out = rms_norm(residual). All [rows, n] bf16.
void launch_add_rms_norm_bf16(__nv_bfloat16* residual, const __nv_bfloat16* x, const float* w,
                              float eps, int rows, int n, __nv_bfloat16* out, cudaStream_t stream);

}  // namespace deltaserve::cuda
