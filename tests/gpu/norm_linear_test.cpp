// A block's input norm and its residual add folded into the projections (CudaBackend::
// norm_linear_multi, norm_linear_silu_mul, linear_add) against the CPU's norm then projections in
// f32, and against the GPU's own norm kernel then projections. Where the weight-streaming GEMM
// takes the group (up to 8 tokens always, up to 16 for groups of >= 48 tiles) and K fits
// (cuda::kSkinnyNormMaxK), it forms the norm itself: h then stays unwritten (checked, so a silent
// fallback fails); elsewhere the norm kernel writes h first. Ragged last tiles, K past a k-tile's
// edge (264), narrow groups at 9-16 tokens (the fallback), K = 4096 (too wide: the fallback). The
// fused runs twice: the same bits.
#include <gtest/gtest.h>

#include <algorithm>
#include <vector>

#include "backend/cuda/ab_switch.h"
#include "backend/cuda/kernels/skinny_gemm.cuh"
#include "cuda_ops_fixture.h"

namespace deltaserve::backend {
namespace {

bool all_nan(const std::vector<float>& v) {
  return std::all_of(v.begin(), v.end(), [](float x) { return x != x; });
}

// The default configuration, in which the fused forms run where they apply.
bool fusing() {
  return cuda::ab_switch_on("DS_SKINNY_NORM") && cuda::ab_switch_on("DS_SKINNY_GEMM");
}

class NormLinear : public CudaOps {
 protected:
  // Rows x [T, H] of a residual stream, its norm's weights, and the CPU's normalised rows.
  void make_input(int T, int H, uint32_t seed) {
    x_ = rnd(static_cast<size_t>(T) * H, seed, 4.0f);
    nw_ = rnd(H, seed + 1, 0.3f);
    normed_.assign(x_.size(), 0.0f);
    cpu_.rms_norm(Tensor(x_.data(), DType::kF32, {T, H}), Tensor(nw_.data(), DType::kF32, {H}),
                  kEps, Tensor(normed_.data(), DType::kF32, {T, H}));
    dx_ = dev(x_, DType::kBF16, {T, H});
    dnw_ = dev(nw_, DType::kF32, {H});
    dh_ = gpu_->alloc(DType::kBF16, {T, H});
    poison(dh_.tensor());
  }
  Backend::ProjInput input() const {
    return {.h = dh_.tensor(), .x = dx_.tensor(), .norm = &dnw_.tensor(), .eps = kEps};
  }
  // The GPU's norm kernel into h: the unfused form's input.
  void norm_into_h() { gpu_->rms_norm(dx_.tensor(), dnw_.tensor(), kEps, dh_.tensor()); }
  // h unwritten where the fused form applies, and x (the residual stream) unchanged.
  void expect_fused(bool fused) {
    if (fusing())
      EXPECT_EQ(all_nan(host(dh_.tensor())), fused)
          << (fused ? "the norm kernel ran" : "h unwritten: the fallback did not run");
    expect_close(host(dx_.tensor()), x_, 0.0f, "the residual stream changed");
  }
  static constexpr float kEps = 1e-6f;
  std::vector<float> x_, nw_, normed_;
  Buffer dx_, dnw_, dh_;
};

TEST_F(NormLinear, ProjectionGroupsOfNormalisedRows) {
  struct Case {
    int H;
    std::vector<int> n;
  };
  const std::vector<Case> cases{{2560, {8192, 1024, 32, 2600}}, {264, {777}}, {4096, {2560, 64}}};
  for (const int T : {1, 3, 8, 9, 16, 17})
    for (const Case& c : cases) {
      SCOPED_TRACE("T " + std::to_string(T) + " H " + std::to_string(c.H) + " first n " +
                   std::to_string(c.n[0]));
      make_input(T, c.H, 40);
      std::vector<Buffer> dw, dy, unfused;
      std::vector<std::vector<float>> ref;
      int64_t tiles = 0;
      for (size_t g = 0; g < c.n.size(); ++g) {
        const int n = c.n[g];
        const std::vector<float> w = rnd(static_cast<size_t>(n) * c.H, 41 + g, 0.05f);
        dw.push_back(dev(w, DType::kBF16, {n, c.H}));
        dy.push_back(gpu_->alloc(DType::kBF16, {T, n}));
        unfused.push_back(gpu_->alloc(DType::kBF16, {T, n}));
        ref.emplace_back(static_cast<size_t>(T) * n);
        cpu_.linear(Tensor(normed_.data(), DType::kF32, {T, c.H}),
                    Tensor(const_cast<float*>(w.data()), DType::kF32, {n, c.H}),
                    Tensor(ref.back().data(), DType::kF32, {T, n}));
        tiles += (n + cuda::kSkinnyTileRows - 1) / cuda::kSkinnyTileRows;
      }
      std::vector<const Tensor*> ws, ys, us;
      for (size_t g = 0; g < c.n.size(); ++g) {
        ws.push_back(&dw[g].tensor());
        ys.push_back(&dy[g].tensor());
        us.push_back(&unfused[g].tensor());
      }
      std::vector<std::vector<float>> first;
      for (int run = 0; run < 2; ++run) {
        for (const Buffer& y : dy) poison(y.tensor());
        poison(dh_.tensor());
        gpu_->norm_linear_multi(input(), ws, ys);
        const bool fused = c.H <= cuda::kSkinnyNormMaxK && (T <= 8 || (T <= 16 && tiles >= 48));
        expect_fused(fused);
        for (size_t g = 0; g < c.n.size(); ++g) {
          const std::vector<float> got = host(dy[g].tensor());
          expect_close(got, ref[g], 1e-2f, "against the CPU");
          if (run == 0) first.push_back(got);
          if (run == 1) EXPECT_EQ(got, first[g]) << "a second run differs";
        }
      }
      norm_into_h();
      gpu_->linear_multi(dh_.tensor(), ws, us);
      for (size_t g = 0; g < c.n.size(); ++g)
        expect_close(host(dy[g].tensor()), host(unfused[g].tensor()), 1e-2f,
                     "against the GPU's norm kernel then the projections");
    }
}

TEST_F(NormLinear, SiluMulOfNormalisedRows) {
  for (const auto& [T, H, I] : {std::tuple{1, 2560, 9216}, std::tuple{5, 2560, 9216},
                                std::tuple{16, 2560, 9216}, std::tuple{17, 2560, 9216},
                                std::tuple{3, 264, 1000}, std::tuple{16, 4096, 1024}}) {
    SCOPED_TRACE("T " + std::to_string(T) + " H " + std::to_string(H) + " I " + std::to_string(I));
    make_input(T, H, 50);
    const std::vector<float> wg = rnd(static_cast<size_t>(I) * H, 51, 0.05f),
                             wu = rnd(static_cast<size_t>(I) * H, 52, 0.05f);
    std::vector<float> g(static_cast<size_t>(T) * I), u(g.size()), ref(g.size());
    const Tensor cx(normed_.data(), DType::kF32, {T, H});
    cpu_.linear(cx, Tensor(const_cast<float*>(wg.data()), DType::kF32, {I, H}),
                Tensor(g.data(), DType::kF32, {T, I}));
    cpu_.linear(cx, Tensor(const_cast<float*>(wu.data()), DType::kF32, {I, H}),
                Tensor(u.data(), DType::kF32, {T, I}));
    cpu_.silu_mul(Tensor(g.data(), DType::kF32, {T, I}), Tensor(u.data(), DType::kF32, {T, I}),
                  Tensor(ref.data(), DType::kF32, {T, I}));
    const Buffer dwg = dev(wg, DType::kBF16, {I, H}), dwu = dev(wu, DType::kBF16, {I, H});
    Buffer gate_up = gpu_->alloc(DType::kBF16, {T, 2 * I}), act = gpu_->alloc(DType::kBF16, {T, I}),
           unfused = gpu_->alloc(DType::kBF16, {T, I});
    std::vector<float> first;
    for (int run = 0; run < 2; ++run) {
      poison(act.tensor());
      poison(dh_.tensor());
      gpu_->norm_linear_silu_mul(input(), dwg.tensor(), dwu.tensor(), gate_up.tensor(),
                                 act.tensor());
      expect_fused(T <= cuda::kSkinnySiluMulMaxRows && H <= cuda::kSkinnyNormMaxK);
      const std::vector<float> got = host(act.tensor());
      expect_close(got, ref, 1e-2f, "against the CPU");
      if (run == 0) first = got;
      if (run == 1) EXPECT_EQ(got, first) << "a second run differs";
    }
    norm_into_h();
    gpu_->linear_silu_mul(dh_.tensor(), dwg.tensor(), dwu.tensor(), gate_up.tensor(),
                          unfused.tensor());
    expect_close(host(act.tensor()), host(unfused.tensor()), 1e-2f,
                 "against the GPU's norm kernel then the projections");
  }
}

// residual += x . w^T on every route: the weight-streaming GEMM's stores (up to 8 tokens at
// n = 2560: whole tiles and tiles summed from partials; n = 777 a ragged last tile) and
// cuBLASLt's beta = 1 (16, 64, 300 tokens).
TEST_F(NormLinear, LinearAddsIntoTheResidual) {
  for (const auto& [T, in, H] :
       {std::tuple{1, 4096, 2560}, std::tuple{8, 9216, 2560}, std::tuple{3, 264, 777},
        std::tuple{16, 4096, 2560}, std::tuple{64, 4096, 2560}, std::tuple{300, 1024, 2560}}) {
    SCOPED_TRACE("T " + std::to_string(T) + " in " + std::to_string(in) + " H " +
                 std::to_string(H));
    const std::vector<float> x = rnd(static_cast<size_t>(T) * in, 60),
                             w = rnd(static_cast<size_t>(H) * in, 61, 0.05f),
                             r = rnd(static_cast<size_t>(T) * H, 62, 4.0f);
    std::vector<float> ref = r, y(r.size());
    cpu_.linear(Tensor(const_cast<float*>(x.data()), DType::kF32, {T, in}),
                Tensor(const_cast<float*>(w.data()), DType::kF32, {H, in}),
                Tensor(y.data(), DType::kF32, {T, H}));
    for (size_t i = 0; i < ref.size(); ++i) ref[i] += y[i];
    ASSERT_GT(deltaserve::testing::max_abs(y), 1.0f);  // the projection moves the residual
    const Buffer dx = dev(x, DType::kBF16, {T, in}), dw = dev(w, DType::kBF16, {H, in}),
                 dr = dev(r, DType::kBF16, {T, H});
    Buffer scratch = gpu_->alloc(DType::kBF16, {T, H});
    gpu_->linear_add(dx.tensor(), dw.tensor(), dr.tensor(), scratch.tensor());
    expect_close(host(dr.tensor()), ref, 1e-2f, "residual + projection");
  }
}

}  // namespace
}  // namespace deltaserve::backend
