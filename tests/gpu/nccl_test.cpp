// The NCCL communicator on GPU ranks (label gpu: skipped where no GPU is visible). One rank runs
// everywhere a GPU is; the sums need 2 GPUs (skipped on one-GPU machines).
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <thread>

#include "core/error.h"
#include "dist/nccl_communicator.h"

namespace deltaserve::dist {
namespace {

int gpus() {
  int n = 0;
  return cudaGetDeviceCount(&n) == cudaSuccess ? n : 0;
}

// Runs the collectives on `size` ranks (one thread and GPU each); returns rank 0's results.
void run(int size) {
  const ncclUniqueId id = nccl_unique_id();
  std::vector<std::thread> ts;
  std::vector<std::vector<float>> reduced(static_cast<size_t>(size)),
      gathered(static_cast<size_t>(size)), scattered(static_cast<size_t>(size)),
      bcast(static_cast<size_t>(size));
  for (int r = 0; r < size; ++r)
    ts.emplace_back([&, r] {
      cudaSetDevice(r);
      cudaStream_t s;
      cudaStreamCreate(&s);
      NcclCommunicator c(id, size, r, r, [s] { return s; });
      const int n = 1024;
      float *x, *g, *sc;
      cudaMalloc(&x, n * sizeof(float));
      cudaMalloc(&g, n * size * sizeof(float));
      cudaMalloc(&sc, n / size * sizeof(float));
      std::vector<float> h(n);
      for (int i = 0; i < n; ++i) h[static_cast<size_t>(i)] = static_cast<float>(r * 1000 + i);
      cudaMemcpy(x, h.data(), n * sizeof(float), cudaMemcpyHostToDevice);
      c.all_gather(Tensor(x, DType::kF32, {n}, Device::kCuda),
                   Tensor(g, DType::kF32, {n * size}, Device::kCuda));
      c.all_reduce_sum(Tensor(x, DType::kF32, {n}, Device::kCuda));
      c.reduce_scatter_sum(Tensor(x, DType::kF32, {n}, Device::kCuda),
                           Tensor(sc, DType::kF32, {n / size}, Device::kCuda));
      c.barrier();
      auto down = [&](float* p, int count) {
        std::vector<float> v(static_cast<size_t>(count));
        cudaMemcpy(v.data(), p, static_cast<size_t>(count) * sizeof(float), cudaMemcpyDeviceToHost);
        return v;
      };
      reduced[static_cast<size_t>(r)] = down(x, n);
      gathered[static_cast<size_t>(r)] = down(g, n * size);
      scattered[static_cast<size_t>(r)] = down(sc, n / size);
      c.broadcast(Tensor(x, DType::kF32, {n}, Device::kCuda), 0);
      cudaStreamSynchronize(s);
      bcast[static_cast<size_t>(r)] = down(x, n);
      cudaFree(x);
      cudaFree(g);
      cudaFree(sc);
      cudaStreamDestroy(s);
    });
  for (auto& t : ts) t.join();
  const int n = 1024;
  for (int r = 0; r < size; ++r) {
    for (int i = 0; i < n; ++i) {
      float sum = 0;
      for (int q = 0; q < size; ++q) sum += static_cast<float>(q * 1000 + i);
      ASSERT_EQ(reduced[static_cast<size_t>(r)][static_cast<size_t>(i)], sum);
      ASSERT_EQ(bcast[static_cast<size_t>(r)][static_cast<size_t>(i)],
                reduced[0][static_cast<size_t>(i)]);
    }
    for (int q = 0; q < size; ++q)
      for (int i = 0; i < n; ++i)
        ASSERT_EQ(gathered[static_cast<size_t>(r)][static_cast<size_t>(q * n + i)],
                  static_cast<float>(q * 1000 + i));
    for (int i = 0; i < n / size; ++i)  // reduce-scatter of the already reduced x: size x the sum
      ASSERT_EQ(scattered[static_cast<size_t>(r)][static_cast<size_t>(i)],
                static_cast<float>(size) * reduced[0][static_cast<size_t>(r * n / size + i)]);
  }
}

TEST(Nccl, OneRankThroughTheNcclPath) {
  if (gpus() < 1) GTEST_SKIP() << "no CUDA device visible: GPU tests run on the H200 test machine";
  run(1);
}

TEST(Nccl, TwoRanks) {
  if (gpus() < 2) GTEST_SKIP() << "needs 2 GPUs (multi-GPU runs are the multi-GPU issue)";
  run(2);
}

TEST(Nccl, MissingDeviceIsAClearError) {
  if (gpus() < 1) GTEST_SKIP() << "no CUDA device visible";
  const ncclUniqueId id = nccl_unique_id();
  try {
    NcclCommunicator c(id, 1, 0, 999, nullptr);
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("CUDA device 999 does not exist"), std::string::npos)
        << e.what();
  }
}

}  // namespace
}  // namespace deltaserve::dist
