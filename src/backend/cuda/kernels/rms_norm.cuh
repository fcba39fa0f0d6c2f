// Zero-centred RMSNorm (y = x * rsqrt(mean(x^2) + eps) * (1 + w)) over bf16 rows with f32
// accumulation, alone or fused with the residual add.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include "backend/cuda/kernels/skinny_gemm.cuh"

namespace deltaserve::cuda {

// x, out: [rows, n] bf16; w: [n] f32. Never allocates or syncs.
void launch_rms_norm_bf16(const __nv_bfloat16* x, const float* w, float eps, int rows, int n,
                          __nv_bfloat16* out, cudaStream_t stream);

// residual = bf16(residual + x) in place, then out = rms_norm(residual). All [rows, n] bf16.
void launch_add_rms_norm_bf16(__nv_bfloat16* residual, const __nv_bfloat16* x, const float* w,
                              float eps, int rows, int n, __nv_bfloat16* out, cudaStream_t stream);

// launch_add_rms_norm_bf16 (rows of x.n values) with x the result of a partials-only GEMM
// (launch_skinny_gemm_partials_bf16), launched as its programmatic dependent: the split tiles'
// partials summed here (the values the GEMM's own sums give, the same bits), so that the GEMM ends
// with its streams. Decode-sized steps: add_rms_norm_partials_supported, else
// cudaErrorInvalidValue.
bool add_rms_norm_partials_supported(const __nv_bfloat16* residual, const SkinnyPartials& x,
                                     const float* w, int rows, const __nv_bfloat16* out);
cudaError_t launch_add_rms_norm_partials_bf16(__nv_bfloat16* residual, const SkinnyPartials& x,
                                              const float* w, float eps, int rows,
                                              __nv_bfloat16* out, cudaStream_t stream);

}  // namespace deltaserve::cuda
