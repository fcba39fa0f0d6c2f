// The weight-streaming GEMM's pieces shared by its two schedules (an internal header of
// skinny_gemm.cu, the static split, and skinny_gemm_dynamic.cu, shares claimed at run time): the
// launch's parameters, the pipeline's shape, the MMAs, and the stores and sums of a tile.
#pragma once

#include <cuda.h>

#include <cstdint>

#include "backend/cuda/kernels/bf16x8.cuh"
#include "backend/cuda/kernels/common.cuh"
#include "backend/cuda/kernels/skinny_gemm.cuh"
#include "backend/cuda/kernels/skinny_partition.h"
#include "backend/cuda/kernels/tma.cuh"
#include "backend/cuda/kernels/wgmma.cuh"

namespace deltaserve::cuda::skinny_kernel {

using bf16 = __nv_bfloat16;

// A block: two consumer warpgroups (warps 0-7) multiplying 128 weight rows, 64 each, and one
// producer warp (warp 8) issuing the copies. A unit is one tile's k-tile: 64 columns of K, one
// SW128 atom row per matrix row. A launch computes kRows token rows (16, 32 or 64: T rounded up;
// rows past T are zeros), the N of its wgmma.
constexpr int kTileRows = kSkinnyTileRows, kTileK = 64, kConsumers = 256,
              kThreads = kConsumers + 32;
// Shared memory for the pipeline: more than half an SM's, so that a block never shares an SM with
// another of the grid (one block an SM: the even split's premise), also when it starts early beside
// the previous kernel's blocks.
constexpr int kPipelineBytes = 160 * 1024;

struct Params {
  CUtensorMap x;                    // [T, K], boxes of kRows rows x 64
  CUtensorMap w[kSkinnyMaxGroups];  // [n, K], boxes of 128 x 64
  bf16* y[kSkinnyMaxGroups];        // [T, n]
  int n[kSkinnyMaxGroups];
  int first_tile[kSkinnyMaxGroups];  // group g's 128-row tiles start here
  // The units are split into `blocks` shares (skinny_partition.h). Static schedule: block c takes
  // share c. Dynamic (claim set): `grid` blocks claim the shares in order from claim[0], and the
  // last to find none left (counted in claim[1]) zeroes both for a later launch.
  int count, T, k_tiles, units, blocks, grid;
  int* claim;
  int slot_floats;  // a partial sum's slot in ws.partials: kTileRows x the launch's kRows
  // SiLU-mul form: w[0] / w[1] the gate / up weights in boxes of 64 rows, a tile's rows 0-63
  // gate rows and 64-127 the same up rows; y[0] the product, n[0] its width.
  bool paired;
  // Mid-stream segments (skinny::mid_units) counted without waiting (DS_SKINNY_DEFER_MID=0: every
  // segment waits for its count, A/B).
  bool defer_mid;
  // With deferral, the block holding a shared tile's first k-tile sums it and the others only
  // count theirs (DS_SKINNY_FIRST_SUMS=0: the last segment that ends a share sums it, A/B).
  bool first_sums;
  SkinnyWorkspace ws;
};
constexpr int kPairRows = kTileRows / 2;

// A block's shared scratch besides the pipeline: whether it completes the tile in hand, the
// addresses of that tile's partials, and (SiLU-mul form) the up half's sums of a whole tile.
struct BlockShared {
  int last;
  // With mid-stream segments deferred, a block sums only its last tile: that tile's mid-stream
  // units and partials' count (their addresses in parts), formed before the kernel waits for its
  // predecessor, off the tail (prepare_last_tile).
  int last_mid, last_np;
  const float* parts[skinny::kMaxParts];
  float xchg[kPairRows][kSkinnySiluMulMaxRows];
};

// A pipeline stage: the weight tile, then the activation tile (both SW128, 1024-byte aligned).
constexpr int kWBytes = kTileRows * wgmma::kRowBytes;
template <int kRows>
struct Pipe {
  static constexpr int kStageBytes = kWBytes + kRows * wgmma::kRowBytes;
  static constexpr int kStages = kPipelineBytes / kStageBytes;
  static constexpr int kSmemBytes = kStages * kStageBytes + wgmma::kAtomBytes;
};

// acc (64 weight rows x kRows tokens) += A B over one 16-column step of K.
template <int kRows>
__device__ inline void mma_step(float (&acc)[kRows / 2], uint64_t a, uint64_t b) {
  if constexpr (kRows == 16)
    wgmma::mma_64x16_ss(acc, a, b, true);
  else if constexpr (kRows == 32)
    wgmma::mma_64x32_ss(acc, a, b, true);
  else
    wgmma::mma_64x64_ss(acc, a, b, true);
}

__device__ inline int first_unit(const Params& p, int c) {
  return skinny::first_unit(c, p.units, p.blocks);
}
__device__ inline int block_of(const Params& p, int u) {
  return skinny::block_of(u, p.units, p.blocks);
}
__device__ inline int slot_of(const Params& p, int c, int tile) {
  return skinny::slot_of(c, tile, p.units, p.blocks, p.k_tiles);
}
__device__ inline int mid_units(const Params& p, int tile) {
  return skinny::mid_units(tile, p.units, p.blocks, p.k_tiles);
}
__device__ inline float* slot_ptr(const Params& p, int slot) {
  return p.ws.partials + static_cast<size_t>(slot) * p.slot_floats;
}

struct TileRef {
  int g, n0;
};
__device__ inline TileRef tile_ref(const Params& p, int tile) {
  if (p.paired) return {0, tile * kPairRows};
  int g = 0;
  while (g + 1 < p.count && tile >= p.first_tile[g + 1]) ++g;
  return {g, (tile - p.first_tile[g]) * kTileRows};
}

// Unit u's weight tile (both halves in the SiLU-mul form) into stage `dst`, completing on `bar`.
__device__ inline void load_weights(const Params& p, int u, unsigned char* dst, uint64_t* bar) {
  const TileRef t = tile_ref(p, u / p.k_tiles);
  const int k0 = (u % p.k_tiles) * kTileK;
  tma::load_2d(dst, &p.w[t.g], k0, t.n0, bar);
  if (p.paired) tma::load_2d(dst + kPairRows * wgmma::kRowBytes, &p.w[1], k0, t.n0, bar);
}
// Unit u's activation tile into stage `dst` (after its weights), completing on `bar`.
__device__ inline void load_activations(const Params& p, int u, unsigned char* dst, uint64_t* bar) {
  tma::load_2d(dst + kWBytes, &p.x, (u % p.k_tiles) * kTileK, 0, bar);
}

// The pipeline's barriers, by thread 0 before a block-wide barrier: a stage is full once its
// copies land (the producer's one arrival with their bytes), empty once every consumer is done.
template <int kStages>
__device__ inline void init_pipeline(uint64_t* full, uint64_t* empty) {
  if (threadIdx.x != 0) return;
  for (int s = 0; s < kStages; ++s) {
    tma::barrier_init(&full[s], 1);
    tma::barrier_init(&empty[s], kConsumers);
  }
  tma::barrier_init_fence();
}

// The consumers' i-th stage of the pipeline (at `stages`): waits for its copies, acc += its
// weight rows (this warpgroup's 64) times its activations, then releases the stage.
template <int kRows>
__device__ inline void mma_unit(float (&acc)[kRows / 2], unsigned char* stages, uint64_t* full,
                                uint64_t* empty, int i) {
  constexpr int kStageBytes = Pipe<kRows>::kStageBytes, kStages = Pipe<kRows>::kStages;
  constexpr uint32_t kStep = 32 >> 4;  // 16 bf16 along K, in the descriptor's 16-byte units
  const int s = i % kStages;
  tma::wait(&full[s], (i / kStages) & 1);
  const uint32_t stage = tma::smem_addr(stages) + s * kStageBytes;
  const uint32_t rows = (threadIdx.x / 128) * 64 * wgmma::kRowBytes;  // this warpgroup's 64
  const uint64_t wd = wgmma::desc(stage + rows, 16, wgmma::kAtomBytes),
                 xd = wgmma::desc(stage + kWBytes, 16, wgmma::kAtomBytes);
  wgmma::fence();
#pragma unroll
  for (int kk = 0; kk < kTileK / 16; ++kk) mma_step<kRows>(acc, wd + kk * kStep, xd + kk * kStep);
  wgmma::commit();
  wgmma::wait<0>();
  tma::arrive(&empty[s]);
}

// This thread's accumulator elements: element j (0..3) of 8-token block i is tile row row(j),
// token tok(i, j).
struct Frag {
  int row0, tok0;
  __device__ Frag() {
    const int lane = static_cast<int>(threadIdx.x) % 32;
    row0 = 16 * (static_cast<int>(threadIdx.x) / 32) + lane / 4;  // 64 rows a warpgroup
    tok0 = 2 * (lane % 4);
  }
  __device__ int row(int j) const { return row0 + (j & 2 ? 8 : 0); }
  __device__ int tok(int i, int j) const { return 8 * i + tok0 + (j & 1); }
};

__device__ inline void consumers_sync() {
  asm volatile("bar.sync 1, %0;\n" ::"n"(kConsumers) : "memory");
}

// silu(gate) * up of the projections' sums, each rounded to bf16 first (as the unfused GEMMs
// store them before silu_mul).
__device__ inline float silu_mul_of(float gate, float up) {
  return silu(round_bf16(gate)) * round_bf16(up);
}

// The SiLU-mul form's whole tile (kRows = kPairTokens): the up half's sums through shared `xchg`
// to the threads holding the same gate rows (warpgroup 1 holds rows kPairRows.., the up rows).
constexpr int kPairTokens = kSkinnySiluMulMaxRows;
__device__ inline void store_pair_tile(const Params& p, const TileRef& t,
                                       const float (&acc)[kPairTokens / 2],
                                       float (*xchg)[kPairTokens]) {
  const Frag f;
  const bool up = threadIdx.x >= kConsumers / 2;
  if (up)
#pragma unroll
    for (int i = 0; i < kPairTokens / 8; ++i)
#pragma unroll
      for (int j = 0; j < 4; ++j) xchg[f.row(j) - kPairRows][f.tok(i, j)] = acc[4 * i + j];
  consumers_sync();
  if (!up)
#pragma unroll
    for (int i = 0; i < kPairTokens / 8; ++i)
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        const int tok = f.tok(i, j), col = t.n0 + f.row(j);
        if (tok < p.T && col < p.n[0])
          p.y[0][static_cast<size_t>(tok) * p.n[0] + col] =
              __float2bfloat16(silu_mul_of(acc[4 * i + j], xchg[f.row(j)][tok]));
      }
  consumers_sync();  // xchg free for the next tile
}

template <int kRows>
__device__ void store_tile(const Params& p, const TileRef& t, const float (&acc)[kRows / 2],
                           float (*xchg)[kPairTokens]) {
  if constexpr (kRows == kPairTokens)
    if (p.paired) return store_pair_tile(p, t, acc, xchg);
  const Frag f;
  const int n = p.n[t.g];
  bf16* y = p.y[t.g];
#pragma unroll
  for (int i = 0; i < kRows / 8; ++i)
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const int tok = f.tok(i, j), col = t.n0 + f.row(j);
      if (tok < p.T && col < n)
        y[static_cast<size_t>(tok) * n + col] = __float2bfloat16(acc[4 * i + j]);
    }
}

template <int kRows>
__device__ void store_partial(const Params& p, int slot, const float (&acc)[kRows / 2]) {
  const Frag f;
  float* part = slot_ptr(p, slot);
#pragma unroll
  for (int i = 0; i < kRows / 8; ++i)
#pragma unroll
    for (int j = 0; j < 4; ++j)
      if (f.tok(i, j) < p.T) part[f.tok(i, j) * kTileRows + f.row(j)] = acc[4 * i + j];
}

__device__ inline void store4(bf16* out, int col, int n, const float4& v) {
  if (n % 4 == 0 && col + 3 < n) {
    const __nv_bfloat162 lo = __floats2bfloat162_rn(v.x, v.y), hi = __floats2bfloat162_rn(v.z, v.w);
    uint2 packed;
    packed.x = *reinterpret_cast<const uint32_t*>(&lo);
    packed.y = *reinterpret_cast<const uint32_t*>(&hi);
    *reinterpret_cast<uint2*>(out) = packed;
    return;
  }
  const float e[4] = {v.x, v.y, v.z, v.w};
  for (int j = 0; j < 4 && col + j < n; ++j) out[j] = __float2bfloat16(e[j]);
}

// A tile reduction of kRows tokens sums kReduceBatch items (four rows of a token) a consumer thread
// at once, with the loads of kReduceParts partials of them in flight together: eight loads for 64
// tokens (a thread's eight items in two rounds, not an L2 round trip each), four below (as many as
// the registers of the kernel's other phases allow: more would leave less room on an SM for the
// programmatic dependents that start beside its block).
template <int kRows>
constexpr int kReduceBatch = kRows / 16;
template <int kRows>
constexpr int kReduceParts = kRows == 64 ? 2 : 4 / kReduceBatch<kRows>;

__device__ inline void add4(float4& s, const float4& v) {
  s.x += v.x;
  s.y += v.y;
  s.z += v.z;
  s.w += v.w;
}

// sum[b] = the np partials' float4 at at[b] + offset, added in block order, kParts partials' loads
// at a time.
template <int kBatch, int kParts>
__device__ void sum_partials(const float* const* parts, int np, const int (&at)[kBatch], int offset,
                             float4 (&sum)[kBatch]) {
#pragma unroll
  for (int b = 0; b < kBatch; ++b) sum[b] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
  const auto load = [&](int c, int b) {
    return __ldcg(reinterpret_cast<const float4*>(parts[c] + offset + at[b]));
  };
  int c = 0;
  // One batch of kParts loads at a time (unrolled, the batches took 101 registers at 16 tokens,
  // against 54), then the remaining partials' loads together.
  constexpr int kTailUnroll = kBatch > 1 ? 1 : 4;
#pragma unroll 1
  for (; c + kParts <= np; c += kParts) {
    float4 v[kParts][kBatch];
#pragma unroll
    for (int j = 0; j < kParts; ++j)
#pragma unroll
      for (int b = 0; b < kBatch; ++b) v[j][b] = load(c + j, b);
#pragma unroll
    for (int j = 0; j < kParts; ++j)
#pragma unroll
      for (int b = 0; b < kBatch; ++b) add4(sum[b], v[j][b]);
  }
#pragma unroll kTailUnroll
  for (; c < np; ++c) {
    float4 v[kBatch];
#pragma unroll
    for (int b = 0; b < kBatch; ++b) v[b] = load(c, b);
#pragma unroll
    for (int b = 0; b < kBatch; ++b) add4(sum[b], v[b]);
  }
}

// The tile's np partial sums (their addresses in `parts`, from gather_parts), added in block order
// (the result does not depend on which block finished last), as bf16.
template <int kRows>
__device__ void reduce_tile(const Params& p, int tile, const float* const* parts, int np) {
  constexpr int kBatch = kReduceBatch<kRows>;
  const TileRef t = tile_ref(p, tile);
  const int n = p.n[t.g];
  const int quads = (p.paired ? kPairRows : kTileRows) / 4;  // of output rows
  const int items = p.T * quads;
  for (int first = static_cast<int>(threadIdx.x); first < items; first += kConsumers * kBatch) {
    int at[kBatch], valid = 0;
#pragma unroll
    for (int b = 0; b < kBatch; ++b) {
      const int item = first + b * kConsumers;  // past the items: summed again, not stored
      at[b] = item < items ? (item / quads) * kTileRows + 4 * (item % quads) : at[0];
      valid += item < items ? 1 : 0;
    }
    float4 v[kBatch];
    sum_partials<kBatch, kReduceParts<kRows>>(parts, np, at, 0, v);
    if (p.paired) {
      float4 up[kBatch];
      sum_partials<kBatch, kReduceParts<kRows>>(parts, np, at, kPairRows, up);
#pragma unroll
      for (int b = 0; b < kBatch; ++b)
        v[b] = make_float4(silu_mul_of(v[b].x, up[b].x), silu_mul_of(v[b].y, up[b].y),
                           silu_mul_of(v[b].z, up[b].z), silu_mul_of(v[b].w, up[b].w));
    }
#pragma unroll
    for (int b = 0; b < kBatch; ++b) {
      if (b >= valid) continue;
      const int tok = at[b] / kTileRows, r = at[b] % kTileRows;
      store4(p.y[t.g] + static_cast<size_t>(tok) * n + t.n0 + r, t.n0 + r, n, v[b]);
    }
  }
}

// atomicAdd with release and acquire semantics at GPU scope, by one thread: the consumers' barrier
// before it orders their partial stores ahead of the release, the one after it their reads of the
// other blocks' partials behind the acquire (the pattern of a grid barrier, in place of a
// sequentially consistent fence by every consumer thread).
__device__ inline int add_acq_rel(int* counter, int v) {
  int old;
  asm volatile("atom.acq_rel.gpu.global.add.s32 %0, [%1], %2;\n"
               : "=r"(old)
               : "l"(counter), "r"(v)
               : "memory");
  return old;
}

// A release reduction (no return) and an acquire load of a tile counter, by one thread.
__device__ inline void red_release(int* counter, int v) {
  asm volatile("red.release.gpu.global.add.s32 [%0], %1;\n" ::"l"(counter), "r"(v) : "memory");
}
__device__ inline int load_acquire(const int* counter) {
  int v;
  asm volatile("ld.acquire.gpu.global.b32 %0, [%1];\n" : "=r"(v) : "l"(counter) : "memory");
  return v;
}

// The addresses of `tile`'s partial sums into parts (by the consumer threads, each some; a
// consumers' barrier must follow before they are read); returns how many.
__device__ inline int gather_parts(const Params& p, int tile, const float** parts) {
  const int c0 = block_of(p, tile * p.k_tiles);
  const int np = block_of(p, (tile + 1) * p.k_tiles - 1) - c0 + 1;
  for (int i = static_cast<int>(threadIdx.x); i < np; i += kConsumers)
    parts[i] = slot_ptr(p, slot_of(p, c0 + i, tile));
  return np;
}

// The claimed-share form's launch (skinny_gemm_claimed.cu): p.grid blocks, kClaimedMaxRows
// tokens, p.blocks shares.
cudaError_t launch_claimed(const Params& p, cudaStream_t stream);

}  // namespace deltaserve::cuda::skinny_kernel
