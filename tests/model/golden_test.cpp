// The gate: the CPU forward against HF transformers float32 logits (test_data/goldens), for both
// tiny checkpoints: full prefill, prefill + teacher-forced decode, chunked prefill, and one mixed
// batch of prefill chunks and decode rows with slot and page reuse.
//
// Tolerance: max |ours - HF| <= 1e-4 * max |HF| over each compared block, and identical argmax at
// every position. Our own re-orderings (chunked vs one-shot, decode vs prefill) must agree to 5e-5
// (measured up to 1.7e-5: f32 sums over 1,000+ recurrent steps in another order).
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <map>

#include "backend/cpu/cpu_backend.h"
#include "model/qwen35.h"
#include "model/safetensors.h"
#include "runner_fixture.h"
#include "test_util.h"

namespace deltaserve::model {
namespace {

using deltaserve::testing::test_data;

constexpr float kHfRelTol = 1e-4f;
constexpr float kSelfRelTol = 5e-5f;
constexpr int32_t kPageSize = 16;
constexpr int32_t kNumPages = 256;

std::vector<int32_t> ids_of(const TensorInfo& t) {
  std::vector<int32_t> v(static_cast<size_t>(t.numel()));
  std::memcpy(v.data(), t.data, t.nbytes);
  return v;
}

std::vector<float> f32_of(const TensorInfo& t) {
  std::vector<float> v(static_cast<size_t>(t.numel()));
  std::memcpy(v.data(), t.data, t.nbytes);
  return v;
}

// Compares [rows, V] logits; `label` names the case in failures.
void expect_close(const std::vector<float>& ours, const std::vector<float>& ref, int64_t V,
                  float rel_tol, const std::string& label) {
  ASSERT_EQ(ours.size(), ref.size()) << label;
  float err = 0, scale = 0;
  int64_t argmax_mismatch = 0;
  const int64_t rows = static_cast<int64_t>(ref.size()) / V;
  for (int64_t r = 0; r < rows; ++r) {
    const float* a = ours.data() + r * V;
    const float* b = ref.data() + r * V;
    for (int64_t i = 0; i < V; ++i) {
      err = std::max(err, std::abs(a[i] - b[i]));
      scale = std::max(scale, std::abs(b[i]));
    }
    argmax_mismatch += std::max_element(a, a + V) - a != std::max_element(b, b + V) - b;
  }
  EXPECT_LE(err, rel_tol * scale) << label << ": max abs err " << err << " vs max |ref| " << scale;
  EXPECT_EQ(argmax_mismatch, 0) << label << ": argmax differs at " << argmax_mismatch << " of "
                                << rows << " positions";
  std::printf("  %-40s rows %5lld  max|err| %.2e  rel %.2e\n", label.c_str(),
              static_cast<long long>(rows), err, err / scale);
}

class Gate : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    const auto dir = test_data() / GetParam();
    cfg_ = load_model_config(dir);
    Checkpoint ckpt(dir);
    model_ = std::make_unique<Qwen35Model>(cfg_, be_, load_weights(ckpt, cfg_, be_));
    runner_ = deltaserve::testing::make_runner(*model_, kNumPages, kPageSize, 4);
    golden_ =
        std::make_unique<SafetensorsFile>(test_data() / "goldens" / (GetParam() + ".safetensors"));
  }

  const TensorInfo& g(const std::string& name) const { return golden_->tensors().at(name); }
  bool has(const std::string& name) const { return golden_->tensors().count(name) > 0; }

  // Runs `ids` through one sequence in chunks of `chunk` tokens; returns the logits of every row.
  std::vector<float> run(const std::vector<int32_t>& ids, int32_t chunk, int32_t slot = 0) {
    std::vector<float> all;
    for (int32_t start = 0; start < static_cast<int32_t>(ids.size()); start += chunk) {
      const int32_t n = std::min<int32_t>(chunk, static_cast<int32_t>(ids.size()) - start);
      std::vector<int32_t> pages;
      for (int32_t p = 0; p * kPageSize < start + n; ++p) pages.push_back(kNumPages - 1 - p);
      const StepBatch b =
          StepBatchBuilder(kPageSize)
              .add(0, std::span<const int32_t>(ids.data() + start, static_cast<size_t>(n)), start,
                   slot, pages, n)
              .build();
      const std::vector<float> l = runner_->forward(b);
      all.insert(all.end(), l.begin(), l.end());
    }
    return all;
  }

  std::string longest_prompt() const {
    std::string best;
    for (int i = 0; has("prompt." + std::to_string(i) + ".ids"); ++i) {
      const std::string n = "prompt." + std::to_string(i);
      if (best.empty() || g(n + ".ids").numel() > g(best + ".ids").numel()) best = n;
    }
    return best;
  }

  ModelConfig cfg_;
  backend::CpuBackend be_;
  std::unique_ptr<Qwen35Model> model_;
  std::unique_ptr<runtime::ModelRunner> runner_;
  std::unique_ptr<SafetensorsFile> golden_;
};

TEST_P(Gate, PrefillMatchesHf) {
  int n = 0;
  for (; has("prompt." + std::to_string(n) + ".ids"); ++n) {
    const std::string p = "prompt." + std::to_string(n);
    const std::vector<int32_t> ids = ids_of(g(p + ".ids"));
    expect_close(run(ids, static_cast<int32_t>(ids.size())), f32_of(g(p + ".logits")),
                 cfg_.vocab_size, kHfRelTol,
                 GetParam() + " prefill T=" + std::to_string(ids.size()));
  }
  EXPECT_GE(n, 4);
}

TEST_P(Gate, PrefillThenDecodeMatchesHfAndOneShot) {
  int n = 0;
  for (; has("decode." + std::to_string(n) + ".ids"); ++n) {
    const std::string p = "decode." + std::to_string(n);
    const std::vector<int32_t> ids = ids_of(g(p + ".ids"));
    const int32_t P = ids_of(g(p + ".prefill_len"))[0];
    const int64_t V = cfg_.vocab_size;
    // Prefill P tokens, then one token per step.
    std::vector<float> ours;
    for (int32_t start = 0; start < static_cast<int32_t>(ids.size());) {
      const int32_t len = start == 0 ? P : 1;
      std::vector<int32_t> pages;
      for (int32_t q = 0; q * kPageSize < start + len; ++q) pages.push_back(q);
      const StepBatch b =
          StepBatchBuilder(kPageSize)
              .add(0, std::span<const int32_t>(ids.data() + start, static_cast<size_t>(len)), start,
                   2, pages, 1)
              .build();
      const std::vector<float> l = runner_->forward(b);
      if (start > 0) ours.insert(ours.end(), l.begin(), l.end());
      start += len;
    }
    expect_close(ours, f32_of(g(p + ".logits")), V, kHfRelTol,
                 GetParam() + " decode after P=" + std::to_string(P));
    const std::vector<float> one_shot = run(ids, static_cast<int32_t>(ids.size()));
    expect_close(ours, std::vector<float>(one_shot.begin() + P * V, one_shot.end()), V, kSelfRelTol,
                 GetParam() + " decode vs one-shot P=" + std::to_string(P));
  }
  EXPECT_GE(n, 2);
}

TEST_P(Gate, ChunkedPrefillEqualsOneShot) {
  const std::string p = longest_prompt();
  const std::vector<int32_t> ids = ids_of(g(p + ".ids"));
  ASSERT_GT(ids.size(), 1000u);
  const std::vector<float> one_shot = run(ids, static_cast<int32_t>(ids.size()));
  const std::vector<float> hf = f32_of(g(p + ".logits"));
  for (int32_t chunk : {1, 7, 64, 100}) {
    const std::vector<float> c = run(ids, chunk, 1);
    expect_close(c, one_shot, cfg_.vocab_size, kSelfRelTol,
                 GetParam() + " chunk " + std::to_string(chunk) + " vs one-shot");
    expect_close(c, hf, cfg_.vocab_size, kHfRelTol,
                 GetParam() + " chunk " + std::to_string(chunk) + " vs HF");
  }
}

// One forward per step holding several sequences: A chunk-prefills a long prompt 100 tokens at a
// time; B prefills then decodes one token per step; when B is done, C starts in B's dirty slot.
TEST_P(Gate, MixedBatchWithSlotAndPageReuse) {
  struct Seq {
    std::vector<int32_t> ids;
    std::vector<int32_t> chunks;  // tokens per step
    int32_t slot;
    size_t step = 0;
    int32_t pos = 0;
    std::vector<int32_t> pages;
    std::vector<float> logits;  // every row
    bool done() const { return step == chunks.size(); }
  };
  const std::string pa = longest_prompt();
  Seq a{ids_of(g(pa + ".ids")), {}, 0};
  for (size_t left = a.ids.size(); left > 0; left -= std::min<size_t>(left, 100))
    a.chunks.push_back(static_cast<int32_t>(std::min<size_t>(left, 100)));
  const std::vector<int32_t> dec = ids_of(g("decode.0.ids"));
  const int32_t P = ids_of(g("decode.0.prefill_len"))[0];
  Seq b{dec, {P}, 3};
  b.chunks.resize(dec.size() - static_cast<size_t>(P) + 1, 1);
  Seq c{ids_of(g("prompt.2.ids")), {}, 3};
  c.chunks = {static_cast<int32_t>(c.ids.size())};

  std::vector<int32_t> free_pages;
  for (int32_t p = 0; p < kNumPages; ++p) free_pages.push_back(p);
  std::reverse(free_pages.begin(), free_pages.end());
  std::vector<Seq*> active{&a, &b};
  bool c_started = false;
  int mixed_steps = 0;
  while (!active.empty()) {
    StepBatchBuilder builder(kPageSize);
    for (Seq* s : active) {
      const int32_t n = s->chunks[s->step];
      while (static_cast<int32_t>(s->pages.size()) * kPageSize < s->pos + n) {
        s->pages.push_back(free_pages.back());
        free_pages.pop_back();
      }
      builder.add(0, std::span<const int32_t>(s->ids.data() + s->pos, static_cast<size_t>(n)),
                  s->pos, s->slot, s->pages, n);
    }
    mixed_steps += active.size() > 1;
    const std::vector<float> l = runner_->forward(builder.build());
    size_t row = 0;
    for (Seq* s : active) {
      const int32_t n = s->chunks[s->step];
      s->logits.insert(s->logits.end(), l.begin() + static_cast<int64_t>(row) * cfg_.vocab_size,
                       l.begin() + static_cast<int64_t>(row + n) * cfg_.vocab_size);
      row += static_cast<size_t>(n);
      s->pos += n;
      ++s->step;
      if (s->done()) free_pages.insert(free_pages.end(), s->pages.begin(), s->pages.end());
    }
    std::erase_if(active, [](Seq* s) { return s->done(); });
    if (b.done() && !c_started) {
      active.push_back(&c);  // reuses B's slot (dirty state) and B's freed pages
      c_started = true;
    }
  }
  EXPECT_GE(mixed_steps, 5);
  const int64_t V = cfg_.vocab_size;
  expect_close(a.logits, f32_of(g(pa + ".logits")), V, kHfRelTol, GetParam() + " mixed: A chunked");
  expect_close(std::vector<float>(b.logits.begin() + P * V, b.logits.end()),
               f32_of(g("decode.0.logits")), V, kHfRelTol, GetParam() + " mixed: B decode");
  expect_close(c.logits, f32_of(g("prompt.2.logits")), V, kHfRelTol,
               GetParam() + " mixed: C in reused slot");
}

INSTANTIATE_TEST_SUITE_P(TinyModels, Gate, ::testing::Values("tiny_real", "tiny_odd"));

}  // namespace
}  // namespace deltaserve::model
