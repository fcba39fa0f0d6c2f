// Timing of one GPU call for the kernel benches: the median over rounds of the mean time of
// `calls` back-to-back calls on a stream (CUDA events around each round), after one warm-up call.
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <stdexcept>
#include <vector>

namespace deltaserve::bench {

template <class Call>
double median_ms_per_call(cudaStream_t stream, int rounds, int calls, Call&& call) {
  call();
  if (cudaStreamSynchronize(stream) != cudaSuccess)
    throw std::runtime_error("CUDA error (warm-up)");
  cudaEvent_t e0, e1;
  cudaEventCreate(&e0);
  cudaEventCreate(&e1);
  std::vector<double> ms;
  for (int r = 0; r < rounds; ++r) {
    cudaEventRecord(e0, stream);
    for (int i = 0; i < calls; ++i) call();
    cudaEventRecord(e1, stream);
    cudaEventSynchronize(e1);
    float t = 0;
    cudaEventElapsedTime(&t, e0, e1);
    ms.push_back(t / calls);
  }
  cudaEventDestroy(e0);
  cudaEventDestroy(e1);
  if (cudaGetLastError() != cudaSuccess) throw std::runtime_error("CUDA error in a timed call");
  std::sort(ms.begin(), ms.end());
  return ms[ms.size() / 2];
}

}  // namespace deltaserve::bench
