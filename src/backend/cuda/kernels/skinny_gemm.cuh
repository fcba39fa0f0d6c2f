// Weight-streaming GEMM for decode-sized batches: y [T, n] = x [T, K] . w [n, K]^T for
// kGemvMaxRows < T <= kSkinnyMaxRows, bf16 in and out, f32 accumulation, up to kSkinnyMaxGroups
// projections of the same x in one launch. Each weight is read once a step by the bulk tensor copy
// engine (TMA) into a deep shared-memory pipeline and multiplied on wgmma (64 weight rows x T
// padded to 16 / 32 / 64 / 128 a warpgroup); K is split over a thread-block cluster whose partial
// sums meet in distributed shared memory, so narrow projections still fill the GPU. Launched as a
// programmatic dependent: the first weight tiles stream while the previous kernel drains.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

namespace deltaserve::cuda {

constexpr int kSkinnyMaxRows = 128;
constexpr int kSkinnyMaxGroups = 4;

struct SkinnyGroup {
  const __nv_bfloat16* w;  // [n, K]
  __nv_bfloat16* y;        // [T, n]
  int n;
};

// True when the skinny path takes this x / w / y: 1 <= T <= kSkinnyMaxRows, K a multiple of 8,
// x and w 16-byte aligned, y 8-byte aligned.
bool skinny_supported(const void* x, const void* w, const void* y, int T, int K);

// Precondition: skinny_supported(x, g.w, g.y, T, K) for each of the `count`
// (1..kSkinnyMaxGroups) groups; sm_count the device's multiprocessors. Never allocates or
// syncs; returns the launch's error (throws deltaserve::DeviceError when a tensor map cannot be
// encoded).
cudaError_t launch_skinny_gemm_bf16(const __nv_bfloat16* x, const SkinnyGroup* groups, int count,
                                    int T, int K, int sm_count, cudaStream_t stream);

}  // namespace deltaserve::cuda
