// A counter between the blocks of one grid: blocks publish data they stored in global memory by
// adding to it, and a block waits for it to reach a target before it reads that data, also through
// the bulk tensor copy engine (TMA). A publisher's stores, a proxy fence, its block's barrier, then
// one thread's add with release semantics at GPU scope; the reader's acquire loads, then a proxy
// fence so that its TMA copies (the async proxy) see what the generic stores wrote.
#pragma once

namespace deltaserve::cuda::grid_counter {

__device__ inline bool reached(const int* counter, int target) {
  int v;
  asm volatile("ld.acquire.gpu.global.b32 %0, [%1];\n" : "=r"(v) : "l"(counter) : "memory");
  return v >= target;
}

__device__ inline void add_release(int* counter, int v) {
  asm volatile("red.release.gpu.global.add.s32 [%0], %1;\n" ::"l"(counter), "r"(v) : "memory");
}

// Orders this thread's generic-proxy global accesses with its async-proxy ones (both ways).
__device__ inline void proxy_fence() { asm volatile("fence.proxy.async.global;\n" ::: "memory"); }

__device__ inline void wait_reached(const int* counter, int target) {
  while (!reached(counter, target)) __nanosleep(32);
  proxy_fence();
}

}  // namespace deltaserve::cuda::grid_counter
