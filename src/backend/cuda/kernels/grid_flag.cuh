// Flags between the blocks of one grid: a block publishes data it stored in global memory, another
// waits for it and then reads it, also through the bulk tensor copy engine (TMA). The publisher's
// stores, then (after its block's barrier) one thread's release of the flag at GPU scope; the
// reader's acquire, then a proxy fence so that its TMA copies (the async proxy) see what the
// generic stores wrote.
#pragma once

namespace deltaserve::cuda::grid_flag {

__device__ inline bool is_set(const int* flag) {
  int v;
  asm volatile("ld.acquire.gpu.global.b32 %0, [%1];\n" : "=r"(v) : "l"(flag) : "memory");
  return v != 0;
}

__device__ inline void set(int* flag) {
  asm volatile("st.release.gpu.global.b32 [%0], %1;\n" ::"l"(flag), "r"(1) : "memory");
}

// Orders this thread's generic-proxy global accesses with its async-proxy ones (both ways).
__device__ inline void proxy_fence() { asm volatile("fence.proxy.async.global;\n" ::: "memory"); }

__device__ inline void wait_set(const int* flag) {
  while (!is_set(flag)) __nanosleep(32);
  proxy_fence();
}

}  // namespace deltaserve::cuda::grid_flag
