#include <gtest/gtest.h>

#include <cmath>
#include <tuple>

#include "backend/cpu/cpu_backend.h"
#include "test_util.h"

namespace deltaserve::backend {
namespace {

using deltaserve::testing::max_abs;
using deltaserve::testing::max_abs_diff;
using deltaserve::testing::random_vec;

void l2(std::vector<float>& x, int T, int d, float scale) {
  for (int t = 0; t < T; ++t) {
    float ss = 0;
    for (int i = 0; i < d; ++i) ss += x[t * d + i] * x[t * d + i];
    for (int i = 0; i < d; ++i) x[t * d + i] *= scale / std::sqrt(ss + 1e-6f);
  }
}

struct DeltaCase {
  int T, dk, dv, chunk;
};

class DeltaRule : public ::testing::TestWithParam<DeltaCase> {};

TEST_P(DeltaRule, ChunkedEqualsRecurrent) {
  const auto [T, dk, dv, chunk] = GetParam();
  std::vector<float> q = random_vec(T * dk, 1), k = random_vec(T * dk, 2),
                     v = random_vec(T * dv, 3);
  l2(q, T, dk, 1.0f / std::sqrt(static_cast<float>(dk)));
  l2(k, T, dk, 1.0f);
  std::vector<float> g(T), beta(T);
  std::vector<float> r = random_vec(2 * T, 4);
  for (int t = 0; t < T; ++t) {
    g[t] = -std::abs(r[t]) * 0.3f;
    beta[t] = 1.0f / (1.0f + std::exp(-r[T + t]));
  }
  std::vector<float> S1 = random_vec(dk * dv, 5, 0.5f), S2 = S1, o1(T * dv), o2(T * dv);
  cpu::delta_rule_recurrent(T, dk, dv, q.data(), k.data(), v.data(), g.data(), beta.data(),
                            S1.data(), o1.data());
  cpu::delta_rule_chunked(T, dk, dv, q.data(), k.data(), v.data(), g.data(), beta.data(), S2.data(),
                          o2.data(), chunk);
  EXPECT_LE(max_abs_diff(o1.data(), o2.data(), o1.size()), 1e-5f * max_abs(o1));
  EXPECT_LE(max_abs_diff(S1.data(), S2.data(), S1.size()), 1e-5f * max_abs(S1));
  EXPECT_GT(max_abs(o1), 0.01f);
}

INSTANTIATE_TEST_SUITE_P(Shapes, DeltaRule,
                         ::testing::Values(DeltaCase{130, 16, 24, 64}, DeltaCase{70, 128, 128, 64},
                                           DeltaCase{33, 16, 24, 7}, DeltaCase{1, 8, 8, 64}));

// A one-sequence batch of n (zero) tokens with pages 0.. and the given slot.
StepBatch one_seq(int32_t n, int32_t start, int32_t slot, int32_t page_size = 4) {
  std::vector<int32_t> pages;
  for (int32_t p = 0; p * page_size < start + n; ++p) pages.push_back(p);
  return StepBatchBuilder(page_size)
      .add(0, std::vector<int32_t>(static_cast<size_t>(n), 0), start, slot, pages)
      .build();
}

TEST(GdnConv, SplitWithStateEqualsWholeAndMatchesFormula) {
  CpuBackend be;
  const int C = 5, K = 4, T = 10;
  std::vector<float> u = random_vec(T * C, 7), w = random_vec(C * K, 8);
  Tensor ut(u.data(), DType::kF32, {T, C}), wt(w.data(), DType::kF32, {C, K});
  std::vector<float> state(2 * C * (K - 1), 123.0f);  // garbage: start_pos 0 must ignore it
  Tensor st(state.data(), DType::kF32, {2, C, K - 1});
  std::vector<float> y_whole(T * C), y_split(T * C);
  be.gdn_conv(one_seq(T, 0, 1), ut, wt, st, K, Tensor(y_whole.data(), DType::kF32, {T, C}));
  for (int t = 0; t < T; ++t)
    for (int c = 0; c < C; ++c) {
      float acc = 0;
      for (int i = 0; i < K; ++i) {
        const int src = t - K + 1 + i;
        if (src >= 0) acc += w[c * K + i] * u[src * C + c];
      }
      EXPECT_NEAR(y_whole[t * C + c], acc / (1 + std::exp(-acc)), 1e-5f);
    }
  be.gdn_conv(one_seq(3, 0, 0), ut.rows(0, 3), wt, st, K,
              Tensor(y_split.data(), DType::kF32, {3, C}));
  be.gdn_conv(one_seq(7, 3, 0), ut.rows(3, T), wt, st, K,
              Tensor(y_split.data() + 3 * C, DType::kF32, {7, C}));
  EXPECT_LE(max_abs_diff(y_whole.data(), y_split.data(), y_whole.size()), 1e-6f);
  // Both slots now hold the last K-1 inputs, oldest first.
  for (int c = 0; c < C; ++c)
    for (int i = 0; i < K - 1; ++i) {
      EXPECT_EQ(state[(0 * C + c) * (K - 1) + i], u[(T - K + 1 + i) * C + c]);
      EXPECT_EQ(state[(1 * C + c) * (K - 1) + i], u[(T - K + 1 + i) * C + c]);
    }
}

// A bf16 recurrent state (--mamba-ssm-cache-dtype bfloat16) computes each step in f32 from the
// stored values and rounds what it stores: from the same (bf16-exact) state, the outputs equal the
// f32 state's exactly and the state left is the f32 result rounded to bf16 — for a decode row, a
// chunked prefill continuing a state, and one with an in-step snapshot (into slot 3).
TEST(GdnState, Bf16StateIsTheF32StepRounded) {
  CpuBackend be;
  const GdnDims d{2, 4, 16, 24, 4};
  const int64_t C = 2 * d.nk * d.dk + d.nv * d.dv, slots = 4, n = slots * d.nv * d.dk * d.dv;
  for (const auto& [T, start, snap_at] :
       {std::tuple{1, 9, 0}, std::tuple{150, 20, 0}, std::tuple{130, 0, 64}}) {
    SCOPED_TRACE(T);
    StepBatchBuilder builder(4);
    std::vector<int32_t> pages;
    for (int32_t p = 0; p * 4 < start + T; ++p) pages.push_back(p);
    builder.add(0, std::vector<int32_t>(static_cast<size_t>(T), 0), start, 1, pages);
    if (snap_at > 0) builder.save_snapshot_at(snap_at, 3);
    const StepBatch batch = builder.build();
    std::vector<float> y = random_vec(T * C, 60), a = random_vec(T * d.nv, 61),
                       b = random_vec(T * d.nv, 62), alog = random_vec(d.nv, 63, 0.5f),
                       dtb = random_vec(d.nv, 64, 0.5f), s32 = random_vec(n, 65, 0.3f);
    std::vector<uint16_t> s16(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) {
      s16[static_cast<size_t>(i)] = f32_to_bf16(s32[static_cast<size_t>(i)]);
      s32[static_cast<size_t>(i)] = bf16_to_f32(s16[static_cast<size_t>(i)]);
    }
    std::vector<float> o32(static_cast<size_t>(T * d.nv * d.dv)), o16(o32.size());
    auto run = [&](const Tensor& state, std::vector<float>& o) {
      be.gated_delta_rule(
          batch, Tensor(y.data(), DType::kF32, {T, C}), Tensor(a.data(), DType::kF32, {T, d.nv}),
          Tensor(b.data(), DType::kF32, {T, d.nv}), Tensor(alog.data(), DType::kF32, {d.nv}),
          Tensor(dtb.data(), DType::kF32, {d.nv}), state, d,
          Tensor(o.data(), DType::kF32, {T, d.nv, d.dv}));
    };
    const std::vector<float> before = s32;
    run(Tensor(s32.data(), DType::kF32, {slots, d.nv, d.dk, d.dv}), o32);
    run(Tensor(s16.data(), DType::kBF16, {slots, d.nv, d.dk, d.dv}), o16);
    EXPECT_EQ(o16, o32);
    int changed = 0;
    for (int64_t i = 0; i < n; ++i) {
      const size_t u = static_cast<size_t>(i);
      ASSERT_EQ(s16[u], f32_to_bf16(s32[u])) << i;
      changed += s32[u] != before[u];
    }
    EXPECT_GT(changed, n / 8) << "the step wrote the state";
  }
}

TEST(CopyState, CopiesOneSlotOfConvAndRecurrentState) {
  CpuBackend be;
  const int slots = 3, C = 5, K = 4, nv = 2, dk = 3, dv = 4;
  std::vector<float> conv = random_vec(slots * C * (K - 1), 40);
  std::vector<float> state = random_vec(slots * nv * dk * dv, 41);
  const std::vector<float> conv0 = conv, state0 = state;
  const Tensor tensors[] = {Tensor(conv.data(), DType::kF32, {slots, C, K - 1}),
                            Tensor(state.data(), DType::kF32, {slots, nv, dk, dv})};
  const SlotMove move{2, 0};
  be.copy_state_rows(tensors, {&move, 1});
  const size_t cr = C * (K - 1), sr = nv * dk * dv;
  for (size_t i = 0; i < cr; ++i) {
    EXPECT_EQ(conv[i], conv0[2 * cr + i]);
    EXPECT_EQ(conv[cr + i], conv0[cr + i]);
    EXPECT_EQ(conv[2 * cr + i], conv0[2 * cr + i]);
  }
  for (size_t i = 0; i < sr; ++i) {
    EXPECT_EQ(state[i], state0[2 * sr + i]);
    EXPECT_EQ(state[sr + i], state0[sr + i]);
  }
}

TEST(Rope, MatchesAnglesAndIdentityAtZero) {
  float c[8], s[8];
  cpu::rope_cos_sin(0, 8, 1e4, c, s);
  for (int i = 0; i < 8; ++i) {
    EXPECT_EQ(c[i], 1.0f);
    EXPECT_EQ(s[i], 0.0f);
  }
  cpu::rope_cos_sin(5, 8, 1e4, c, s);
  for (int i = 0; i < 4; ++i) {
    const double ang = 5.0 * std::pow(1e4, -2.0 * i / 8);
    EXPECT_NEAR(c[i], std::cos(ang), 1e-5);
    EXPECT_NEAR(s[i + 4], std::sin(ang), 1e-5);
  }
}

TEST(PagedAttention, ScatteredPagesEqualContiguous) {
  CpuBackend be;
  const int nh = 4, nkv = 2, hd = 8, T = 11, ps = 4;
  AttnDims d{nh, nkv, hd, 4, 1e4, 1e-6f};
  std::vector<float> qg0 = random_vec(T * nh * 2 * hd, 11), k0 = random_vec(T * nkv * hd, 12),
                     v0 = random_vec(T * nkv * hd, 13), qn = random_vec(hd, 14, 0.3f),
                     kn = random_vec(hd, 15, 0.3f);
  auto run = [&](std::vector<int32_t> pages) {
    std::vector<float> qg = qg0, k = k0, v = v0, q(T * nh * hd), gate(T * nh * hd),
                       out(T * nh * hd);
    std::vector<float> kc(8 * ps * nkv * hd), vc(kc.size());
    const StepBatch batch =
        StepBatchBuilder(ps).add(0, std::vector<int32_t>(T, 0), 0, 0, pages).build();
    Tensor kt(k.data(), DType::kF32, {T, nkv, hd});
    be.attn_prep_and_cache(
        batch, Tensor(qg.data(), DType::kF32, {T, nh * 2 * hd}), kt,
        Tensor(v.data(), DType::kF32, {T, nkv, hd}), Tensor(qn.data(), DType::kF32, {hd}),
        Tensor(kn.data(), DType::kF32, {hd}), d, Tensor(q.data(), DType::kF32, {T, nh, hd}),
        Tensor(gate.data(), DType::kF32, {T, nh, hd}),
        Tensor(kc.data(), DType::kF32, {8, ps, nkv, hd}),
        Tensor(vc.data(), DType::kF32, {8, ps, nkv, hd}));
    be.paged_attention(batch, Tensor(q.data(), DType::kF32, {T, nh, hd}),
                       Tensor(gate.data(), DType::kF32, {T, nh, hd}),
                       Tensor(kc.data(), DType::kF32, {8, ps, nkv, hd}),
                       Tensor(vc.data(), DType::kF32, {8, ps, nkv, hd}), d,
                       Tensor(out.data(), DType::kF32, {T, nh, hd}));
    // The gates read in place from qg (each head's second half): the same outputs.
    std::vector<float> out_qg(out.size(), -1.0f);
    be.paged_attention(batch, Tensor(q.data(), DType::kF32, {T, nh, hd}),
                       Tensor(qg.data(), DType::kF32, {T, nh, 2 * hd}),
                       Tensor(kc.data(), DType::kF32, {8, ps, nkv, hd}),
                       Tensor(vc.data(), DType::kF32, {8, ps, nkv, hd}), d,
                       Tensor(out_qg.data(), DType::kF32, {T, nh, hd}));
    EXPECT_EQ(out_qg, out);
    return out;
  };
  const std::vector<float> a = run({0, 1, 2}), b = run({6, 2, 4});
  EXPECT_LE(max_abs_diff(a.data(), b.data(), a.size()), 1e-6f);
  EXPECT_GT(max_abs(a), 0.01f);
}

}  // namespace
}  // namespace deltaserve::backend
