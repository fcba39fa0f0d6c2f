// The MLP's gate / up projections with the SiLU-mul in the GEMM's epilogue, for prefill-sized token
// counts: act [T, I] = silu(x . w_gate^T) * (x . w_up^T), bf16 in and out, f32 accumulation, the
// SiLU-mul on the f32 sums, rounded once (the unfused ops round each sum to bf16 first: the two
// agree to about a bf16 ulp). The [T, 2 I] gate / up intermediate is never written, and no
// SiLU-mul kernel reads it back.
//
// A persistent grid of (up to) one block an SM walks output tiles of 128 tokens x 128 columns; a
// tile's k-steps multiply x's 128 x 64 box against 128 gate rows and the same 128 up rows (one
// 256-row wgmma B operand, so a thread holds the gate and up sums of the same outputs). One
// producer warp issues the bulk tensor copies into a four-stage pipeline; two consumer warpgroups
// of 64 tokens each run m64n256k16 wgmma on it and store their products. Blocks run in clusters of
// two on vertically adjacent tiles, each weight box copied once into both (TMA multicast).
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

namespace deltaserve::cuda {

// Output columns of a tile: I must be a multiple of it.
constexpr int kGemmSiluMulTileCols = 128;

// The fewest tokens for which CudaBackend::linear_silu_mul takes this kernel over cuBLASLt's GEMM
// into [T, 2 I] and the SiLU-mul kernel (below, the weight-streaming forms or cuBLASLt). On the
// H200 at the 4B shape (linear_bench --mlp, two rounds, us a call, ours / cuBLASLt + SiLU-mul):
// 1,024 tokens 146 / 141 (too few 128-row tiles to fill 66 clusters evenly), 2,048 277 / 282,
// 4,096 598-610 / 589-597, 8,192 1,178-1,187 / 1,255, 16,384 2,314-2,326 / 2,408-2,430.
constexpr int64_t kGemmSiluMulMinRows = 2048;

// Whether the kernel takes these operands: I a multiple of kGemmSiluMulTileCols, K of 8, the
// pointers 16-byte aligned.
bool gemm_silu_mul_supported(const void* x, const void* w_gate, const void* w_up, const void* act,
                             int64_t T, int64_t K, int64_t I);

// x [T, K], w_gate / w_up [I, K] (anywhere: each has its own tensor map), act [T, I], on `sm_count`
// SMs at most. Never allocates or syncs; cudaErrorInvalidValue for operands it does not take.
cudaError_t launch_gemm_silu_mul_bf16(const __nv_bfloat16* x, const __nv_bfloat16* w_gate,
                                      const __nv_bfloat16* w_up, __nv_bfloat16* act, int T, int K,
                                      int I, int sm_count, cudaStream_t stream);

}  // namespace deltaserve::cuda
