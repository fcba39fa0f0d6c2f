// The weight-streaming GEMM launched directly (launch_skinny_gemm_bf16), at 1 and 16 tokens and
// from 17 to 64 — where the backend routes only some groups to it — against the CPU's
// projections: grouped projections with ragged last tiles (n = 32, 2600), K past a k-tile's edge
// (264), and long K (9216: each tile split between many blocks, summed from their partials). Each
// case runs twice on poisoned outputs: the same bits (the partials are added in a fixed order),
// and the tile counters (their mid-stream marks included) are all zero after each launch (the next
// launch's premise).
#include "backend/cuda/kernels/skinny_gemm.cuh"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <tuple>
#include <utility>
#include <vector>

#include "backend/cuda/kernels/rms_norm.cuh"
#include "cuda_ops_fixture.h"

namespace deltaserve::backend {
namespace {

struct SkinnyCase {
  int K;
  std::vector<int> n;
};

class SkinnyGemm : public CudaOps {
 protected:
  void SetUp() override {
    CudaOps::SetUp();
    if (IsSkipped()) return;
    cudaDeviceGetAttribute(&sms_, cudaDevAttrMultiProcessorCount, 0);
    partials_ =
        gpu_->alloc(DType::kF32, {static_cast<int64_t>(cuda::skinny_workspace_floats(sms_))});
    counters_ = gpu_->alloc(DType::kI32, {cuda::kSkinnyMaxTiles});
    cudaMemsetAsync(counters_.tensor().data, 0, counters_.tensor().nbytes(), gpu_->stream());
  }
  cuda::SkinnyWorkspace ws() const {
    return {static_cast<float*>(partials_.tensor().data),
            static_cast<int*>(counters_.tensor().data)};
  }
  int nonzero_counters() {
    std::vector<int> c(cuda::kSkinnyMaxTiles);
    cudaStreamSynchronize(gpu_->stream());
    cudaMemcpy(c.data(), counters_.tensor().data, c.size() * sizeof(int), cudaMemcpyDeviceToHost);
    int nonzero = 0;
    for (int v : c) nonzero += v != 0 ? 1 : 0;
    return nonzero;
  }
  int sms_ = 0;
  Buffer partials_, counters_;
};

TEST_F(SkinnyGemm, MatchesTheCpuUpTo64Tokens) {
  const std::vector<SkinnyCase> cases{
      {2560, {8192, 1024, 32, 2600}}, {9216, {2560}}, {4096, {2560}}, {264, {777}}, {2560, {9216}}};
  for (const int T : {1, 16, 17, 31, 32, 33, 48, 64})
    for (const SkinnyCase& c : cases) {
      SCOPED_TRACE("T " + std::to_string(T) + " K " + std::to_string(c.K) + " first n " +
                   std::to_string(c.n[0]));
      std::vector<float> x = rnd(static_cast<size_t>(T) * c.K, 80);
      const Buffer dx = dev(x, DType::kBF16, {T, c.K});
      std::vector<std::vector<float>> w;
      std::vector<Buffer> dw, dy;
      cuda::SkinnyGroup groups[cuda::kSkinnyMaxGroups];
      for (size_t g = 0; g < c.n.size(); ++g) {
        w.push_back(rnd(static_cast<size_t>(c.n[g]) * c.K, 81 + static_cast<uint32_t>(g), 0.05f));
        dw.push_back(dev(w.back(), DType::kBF16, {c.n[g], c.K}));
        dy.push_back(gpu_->alloc(DType::kBF16, {T, c.n[g]}));
        groups[g] = {static_cast<const __nv_bfloat16*>(dw.back().tensor().data),
                     static_cast<__nv_bfloat16*>(dy.back().tensor().data), c.n[g]};
      }
      std::vector<std::vector<float>> first(c.n.size());
      for (int run = 0; run < 2; ++run) {
        for (Buffer& y : dy) poison(y.tensor());
        ASSERT_EQ(cuda::launch_skinny_gemm_bf16(static_cast<const __nv_bfloat16*>(dx.tensor().data),
                                                groups, static_cast<int>(c.n.size()), T, c.K, ws(),
                                                sms_, gpu_->stream()),
                  cudaSuccess);
        EXPECT_EQ(nonzero_counters(), 0) << "tile counters left set";
        for (size_t g = 0; g < c.n.size(); ++g) {
          const std::vector<float> got = host(dy[g].tensor());
          if (run == 0) {
            std::vector<float> ref(static_cast<size_t>(T) * c.n[g]);
            cpu_.linear(Tensor(x.data(), DType::kF32, {T, c.K}),
                        Tensor(w[g].data(), DType::kF32, {c.n[g], c.K}),
                        Tensor(ref.data(), DType::kF32, {T, c.n[g]}));
            expect_close(got, ref, 1e-2f, "skinny GEMM");
            first[g] = got;
          } else {
            EXPECT_EQ(got, first[g]) << "a second run differs";
          }
        }
      }
    }
}

// The residual projections' form: the GEMM leaves its split tiles' partials and the add + norm
// kernel sums them. Against the GEMM that sums them itself then the add + norm kernel, the same
// bits in the residual and the normalised rows (T 1 to 64; K 4096 and 9216, the 4B shape's output
// and down projections, and 264; n 2600's ragged last tile), no tile counter touched.
TEST_F(SkinnyGemm, NormSummingThePartialsMatchesTheGemmsSums) {
  const auto bits = [this](const Buffer& b) {
    std::vector<uint16_t> v(static_cast<size_t>(b.tensor().numel()));
    cudaStreamSynchronize(gpu_->stream());
    cudaMemcpy(v.data(), b.tensor().data, v.size() * sizeof(uint16_t), cudaMemcpyDeviceToHost);
    return v;
  };
  const float eps = 1e-6f;
  for (const int T : {1, 3, 8, 16, 33, 64})
    for (const auto& [K, n] :
         std::vector<std::pair<int, int>>{{4096, 2560}, {9216, 2560}, {264, 2600}, {9216, 1024}}) {
      SCOPED_TRACE("T " + std::to_string(T) + " K " + std::to_string(K) + " n " +
                   std::to_string(n));
      const Buffer dx = dev(rnd(static_cast<size_t>(T) * K, 90), DType::kBF16, {T, K});
      const Buffer dw = dev(rnd(static_cast<size_t>(n) * K, 91, 0.05f), DType::kBF16, {n, K});
      const Buffer norm_w = dev(rnd(n, 92, 0.5f), DType::kF32, {n});
      const std::vector<float> residual = rnd(static_cast<size_t>(T) * n, 93);
      Buffer res_a = dev(residual, DType::kBF16, {T, n}),
             res_b = dev(residual, DType::kBF16, {T, n});
      Buffer y_a = gpu_->alloc(DType::kBF16, {T, n}), y_b = gpu_->alloc(DType::kBF16, {T, n});
      Buffer out_a = gpu_->alloc(DType::kBF16, {T, n}), out_b = gpu_->alloc(DType::kBF16, {T, n});
      for (const Buffer* b : {&y_a, &y_b, &out_a, &out_b}) poison(b->tensor());
      const auto* x = static_cast<const __nv_bfloat16*>(dx.tensor().data);
      const auto* w = static_cast<const __nv_bfloat16*>(dw.tensor().data);
      const auto* nw = static_cast<const float*>(norm_w.tensor().data);
      const auto bf = [](Buffer& b) { return static_cast<__nv_bfloat16*>(b.tensor().data); };
      const cuda::SkinnyGroup a{w, bf(y_a), n};
      ASSERT_EQ(cuda::launch_skinny_gemm_bf16(x, &a, 1, T, K, ws(), sms_, gpu_->stream()),
                cudaSuccess);
      cuda::launch_add_rms_norm_bf16(bf(res_a), bf(y_a), nw, eps, T, n, bf(out_a), gpu_->stream());
      const cuda::SkinnyGroup b{w, bf(y_b), n};
      cuda::SkinnyPartials where{};
      ASSERT_EQ(
          cuda::launch_skinny_gemm_partials_bf16(x, b, T, K, ws(), sms_, gpu_->stream(), &where),
          cudaSuccess);
      ASSERT_TRUE(cuda::add_rms_norm_partials_supported(bf(res_b), where, nw, T, bf(out_b)));
      ASSERT_EQ(cuda::launch_add_rms_norm_partials_bf16(bf(res_b), where, nw, eps, T, bf(out_b),
                                                        gpu_->stream()),
                cudaSuccess);
      EXPECT_EQ(cudaStreamSynchronize(gpu_->stream()), cudaSuccess);
      const std::vector<uint16_t> ref = bits(out_a);
      ASSERT_EQ(std::count(ref.begin(), ref.end(), uint16_t{0xffff}), 0) << "the reference ran";
      EXPECT_EQ(bits(res_b), bits(res_a)) << "residual";
      EXPECT_EQ(bits(out_b), bits(out_a)) << "normalised rows";
      EXPECT_EQ(nonzero_counters(), 0) << "tile counters left set";
    }
}

}  // namespace
}  // namespace deltaserve::backend
