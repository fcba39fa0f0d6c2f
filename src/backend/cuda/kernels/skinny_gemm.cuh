// Weight-streaming GEMM for decode-sized batches: y [T, n] = x [T, K] . w [n, K]^T for
// 1 <= T <= kSkinnyMaxRows, bf16 in and out, f32 accumulation, up to kSkinnyMaxGroups
// projections of the same x in one launch. Each weight is read once a step by the bulk tensor copy
// engine (TMA) into a deep shared-memory pipeline and multiplied on wgmma (tiles of 128 weight
// rows, two warpgroups of 64, x T padded to 16, 32 or 64). A persistent grid of one block an
// SM splits the (tile, 64-column k-tile) units evenly (stream-K), so narrow projections still fill
// the GPU and no block waits on a wave tail; a tile split between blocks is summed from f32
// partials, in a fixed order, by the block holding its first k-tile, once every other block's
// partial is counted (the others count theirs without waiting; a block whose share starts inside a
// tile and streams on past it marks the tile instead). The summing block waits for blocks that
// never wait, so every block of the grid must find an SM while others wait: no more blocks than
// SMs, and nothing holding SMs for good beside the launch.
// Launched as a programmatic dependent: its first weight tiles stream while the previous kernel
// drains. A second form takes the MLP's gate and up projections and stores silu(gate) * up
// (launch_skinny_gemm_silu_mul_bf16).
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

namespace deltaserve::cuda {

// Up to 64 tokens (the wgmma N of 16, 32 or 64).
constexpr int kSkinnyMaxRows = 64;
constexpr int kSkinnyMaxGroups = 4;

// Most tiles of kSkinnyTileRows weight rows in one launch (the lm_head of a 248k vocabulary
// takes 1,940); and the fewest for which the GEMM pays over cuBLASLt from 9 tokens on: with fewer,
// most tiles are shared between blocks.
constexpr int kSkinnyTileRows = 128, kSkinnyMaxTiles = 8192, kSkinnyMinTiles = 48;

// Whether the GEMM beats cuBLASLt at T tokens for a group of `tiles` 128-row tiles in all whose
// narrowest projection has `narrowest` (measured on the H200 at the 4B shapes, bench/linear_bench):
// - up to 8 tokens, always (a step that mixed it with the GEMV kernel ran slower than either);
// - up to 16, for kSkinnyMinTiles tiles or more (the 20-tile projections, n = 2560, run faster on
//   cuBLASLt; the 80- to 1,940-tile ones faster here);
// - up to 64, only for such groups holding a narrow projection (fewer than kSkinnyMinTiles tiles),
//   which cuBLASLt runs as a poorly filled GEMM of its own: the GDN and attention input groups. Its
//   time grows with T, so wide projections alone (the MLP's gate / up, the lm_head) stream faster
//   on cuBLASLt there (ncu on gate / up at T = 64: DRAM at 54% of peak; of the warps' stall
//   samples 25% on the stage barrier, 12% on the wgmma wait after every stage, 11% in the tile
//   reduction; with the reduction's loads batched — its first form, 6e980ee — the wide groups
//   here still made decode at B = 32 and 64 slower in one lease).
// Graphed, the narrow projections on this GEMM above 8 tokens (instead of cuBLASLt's split-K)
// made decode slower: up to 16 tokens, B = 16 3.96 against 3.92 ms; up to 64, B = 32 / 64 4.93 /
// 6.47 against 4.68 / 6.06 (their early start takes the SMs the GDN decode kernel before them
// needs).
inline bool skinny_gemm_pays(int T, int64_t tiles, int64_t narrowest) {
  if (T <= 8) return true;
  if (tiles < kSkinnyMinTiles) return false;
  return T <= 16 || (T <= kSkinnyMaxRows && narrowest < kSkinnyMinTiles);
}

// Device memory the launches share (one launch at a time: stream order): f32 partial sums
// (skinny_workspace_floats) and kSkinnyMaxTiles tile counters, zero before the first launch (every
// launch leaves them zero).
struct SkinnyWorkspace {
  float* partials;
  int* counters;
};
size_t skinny_workspace_floats(int sm_count);

struct SkinnyGroup {
  const __nv_bfloat16* w;  // [n, K]
  __nv_bfloat16* y;        // [T, n]
  int n;
};

// True when the skinny path takes this x / w / y: 1 <= T <= kSkinnyMaxRows, K a multiple of 8,
// x and w 16-byte aligned, y 8-byte aligned.
bool skinny_supported(const void* x, const void* w, const void* y, int T, int K);

// Precondition: skinny_supported(x, g.w, g.y, T, K) for each of the `count`
// (1..kSkinnyMaxGroups) groups, at most kSkinnyMaxTiles tiles of 128 rows in all (else
// cudaErrorInvalidValue); no kernel writes the w (weights): their copies start before the launch
// waits for the previous kernel; sm_count the device's multiprocessors. Never allocates or
// syncs; returns the launch's error (throws deltaserve::DeviceError when a tensor map cannot be
// encoded).
cudaError_t launch_skinny_gemm_bf16(const __nv_bfloat16* x, const SkinnyGroup* groups, int count,
                                    int T, int K, const SkinnyWorkspace& ws, int sm_count,
                                    cudaStream_t stream);

// Where a partials-only launch (below) leaves y [T, n]: tile t's columns (128 from 128 t) are in y
// where one block held all its k-tiles, else in the workspace as the sharing blocks' f32 partials
// (skinny::tile_parts), which summed in block order and rounded to bf16 are the values
// launch_skinny_gemm_bf16 stores (skinny_partials.cuh reads them so).
struct SkinnyPartials {
  const float* partials;
  const __nv_bfloat16* y;
  int n, units, blocks, k_tiles;
};

// launch_skinny_gemm_bf16 for one projection, its shared tiles left as partials for the next
// kernel to sum: no tile counters, no block waiting for another's partial, and the launch ends
// with its blocks' streams. The partials stay valid until the next launch on `ws` (which, a
// programmatic dependent, writes them only after its wait for the kernel before it). Preconditions
// as launch_skinny_gemm_bf16's; *where tells the reader where the values lie.
cudaError_t launch_skinny_gemm_partials_bf16(const __nv_bfloat16* x, const SkinnyGroup& group,
                                             int T, int K, const SkinnyWorkspace& ws, int sm_count,
                                             cudaStream_t stream, SkinnyPartials* where);

// The MLP's gate and up projections and SiLU-mul in one launch, for up to kSkinnySiluMulMaxRows
// tokens: act [T, I] = silu(x . gate^T) * (x . up^T), gate and up [I, K]. Each 128-row tile
// streams 64 rows of gate and the same 64 of up, and the block that completes a tile's sum forms
// the product: the values the two projections (rounded to bf16) then silu_mul give, without the
// launch between them. Preconditions as launch_skinny_gemm_bf16's for x, gate / up and act.
constexpr int kSkinnySiluMulMaxRows = 16;
cudaError_t launch_skinny_gemm_silu_mul_bf16(const __nv_bfloat16* x, const __nv_bfloat16* gate,
                                             const __nv_bfloat16* up, __nv_bfloat16* act, int T,
                                             int K, int I, const SkinnyWorkspace& ws, int sm_count,
                                             cudaStream_t stream);

}  // namespace deltaserve::cuda
