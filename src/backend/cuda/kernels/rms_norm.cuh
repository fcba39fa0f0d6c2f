// Zero-centred RMSNorm (y = x * rsqrt(mean(x^2) + eps) * (1 + w)) for bf16 rows, f32 accumulation.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

namespace deltaserve::cuda {

// x, out: [rows, n] bf16 row-major; w: [n] bf16. Never allocates or syncs.
// Precondition: n % 8 == 0 (16-byte vector loads), pointers 16-byte aligned.
void launch_rms_norm_bf16(const __nv_bfloat16* x, const __nv_bfloat16* w, float eps, int rows,
                          int n, __nv_bfloat16* out, cudaStream_t stream);

}  // namespace deltaserve::cuda
