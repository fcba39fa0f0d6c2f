// CUDA RMSNorm against the CPU backend's (label gpu: skipped where no GPU is visible).
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include "backend/cpu/cpu_backend.h"
#include "backend/cuda/kernels/rms_norm.cuh"
#include "test_util.h"

namespace deltaserve {
namespace {

bool have_gpu() {
  int n = 0;
  return cudaGetDeviceCount(&n) == cudaSuccess && n > 0;
}

TEST(CudaRmsNorm, MatchesCpu) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device visible: GPU tests run on the H200 test machine";
  const int rows = 37, n = 2560;
  std::vector<float> x = testing::random_vec(rows * n, 1), w = testing::random_vec(n, 2, 0.3f);
  std::vector<uint16_t> xb(x.size()), wb(w.size());
  for (size_t i = 0; i < x.size(); ++i) x[i] = bf16_to_f32(xb[i] = f32_to_bf16(x[i]));
  for (size_t i = 0; i < w.size(); ++i) w[i] = bf16_to_f32(wb[i] = f32_to_bf16(w[i]));
  std::vector<float> ref(x.size());
  backend::CpuBackend cpu;
  cpu.rms_norm(Tensor(x.data(), DType::kF32, {rows, n}), Tensor(w.data(), DType::kF32, {n}), 1e-6f,
               Tensor(ref.data(), DType::kF32, {rows, n}));
  void *dx, *dw, *dout;
  ASSERT_EQ(cudaMalloc(&dx, xb.size() * 2), cudaSuccess);
  ASSERT_EQ(cudaMalloc(&dw, wb.size() * 2), cudaSuccess);
  ASSERT_EQ(cudaMalloc(&dout, xb.size() * 2), cudaSuccess);
  cudaMemcpy(dx, xb.data(), xb.size() * 2, cudaMemcpyHostToDevice);
  cudaMemcpy(dw, wb.data(), wb.size() * 2, cudaMemcpyHostToDevice);
  cudaMemset(dout, 0xff, xb.size() * 2);  // poison
  cuda::launch_rms_norm_bf16(static_cast<__nv_bfloat16*>(dx), static_cast<__nv_bfloat16*>(dw),
                             1e-6f, rows, n, static_cast<__nv_bfloat16*>(dout), nullptr);
  ASSERT_EQ(cudaGetLastError(), cudaSuccess);
  std::vector<uint16_t> out(xb.size());
  ASSERT_EQ(cudaMemcpy(out.data(), dout, out.size() * 2, cudaMemcpyDeviceToHost), cudaSuccess);
  for (size_t i = 0; i < out.size(); ++i)
    ASSERT_NEAR(bf16_to_f32(out[i]), ref[i], 1e-2f * (1.0f + std::abs(ref[i])))
        << i;  // bf16 output rounding
  cudaFree(dx);
  cudaFree(dw);
  cudaFree(dout);
}

}  // namespace
}  // namespace deltaserve
