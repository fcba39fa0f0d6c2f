// The fixture of the CUDA op tests: a CudaBackend next to the CpuBackend, bf16-exact random
// inputs, device tensors and the comparison at bf16 resolution; step batches of given shapes.
#pragma once

#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <memory>
#include <vector>

#include "backend/cpu/cpu_backend.h"
#include "backend/cuda/cuda_backend.h"
#include "gpu_test_util.h"
#include "test_util.h"

namespace deltaserve::backend {

class CudaOps : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!deltaserve::testing::have_gpu())
      GTEST_SKIP() << "no CUDA device visible: GPU tests run on the H200 test machine";
    gpu_ = std::make_unique<CudaBackend>(0);
  }
  // A bf16-exact random host vector.
  static std::vector<float> rnd(size_t n, uint32_t seed, float scale = 1.0f) {
    std::vector<float> v = deltaserve::testing::random_vec(n, seed, scale);
    for (float& x : v) x = bf16_to_f32(f32_to_bf16(x));
    return v;
  }
  // A device tensor of `dt` holding `v` (poisoned first, on the backend's stream: the legacy
  // default stream does not order against its non-blocking streams).
  Buffer dev(const std::vector<float>& v, DType dt, std::initializer_list<int64_t> dims) {
    Buffer b = gpu_->alloc(dt, dims);
    poison(b.tensor());
    gpu_->upload(DType::kF32, v.data(), v.size(), b.tensor());
    return b;
  }
  // NaN bytes over t, ordered before the backend's next op.
  void poison(const Tensor& t) { cudaMemsetAsync(t.data, 0xff, t.nbytes(), gpu_->stream()); }
  std::vector<float> host(const Tensor& t) {
    std::vector<float> v(static_cast<size_t>(t.numel()));
    gpu_->download_f32(t, v.data());
    EXPECT_EQ(cudaGetLastError(), cudaSuccess);
    return v;
  }
  static void expect_close(const std::vector<float>& got, const std::vector<float>& ref, float rel,
                           const char* what) {
    ASSERT_EQ(got.size(), ref.size());
    const float scale = std::max(1.0f, deltaserve::testing::max_abs(ref));
    EXPECT_LE(deltaserve::testing::max_abs_diff(got.data(), ref.data(), got.size()), rel * scale)
        << what;
  }
  CpuBackend cpu_;
  std::unique_ptr<CudaBackend> gpu_;
};

struct SeqSpec {
  int32_t n, start, slot;
  std::vector<int32_t> pages;
};

// A StepBatch of sequences of n (zero) tokens each.
inline StepBatch make_batch(int ps, const std::vector<SeqSpec>& seqs) {
  StepBatchBuilder b(ps);
  for (const SeqSpec& s : seqs)
    b.add(0, std::vector<int32_t>(static_cast<size_t>(s.n), 0), s.start, s.slot, s.pages);
  return b.build();
}

inline std::vector<int32_t> range(int32_t begin, int32_t n, int32_t step = 1) {
  std::vector<int32_t> v;
  for (int32_t i = 0; i < n; ++i) v.push_back(begin + step * i);
  return v;
}

// A batch of three sequences (fresh prefill, continued prefill, decode) with scattered pages.
inline StepBatch test_batch(int ps) {
  return make_batch(ps,
                    {{20, 0, 0, {7, 3}}, {9, 13, 1, {0, 5, 9}}, {1, 40, 2, {1, 2, 4, 6, 8, 10}}});
}

// Long prefills: a fresh one of 150 tokens (chunks of 64, 64, 22) and a continued one of 70 after
// 33 cached, next to a decode row: the chunked delta rule across chunk boundaries.
inline StepBatch prefill_batch(int ps) {
  return make_batch(ps, {{150, 0, 1, range(0, 10)}, {70, 33, 0, range(10, 7)}, {1, 9, 2, {20}}});
}

}  // namespace deltaserve::backend
