// The real-size check (label gpu): our CUDA forward on a random Qwen3.5-4B-shaped checkpoint
// against HF, with the data tools/make_4b_check.py writes on the H200 test machine (8.4 GB, made
// there, never carried: the test skips unless DS_REAL_CHECK_DIR names that directory).
// Cases: full prefill of a short (64) and a long (4,640 > 4,096) prompt; the last 32 positions of
// each decoded token by token after a prefill, eagerly, through a batch-1 CUDA graph, and batched
// (short + long + a second long in another slot: the 4-row graph with one padding row).
// Metric, against HF float32: argmax agreement over the compared positions and the max |error| of
// the log-softmax over every vocabulary entry; HF's own bf16 forward on the same positions is the
// yardstick: agreement at most 3 points below it and max log-prob error at most 1.5x its + 0.02.
// Graphed batch-1 decode must equal eager decode bit for bit. The same cases run on one GPU and,
// with 2+ GPUs, on NCCL tensor-parallel ranks (TP2; TP4 with 4 GPUs).
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <functional>

#include "app/gpu_ranks.h"
#include "backend/cuda/cuda_backend.h"
#include "gpu_test_util.h"
#include "model/loader.h"
#include "model/safetensors.h"
#include "runner_fixture.h"
#include "test_util.h"

namespace deltaserve::model {
namespace {

using deltaserve::testing::have_gpu;
using deltaserve::testing::read_tensor;

struct Stats {
  double agree = 0, max_lp_err = 0;
};

// Argmax agreement and max |log-softmax difference| of rows x against ref, both [R, V].
Stats stats(const float* x, const float* ref, int64_t R, int64_t V) {
  Stats s;
  auto lse = [V](const float* r) {
    const float m = *std::max_element(r, r + V);
    double z = 0;
    for (int64_t i = 0; i < V; ++i) z += std::exp(static_cast<double>(r[i] - m));
    return m + std::log(z);
  };
  for (int64_t r = 0; r < R; ++r) {
    const float *a = x + r * V, *b = ref + r * V;
    s.agree += std::max_element(a, a + V) - a == std::max_element(b, b + V) - b;
    const double la = lse(a), lb = lse(b);
    for (int64_t i = 0; i < V; ++i)
      s.max_lp_err = std::max(s.max_lp_err, std::abs((a[i] - la) - (b[i] - lb)));
  }
  s.agree /= static_cast<double>(R);
  return s;
}

struct Case {
  std::vector<int32_t> ids, rows;
  std::vector<float> f32, bf16;
};

// The cache options of a run (every run is held to the same bounds against HF).
struct Options {
  DType state_dtype = DType::kF32;
  bool kv_cache_fp8 = false;
};

// Every case of the file comment through `m`; `label` prefixes the printed rows.
// `m`: one GPU (a LocalExecutor) or N NCCL ranks (TpExecutor).
void check_against_hf(const std::string& dir, const std::string& label, engine::Executor& m,
                      int64_t V, const Options& opt = {}) {
  SafetensorsFile ref(std::filesystem::path(dir) / "ref.safetensors");
  const auto& t = ref.tensors();
  std::vector<Case> cases(2);
  const char* names[2] = {"short", "long"};
  for (int c = 0; c < 2; ++c) {
    const std::string n = names[c];
    cases[c] = {read_tensor<int32_t>(t.at(n + ".ids")), read_tensor<int32_t>(t.at(n + ".rows")),
                read_tensor<float>(t.at(n + ".f32")), read_tensor<float>(t.at(n + ".bf16"))};
  }
  const int32_t page = 16, D = 32;
  const int32_t pps = static_cast<int32_t>(cases[1].ids.size()) / page + 2;
  deltaserve::testing::configure_executor(m, 3 * pps, page, 4,
                                          static_cast<int32_t>(cases[1].ids.size()),
                                          opt.state_dtype, opt.kv_cache_fp8);
  auto pages = [&](int slot) {
    std::vector<int32_t> p;
    for (int32_t q = 0; q < pps; ++q) p.push_back(slot * pps + q);
    return p;
  };
  auto check = [&](const char* what, const Case& cs, const std::vector<float>& ours, int64_t first,
                   int64_t R) {
    const Stats o = stats(ours.data(), cs.f32.data() + first * V, R, V);
    const Stats h = stats(cs.bf16.data() + first * V, cs.f32.data() + first * V, R, V);
    std::printf("  %s %-34s rows %3lld: ours argmax %.4f max|dlogprob| %.4f | HF bf16 %.4f %.4f\n",
                label.c_str(), what, static_cast<long long>(R), o.agree, o.max_lp_err, h.agree,
                h.max_lp_err);
    EXPECT_GE(o.agree, h.agree - 0.03) << label << " " << what;
    EXPECT_LE(o.max_lp_err, 1.5 * h.max_lp_err + 0.02) << label << " " << what;
  };
  // Full prefill, eager.
  for (int c = 0; c < 2; ++c) {
    const Case& cs = cases[c];
    const StepBatch b = StepBatchBuilder(page).add_rows(0, cs.ids, 0, c, pages(c), cs.rows).build();
    check((std::string("prefill ") + names[c] + " T=" + std::to_string(cs.ids.size())).c_str(), cs,
          m.execute(b), 0, static_cast<int64_t>(cs.rows.size()));
  }
  // Prefill all but the last D tokens of case c into `slot`, then decode them in `rows` steps.
  auto prefill_head = [&](int c, int slot) {
    const Case& cs = cases[c];
    const int32_t P = static_cast<int32_t>(cs.ids.size()) - D;
    m.execute(StepBatchBuilder(page)
                  .add(0, std::span<const int32_t>(cs.ids.data(), static_cast<size_t>(P)), 0, slot,
                       pages(slot), 0)
                  .build());
  };
  auto decode_solo = [&](int c) {
    prefill_head(c, c);
    const Case& cs = cases[c];
    const int32_t P = static_cast<int32_t>(cs.ids.size()) - D;
    std::vector<float> out;
    for (int32_t k = 0; k < D; ++k) {
      const auto l = m.execute(StepBatchBuilder(page)
                                   .add(0, std::vector<int32_t>{cs.ids[static_cast<size_t>(P + k)]},
                                        P + k, c, pages(c), 1)
                                   .build());
      out.insert(out.end(), l.begin(), l.end());
    }
    return out;
  };
  std::vector<std::vector<float>> eager(2), graphed(2);
  for (int c = 0; c < 2; ++c) {
    eager[c] = decode_solo(c);
    const int64_t R = static_cast<int64_t>(cases[c].rows.size());
    check((std::string("decode eager ") + names[c]).c_str(), cases[c], eager[c], R - D, D);
  }
  ASSERT_EQ(m.capture_decode_graphs({1, 2, 4}, pps).size(), 3u);
  for (int c = 0; c < 2; ++c) {
    graphed[c] = decode_solo(c);
    EXPECT_EQ(testing::max_abs_diff(graphed[c].data(), eager[c].data(), eager[c].size()), 0.0f)
        << label << ": graphed batch-1 decode differs from eager (" << names[c] << ")";
  }
  // Batched: short (slot 0), long (slot 1), long again (slot 2) decode together: bucket 4.
  prefill_head(0, 0);
  prefill_head(1, 1);
  prefill_head(1, 2);
  std::vector<std::vector<float>> batched(3);
  const int src[3] = {0, 1, 1};
  for (int32_t k = 0; k < D; ++k) {
    StepBatchBuilder b(page);
    for (int r = 0; r < 3; ++r) {
      const Case& cs = cases[src[r]];
      const int32_t P = static_cast<int32_t>(cs.ids.size()) - D;
      b.add(0, std::vector<int32_t>{cs.ids[static_cast<size_t>(P + k)]}, P + k, r, pages(r), 1);
    }
    const auto l = m.execute(b.build());
    for (int r = 0; r < 3; ++r)
      batched[r].insert(batched[r].end(), l.begin() + r * V, l.begin() + (r + 1) * V);
  }
  // Batched rows are checked against HF like the solo runs (not bit for bit: split-KV attention
  // picks its split count from the step's token count, which changes the summation order).
  for (int r = 0; r < 3; ++r) {
    const Case& cs = cases[src[r]];
    const int64_t R = static_cast<int64_t>(cs.rows.size());
    check(("decode graphed batched row " + std::to_string(r) + " (" + names[src[r]] + ")").c_str(),
          cs, batched[r], R - D, D);
    std::printf(
        "    max |batched - solo graphed| logit: %.4f\n",
        testing::max_abs_diff(batched[r].data(), graphed[src[r]].data(), batched[r].size()));
  }
}

class RealSize : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!have_gpu())
      GTEST_SKIP() << "no CUDA device visible: GPU tests run on the H200 test machine";
    const char* dir = std::getenv("DS_REAL_CHECK_DIR");
    if (!dir || !std::filesystem::exists(std::filesystem::path(dir) / "ref.safetensors"))
      GTEST_SKIP() << "set DS_REAL_CHECK_DIR to the output of tools/make_4b_check.py (made on the "
                      "H200 test machine)";
    dir_ = dir;
  }
  std::string dir_;
};

TEST_F(RealSize, Qwen35_4bShapeMatchesHf) {
  backend::CudaBackend be(0);
  auto m = load_model(dir_ + "/ckpt", LoadFormat::kSafetensors, be, true);
  engine::LocalExecutor ex(*m);
  check_against_hf(dir_, "TP1", ex, m->config().vocab_size);
}

// --mamba-ssm-cache-dtype bfloat16: the same cases and bounds with the GDN state kept in bf16
// between steps (the decode rows carry it across 32 steps; its drift from the f32 state shows
// beside the TP1 rows above).
TEST_F(RealSize, Qwen35_4bShapeWithBf16StateMatchesHf) {
  backend::CudaBackend be(0);
  auto m = load_model(dir_ + "/ckpt", LoadFormat::kSafetensors, be, true);
  engine::LocalExecutor ex(*m);
  check_against_hf(dir_, "TP1 bf16 state", ex, m->config().vocab_size,
                   {.state_dtype = DType::kBF16});
}

// --kv-cache-dtype fp8: the same cases and bounds with the KV cache in e4m3 (every key and value
// rounded to 3 mantissa bits). On the H200 (d36d936) every row was within them, e.g. the long
// prefill's argmax 0.8125 and max |dlogprob| 0.3732 against HF bf16's 0.7891 / 0.4480.
TEST_F(RealSize, Qwen35_4bShapeWithFp8KvCacheMatchesHf) {
  backend::CudaBackend be(0);
  auto m = load_model(dir_ + "/ckpt", LoadFormat::kSafetensors, be, true);
  engine::LocalExecutor ex(*m);
  check_against_hf(dir_, "TP1 fp8 KV", ex, m->config().vocab_size, {.kv_cache_fp8 = true});
}

// The same cases on NCCL ranks over GPUs 0..N-1 (N = 2, and 4 with 4 GPUs): the multi-GPU issue's
// real-size run. Held to the same HF bounds as one GPU.
TEST_F(RealSize, Qwen35_4bShapeOnSeveralGpusMatchesHf) {
  int gpus = 0;
  if (cudaGetDeviceCount(&gpus) != cudaSuccess || gpus < 2)
    GTEST_SKIP() << "needs 2 or more visible GPUs (" << gpus << " visible)";
  for (int N : {2, 4}) {
    if (N > gpus) continue;
    auto ex = app::make_gpu_tp_executor(
        N,
        [&](int rank, backend::Backend& be, dist::Communicator* comm) {
          return load_model(dir_ + "/ckpt", LoadFormat::kSafetensors, be, false, {N, rank}, comm);
        },
        std::chrono::minutes(5));
    check_against_hf(dir_, "TP" + std::to_string(N), *ex, ex->config().vocab_size);
  }
}

}  // namespace
}  // namespace deltaserve::model
