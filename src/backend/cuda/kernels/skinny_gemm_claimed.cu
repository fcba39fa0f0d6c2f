// The weight-streaming GEMM with its shares claimed at run time (up to 16 tokens): the units are
// split into more shares than blocks (skinny::claimed_shares); block c takes share c, then claims
// the next from a counter whenever it has copied its last one's units. A block that starts late
// (its SM still held by the previous kernel) or streams slowly takes fewer shares, so the blocks
// finish together instead of the grid waiting for the slowest of equal shares.
//
// A tile split between shares is summed from the shares' partials, in share order (the results do
// not depend on which block ran which share), by the block holding its last k-tile, after that
// block's stream: every segment only counts its k-tiles (a release reduction, nothing returned),
// so no block waits in mid-stream for an atomic. The summing blocks wait only for shares of lower
// numbers, claimed before theirs by blocks that never wait in mid-stream: they finish.
#include "backend/cuda/kernels/pdl.cuh"
#include "backend/cuda/kernels/skinny_gemm_tile.cuh"
#include "backend/cuda/kernels/tma.cuh"

namespace deltaserve::cuda::skinny_kernel {
namespace {

// Claimed shares between the producer and the consumers: the producer runs at most a pipeline
// ahead (kStages stages, each share at least one), so the ring never overwrites an unread share.
constexpr int kRing = 16;

// A claim: the counter's value before this block's increment, issued without waiting (the
// result is read only where used, a share's copies later: an atomic's return takes microseconds
// while the memory system streams).
__device__ inline int claim_async(int* counter) {
  int old;
  asm volatile("atom.global.add.u32 %0, [%1], 1;\n" : "=r"(old) : "l"(counter) : "memory");
  return old;
}

// The block's shares in order: its own (blockIdx.x), then those it claims, each claim issued as
// the previous share's copies start. The first stages of its own share copy their weights before
// the wait for the previous kernel, their activations after it. A share's number goes into the
// ring before its first stage is armed (the arrival releases it to the consumers that wait on that
// stage); -1 goes into a stage completed without copies once the shares run out. (Plain locals:
// with the producer's state in a struct, the compiler kept it in local memory, the parameters
// behind a generic pointer.)
template <int kRows>
__device__ void produce_claimed(const Params& p, unsigned char* stages, uint64_t* full,
                                uint64_t* empty, int* ring) {
  constexpr int kStageBytes = Pipe<kRows>::kStageBytes, kStages = Pipe<kRows>::kStages;
  static_assert(kStages < kRing, "a share's ring entry outlives its stages");
  tma::prefetch_map(&p.x);
  const auto stage = [&](int i) { return stages + i % kStages * kStageBytes; };
  const auto arm = [&](int i) {  // stage i free, and expecting its copies' bytes
    if (i >= kStages) tma::wait(&empty[i % kStages], (i / kStages - 1) & 1);
    tma::arrive_expect_bytes(&full[i % kStages], kStageBytes);
  };
  int c = static_cast<int>(blockIdx.x), i = 0;
  const int u0 = first_unit(p, c), early = min(first_unit(p, c + 1) - u0, kStages);
  ring[0] = c;
  for (; i < early; ++i) {
    arm(i);
    load_weights(p, u0 + i, stage(i), &full[i]);
  }
  int next = claim_async(&p.claim[0]);
  pdl::wait_for_predecessor();
  for (int j = 0; j < early; ++j) load_activations(p, u0 + j, stage(j), &full[j]);
  for (int k = 0;;) {
    for (int u = first_unit(p, c) + (k == 0 ? early : 0), u1 = first_unit(p, c + 1); u < u1;
         ++u, ++i) {
      arm(i);
      load_weights(p, u, stage(i), &full[i % kStages]);
      load_activations(p, u, stage(i), &full[i % kStages]);
    }
    c = p.grid + next;
    ++k;
    if (c >= p.blocks) {
      ring[k % kRing] = -1;
      if (i >= kStages) tma::wait(&empty[i % kStages], (i / kStages - 1) & 1);
      tma::arrive(&full[i % kStages]);
      break;
    }
    ring[k % kRing] = c;
    next = claim_async(&p.claim[0]);
  }
  // The last block to run out zeroes the claim counters for a later launch: the count's release
  // orders each block's claims before it, its acquire the zeroing after all.
  if (add_acq_rel(&p.claim[1], 1) == p.grid - 1) {
    p.claim[0] = 0;
    p.claim[1] = 0;
  }
}

// Sums `tile` from its shares' partials (all counted: this block completed its count) and zeroes
// its counter for the next launch.
template <int kRows>
__device__ void sum_tile(const Params& p, int tile, BlockShared& sh) {
  const int np = gather_parts(p, tile, sh.parts);
  consumers_sync();
  reduce_tile<kRows>(p, tile, sh.parts, np);
  if (threadIdx.x == 0) p.ws.counters[tile] = 0;
}

// The segments' counts go through a queue in shared memory to a thread of a warp of their own,
// which makes each (a release reduction: a fence that waits for the block's stores to land, then
// the add): by a consumer thread, that wait stalled its warpgroup's MMAs at every segment's end
// (about 3 us a share in lease 5).
constexpr int kCountRing = 8, kCountingThread = kThreads;  // the first thread past the producer
struct CountQueue {
  int tile[kCountRing], n[kCountRing];  // tile -1: no more counts
  uint64_t full[kCountRing], empty[kCountRing];
  __device__ void init() {
    for (int s = 0; s < kCountRing; ++s) {
      tma::barrier_init(&full[s], 1);
      tma::barrier_init(&empty[s], 1);
    }
  }
  // By consumer thread 0 (after the consumers' barrier that follows their partials' stores): the
  // j-th count. Its arrival releases the consumers' stores to the counting thread.
  __device__ void post(int j, int t, int k_tiles) {
    const int s = j % kCountRing;
    if (j >= kCountRing) tma::wait(&empty[s], (j / kCountRing - 1) & 1);
    tile[s] = t;
    n[s] = k_tiles;
    tma::arrive(&full[s]);
  }
  // By the counting thread: every count posted, in order, until the -1.
  __device__ void count_all(const Params& p) {
    for (int j = 0;; ++j) {
      const int s = j % kCountRing;
      tma::wait(&full[s], (j / kCountRing) & 1);
      if (tile[s] < 0) return;
      red_release(&p.ws.counters[tile[s]], n[s]);
      tma::arrive(&empty[s]);
    }
  }
};

// The tiles whose last k-tile this block computed (summed after its stream), in shared memory.
constexpr int kMaxPending = 64;
struct Pending {
  int tiles[kMaxPending];
};

// Thread 0: waits until every segment of `tile` is counted (the last included: this block's).
__device__ inline void wait_counted(const Params& p, int tile) {
  while (load_acquire(&p.ws.counters[tile]) != p.k_tiles) {
  }
}

// The consumer warpgroups over the block's shares, tile segment by tile segment, then the sums of
// the tiles whose last k-tile they hold.
template <int kRows>
__device__ void consume_claimed(const Params& p, unsigned char* stages, uint64_t* full,
                                uint64_t* empty, const int* ring, BlockShared& sh, Pending& pend,
                                CountQueue& counts) {
  constexpr int kStages = Pipe<kRows>::kStages;
  float acc[kRows / 2];
  int pending = 0;  // the same count in every consumer thread
  int posted = 0;   // thread 0's counts
  for (int i = 0, k = 0;; ++k) {
    tma::wait(&full[i % kStages], (i / kStages) & 1);  // the share's first stage: its ring entry
    const int c = ring[k % kRing];
    if (c < 0) break;
    const int u1 = first_unit(p, c + 1);
    for (int u = first_unit(p, c); u < u1;) {
      const int tile = u / p.k_tiles, kt0 = u - tile * p.k_tiles;
      const int end = min(u1, (tile + 1) * p.k_tiles), kt1 = end - tile * p.k_tiles;
#pragma unroll
      for (int a = 0; a < kRows / 2; ++a) acc[a] = 0.0f;
      for (; u < end; ++u, ++i) mma_unit<kRows>(acc, stages, full, empty, i);
      if (kt0 == 0 && kt1 == p.k_tiles) {
        store_tile<kRows>(p, tile_ref(p, tile), acc, sh.xchg);
        continue;
      }
      store_partial<kRows>(p, slot_of(p, c, tile), acc);
      consumers_sync();  // every consumer's partial stored before the count's release
      if (threadIdx.x == 0) counts.post(posted++, tile, kt1 - kt0);
      if (kt1 < p.k_tiles) continue;
      if (pending < kMaxPending) {  // the tile's last segment: summed after the stream
        if (threadIdx.x == 0) pend.tiles[pending] = tile;
        ++pending;
        continue;
      }
      if (threadIdx.x == 0) wait_counted(p, tile);  // (a long run of them: now)
      consumers_sync();  // the count's acquire before any consumer reads the partials
      sum_tile<kRows>(p, tile, sh);
    }
  }
  if (threadIdx.x == 0) counts.post(posted, -1, 0);
  for (int j = 0; j < pending; ++j) {
    consumers_sync();  // the list written; the previous sum's reads of sh.parts done
    if (threadIdx.x == 0) wait_counted(p, pend.tiles[j]);
    consumers_sync();
    sum_tile<kRows>(p, pend.tiles[j], sh);
  }
}

template <int kRows>
__global__ void __launch_bounds__(kThreads + 32, 1)
    skinny_gemm_claimed_kernel(const __grid_constant__ Params p) {
  constexpr int kStages = Pipe<kRows>::kStages;
  extern __shared__ unsigned char raw[];
  unsigned char* stages = wgmma::atom_aligned<unsigned char>(raw);
  __shared__ uint64_t full[kStages], empty[kStages];
  __shared__ BlockShared sh;
  __shared__ int ring[kRing];
  __shared__ Pending pend;
  __shared__ CountQueue counts;
  if (threadIdx.x == 0) counts.init();
  init_pipeline<kStages>(full, empty);
  __syncthreads();
  pdl::allow_successor();  // the next kernel's blocks may start streaming their weights
  if (threadIdx.x >= kConsumers) {
    if (threadIdx.x == kConsumers) produce_claimed<kRows>(p, stages, full, empty, ring);
    if (threadIdx.x == kCountingThread) counts.count_all(p);
    return;
  }
  pdl::wait_for_predecessor();  // before the stores and the workspace
  consume_claimed<kRows>(p, stages, full, empty, ring, sh, pend, counts);
}

}  // namespace

cudaError_t launch_claimed(const Params& p, cudaStream_t stream) {
  constexpr int kRows = skinny::kClaimedMaxRows;
  const auto kernel = skinny_gemm_claimed_kernel<kRows>;
  constexpr int smem = Pipe<kRows>::kSmemBytes;
  const cudaError_t e =
      cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
  if (e != cudaSuccess) return e;
  return pdl::launch_with(true, kernel, p.grid, kThreads + 32, smem, stream, p);
}

}  // namespace deltaserve::cuda::skinny_kernel
