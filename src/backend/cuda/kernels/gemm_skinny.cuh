// Skinny linear layers on tensor cores (decode steps of kGemvMaxRows < T <= kSkinnyMaxRows rows):
// y [T, N] = x [T, K] . w [N, K]^T, bf16 in and out, f32 accumulation. The weights are the big
// operand and are streamed once: a block owns 128 weight rows (a 16-row mma.sync tile per warp)
// and a slice of K, the x rows ride along as the narrow operand, 64-column chunks of both move
// through a 4-stage cp.async pipeline. Where 128-row tiles alone cannot fill the GPU, K is split
// across the blocks of a thread-block cluster (up to 8): each leaves its f32 partial tile in
// shared memory and each adds, in split order, 1/splits of the tile's elements over distributed
// shared memory. The split depends on (N, K) and the SM count only, so a row's result never
// depends on T.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstddef>

namespace deltaserve::cuda {

constexpr int kSkinnyMaxRows = 64;

// Lets the kernel use its shared memory on the current device (once per device, before the
// first launch).
cudaError_t skinny_gemm_init();

// True when the skinny kernel takes this shape: T <= kSkinnyMaxRows, K a multiple of 64, x and w
// 16-byte aligned.
bool skinny_gemm_supported(const void* x, const void* w, int T, int K);

// Precondition: skinny_gemm_supported(x, w, T, K); skinny_gemm_init() ran on this device.
// `num_sms`: the device's SM count (picks the split). Never allocates or syncs.
void launch_skinny_gemm(const __nv_bfloat16* x, const __nv_bfloat16* w, __nv_bfloat16* y, int T,
                        int K, int N, int num_sms, cudaStream_t stream);

}  // namespace deltaserve::cuda
