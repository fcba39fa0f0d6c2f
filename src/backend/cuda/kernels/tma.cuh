// Hopper's bulk tensor copy engine (TMA) and the shared-memory barriers its copies complete on
// (sm_90): a 2-D tile of a global tensor copied into shared memory by one thread (or into the
// shared memory of several CTAs of a thread-block cluster at once), the barrier counting the bytes
// that landed; and the cluster's rank, remote arrivals and barrier.
//
// A tensor map (CUtensorMap, encoded on the host by `encode_tma_2d`) is passed by value as a
// __grid_constant__ kernel parameter; the copy instructions take its address.
#pragma once

#include <cuda.h>

#include <cstdint>

namespace deltaserve::cuda::tma {

__device__ inline uint32_t smem_addr(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// A transaction barrier in shared memory expecting `count` arrivals a phase.
__device__ inline void barrier_init(uint64_t* bar, uint32_t count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(smem_addr(bar)), "r"(count)
               : "memory");
}
// Makes initialised barriers visible to the copy engine (and the cluster); then a block barrier.
__device__ inline void barrier_init_fence() {
  asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
}
// One arrival that also announces `bytes` of copies completing on this phase.
__device__ inline void arrive_expect_bytes(uint64_t* bar, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(smem_addr(bar)),
               "r"(bytes)
               : "memory");
}
__device__ inline void arrive(uint64_t* bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(smem_addr(bar)) : "memory");
}
// Waits until the barrier's phase of parity `parity` has completed. With kSuspend (waits that may
// be long: another warpgroup's whole phase of work) each try may suspend the thread until the phase
// completes (up to the hint's ~0.1 ms), so that waiting warps need not take issue slots from the
// warps they wait for. (In the fused GDN chunk kernel that timed the same as without: 0.457
// against 0.459 ms a layer at 8 x 1024.)
template <bool kSuspend>
__device__ inline void wait_phase(uint64_t* bar, uint32_t parity) {
  uint32_t done = 0;
  while (!done) {
    if constexpr (kSuspend)
      asm volatile(
          "{\n.reg .pred p;\nmbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2, %3;\n"
          "selp.u32 %0, 1, 0, p;\n}\n"
          : "=r"(done)
          : "r"(smem_addr(bar)), "r"(parity), "r"(100000)
          : "memory");
    else
      asm volatile(
          "{\n.reg .pred p;\nmbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n"
          "selp.u32 %0, 1, 0, p;\n}\n"
          : "=r"(done)
          : "r"(smem_addr(bar)), "r"(parity)
          : "memory");
  }
}
__device__ inline void wait(uint64_t* bar, uint32_t parity) { wait_phase<false>(bar, parity); }
// Whether the barrier's phase of parity `parity` has completed (never waits).
__device__ inline bool phase_done(uint64_t* bar, uint32_t parity) {
  uint32_t done;
  asm volatile(
      "{\n.reg .pred p;\nmbarrier.test_wait.parity.shared::cta.b64 p, [%1], %2;\n"
      "selp.u32 %0, 1, 0, p;\n}\n"
      : "=r"(done)
      : "r"(smem_addr(bar)), "r"(parity)
      : "memory");
  return done != 0;
}
__device__ inline void wait_suspended(uint64_t* bar, uint32_t parity) {
  wait_phase<true>(bar, parity);
}

// Copies the box at (c0 innermost, c1) of `map` to shared `dst` (1024-byte aligned for the
// 128-byte swizzle), completing on `bar`. Elements outside the tensor land as zeros (and count).
__device__ inline void load_2d(void* dst, const CUtensorMap* map, int c0, int c1, uint64_t* bar) {
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, "
      "{%2, %3}], [%4];\n" ::"r"(smem_addr(dst)),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(c0), "r"(c1), "r"(smem_addr(bar))
      : "memory");
}

// As load_2d, the box landing at `dst`'s offset in each CTA of the cluster whose rank is a bit of
// `ranks`, completing on the barrier at `bar`'s offset in each.
__device__ inline void load_2d_multicast(void* dst, const CUtensorMap* map, int c0, int c1,
                                         uint64_t* bar, uint16_t ranks) {
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes.multicast::"
      "cluster [%0], [%1, {%2, %3}], [%4], %5;\n" ::"r"(smem_addr(dst)),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(c0), "r"(c1), "r"(smem_addr(bar)), "h"(ranks)
      : "memory");
}

// One arrival on the barrier at `bar`'s offset in the cluster's CTA of rank `rank`.
__device__ inline void arrive_in_cta(uint64_t* bar, uint32_t rank) {
  asm volatile(
      "{\n.reg .b32 remote;\nmapa.shared::cluster.u32 remote, %0, %1;\n"
      "mbarrier.arrive.shared::cluster.b64 _, [remote];\n}\n" ::"r"(smem_addr(bar)),
      "r"(rank)
      : "memory");
}

// Stores v at `p`'s offset in the shared memory of the cluster's CTA of rank `rank`.
__device__ inline void store_f32_to_cta(float* p, float v, uint32_t rank) {
  asm volatile(
      "{\n.reg .b32 remote;\nmapa.shared::cluster.u32 remote, %0, %1;\n"
      "st.shared::cluster.f32 [remote], %2;\n}\n" ::"r"(smem_addr(p)),
      "r"(rank), "f"(v)
      : "memory");
}

// This CTA's rank in its cluster.
__device__ inline uint32_t cluster_rank() {
  uint32_t r;
  asm volatile("mov.u32 %0, %%cluster_ctarank;\n" : "=r"(r));
  return r;
}

// Every thread of every CTA of the cluster arrives, then waits for all of them.
__device__ inline void cluster_sync() {
  asm volatile("barrier.cluster.arrive.aligned;\nbarrier.cluster.wait.aligned;\n" ::: "memory");
}

// Copies `bytes` (a multiple of 16; both addresses 16-byte aligned) from shared `src` to global
// `dst` by the bulk copy engine, in the issuing thread's bulk group. The block's writes of `src`
// must be made visible to the async proxy first (fence.proxy.async.shared::cta, then a barrier).
__device__ inline void store_bulk(void* dst, const void* src, uint32_t bytes) {
  asm volatile("cp.async.bulk.global.shared::cta.bulk_group [%0], [%1], %2;\n" ::"l"(dst),
               "r"(smem_addr(src)), "r"(bytes)
               : "memory");
}
__device__ inline void bulk_commit() { asm volatile("cp.async.bulk.commit_group;\n" ::: "memory"); }
// The thread's bulk groups but the newest kPending: their shared sources read (free to reuse).
template <int kPending>
__device__ inline void bulk_wait_read() {
  asm volatile("cp.async.bulk.wait_group.read %0;\n" ::"n"(kPending) : "memory");
}
// ... and their writes to global memory done.
template <int kPending>
__device__ inline void bulk_wait() {
  asm volatile("cp.async.bulk.wait_group %0;\n" ::"n"(kPending) : "memory");
}

__device__ inline void prefetch_map(const CUtensorMap* map) {
  asm volatile("prefetch.tensormap [%0];\n" ::"l"(reinterpret_cast<uint64_t>(map)) : "memory");
}

}  // namespace deltaserve::cuda::tma
