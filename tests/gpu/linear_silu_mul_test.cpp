// CudaBackend::linear_silu_mul — the MLP's gate / up projections and SiLU-mul, formed inside the
// weight-streaming GEMM up to 16 tokens; from kGemmSiluMulMinRows tokens with I a multiple of
// kGemmSiluMulTileCols, inside the prefill GEMM's epilogue (gate_up then stays unwritten: checked,
// so a silent fallback fails; ragged last row tiles, K not a multiple of 64, more tiles than SMs);
// otherwise, with the weights adjacent (as the loader places them), one cuBLASLt GEMM into
// [T, 2 I] and SiLU-mul over its halves (I = 1001: the scalar kernel), else the unfused ops —
// against the CPU's two projections then silu_mul, and against the GPU's own unfused ops, at the
// 4B shape and at widths that leave a ragged last tile (I = 1000, 6200: not multiples of 64). Runs
// twice: the same bits.
#include <gtest/gtest.h>

#include <algorithm>
#include <tuple>
#include <vector>

#include "backend/cuda/kernels/gemm_silu_mul.cuh"
#include "cuda_ops_fixture.h"

namespace deltaserve::backend {
namespace {

TEST_F(CudaOps, LinearSiluMulMatchesTheProjectionsThenSiluMul) {
  for (auto [T, H, I, adjacent] :
       {std::tuple{1, 2560, 9216, true}, std::tuple{5, 2560, 9216, false},
        std::tuple{16, 2560, 9216, true}, std::tuple{3, 264, 1000, false},
        std::tuple{16, 1024, 6200, false}, std::tuple{17, 2560, 9216, false},
        std::tuple{17, 2560, 9216, true}, std::tuple{64, 2560, 9216, true},
        std::tuple{300, 1024, 6200, true}, std::tuple{40, 264, 1001, true},
        std::tuple{2100, 264, 1024, false}, std::tuple{2200, 1024, 2048, true},
        std::tuple{2048, 2560, 2304, true}, std::tuple{4096, 2560, 9216, true}}) {
    SCOPED_TRACE("T " + std::to_string(T) + " H " + std::to_string(H) + " I " + std::to_string(I) +
                 (adjacent ? " adjacent" : ""));
    std::vector<float> x = rnd(static_cast<size_t>(T) * H, 70),
                       wg = rnd(static_cast<size_t>(I) * H, 71, 0.05f),
                       wu = rnd(static_cast<size_t>(I) * H, 72, 0.05f);
    Buffer dx = dev(x, DType::kBF16, {T, H});
    // The weights apart, or (as the loader places them) up's rows right after gate's.
    std::vector<float> both = wg;
    both.insert(both.end(), wu.begin(), wu.end());
    Buffer dwg = dev(wg, DType::kBF16, {I, H}), dwu = dev(wu, DType::kBF16, {I, H}),
           dboth = dev(both, DType::kBF16, {2 * I, H});
    const Tensor w_gate = adjacent ? dboth.tensor().rows(0, I) : dwg.tensor(),
                 w_up = adjacent ? dboth.tensor().rows(I, 2 * I) : dwu.tensor();
    Buffer gate_up = gpu_->alloc(DType::kBF16, {T, 2 * I}), act = gpu_->alloc(DType::kBF16, {T, I});
    std::vector<Buffer> unfused_bufs;
    for (int i = 0; i < 3; ++i) unfused_bufs.push_back(gpu_->alloc(DType::kBF16, {T, I}));
    // The CPU: both projections in f32, then silu_mul.
    std::vector<float> g(static_cast<size_t>(T) * I), u(g.size()), ref(g.size());
    const Tensor cg(g.data(), DType::kF32, {T, I}), cu(u.data(), DType::kF32, {T, I});
    cpu_.linear(Tensor(x.data(), DType::kF32, {T, H}), Tensor(wg.data(), DType::kF32, {I, H}), cg);
    cpu_.linear(Tensor(x.data(), DType::kF32, {T, H}), Tensor(wu.data(), DType::kF32, {I, H}), cu);
    cpu_.silu_mul(cg, cu, Tensor(ref.data(), DType::kF32, {T, I}));
    // The GPU's unfused ops.
    const Tensor* ws[] = {&dwg.tensor(), &dwu.tensor()};
    const Tensor* ys[] = {&unfused_bufs[0].tensor(), &unfused_bufs[1].tensor()};
    gpu_->linear_multi(dx.tensor(), ws, ys);
    gpu_->silu_mul(unfused_bufs[0].tensor(), unfused_bufs[1].tensor(), unfused_bufs[2].tensor());
    const std::vector<float> unfused = host(unfused_bufs[2].tensor());
    std::vector<float> first;
    for (int run = 0; run < 2; ++run) {
      poison(gate_up.tensor());
      poison(act.tensor());
      gpu_->linear_silu_mul(dx.tensor(), w_gate, w_up, gate_up.tensor(), act.tensor());
      const std::vector<float> got = host(act.tensor());
      expect_close(got, ref, 1e-2f, "against the CPU");
      // The GPU's own unfused ops sum the same products, split differently between blocks (so a
      // rounded gate or up value may differ by an ulp): the bound of the CPU check.
      expect_close(got, unfused, 1e-2f, "against the unfused GPU ops");
      if (T >= cuda::kGemmSiluMulMinRows && I % cuda::kGemmSiluMulTileCols == 0) {
        const std::vector<float> scratch = host(gate_up.tensor());
        EXPECT_TRUE(std::all_of(scratch.begin(), scratch.end(), [](float v) { return v != v; }))
            << "the prefill GEMM's fused form wrote gate_up: it did not run";
      }
      if (run == 0)
        first = got;
      else
        EXPECT_EQ(got, first) << "a second run differs";
    }
  }
}

}  // namespace
}  // namespace deltaserve::backend
