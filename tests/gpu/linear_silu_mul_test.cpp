// CudaBackend::linear_silu_mul — the MLP's gate / up projections and SiLU-mul, formed inside the
// weight-streaming GEMM up to 16 tokens — against the CPU's two projections then silu_mul, and
// against the GPU's own unfused ops, at the 4B shape and at widths that leave a ragged last tile
// (I = 1000, 6200: not multiples of 64). 17 tokens take the unfused ops. Runs twice: the same bits.
#include <gtest/gtest.h>

#include <tuple>
#include <vector>

#include "cuda_ops_fixture.h"

namespace deltaserve::backend {
namespace {

TEST_F(CudaOps, LinearSiluMulMatchesTheProjectionsThenSiluMul) {
  for (auto [T, H, I] :
       {std::tuple{1, 2560, 9216}, std::tuple{5, 2560, 9216}, std::tuple{16, 2560, 9216},
        std::tuple{3, 264, 1000}, std::tuple{16, 1024, 6200}, std::tuple{17, 2560, 9216}}) {
    SCOPED_TRACE("T " + std::to_string(T) + " H " + std::to_string(H) + " I " + std::to_string(I));
    std::vector<float> x = rnd(static_cast<size_t>(T) * H, 70),
                       wg = rnd(static_cast<size_t>(I) * H, 71, 0.05f),
                       wu = rnd(static_cast<size_t>(I) * H, 72, 0.05f);
    Buffer dx = dev(x, DType::kBF16, {T, H}), dwg = dev(wg, DType::kBF16, {I, H}),
           dwu = dev(wu, DType::kBF16, {I, H});
    std::vector<Buffer> scratch;
    for (int i = 0; i < 5; ++i) scratch.push_back(gpu_->alloc(DType::kBF16, {T, I}));
    // The CPU: both projections in f32, then silu_mul.
    std::vector<float> g(static_cast<size_t>(T) * I), u(g.size()), ref(g.size());
    const Tensor cg(g.data(), DType::kF32, {T, I}), cu(u.data(), DType::kF32, {T, I});
    cpu_.linear(Tensor(x.data(), DType::kF32, {T, H}), Tensor(wg.data(), DType::kF32, {I, H}), cg);
    cpu_.linear(Tensor(x.data(), DType::kF32, {T, H}), Tensor(wu.data(), DType::kF32, {I, H}), cu);
    cpu_.silu_mul(cg, cu, Tensor(ref.data(), DType::kF32, {T, I}));
    // The GPU's unfused ops.
    const Tensor* ws[] = {&dwg.tensor(), &dwu.tensor()};
    const Tensor* ys[] = {&scratch[3].tensor(), &scratch[4].tensor()};
    gpu_->linear_multi(dx.tensor(), ws, ys);
    gpu_->silu_mul(scratch[3].tensor(), scratch[4].tensor(), scratch[2].tensor());
    const std::vector<float> unfused = host(scratch[2].tensor());
    std::vector<float> first;
    for (int run = 0; run < 2; ++run) {
      for (int i = 0; i < 3; ++i) poison(scratch[static_cast<size_t>(i)].tensor());
      gpu_->linear_silu_mul(dx.tensor(), dwg.tensor(), dwu.tensor(), scratch[0].tensor(),
                            scratch[1].tensor(), scratch[2].tensor());
      const std::vector<float> got = host(scratch[2].tensor());
      expect_close(got, ref, 1e-2f, "against the CPU");
      // The GPU's own unfused ops sum the same products, split differently between blocks (so a
      // rounded gate or up value may differ by an ulp): the bound of the CPU check.
      expect_close(got, unfused, 1e-2f, "against the unfused GPU ops");
      if (run == 0)
        first = got;
      else
        EXPECT_EQ(got, first) << "a second run differs";
    }
  }
}

}  // namespace
}  // namespace deltaserve::backend
