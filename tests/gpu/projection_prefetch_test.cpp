// The weight-streaming GEMM pulling the next projection's weights into L2 (the projection order
// of Backend::set_projection_order): projections run in the declared order give exactly the
// results they give with no order declared, and match the CPU. The order includes a projection
// the GEMM cannot stream (K = 100: not a multiple of 8), which no launch may pull; the steps run
// at 1, 16 and 40 tokens (at 40 the wide projections go to cuBLASLt, the narrow group stays).
#include <gtest/gtest.h>

#include <vector>

#include "cuda_ops_fixture.h"

namespace deltaserve::backend {
namespace {

struct Projection {
  int in;
  std::vector<int> outs;
};

TEST_F(CudaOps, ProjectionsInTheDeclaredOrderMatchUndeclared) {
  const std::vector<Projection> chain{
      {2560, {8192, 1024, 32, 2600}}, {4096, {2560}}, {100, {50}}, {2560, {9216, 9216}}};
  std::vector<Buffer> weights;
  std::vector<std::vector<float>> host_w;
  std::vector<std::vector<const Tensor*>> order(chain.size());
  uint32_t seed = 300;
  for (size_t p = 0; p < chain.size(); ++p)
    for (const int out : chain[p].outs) {
      host_w.push_back(rnd(static_cast<size_t>(out) * chain[p].in, ++seed, 0.05f));
      weights.push_back(dev(host_w.back(), DType::kBF16, {out, chain[p].in}));
    }
  for (size_t p = 0, i = 0; p < chain.size(); ++p)
    for (size_t j = 0; j < chain[p].outs.size(); ++j) order[p].push_back(&weights[i++].tensor());
  for (const int T : {1, 16, 40}) {
    SCOPED_TRACE("T " + std::to_string(T));
    // The chain and its first projection again (pulled by the last), each output downloaded.
    const auto run = [&] {
      std::vector<std::vector<float>> got;
      for (size_t step = 0; step <= chain.size(); ++step) {
        const size_t p = step % chain.size();
        Buffer x = dev(rnd(static_cast<size_t>(T) * chain[p].in, 7 + static_cast<uint32_t>(step)),
                       DType::kBF16, {T, chain[p].in});
        std::vector<Buffer> ys;
        std::vector<const Tensor*> yp;
        for (const int out : chain[p].outs) {
          ys.push_back(gpu_->alloc(DType::kBF16, {T, out}));
          poison(ys.back().tensor());
        }
        for (const Buffer& y : ys) yp.push_back(&y.tensor());
        gpu_->linear_multi(x.tensor(), order[p], yp);
        for (const Buffer& y : ys) got.push_back(host(y.tensor()));
      }
      return got;
    };
    gpu_->set_projection_order(order);
    const std::vector<std::vector<float>> ordered = run();
    gpu_->set_projection_order({});
    const std::vector<std::vector<float>> plain = run();
    ASSERT_EQ(ordered.size(), plain.size());
    for (size_t i = 0; i < ordered.size(); ++i) EXPECT_EQ(ordered[i], plain[i]) << "output " << i;
    // The first projection's first output against the CPU (the rest are the same code paths).
    std::vector<float> x = rnd(static_cast<size_t>(T) * 2560, 7);
    std::vector<float> ref(static_cast<size_t>(T) * 8192);
    cpu_.linear(Tensor(x.data(), DType::kF32, {T, 2560}),
                Tensor(host_w[0].data(), DType::kF32, {8192, 2560}),
                Tensor(ref.data(), DType::kF32, {T, 8192}));
    expect_close(ordered[0], ref, 1e-2f, "the first projection");
  }
}

}  // namespace
}  // namespace deltaserve::backend
