// Every implemented CUDA op against its CPU twin on random inputs (label gpu: skipped where no GPU
// is visible). Inputs are rounded to bf16 first so both backends see the same values; outputs are
// compared at bf16 resolution.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include "backend/cpu/cpu_backend.h"
#include "backend/cuda/cuda_backend.h"
#include "core/error.h"
#include "test_util.h"

namespace deltaserve::backend {
namespace {

bool have_gpu() {
  int n = 0;
  return cudaGetDeviceCount(&n) == cudaSuccess && n > 0;
}

class CudaOps : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!have_gpu()) GTEST_SKIP() << "no CUDA device visible: GPU tests run on the H200 test machine";
    gpu_ = std::make_unique<CudaBackend>(0);
  }
  // A bf16-exact random host vector.
  static std::vector<float> rnd(size_t n, uint32_t seed, float scale = 1.0f) {
    std::vector<float> v = deltaserve::testing::random_vec(n, seed, scale);
    for (float& x : v) x = bf16_to_f32(f32_to_bf16(x));
    return v;
  }
  // A device tensor of `dt` holding `v` (poisoned first).
  Buffer dev(const std::vector<float>& v, DType dt, std::initializer_list<int64_t> dims) {
    Buffer b = gpu_->alloc(dt, dims);
    cudaMemset(b.tensor().data, 0xff, b.tensor().nbytes());
    gpu_->upload(DType::kF32, v.data(), v.size(), b.tensor());
    return b;
  }
  std::vector<float> host(const Tensor& t) {
    std::vector<float> v(static_cast<size_t>(t.numel()));
    gpu_->download_f32(t, v.data());
    EXPECT_EQ(cudaGetLastError(), cudaSuccess);
    return v;
  }
  static void expect_close(const std::vector<float>& got, const std::vector<float>& ref, float rel, const char* what) {
    ASSERT_EQ(got.size(), ref.size());
    const float scale = std::max(1.0f, deltaserve::testing::max_abs(ref));
    EXPECT_LE(deltaserve::testing::max_abs_diff(got.data(), ref.data(), got.size()), rel * scale) << what;
  }
  CpuBackend cpu_;
  std::unique_ptr<CudaBackend> gpu_;
};

TEST_F(CudaOps, RmsNormAndAddRmsNorm) {
  const int rows = 37, n = 2560;
  auto x = rnd(rows * n, 1), r = rnd(rows * n, 2), w = rnd(n, 3, 0.3f);
  auto dx = dev(x, DType::kBF16, {rows, n}), dr = dev(r, DType::kBF16, {rows, n}), dw = dev(w, DType::kF32, {n});
  auto dout = gpu_->alloc(DType::kBF16, {rows, n});
  std::vector<float> ref(x.size());
  gpu_->rms_norm(dx.tensor(), dw.tensor(), 1e-6f, dout.tensor());
  cpu_.rms_norm(Tensor(x.data(), DType::kF32, {rows, n}), Tensor(w.data(), DType::kF32, {n}), 1e-6f,
                Tensor(ref.data(), DType::kF32, {rows, n}));
  expect_close(host(dout.tensor()), ref, 1e-2f, "rms_norm");
  // Fused residual add: the residual is rounded to bf16 on the GPU, so compare with that.
  gpu_->add_rms_norm(dr.tensor(), dx.tensor(), dw.tensor(), 1e-6f, dout.tensor());
  std::vector<float> res = r;
  for (size_t i = 0; i < res.size(); ++i) res[i] = bf16_to_f32(f32_to_bf16(res[i] + x[i]));
  std::vector<float> zero(x.size(), 0.0f);
  cpu_.add_rms_norm(Tensor(res.data(), DType::kF32, {rows, n}), Tensor(zero.data(), DType::kF32, {rows, n}),
                    Tensor(w.data(), DType::kF32, {n}), 1e-6f, Tensor(ref.data(), DType::kF32, {rows, n}));
  expect_close(host(dr.tensor()), res, 0.0f, "residual");
  expect_close(host(dout.tensor()), ref, 1e-2f, "add_rms_norm");
}

TEST_F(CudaOps, LinearThroughCublasLt) {
  for (auto [T, in, out] : {std::tuple{1, 2560, 9216}, std::tuple{17, 256, 384}, std::tuple{130, 1024, 2560}}) {
    auto x = rnd(static_cast<size_t>(T) * in, 4), w = rnd(static_cast<size_t>(out) * in, 5, 0.05f);
    auto dx = dev(x, DType::kBF16, {T, in}), dw = dev(w, DType::kBF16, {out, in});
    auto dy = gpu_->alloc(DType::kBF16, {T, out});
    gpu_->linear(dx.tensor(), dw.tensor(), dy.tensor());
    std::vector<float> ref(static_cast<size_t>(T) * out);
    cpu_.linear(Tensor(x.data(), DType::kF32, {T, in}), Tensor(w.data(), DType::kF32, {out, in}),
                Tensor(ref.data(), DType::kF32, {T, out}));
    expect_close(host(dy.tensor()), ref, 1e-2f, "linear");
  }
}

TEST_F(CudaOps, EmbeddingGatherSiluMulGatedNorm) {
  const int V = 300, H = 256, T = 9;
  auto table = rnd(V * H, 6);
  std::vector<int32_t> ids{0, 299, 5, 5, 17, 123, 1, 250, 42};
  auto dt = dev(table, DType::kBF16, {V, H});
  auto did = gpu_->alloc(DType::kI32, {T});
  gpu_->upload_i32(ids.data(), did.tensor());
  auto de = gpu_->alloc(DType::kBF16, {T, H});
  gpu_->embedding(did.tensor(), dt.tensor(), de.tensor());
  std::vector<float> ref(static_cast<size_t>(T) * H);
  cpu_.embedding(Tensor(ids.data(), DType::kI32, {T}), Tensor(table.data(), DType::kF32, {V, H}),
                 Tensor(ref.data(), DType::kF32, {T, H}));
  expect_close(host(de.tensor()), ref, 0.0f, "embedding");
  gpu_->gather_rows(dt.tensor(), did.tensor(), de.tensor());
  expect_close(host(de.tensor()), ref, 0.0f, "gather_rows");

  const int n = 5000;
  auto g = rnd(n, 7, 3.0f), u = rnd(n, 8);
  auto dg = dev(g, DType::kBF16, {n}), du = dev(u, DType::kBF16, {n});
  auto dm = gpu_->alloc(DType::kBF16, {n});
  gpu_->silu_mul(dg.tensor(), du.tensor(), dm.tensor());
  std::vector<float> sm(n);
  cpu_.silu_mul(Tensor(g.data(), DType::kF32, {n}), Tensor(u.data(), DType::kF32, {n}), Tensor(sm.data(), DType::kF32, {n}));
  expect_close(host(dm.tensor()), sm, 1e-2f, "silu_mul");

  const int rows = 4 * 7, dv = 128;
  auto o = rnd(static_cast<size_t>(rows) * dv, 9), z = rnd(static_cast<size_t>(rows) * dv, 10), w = rnd(dv, 11);
  auto dout = dev(o, DType::kBF16, {7, 4, dv}), dz = dev(z, DType::kBF16, {7, 4 * dv}), dw = dev(w, DType::kF32, {dv});
  gpu_->gated_rms_norm(dout.tensor(), dz.tensor(), dw.tensor(), 1e-6f);
  cpu_.gated_rms_norm(Tensor(o.data(), DType::kF32, {7, 4, dv}), Tensor(z.data(), DType::kF32, {7, 4 * dv}),
                      Tensor(w.data(), DType::kF32, {dv}), 1e-6f);
  expect_close(host(dout.tensor()), o, 1e-2f, "gated_rms_norm");
}

TEST_F(CudaOps, MissingOpsSayNotImplemented) {
  EXPECT_THROW(gpu_->gdn_conv({}, {}, {}, 4, {}), Error);
  EXPECT_THROW(CudaBackend(99), Error);
}

}  // namespace
}  // namespace deltaserve::backend
