// A backend on a share of the SMs (a green context): the shares add up to the GPU, a share that
// leaves no SM is refused, and the share's backend computes the projections at T = 1, 16 and 300
// as the CPU does — the weight-streaming GEMM with its grid sized for the share (its tiles' sums
// can wait on other blocks of the grid, so a grid larger than the share could hang) and cuBLASLt.
// (The K split follows the SM count, so the share's sums are not the whole GPU's bit for bit.)
#include <gtest/gtest.h>

#include "cuda_ops_fixture.h"

namespace deltaserve::backend {
namespace {

TEST_F(CudaOps, BackendOnAnSmShareMatchesTheCpu) {
  int sms = 0;
  ASSERT_EQ(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0), cudaSuccess);
  auto [share, rest] = cuda::SmPartition::split(0, 16);
  EXPECT_GE(share.sm_count(), 16);
  EXPECT_LT(share.sm_count(), sms);
  EXPECT_EQ(share.sm_count() + rest.sm_count(), sms);
  EXPECT_THROW(cuda::SmPartition::split(0, sms), Error);
  {
    CudaBackend part(0, &share);
    const int in = 2560, out = 9216;
    for (int T : {1, 16, 300}) {
      SCOPED_TRACE("T " + std::to_string(T));
      auto x = rnd(static_cast<size_t>(T) * in, 11),
           w = rnd(static_cast<size_t>(out) * in, 12, 0.05f);
      auto dx = dev(x, DType::kBF16, {T, in}), dw = dev(w, DType::kBF16, {out, in});
      auto y = gpu_->alloc(DType::kBF16, {T, out});
      poison(y.tensor());
      ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);  // inputs and poison before the share's work
      part.linear(dx.tensor(), dw.tensor(), y.tensor());
      std::vector<float> got(static_cast<size_t>(T) * out), ref(got.size());
      part.download_f32(y.tensor(), got.data());
      cpu_.linear(Tensor(x.data(), DType::kF32, {T, in}), Tensor(w.data(), DType::kF32, {out, in}),
                  Tensor(ref.data(), DType::kF32, {T, out}));
      expect_close(got, ref, 1e-2f, "linear on the share");
    }
  }
}

}  // namespace
}  // namespace deltaserve::backend
