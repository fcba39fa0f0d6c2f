// The decode MLP in one launch (launch_skinny_mlp_bf16) against the CPU (both projections in f32,
// SiLU-mul rounded to bf16, the down projection) and against the GPU's two launches it replaces
// (the SiLU-mul form, then the down projection): the same bits where both split the units between
// as many blocks. Shapes: the 4B and 0.8B MLPs, a ragged last act tile (I = 1000), a ragged last
// down tile (H = 2600), K past a k-tile's edge (H = 264). Each case launches three times, on
// poisoned outputs, with new inputs on the third: a block that read an act tile before it was
// stored, or a flag left set by the launch before, shows as a mismatch; and every tile counter and
// flag is zero after each launch. Then CudaBackend::mlp_add_rms_norm against the backend's default
// (linear_silu_mul, then linear_add_rms_norm), to 17 tokens (past the one-launch form).
#include <gtest/gtest.h>

#include <cmath>
#include <tuple>
#include <vector>

#include "backend/cuda/kernels/skinny_partition.h"
#include "skinny_fixture.h"

namespace deltaserve::backend {
namespace {

using bf16 = __nv_bfloat16;

const bf16* cbf(const Buffer& b) { return static_cast<const bf16*>(b.tensor().data); }
bf16* mbf(const Buffer& b) { return static_cast<bf16*>(b.tensor().data); }

struct MlpRef {
  std::vector<float> act, y;
};

// The CPU's MLP: act rounded to bf16 (as the GPU stores it) before the down projection.
MlpRef cpu_mlp(CpuBackend& cpu, const std::vector<float>& x, const std::vector<float>& wg,
               const std::vector<float>& wu, const std::vector<float>& wd, int T, int H, int I) {
  std::vector<float> g(static_cast<size_t>(T) * I), u(g.size());
  MlpRef r{std::vector<float>(g.size()), std::vector<float>(static_cast<size_t>(T) * H)};
  const Tensor tx(const_cast<float*>(x.data()), DType::kF32, {T, H});
  cpu.linear(tx, Tensor(const_cast<float*>(wg.data()), DType::kF32, {I, H}),
             Tensor(g.data(), DType::kF32, {T, I}));
  cpu.linear(tx, Tensor(const_cast<float*>(wu.data()), DType::kF32, {I, H}),
             Tensor(u.data(), DType::kF32, {T, I}));
  for (size_t i = 0; i < g.size(); ++i) {
    const float gate = bf16_to_f32(f32_to_bf16(g[i])), up = bf16_to_f32(f32_to_bf16(u[i]));
    r.act[i] = bf16_to_f32(f32_to_bf16(gate / (1.0f + std::exp(-gate)) * up));
  }
  cpu.linear(Tensor(r.act.data(), DType::kF32, {T, I}),
             Tensor(const_cast<float*>(wd.data()), DType::kF32, {H, I}),
             Tensor(r.y.data(), DType::kF32, {T, H}));
  return r;
}

TEST_F(SkinnyGemm, MlpInOneLaunchMatchesTheCpuAndTheTwoLaunches) {
  for (auto [T, H, I] :
       {std::tuple{1, 2560, 9216}, std::tuple{5, 2560, 9216}, std::tuple{8, 2560, 9216},
        std::tuple{16, 2560, 9216}, std::tuple{4, 1024, 3584}, std::tuple{16, 2600, 1000},
        std::tuple{3, 264, 1000}}) {
    SCOPED_TRACE("T " + std::to_string(T) + " H " + std::to_string(H) + " I " + std::to_string(I));
    const std::vector<float> wg = rnd(static_cast<size_t>(I) * H, 91, 0.05f),
                             wu = rnd(static_cast<size_t>(I) * H, 92, 0.05f),
                             wd = rnd(static_cast<size_t>(H) * I, 93, 0.05f);
    const Buffer dwg = dev(wg, DType::kBF16, {I, H}), dwu = dev(wu, DType::kBF16, {I, H}),
                 dwd = dev(wd, DType::kBF16, {H, I});
    Buffer act = gpu_->alloc(DType::kBF16, {T, I}), y = gpu_->alloc(DType::kBF16, {T, H});
    Buffer act2 = gpu_->alloc(DType::kBF16, {T, I}), y2 = gpu_->alloc(DType::kBF16, {T, H});
    const int units1 = (I + 63) / 64 * ((H + 63) / 64), units2 = (H + 127) / 128 * ((I + 63) / 64);
    const bool same_split = cuda::skinny::blocks_for(units1, (H + 63) / 64, sms_) ==
                            cuda::skinny::blocks_for(units2, (I + 63) / 64, sms_);
    for (int run = 0; run < 3; ++run) {
      SCOPED_TRACE("launch " + std::to_string(run));
      const std::vector<float> x = rnd(static_cast<size_t>(T) * H, run < 2 ? 90 : 94);
      const Buffer dx = dev(x, DType::kBF16, {T, H});
      poison(act.tensor());
      poison(y.tensor());
      ASSERT_EQ(cuda::launch_skinny_mlp_bf16(cbf(dx), cbf(dwg), cbf(dwu), cbf(dwd), mbf(act),
                                             mbf(y), T, H, I, ws(), sms_, gpu_->stream()),
                cudaSuccess);
      EXPECT_EQ(nonzero_counters(), 0) << "tile counters or act flags left set";
      const MlpRef ref = cpu_mlp(cpu_, x, wg, wu, wd, T, H, I);
      const std::vector<float> got_act = host(act.tensor()), got_y = host(y.tensor());
      expect_close(got_act, ref.act, 1e-2f, "act against the CPU");
      expect_close(got_y, ref.y, 1e-2f, "y against the CPU");
      // The two launches the one replaces.
      ASSERT_EQ(cuda::launch_skinny_gemm_silu_mul_bf16(cbf(dx), cbf(dwg), cbf(dwu), mbf(act2), T, H,
                                                       I, ws(), sms_, gpu_->stream()),
                cudaSuccess);
      const cuda::SkinnyGroup down{cbf(dwd), mbf(y2), H};
      ASSERT_EQ(
          cuda::launch_skinny_gemm_bf16(cbf(act2), &down, 1, T, I, ws(), sms_, gpu_->stream()),
          cudaSuccess);
      const std::vector<float> two_act = host(act2.tensor()), two_y = host(y2.tensor());
      if (same_split) {
        EXPECT_EQ(got_act, two_act) << "act differs from the SiLU-mul launch's";
        EXPECT_EQ(got_y, two_y) << "y differs from the two launches'";
      } else {
        expect_close(got_y, two_y, 1e-2f, "y against the two launches");
      }
    }
  }
}

TEST_F(CudaOps, MlpAddRmsNormMatchesTheDefaultOps) {
  constexpr int H = 2560, I = 9216;
  const std::vector<float> wg = rnd(static_cast<size_t>(I) * H, 95, 0.05f),
                           wu = rnd(static_cast<size_t>(I) * H, 96, 0.05f),
                           wd = rnd(static_cast<size_t>(H) * I, 97, 0.05f), nw = rnd(H, 98, 0.5f);
  const Buffer dwg = dev(wg, DType::kBF16, {I, H}), dwu = dev(wu, DType::kBF16, {I, H}),
               dwd = dev(wd, DType::kBF16, {H, I}), dnw = dev(nw, DType::kBF16, {H});
  for (const int T : {1, 7, 16, 17}) {
    SCOPED_TRACE("T " + std::to_string(T));
    const std::vector<float> x = rnd(static_cast<size_t>(T) * H, 99), res = rnd(x.size(), 100);
    std::vector<std::vector<float>> residual(2), out(2);
    for (int fused = 0; fused < 2; ++fused) {
      const Buffer dx = dev(x, DType::kBF16, {T, H}), dres = dev(res, DType::kBF16, {T, H});
      Buffer gate_up = gpu_->alloc(DType::kBF16, {T, 2 * I}),
             act = gpu_->alloc(DType::kBF16, {T, I}), o = gpu_->alloc(DType::kBF16, {T, H}),
             scratch = gpu_->alloc(DType::kBF16, {T, H});
      const MlpTensors m{dx.tensor(),  dwg.tensor(),     dwu.tensor(),
                         dwd.tensor(), gate_up.tensor(), act.tensor()};
      if (fused)
        gpu_->mlp_add_rms_norm(m, dres.tensor(), dnw.tensor(), 1e-6f, o.tensor(), scratch.tensor());
      else
        gpu_->Backend::mlp_add_rms_norm(m, dres.tensor(), dnw.tensor(), 1e-6f, o.tensor(),
                                        scratch.tensor());
      residual[fused] = host(dres.tensor());
      out[fused] = host(o.tensor());
    }
    // Up to 8 tokens both down projections run on the weight-streaming GEMM with the same split:
    // the same bits. Above, the default's runs on cuBLASLt, adding into the residual in f32.
    if (T <= 8) {
      EXPECT_EQ(residual[1], residual[0]);
      EXPECT_EQ(out[1], out[0]);
    }
    expect_close(residual[1], residual[0], 1e-2f, "residual");
    expect_close(out[1], out[0], 1e-2f, "normalised");
  }
}

}  // namespace
}  // namespace deltaserve::backend
