// Skinny linear layers (decode) where the weight-streaming GEMM (skinny_gemm.cuh) does not apply:
// y [T, N] = x [T, K] . w [N, K]^T for T <= kGemvMaxRows, bf16 in and out, f32 accumulation. A warp
// streams one weight row with 16-byte loads that bypass L1 and applies it to all T activation rows,
// so the weights are read once per step. CudaBackend takes it for outputs the GEMM cannot store
// (not 8-byte aligned) and with DS_SKINNY_GEMM=0.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

namespace deltaserve::cuda {

constexpr int kGemvMaxRows = 8;

// True when the GEMV path takes this shape: 1 <= T <= kGemvMaxRows, K a multiple of 8 and x, w
// 16-byte aligned.
bool gemv_supported(const void* x, const void* w, int T, int K);

// Up to kGemvMaxGroups projections of the same x, run as one launch: y[i] [T, n[i]] = x . w[i]^T.
constexpr int kGemvMaxGroups = 4;
struct GemvGroups {
  const __nv_bfloat16* w[kGemvMaxGroups];
  __nv_bfloat16* y[kGemvMaxGroups];
  int n[kGemvMaxGroups];
  int count;
};
// Precondition: gemv_supported(x, w[i], T, K) for every group. Never allocates or syncs.
void launch_gemv_multi_bf16(const __nv_bfloat16* x, const GemvGroups& g, int T, int K,
                            cudaStream_t stream);

}  // namespace deltaserve::cuda
