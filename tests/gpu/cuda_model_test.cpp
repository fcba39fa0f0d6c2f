// The whole Qwen3.5 forward on the CUDA backend (bf16) against HF on both tiny checkpoints (label
// gpu). The yardstick is HF's own bf16 forward (goldens/<model>.bf16.safetensors, made by
// tools/make_bf16_goldens.py): against the float32 goldens, summed over every prompt and decode
// block of a model, our max |error| must be at most 1.25x HF bf16's, and our argmax agreement over
// all positions at most 1 point below HF bf16's. Every block's numbers are printed.
// NOTE: the bound is on the sums because the per-block maxima of two bf16 runs are single noisy
// samples (per block, ours and HF bf16 each come out ahead about half the time).
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cstring>

#include "backend/cpu/cpu_backend.h"
#include "backend/cuda/cuda_backend.h"
#include "gpu_test_util.h"
#include "model/loader.h"
#include "model/qwen35.h"
#include "model/safetensors.h"
#include "runner_fixture.h"
#include "runtime/model_runner.h"
#include "test_util.h"

namespace deltaserve::model {
namespace {

using deltaserve::testing::test_data;

using deltaserve::testing::have_gpu;
using deltaserve::testing::read_tensor;

struct Deviation {
  float err = 0, scale = 0;
  double agree = 0;
};

// Max abs error and argmax agreement of `x` against the f32 reference.
Deviation deviation(const std::vector<float>& x, const std::vector<float>& ref, int64_t V) {
  Deviation d;
  int64_t agree = 0;
  const int64_t rows = static_cast<int64_t>(ref.size()) / V;
  for (int64_t r = 0; r < rows; ++r) {
    const float *a = x.data() + r * V, *b = ref.data() + r * V;
    for (int64_t i = 0; i < V; ++i) {
      d.err = std::max(d.err, std::abs(a[i] - b[i]));
      d.scale = std::max(d.scale, std::abs(b[i]));
    }
    agree += std::max_element(a, a + V) - a == std::max_element(b, b + V) - b;
  }
  d.agree = static_cast<double>(agree) / static_cast<double>(rows);
  return d;
}

// Sums over a model's blocks: max errors, and agreeing / all positions.
struct Totals {
  double ours_err = 0, hf_err = 0, ours_agree = 0, hf_agree = 0, rows = 0;
};

void compare(const std::vector<float>& ours, const std::vector<float>& f32,
             const std::vector<float>& hf_bf16, int64_t V, const std::string& label, Totals& tot) {
  ASSERT_EQ(ours.size(), f32.size()) << label;
  const Deviation o = deviation(ours, f32, V), h = deviation(hf_bf16, f32, V);
  std::printf(
      "  %-30s vs f32: ours max|err| %.3e (rel %.3e) argmax %.4f | HF bf16 %.3e (rel %.3e) argmax "
      "%.4f\n",
      label.c_str(), o.err, o.err / o.scale, o.agree, h.err, h.err / h.scale, h.agree);
  const double rows = static_cast<double>(f32.size()) / static_cast<double>(V);
  tot.ours_err += o.err;
  tot.hf_err += h.err;
  tot.ours_agree += o.agree * rows;
  tot.hf_agree += h.agree * rows;
  tot.rows += rows;
}

// The parameter's tiny checkpoint on GPU 0.
class CudaModel : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    if (!have_gpu())
      GTEST_SKIP() << "no CUDA device visible: GPU tests run on the H200 test machine";
    dir_ = test_data() / GetParam();
    cfg_ = load_model_config(dir_);
    be_ = std::make_unique<backend::CudaBackend>(0);
    Checkpoint ckpt(dir_);
    m_ = std::make_unique<Qwen35Model>(cfg_, *be_, load_weights(ckpt, cfg_, *be_));
  }
  std::filesystem::path dir_;
  ModelConfig cfg_;
  std::unique_ptr<backend::CudaBackend> be_;
  std::unique_ptr<Qwen35Model> m_;
};

TEST_P(CudaModel, MatchesHfGoldens) {
  const ModelConfig& cfg = cfg_;
  backend::CudaBackend& be = *be_;
  Qwen35Model& m = *m_;
  auto runner = deltaserve::testing::make_runner(m, 256, 16, 4, 2048);
  SafetensorsFile g(test_data() / "goldens" / (GetParam() + ".safetensors"));
  SafetensorsFile gb(test_data() / "goldens" / (GetParam() + ".bf16.safetensors"));
  const auto& t = g.tensors();
  const auto& tb = gb.tensors();
  Totals tot;
  for (int i = 0; t.count("prompt." + std::to_string(i) + ".ids"); ++i) {
    const std::string p = "prompt." + std::to_string(i);
    const auto ids = read_tensor<int32_t>(t.at(p + ".ids"));
    std::vector<int32_t> pages;
    for (int32_t q = 0; q * 16 < static_cast<int32_t>(ids.size()); ++q) pages.push_back(255 - q);
    const StepBatch b =
        StepBatchBuilder(16).add(0, ids, 0, 1, pages, static_cast<int32_t>(ids.size())).build();
    compare(runner->forward(b), read_tensor<float>(t.at(p + ".logits")),
            read_tensor<float>(tb.at(p + ".logits")), cfg.vocab_size,
            GetParam() + " prefill T=" + std::to_string(ids.size()), tot);
  }
  // Teacher-forced decode after a prefill: eagerly, then through the decode graphs (which must
  // give the same bits: every kernel computes a row the same way whatever the batch size).
  auto decode_all = [&](int j, int32_t& P) {
    const std::string p = "decode." + std::to_string(j);
    const auto ids = read_tensor<int32_t>(t.at(p + ".ids"));
    P = read_tensor<int32_t>(t.at(p + ".prefill_len"))[0];
    std::vector<float> ours;
    for (int32_t start = 0; start < static_cast<int32_t>(ids.size());) {
      const int32_t n = start == 0 ? P : 1;
      std::vector<int32_t> pages;
      for (int32_t q = 0; q * 16 < start + n; ++q) pages.push_back(q);
      const StepBatch b =
          StepBatchBuilder(16)
              .add(0, std::span<const int32_t>(ids.data() + start, static_cast<size_t>(n)), start,
                   2, pages, 1)
              .build();
      const auto l = runner->forward(b);
      if (start > 0) ours.insert(ours.end(), l.begin(), l.end());
      start += n;
    }
    return ours;
  };
  std::vector<std::vector<float>> eager;
  for (int j = 0; t.count("decode." + std::to_string(j) + ".ids"); ++j) {
    int32_t P = 0;
    eager.push_back(decode_all(j, P));
    const std::string p = "decode." + std::to_string(j);
    compare(eager.back(), read_tensor<float>(t.at(p + ".logits")),
            read_tensor<float>(tb.at(p + ".logits")), cfg.vocab_size,
            GetParam() + " decode after P=" + std::to_string(P), tot);
  }
  runner->capture_decode_graphs({1, 2, 4}, 128);
  ASSERT_EQ(runner->graph_buckets(), (std::vector<int32_t>{1, 2, 4}));
  for (int j = 0; j < static_cast<int>(eager.size()); ++j) {
    int32_t P = 0;
    const std::vector<float> graphed = decode_all(j, P);
    ASSERT_EQ(graphed.size(), eager[static_cast<size_t>(j)].size());
    ASSERT_EQ(runner->graph_buckets().size(), 3u) << "the graphs must survive the prefills";
    EXPECT_EQ(deltaserve::testing::max_abs_diff(
                  graphed.data(), eager[static_cast<size_t>(j)].data(), graphed.size()),
              0.0f)
        << "graphed decode after P=" << P << " differs from eager";
  }
  std::printf(
      "  %s totals: sum of max|err| ours %.4f vs HF bf16 %.4f; argmax agreement ours %.4f vs HF "
      "bf16 %.4f\n",
      GetParam().c_str(), tot.ours_err, tot.hf_err, tot.ours_agree / tot.rows,
      tot.hf_agree / tot.rows);
  EXPECT_LE(tot.ours_err, 1.25 * tot.hf_err);
  EXPECT_GE(tot.ours_agree / tot.rows, tot.hf_agree / tot.rows - 0.01);
}

// Decode batches of 3 sequences replay the 4-row graph with a padding row: every sequence's
// logits equal its solo eager run bit for bit, step after step (so the padding row touched no
// other slot or page).
TEST_P(CudaModel, GraphedBatchedDecodeEqualsSoloEager) {
  const ModelConfig& cfg = cfg_;
  backend::CudaBackend& be = *be_;
  Qwen35Model& m = *m_;
  auto runner = deltaserve::testing::make_runner(m, 64, 16, 4, 256);
  // One sequence's step: n tokens at `start`, its last row sampled.
  auto step = [](const std::vector<int32_t>& ids, int32_t start, int s,
                 const std::vector<int32_t>& pages) {
    return StepBatchBuilder(16).add(0, ids, start, s, pages, 1).build();
  };
  const int32_t V = static_cast<int32_t>(cfg.vocab_size);
  const std::vector<int32_t> plen{5, 40, 17};
  const int steps = 6;
  auto prompt = [&](int s) {
    std::vector<int32_t> ids;
    for (int i = 0; i < plen[static_cast<size_t>(s)]; ++i) ids.push_back((s * 131 + i * 17) % V);
    return ids;
  };
  auto next_id = [&](int s, int k) { return (s * 7 + k * 29 + 3) % V; };
  auto pages = [](int s, int32_t upto) {
    std::vector<int32_t> p;
    for (int32_t q = 0; q * 16 < upto; ++q) p.push_back(s * 16 + q);
    return p;
  };
  // Solo eager runs.
  std::vector<std::vector<float>> solo(3);
  for (int s = 0; s < 3; ++s) {
    const auto ids = prompt(s);
    runner->forward(step(ids, 0, s, pages(s, plen[static_cast<size_t>(s)])));
    for (int k = 0; k < steps; ++k) {
      const int32_t pos = plen[static_cast<size_t>(s)] + k;
      const auto l = runner->forward(step({next_id(s, k)}, pos, s, pages(s, pos + 1)));
      solo[static_cast<size_t>(s)].insert(solo[static_cast<size_t>(s)].end(), l.begin(), l.end());
    }
  }
  runner->capture_decode_graphs({1, 2, 4}, 16);
  ASSERT_EQ(runner->graph_buckets().size(), 3u);
  // The same prefills (eager: not decode-only steps; one at a time, as cuBLASLt may pick another
  // algorithm for another row count), then the three decode together (graph bucket 4).
  for (int s = 0; s < 3; ++s) {
    const auto ids = prompt(s);
    runner->forward(step(ids, 0, s, pages(s, plen[static_cast<size_t>(s)])));
  }
  for (int k = 0; k < steps; ++k) {
    StepBatchBuilder d(16);
    for (int s = 0; s < 3; ++s) {
      const int32_t pos = plen[static_cast<size_t>(s)] + k;
      d.add(0, std::vector<int32_t>{next_id(s, k)}, pos, s, pages(s, pos + 1), 1);
    }
    const auto l = runner->forward(d.build());
    for (int s = 0; s < 3; ++s)
      EXPECT_EQ(deltaserve::testing::max_abs_diff(
                    l.data() + static_cast<size_t>(s) * V,
                    solo[static_cast<size_t>(s)].data() + static_cast<size_t>(k) * V, V),
                0.0f)
          << "sequence " << s << " step " << k;
  }
}

// Prefix caching's device path: a sequence resumed from a GDN snapshot (taken after a step, or
// inside one by the GDN kernels) and shared KV pages (StateSource::kSnapshot) against the same
// sequence prefilled in one piece, both against the CPU float32 forward: the resumed logits must
// be as close to float32 as the one-piece ones (the gate's 1.25x on the max error, the same argmax
// agreement).
TEST_P(CudaModel, SnapshotResumeStaysWithinTheGate) {
  const int32_t V = static_cast<int32_t>(cfg_.vocab_size);
  std::vector<int32_t> prompt(200), next(8);
  for (size_t i = 0; i < prompt.size(); ++i) prompt[i] = static_cast<int32_t>((i * 37 + 11) % V);
  for (size_t i = 0; i < next.size(); ++i) next[i] = static_cast<int32_t>((i * 53 + 7) % V);
  auto pages = [](int32_t first, int32_t n) {
    std::vector<int32_t> p(static_cast<size_t>(n));
    for (int32_t i = 0; i < n; ++i) p[static_cast<size_t>(i)] = first + i;
    return p;
  };
  // kWhole: the prompt on slot 0 in one piece. Else its first 128 tokens are snapshotted — after a
  // prefill of just them on slot 1 (kAfterStep) or inside a whole-prompt prefill on slot 1
  // (kInStep) — and slot 0 resumes from the snapshot on those pages plus its own.
  enum Mode { kWhole, kAfterStep, kInStep };
  auto run = [&](runtime::ModelRunner& r, Mode mode) {
    std::vector<float> out;
    std::vector<int32_t> table = pages(20, 14);
    const int32_t snap = r.plan().snapshot_slot(0);
    if (mode == kWhole) {
      out = r.forward(StepBatchBuilder(16).add(1, prompt, 0, 0, table, 1).build());
    } else {
      const std::vector<int32_t> head(prompt.begin(), prompt.begin() + 128);
      if (mode == kAfterStep)
        r.forward(
            StepBatchBuilder(16).add(9, head, 0, 1, pages(0, 8), 0).save_snapshot(snap).build());
      else
        r.forward(StepBatchBuilder(16)
                      .add(9, prompt, 0, 1, pages(0, 13), 0)
                      .save_snapshot_at(128, snap)
                      .build());
      table = pages(0, 8);
      for (int32_t p : pages(28, 6)) table.push_back(p);
      const std::vector<int32_t> tail(prompt.begin() + 128, prompt.end());
      out = r.forward(StepBatchBuilder(16)
                          .add(1, tail, 128, 0, table, 1, StateSource::kSnapshot, snap)
                          .build());
    }
    for (size_t k = 0; k < next.size(); ++k) {
      const auto l = r.forward(StepBatchBuilder(16)
                                   .add(1, std::vector<int32_t>{next[k]},
                                        static_cast<int32_t>(prompt.size() + k), 0, table, 1)
                                   .build());
      out.insert(out.end(), l.begin(), l.end());
    }
    return out;
  };
  backend::CpuBackend cpu;
  auto cpu_model = load_model(dir_.string(), LoadFormat::kAuto, cpu, false);
  auto cpu_runner = deltaserve::testing::make_runner(*cpu_model, 64, 16, 2, 256, 1);
  auto gpu_runner = deltaserve::testing::make_runner(*m_, 64, 16, 2, 256, 1);
  const std::vector<float> ref = run(*cpu_runner, kWhole);
  const Deviation w = deviation(run(*gpu_runner, kWhole), ref, V);
  for (const Mode mode : {kAfterStep, kInStep}) {
    const Deviation r = deviation(run(*gpu_runner, mode), ref, V);
    std::printf(
        "  %s snapshot resume (%s) vs f32: max|err| %.3e argmax %.4f | one piece %.3e "
        "argmax %.4f\n",
        GetParam().c_str(), mode == kInStep ? "in-step" : "after a step", r.err, r.agree, w.err,
        w.agree);
    EXPECT_LE(r.err, 1.25 * w.err + 1e-6);
    EXPECT_GE(r.agree, w.agree - 0.01);
  }
}

// Decode graphs of at least the backend's min_tuned_decode_rows() rows run on the cuBLASLt
// algorithms tuned for their row count when they are captured: a decode step of that many
// sequences replayed from its graph is as close to the CPU's float32 forward as the same step run
// eagerly on the untuned heuristics, within the snapshot test's gate.
TEST_P(CudaModel, TunedDecodeGraphStaysWithinTheGate) {
  const int64_t rows = be_->min_tuned_decode_rows();
  if (!be_->tunes_linears() || rows > 64)
    GTEST_SKIP() << "decode GEMM tuning is off (DS_GEMM_TUNE=0 or DS_GEMM_TUNE_DECODE=0) or "
                    "starts above 64 rows (DS_GEMM_TUNE_DECODE_ROWS)";
  const int32_t V = static_cast<int32_t>(cfg_.vocab_size);
  const int32_t B = static_cast<int32_t>(rows), kPrompt = 4;
  StepBatchBuilder prefill(16), decode(16);
  for (int32_t s = 0; s < B; ++s) {
    std::vector<int32_t> ids;
    for (int32_t i = 0; i < kPrompt; ++i) ids.push_back((s * 131 + i * 17) % V);
    const std::vector<int32_t> page{s};
    prefill.add(static_cast<uint64_t>(s), ids, 0, s, page, 0);
    decode.add(static_cast<uint64_t>(s), std::vector<int32_t>{(s * 7 + 3) % V}, kPrompt, s, page,
               1);
  }
  const StepBatch pre = prefill.build(), dec = decode.build();
  ASSERT_TRUE(dec.is_decode());
  backend::CpuBackend cpu;
  auto cpu_model = load_model(dir_.string(), LoadFormat::kAuto, cpu, false);
  auto cpu_runner = deltaserve::testing::make_runner(*cpu_model, 2 * B, 16, B, B * kPrompt);
  auto gpu_runner = deltaserve::testing::make_runner(*m_, 2 * B, 16, B, B * kPrompt);
  cpu_runner->forward(pre);
  const std::vector<float> ref = cpu_runner->forward(dec);
  gpu_runner->forward(pre);
  const Deviation eager = deviation(gpu_runner->forward(dec), ref, V);
  gpu_runner->capture_decode_graphs({B}, 1);
  ASSERT_EQ(gpu_runner->graph_buckets(), (std::vector<int32_t>{B}));
  gpu_runner->forward(pre);  // eager (not decode-only): the same states again
  const Deviation graphed = deviation(gpu_runner->forward(dec), ref, V);
  std::printf(
      "  %s %d-row decode vs f32: tuned graph max|err| %.3e argmax %.4f | eager %.3e "
      "argmax %.4f\n",
      GetParam().c_str(), B, graphed.err, graphed.agree, eager.err, eager.agree);
  EXPECT_LE(graphed.err, 1.25 * eager.err + 1e-6);
  EXPECT_GE(graphed.agree, eager.agree - 0.01);
}

// The memory plan on the GPU: the runner allocates exactly the plan, and the backend's own
// workspace after the largest step the plan allows stays within the plan's workspace.
TEST_P(CudaModel, MemoryPlanEqualsWhatIsAllocated) {
  const ModelConfig& cfg = cfg_;
  backend::CudaBackend& be = *be_;
  Qwen35Model& m = *m_;
  runtime::PlanLimits limits;
  limits.max_num_seqs = 4;
  limits.max_num_batched_tokens = 1000;
  limits.max_model_len = 1024;
  limits.page_size = 16;
  limits.num_snapshots = 2;
  limits.max_graph_batch = 4;
  runtime::MemoryBudget budget;
  budget.kind = runtime::MemoryBudget::Kind::kDeviceShare;
  budget.utilization = 0.02;  // ~2.8 GiB of the H200
  const runtime::MemoryPlan plan = runtime::plan_for(m, limits, budget);
  std::printf("  %s plan: %s\n", GetParam().c_str(), plan.describe().c_str());
  const int64_t before = be.allocated_bytes();
  runtime::ModelRunner runner(m, plan);
  EXPECT_EQ(be.allocated_bytes() - before, plan.runner_bytes());
  std::vector<int32_t> ids(1000), pages;
  for (size_t i = 0; i < ids.size(); ++i) ids[i] = static_cast<int32_t>(i % cfg.vocab_size);
  for (int32_t q = 0; q * 16 < 1000; ++q) pages.push_back(q);
  runner.forward(StepBatchBuilder(16).add(0, ids, 0, 0, pages, 1).build());
  EXPECT_EQ(be.allocated_bytes() - before, plan.runner_bytes())
      << "a planned step allocates nothing";
  EXPECT_LE(be.workspace_allocated(), plan.workspace_bytes);
  size_t free_b = 0, total_b = 0;
  ASSERT_TRUE(be.memory_info(free_b, total_b));
  EXPECT_GE(static_cast<int64_t>(free_b), plan.reserve_bytes) << "the share fits the device";
}

INSTANTIATE_TEST_SUITE_P(TinyModels, CudaModel, ::testing::Values("tiny_real", "tiny_odd"));

}  // namespace
}  // namespace deltaserve::model
