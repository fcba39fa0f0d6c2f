// The projection order a model declares to its backend (Backend::set_projection_order, which the
// CUDA backend's weight-streaming GEMM follows to pull the next projection's weights into L2) is
// the order in which a forward really runs its projections, step after step; and the model takes
// it back when it is destroyed (the weights are freed then).
#include <gtest/gtest.h>

#include <vector>

#include "backend/cpu/cpu_backend.h"
#include "model/loader.h"
#include "runner_fixture.h"
#include "runtime/model_runner.h"
#include "test_util.h"

namespace deltaserve::runtime {
namespace {

using Group = std::vector<const void*>;  // a projection call's weights

// A CPU backend that keeps the declared order and logs each projection call's weights (a
// linear_multi or linear_add_rms_norm once, not the linear calls it makes).
class ProjectionLog final : public backend::CpuBackend {
 public:
  void set_projection_order(std::span<const std::vector<const Tensor*>> order) override {
    declared.clear();
    for (const auto& g : order) {
      Group w;
      for (const Tensor* t : g) w.push_back(t->data);
      declared.push_back(w);
    }
  }
  void linear(const Tensor& x, const Tensor& w, const Tensor& y) override {
    if (depth_ == 0) calls.push_back({w.data});
    CpuBackend::linear(x, w, y);
  }
  void linear_multi(const Tensor& x, std::span<const Tensor* const> ws,
                    std::span<const Tensor* const> ys) override {
    Group g;
    for (const Tensor* w : ws) g.push_back(w->data);
    calls.push_back(g);
    ++depth_;
    CpuBackend::linear_multi(x, ws, ys);
    --depth_;
  }
  void linear_add_rms_norm(const Tensor& x, const Tensor& w, const Tensor& residual,
                           const Tensor& norm_w, float eps, const Tensor& out,
                           const Tensor& scratch) override {
    calls.push_back({w.data});
    ++depth_;
    CpuBackend::linear_add_rms_norm(x, w, residual, norm_w, eps, out, scratch);
    --depth_;
  }

  std::vector<Group> declared, calls;

 private:
  int depth_ = 0;
};

TEST(ProjectionOrder, IsTheOrderOfEveryStepsProjections) {
  ProjectionLog be;
  auto m = model::load_model((testing::test_data() / "tiny_real").string(),
                             model::LoadFormat::kAuto, be, false);
  const size_t layers = static_cast<size_t>(m->config().num_layers);
  ASSERT_EQ(be.declared.size(), 4 * layers + 1) << "four projections a layer, then the lm_head";
  auto runner = testing::make_runner(*m, 8, 16, 2, 64);
  std::vector<int32_t> prompt(40);
  for (size_t i = 0; i < prompt.size(); ++i) prompt[i] = static_cast<int32_t>((i * 31 + 7) % 384);
  const std::vector<int32_t> pages{0, 1, 2, 3};
  runner->forward(StepBatchBuilder(16).add(1, prompt, 0, 0, pages, 1).build());
  for (int32_t k = 0; k < 2; ++k)
    runner->forward(
        StepBatchBuilder(16).add(1, std::vector<int32_t>{5 + k}, 40 + k, 0, pages, 1).build());
  ASSERT_EQ(be.calls.size(), 3 * be.declared.size()) << "a prefill and two decode steps";
  for (size_t i = 0; i < be.calls.size(); ++i)
    EXPECT_EQ(be.calls[i], be.declared[i % be.declared.size()]) << "projection call " << i;
  runner.reset();
  m.reset();
  EXPECT_TRUE(be.declared.empty()) << "the destroyed model's weights are still declared";
}

}  // namespace
}  // namespace deltaserve::runtime
