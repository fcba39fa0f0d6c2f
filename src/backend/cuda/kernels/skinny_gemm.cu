#include <algorithm>
#include <cstdint>
#include <cstdlib>

#include "backend/cuda/ab_switch.h"
#include "backend/cuda/kernels/bf16x8.cuh"
#include "backend/cuda/kernels/common.cuh"
#include "backend/cuda/kernels/pdl.cuh"
#include "backend/cuda/kernels/skinny_gemm.cuh"
#include "backend/cuda/kernels/skinny_partition.h"
#include "backend/cuda/kernels/skinny_sums.cuh"
#include "backend/cuda/kernels/tma.cuh"
#include "backend/cuda/kernels/tma_map.h"
#include "backend/cuda/kernels/wgmma.cuh"

namespace deltaserve::cuda {
namespace {

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
  int count, T, k_tiles, units, blocks;
  // SiLU-mul form: w[0] / w[1] the gate / up weights in boxes of 64 rows, a tile's rows 0-63
  // gate rows and 64-127 the same up rows; y[0] the product, n[0] its width.
  bool paired;
  // Mid-stream segments (skinny::mid_units) counted without waiting (DS_SKINNY_DEFER_MID=0: every
  // segment waits for its count, A/B).
  bool defer_mid;
  // With deferral, the block holding a shared tile's first k-tile sums it and the others only
  // count theirs (DS_SKINNY_FIRST_SUMS=0: the last segment that ends a share sums it, A/B).
  bool first_sums;
  // A shared tile's segments only stored as partials, for the next kernel to sum
  // (launch_skinny_gemm_partials_bf16): no counts, no summing block.
  bool partials_only;
  // Stages whose weight tiles are copied before the wait for the previous kernel (the rest after
  // it): early_stages_for below.
  int early_stages;
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
// More than any pipeline's stages (at 16 tokens: 8).
constexpr int kSkinnyMaxStages = 64;
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
__device__ inline int slot_of(const Params& p, int c, int tile) {
  return skinny::slot_of(c, tile, p.units, p.blocks, p.k_tiles);
}
__device__ inline int mid_units(const Params& p, int tile) {
  return skinny::mid_units(tile, p.units, p.blocks, p.k_tiles);
}
__device__ inline float* slot_ptr(const Params& p, int slot) {
  return skinny::slot_floats(p.ws.partials, slot);
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

// One thread issues every copy: the first (p.early_stages) stages' weight tiles before waiting for
// the previous kernel (weights are never written by one), then activations and the rest as stages
// free up.
template <int kRows>
__device__ void produce(const Params& p, int u0, int u1, unsigned char* stages, uint64_t* full,
                        uint64_t* empty) {
  constexpr int kStageBytes = Pipe<kRows>::kStageBytes, kStages = Pipe<kRows>::kStages;
  tma::prefetch_map(&p.x);
  const auto load_w = [&](int i) {
    const int u = u0 + i, s = i % kStages;
    const TileRef t = tile_ref(p, u / p.k_tiles);
    unsigned char* dst = stages + s * kStageBytes;
    const int k0 = (u % p.k_tiles) * kTileK;
    tma::load_2d(dst, &p.w[t.g], k0, t.n0, &full[s]);
    if (p.paired) tma::load_2d(dst + kPairRows * wgmma::kRowBytes, &p.w[1], k0, t.n0, &full[s]);
  };
  const auto load_x = [&](int i) {
    const int u = u0 + i, s = i % kStages;
    tma::load_2d(stages + s * kStageBytes + kWBytes, &p.x, (u % p.k_tiles) * kTileK, 0, &full[s]);
  };
  const int first = min(u1 - u0, kStages), early = min(first, p.early_stages);
  const auto load_first = [&](int i) {
    tma::arrive_expect_bytes(&full[i], kStageBytes);
    load_w(i);
  };
  for (int i = 0; i < early; ++i) load_first(i);
  pdl::wait_for_predecessor();
  for (int i = early; i < first; ++i) load_first(i);
  for (int i = 0; i < first; ++i) load_x(i);
  for (int i = first; u0 + i < u1; ++i) {
    tma::wait(&empty[i % kStages], (i / kStages - 1) & 1);
    tma::arrive_expect_bytes(&full[i % kStages], kStageBytes);
    load_w(i);
    load_x(i);
  }
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
__device__ void store_pair_tile(const Params& p, const TileRef& t,
                                const float (&acc)[kPairTokens / 2], float (*xchg)[kPairTokens]) {
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

// The tile's np partial sums (their addresses in `parts`, from gather_parts), added in block order
// (the result does not depend on which block finished last), as bf16.
template <int kRows>
__device__ void reduce_tile(const Params& p, int tile, const float* const* parts, int np) {
  constexpr int kBatch = kReduceBatch<kRows>;
  const TileRef t = tile_ref(p, tile);
  const int n = p.n[t.g];
  const int quads = (p.paired ? kPairRows : kTileRows) / 4;  // of output rows
  const int items = p.T * quads;
  const auto part = [parts](int c) { return parts[c]; };
  for (int first = static_cast<int>(threadIdx.x); first < items; first += kConsumers * kBatch) {
    int at[kBatch], valid = 0;
#pragma unroll
    for (int b = 0; b < kBatch; ++b) {
      const int item = first + b * kConsumers;  // past the items: summed again, not stored
      at[b] = item < items ? (item / quads) * kTileRows + 4 * (item % quads) : at[0];
      valid += item < items ? 1 : 0;
    }
    float4 v[kBatch];
    skinny::sum_partials<kBatch, kReduceParts<kRows>>(part, np, at, 0, v);
    if (p.paired) {
      float4 up[kBatch];
      skinny::sum_partials<kBatch, kReduceParts<kRows>>(part, np, at, kPairRows, up);
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

// The addresses of `tile`'s partial sums into parts (by the consumer threads, each some; a
// consumers' barrier must follow before they are read); returns how many.
__device__ inline int gather_parts(const Params& p, int tile, const float** parts) {
  const skinny::TileParts t = skinny::tile_parts(tile, p.units, p.blocks, p.k_tiles);
  for (int i = static_cast<int>(threadIdx.x); i < t.count; i += kConsumers)
    parts[i] = slot_ptr(p, skinny::part_slot(t, i));
  return t.count;
}

// A tile counter: k-tiles summed in its low bits, and kMidSegment once its mid-stream segment's
// partial is stored.
constexpr int kMidSegment = 1 << 20;

__device__ inline void red_release(int* counter, int v) {
  asm volatile("red.release.gpu.global.add.s32 [%0], %1;\n" ::"l"(counter), "r"(v) : "memory");
}
__device__ inline int load_acquire(const int* counter) {
  int v;
  asm volatile("ld.acquire.gpu.global.b32 %0, [%1];\n" : "=r"(v) : "l"(counter) : "memory");
  return v;
}

// A shared tile's segment in the middle of the block's units (skinny::mid_units, the block's
// first): its partial stored and the tile marked, without waiting for the count, so the block
// streams on; a block whose share ends in the tile sums it.
template <int kRows>
__device__ void publish_mid_segment(const Params& p, int c, int tile,
                                    const float (&acc)[kRows / 2]) {
  store_partial<kRows>(p, slot_of(p, c, tile), acc);
  consumers_sync();  // every consumer's partial stored before the mark's release
  if (threadIdx.x == 0) red_release(&p.ws.counters[tile], kMidSegment);
}

// Whether this block, whose segment [kt0, kt1) of a shared tile ends its share (so the tile is its
// last, with `mid` mid-stream units), sums the tile. Without deferral: the segment that completes
// the count. Deferred: the tile's first segment (kt0 = 0; the others only count), or with
// DS_SKINNY_FIRST_SUMS=0 the last segment that ends a share; either once every segment is counted
// and the mid-stream mark is in. By one thread.
__device__ inline bool sums_tile(const Params& p, int tile, int kt0, int kt1, int mid) {
  int* counter = &p.ws.counters[tile];
  int v = add_acq_rel(counter, kt1 - kt0) + kt1 - kt0;
  if (!p.defer_mid) return v == p.k_tiles;
  const auto counted = [&] { return (v & (kMidSegment - 1)) == p.k_tiles - mid; };
  const auto complete = [&] { return counted() && (mid == 0 || (v & kMidSegment) != 0); };
  if (!p.first_sums && !counted()) return false;
  while (!complete()) v = load_acquire(counter);
  return true;
}

// A tile's sum over k-tiles [kt0, kt1) is done: stored as bf16 when that is all of K, else left as
// a partial; the block that completes a tile's count (a counter per tile; with mid-stream segments
// deferred, the block holding the tile's first k-tile, once every other segment is counted) adds
// its partials.
template <int kRows>
__device__ void finish_segment(const Params& p, int c, int tile, int kt0, int kt1,
                               const float (&acc)[kRows / 2], BlockShared& sh) {
  if (kt0 == 0 && kt1 == p.k_tiles) return store_tile<kRows>(p, tile_ref(p, tile), acc, sh.xchg);
  store_partial<kRows>(p, slot_of(p, c, tile), acc);
  consumers_sync();               // every consumer's partial stored before the count's release
  if (p.first_sums && kt0 > 0) {  // counted without waiting: the tile's first segment sums it
    if (threadIdx.x == 0) red_release(&p.ws.counters[tile], kt1 - kt0);
    return;
  }
  if (threadIdx.x == 0) sh.last = sums_tile(p, tile, kt0, kt1, sh.last_mid);
  consumers_sync();  // the count's acquire before any consumer reads the other blocks' partials
  if (!sh.last) return;
  int np = sh.last_np;  // deferred mid-stream segments: gathered at the block's start
  if (!p.defer_mid) {
    np = gather_parts(p, tile, sh.parts);
    consumers_sync();
  }
  reduce_tile<kRows>(p, tile, sh.parts, np);
  if (threadIdx.x == 0) p.ws.counters[tile] = 0;  // ready for the next launch
}

// The partials-only form's segment: a whole tile stored as bf16, a shared tile's part left in the
// block's slot (slot_of), for the kernel after this one to sum; no counts, no waits.
template <int kRows>
__device__ void keep_segment(const Params& p, int c, int tile, int kt0, int kt1,
                             const float (&acc)[kRows / 2], BlockShared& sh) {
  if (kt0 == 0 && kt1 == p.k_tiles) return store_tile<kRows>(p, tile_ref(p, tile), acc, sh.xchg);
  store_partial<kRows>(p, slot_of(p, c, tile), acc);
}

// With mid-stream segments deferred, the only tile a block may sum is its last, where shared: its
// mid-stream units and partials' addresses, formed before the kernel waits for its predecessor
// (from the launch's parameters, into shared memory; the first consumers_sync orders them before
// any use).
__device__ inline void prepare_last_tile(const Params& p, int u0, int u1, BlockShared& sh) {
  const int last = (u1 - 1) / p.k_tiles;
  if (u1 % p.k_tiles == 0 && u1 - p.k_tiles >= u0) return;  // whole: stored, never summed
  const int np = gather_parts(p, last, sh.parts);
  if (threadIdx.x == 0) {
    sh.last_np = np;
    sh.last_mid = mid_units(p, last);
  }
}

// The consumer warpgroups over the block's units, tile segment by tile segment; each stage is
// released once the MMAs reading it have completed.
template <int kRows>
__device__ void consume(const Params& p, int c, int u0, int u1, unsigned char* stages,
                        uint64_t* full, uint64_t* empty, BlockShared& sh) {
  constexpr int kStageBytes = Pipe<kRows>::kStageBytes, kStages = Pipe<kRows>::kStages;
  const uint32_t base = tma::smem_addr(stages);
  const uint32_t rows = (threadIdx.x / 128) * 64 * wgmma::kRowBytes;  // this warpgroup's 64
  constexpr uint32_t kStep = 32 >> 4;  // 16 bf16 along K, in the descriptor's 16-byte units
  float acc[kRows / 2];
  for (int u = u0, i = 0; u < u1;) {
    const int tile = u / p.k_tiles, kt0 = u - tile * p.k_tiles;
    const int end = min(u1, (tile + 1) * p.k_tiles);
#pragma unroll
    for (int a = 0; a < kRows / 2; ++a) acc[a] = 0.0f;
    for (; u < end; ++u, ++i) {
      const int s = i % kStages;
      tma::wait(&full[s], (i / kStages) & 1);
      const uint32_t stage = base + s * kStageBytes;
      const uint64_t wd = wgmma::desc(stage + rows, 16, wgmma::kAtomBytes),
                     xd = wgmma::desc(stage + kWBytes, 16, wgmma::kAtomBytes);
      wgmma::fence();
#pragma unroll
      for (int kk = 0; kk < kTileK / 16; ++kk)
        mma_step<kRows>(acc, wd + kk * kStep, xd + kk * kStep);
      wgmma::commit();
      wgmma::wait<0>();
      tma::arrive(&empty[s]);
    }
    if (p.partials_only)
      keep_segment<kRows>(p, c, tile, kt0, end - tile * p.k_tiles, acc, sh);
    else if (p.defer_mid && kt0 > 0 && end < u1)  // shared, and the block streams on past it
      publish_mid_segment<kRows>(p, c, tile, acc);
    else
      finish_segment<kRows>(p, c, tile, kt0, end - tile * p.k_tiles, acc, sh);
  }
}

template <int kRows>
__global__ void __launch_bounds__(kThreads, 1)
    skinny_gemm_kernel(const __grid_constant__ Params p) {
  constexpr int kStages = Pipe<kRows>::kStages;
  extern __shared__ unsigned char raw[];
  unsigned char* stages = wgmma::atom_aligned<unsigned char>(raw);
  __shared__ uint64_t full[kStages], empty[kStages];
  __shared__ BlockShared sh;
  const int c = static_cast<int>(blockIdx.x), u0 = first_unit(p, c), u1 = first_unit(p, c + 1);
  if (threadIdx.x == 0) {
    for (int s = 0; s < kStages; ++s) {
      tma::barrier_init(&full[s], 1);
      tma::barrier_init(&empty[s], kConsumers);
    }
    tma::barrier_init_fence();
  }
  __syncthreads();
  pdl::allow_successor();  // the next kernel's blocks may start streaming their weights
  if (threadIdx.x >= kConsumers) {
    if (threadIdx.x == kConsumers) produce<kRows>(p, u0, u1, stages, full, empty);
    return;
  }
  if (threadIdx.x == 0) sh.last_mid = 0;
  if (p.defer_mid) prepare_last_tile(p, u0, u1, sh);  // shared memory only: before the wait
  pdl::wait_for_predecessor();                        // before the stores and the workspace
  consume<kRows>(p, c, u0, u1, stages, full, empty, sh);
}

template <int kRows>
cudaError_t launch(const Params& p, cudaStream_t stream) {
  const auto kernel = skinny_gemm_kernel<kRows>;
  constexpr int smem = Pipe<kRows>::kSmemBytes;
  const cudaError_t e =
      cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
  if (e != cudaSuccess) return e;
  return pdl::launch_with(true, kernel, p.blocks, kThreads, smem, stream, p);
}

// How many stages' weights a launch of T tokens copies before its wait: kLaterEarlyStages from
// 9 to 32 tokens, every stage else. The idea (not measured directly): a burst of 132 x the
// pipeline queues ahead of the previous kernel's own loads; up to 8 tokens the GEMM's ramp weighs
// more, at 64 no steady gain.
// On an H100 (graphed ms, ctx 1k, two rounds in each of two leases, 4 early stages / all): B = 16
// 4.525, 4.518 / 4.566, 4.568 and 4.516, 4.515 / 4.564, 4.564; B = 12 4.382, 4.380 / 4.409, 4.392;
// B = 32 5.601, 5.605 / 5.605, 5.609; B = 64 7.411, 7.418 / 7.473, 7.466 then 7.459, 7.446 /
// 7.412, 7.404; B = 1 3.604, 3.602 / 3.569, 3.573, B = 4 3.783, 3.786 / 3.757, 3.761 (1 or 2
// stages slower still; decode_h100_2026-12-05.md). DS_SKINNY_EARLY_STAGES=N: N at every T (A/B).
constexpr int kLaterEarlyStages = 4, kLaterEarlyMinRows = 9, kLaterEarlyMaxRows = 32;
int early_stages_for(int T) {
  static const int forced = [] {
    const char* v = std::getenv("DS_SKINNY_EARLY_STAGES");
    return v ? std::max(0, std::atoi(v)) : -1;
  }();
  if (forced >= 0) return forced;
  return T >= kLaterEarlyMinRows && T <= kLaterEarlyMaxRows ? kLaterEarlyStages : kSkinnyMaxStages;
}

// x [T, K] and the split of p's `tiles` tiles of K between blocks, then the launch.
cudaError_t launch_tiles(Params& p, const bf16* x, int tiles, int T, int K,
                         const SkinnyWorkspace& ws, int sm_count, cudaStream_t stream) {
  if (tiles > kSkinnyMaxTiles) return cudaErrorInvalidValue;
  const int rows = T <= 16 ? 16 : T <= 32 ? 32 : 64;
  p.x = encode_tma_2d_bf16(x, T, K, rows);
  p.T = T;
  p.k_tiles = (K + kTileK - 1) / kTileK;
  p.units = tiles * p.k_tiles;
  p.blocks = skinny::blocks_for(p.units, p.k_tiles, sm_count);
  p.ws = ws;
  static const bool defer_mid = ab_switch_on("DS_SKINNY_DEFER_MID");
  p.defer_mid = defer_mid && !p.partials_only;
  static const bool first_sums = ab_switch_on("DS_SKINNY_FIRST_SUMS");
  p.first_sums = p.defer_mid && first_sums;
  p.early_stages = early_stages_for(T);
  return rows == 16   ? launch<16>(p, stream)
         : rows == 32 ? launch<32>(p, stream)
                      : launch<64>(p, stream);
}

// The groups' weights, outputs and first tiles into p; returns their tiles.
int set_groups(Params& p, const SkinnyGroup* groups, int count, int K) {
  int tiles = 0;
  for (int g = 0; g < count; ++g) {
    p.w[g] = encode_tma_2d_bf16(groups[g].w, groups[g].n, K, kTileRows);
    p.y[g] = groups[g].y;
    p.n[g] = groups[g].n;
    p.first_tile[g] = tiles;
    tiles += (groups[g].n + kTileRows - 1) / kTileRows;
  }
  p.count = count;
  return tiles;
}

}  // namespace

size_t skinny_workspace_floats(int sm_count) {
  return static_cast<size_t>(2 * sm_count) * kTileRows * kSkinnyMaxRows;
}

bool skinny_supported(const void* x, const void* w, const void* y, int T, int K) {
  const auto aligned = [](const void* p, uintptr_t a) {
    return reinterpret_cast<uintptr_t>(p) % a == 0;
  };
  return T >= 1 && T <= kSkinnyMaxRows && K % 8 == 0 && K > 0 && aligned(x, 16) && aligned(w, 16) &&
         aligned(y, 8);
}

cudaError_t launch_skinny_gemm_bf16(const bf16* x, const SkinnyGroup* groups, int count, int T,
                                    int K, const SkinnyWorkspace& ws, int sm_count,
                                    cudaStream_t stream) {
  if (T < 1 || T > kSkinnyMaxRows) return cudaErrorInvalidValue;
  Params p{};
  return launch_tiles(p, x, set_groups(p, groups, count, K), T, K, ws, sm_count, stream);
}

cudaError_t launch_skinny_gemm_partials_bf16(const bf16* x, const SkinnyGroup& group, int T, int K,
                                             const SkinnyWorkspace& ws, int sm_count,
                                             cudaStream_t stream, SkinnyPartials* where) {
  if (T < 1 || T > kSkinnyMaxRows) return cudaErrorInvalidValue;
  Params p{};
  p.partials_only = true;
  const cudaError_t e = launch_tiles(p, x, set_groups(p, &group, 1, K), T, K, ws, sm_count, stream);
  *where = {ws.partials, group.y, group.n, p.units, p.blocks, p.k_tiles};
  return e;
}

cudaError_t launch_skinny_gemm_silu_mul_bf16(const bf16* x, const bf16* gate, const bf16* up,
                                             bf16* act, int T, int K, int I,
                                             const SkinnyWorkspace& ws, int sm_count,
                                             cudaStream_t stream) {
  if (T < 1 || T > kSkinnySiluMulMaxRows) return cudaErrorInvalidValue;
  Params p{};
  p.paired = true;
  p.w[0] = encode_tma_2d_bf16(gate, I, K, kPairRows);
  p.w[1] = encode_tma_2d_bf16(up, I, K, kPairRows);
  p.y[0] = act;
  p.n[0] = I;
  p.count = 1;
  return launch_tiles(p, x, (I + kPairRows - 1) / kPairRows, T, K, ws, sm_count, stream);
}

}  // namespace deltaserve::cuda
