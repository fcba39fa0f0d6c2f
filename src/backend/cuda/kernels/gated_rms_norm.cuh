// The Gated DeltaNet output norm: o = o * rsqrt(mean(o^2) + eps) * w * silu(z) per value head.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

namespace deltaserve::cuda {

// o (in place), z: [rows, dv] bf16 (rows = tokens x value heads); w: [dv] f32 (plain weight, no
// +1). Never allocates or syncs.
void launch_gated_rms_norm_bf16(__nv_bfloat16* o, const __nv_bfloat16* z, const float* w, float eps,
                                int rows, int dv, cudaStream_t stream);

}  // namespace deltaserve::cuda
