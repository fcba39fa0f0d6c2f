// The chunked delta rule of the CUDA backend (bf16 tensor-core operands, f32 accumulation and f32
// state) against the CPU backend's chunked form (f32 throughout), at the real head shape (dk = dv =
// 128, two value heads per key head — the prep's paired form —, and one or three — its one-head
// form): single sequences of T in {1, 63, 64, 65, 1000, 8192}, fresh
// and continuing from a state; varlen mixes (the state pass in quarter-head, half-head and whole-
// head blocks; the 40-sequence mixes fill an H200 with (sequence, value head) blocks, so by
// default they take the fused kernel, gdn_chunk_fused.cu); in-step snapshots; a bf16 state.
// tests/CMakeLists.txt runs the cases again with each form forced (DS_GDN_FUSED, DS_GDN_PASS_T).
// Bounds are those of bf16 operands: |error| <= 2^-6 of the largest reference magnitude (at least
// 1) for the bf16 output and 2^-7 for the f32 state (4 and 2 bf16 ulps at that magnitude).
#include <gtest/gtest.h>

#include <array>
#include <cmath>
#include <cstdio>
#include <cstdlib>

#include "cuda_ops_fixture.h"

namespace deltaserve::backend {
namespace {

constexpr int kD = 128, kPage = 64;
constexpr float kOutBound = 1.0f / 64, kStateBound = 1.0f / 128;
// A bf16 state (--mamba-ssm-cache-dtype bfloat16) is rounded on both sides: one bf16 ulp more.
constexpr float kBf16StateBound = kStateBound + 1.0f / 256;

struct Seq {
  int32_t n, start;
};

struct Case {
  const char* name;
  std::vector<Seq> seqs;
  int32_t snap_at = 0;  // > 0: the first sequence's state after this many tokens to slot `seqs`
};

StepBatch case_batch(const Case& c) {
  StepBatchBuilder b(kPage);
  int32_t page = 0;
  for (size_t i = 0; i < c.seqs.size(); ++i) {
    const Seq& s = c.seqs[i];
    const int32_t pages = (s.start + s.n + kPage - 1) / kPage;
    b.add(0, std::vector<int32_t>(static_cast<size_t>(s.n), 0), s.start, static_cast<int32_t>(i),
          range(page, pages));
    page += pages;
    if (i == 0 && c.snap_at > 0) b.save_snapshot_at(c.snap_at, static_cast<int32_t>(c.seqs.size()));
  }
  return b.build();
}

class GdnChunk : public CudaOps {
 protected:
  // The prep's paired blocks wherever a key head has two value heads, also for steps whose paired
  // grid would leave SMs idle (in service those take the one-head form): read at the first launch.
  static void SetUpTestSuite() { setenv("DS_GDN_PREP_PAIRS", "1", 1); }
  int nk_ = 2, nv_ = 4;  // key / value heads (a test may change them)

  // Runs one case on both backends with the state in `state_dtype` (f32 or bf16 on both); returns
  // {output error, state error} relative to the scale.
  std::pair<float, float> run(const Case& c, DType state_dtype = DType::kF32) {
    const StepBatch batch = case_batch(c);
    const int T = batch.num_tokens(), C = 2 * nk_ * kD + nv_ * kD;
    const int slots = static_cast<int>(c.seqs.size()) + 1;
    GdnDims d{nk_, nv_, kD, kD, 4};
    auto y = rnd(static_cast<size_t>(T) * C, 40), a = rnd(static_cast<size_t>(T) * nv_, 41),
         bb = rnd(static_cast<size_t>(T) * nv_, 42), dtb = rnd(nv_, 44, 0.5f);
    // Decay rates from ~0.005 to ~0.5 per token: long sequences keep a long memory.
    std::vector<float> alog = deltaserve::testing::random_vec(nv_, 43, 1.5f);
    for (float& x : alog) x -= 2.5f;
    auto st = deltaserve::testing::random_vec(static_cast<size_t>(slots) * nv_ * kD * kD, 45, 0.1f);
    const bool bf16_state = state_dtype == DType::kBF16;
    std::vector<uint16_t> st16(bf16_state ? st.size() : 0);
    for (size_t i = 0; i < st16.size(); ++i) {
      st16[i] = f32_to_bf16(st[i]);
      st[i] = bf16_to_f32(st16[i]);
    }
    auto dy = dev(y, DType::kBF16, {T, C}), da = dev(a, DType::kBF16, {T, nv_}),
         db = dev(bb, DType::kBF16, {T, nv_}), dal = dev(alog, DType::kF32, {nv_}),
         ddt = dev(dtb, DType::kF32, {nv_}), dst = dev(st, state_dtype, {slots, nv_, kD, kD});
    auto dout = gpu_->alloc(DType::kBF16, {T, nv_, kD});
    gpu_->gated_delta_rule(batch, dy.tensor(), da.tensor(), db.tensor(), dal.tensor(), ddt.tensor(),
                           dst.tensor(), d, dout.tensor());
    std::vector<float> out(static_cast<size_t>(T) * nv_ * kD);
    cpu_.gated_delta_rule(
        batch, Tensor(y.data(), DType::kF32, {T, C}), Tensor(a.data(), DType::kF32, {T, nv_}),
        Tensor(bb.data(), DType::kF32, {T, nv_}), Tensor(alog.data(), DType::kF32, {nv_}),
        Tensor(dtb.data(), DType::kF32, {nv_}),
        bf16_state ? Tensor(st16.data(), DType::kBF16, {slots, nv_, kD, kD})
                   : Tensor(st.data(), DType::kF32, {slots, nv_, kD, kD}),
        d, Tensor(out.data(), DType::kF32, {T, nv_, kD}));
    const std::vector<float> got_out = host(dout.tensor()), got_st = host(dst.tensor());
    for (size_t i = 0; i < st16.size(); ++i) st[i] = bf16_to_f32(st16[i]);
    auto rel = [](const std::vector<float>& g, const std::vector<float>& r) {
      const float scale = std::max(1.0f, deltaserve::testing::max_abs(r));
      return deltaserve::testing::max_abs_diff(g.data(), r.data(), g.size()) / scale;
    };
    return {rel(got_out, out), rel(got_st, st)};
  }
  void check(const Case& c, DType state_dtype = DType::kF32) {
    const auto [eo, es] = run(c, state_dtype);
    const bool bf16_state = state_dtype == DType::kBF16;
    std::printf("gdn chunk %-28s %s state: output %.3e state %.3e\n", c.name,
                bf16_state ? "bf16" : "f32", eo, es);
    std::fflush(stdout);
    EXPECT_LE(eo, kOutBound) << c.name << ": output";
    EXPECT_LE(es, bf16_state ? kBf16StateBound : kStateBound)
        << c.name << ": state (every slot, the snapshot's included)";
  }
};

TEST_F(GdnChunk, SingleSequencesFreshAndFromAState) {
  for (int32_t T : {1, 63, 64, 65, 1000, 8192})
    for (int32_t start : {0, 77}) {
      const std::string name = "T=" + std::to_string(T) + (start ? " from a state" : " fresh");
      check(Case{name.c_str(), {{T, start}}});
    }
}

TEST_F(GdnChunk, VarlenMixes) {
  check(Case{"8 x 1024 fresh", std::vector<Seq>(8, Seq{1024, 0})});
  check(
      Case{"mixed lengths and starts", {{1000, 0}, {65, 300}, {1, 40}, {64, 0}, {130, 5}, {1, 0}}});
  check(Case{"decode rows beside a prefill", {{1, 10}, {1, 20}, {200, 0}, {1, 30}}});
  // The state pass's blocks by how many fit an H200's 132 SMs at once: a quarter of a head's
  // columns a block for 8 x 4 heads ("8 x 1024" above), a half for 12 x 4. Chunks' rows past a
  // sequence are the next sequence's.
  std::vector<Seq> twelve;
  for (int i = 0; i < 12; ++i)
    twelve.push_back(
        Seq{std::array{300, 65, 1, 128}[static_cast<size_t>(i % 4)], i % 2 ? 9 * i : 0});
  check(Case{"12 sequences (half heads)", twelve});
  // Enough sequences (x value heads) to fill an H200's 132 SMs: a block a head, the in-step
  // snapshot included.
  std::vector<Seq> many;
  for (int i = 0; i < 40; ++i)
    many.push_back(
        Seq{std::array{70, 1, 130, 64, 200}[static_cast<size_t>(i % 5)], i % 3 == 0 ? 0 : 17 * i});
  check(Case{"40 sequences, snapshot at 64", many, 64});
}

// --mamba-ssm-cache-dtype bfloat16: the decode kernel (T = 1), the chunked pass in both forms and
// the in-step snapshot, reading and writing a bf16 state, against the CPU's bf16 state.
TEST_F(GdnChunk, Bf16State) {
  for (int32_t T : {1, 65, 1000})
    for (int32_t start : {0, 77}) {
      const std::string name = "T=" + std::to_string(T) + (start ? " from a state" : " fresh");
      check(Case{name.c_str(), {{T, start}}}, DType::kBF16);
    }
  std::vector<Seq> many;
  for (int i = 0; i < 40; ++i) many.push_back(Seq{i % 2 == 0 ? 70 : 1, i % 3 == 0 ? 0 : 17 * i});
  check(Case{"40 sequences, snapshot at 64", many, 64}, DType::kBF16);
  check(Case{"snapshot at 128 of 300", {{300, 64}, {70, 0}}, 128}, DType::kBF16);
}

// A key head with one or three value heads: the prep's one-head blocks (two value heads a key
// head take the paired blocks in every other test).
TEST_F(GdnChunk, OddValueHeadsPerKeyHead) {
  for (const auto [nk, nv] : {std::pair{2, 2}, std::pair{1, 3}}) {
    nk_ = nk;
    nv_ = nv;
    check(Case{nk == nv ? "T=1000 fresh, 1 v head a k head" : "T=1000 fresh, 3 v heads a k head",
               {{1000, 0}}});
    check(Case{nk == nv ? "mixed, 1 v head a k head" : "mixed, 3 v heads a k head",
               {{300, 77}, {65, 0}, {1, 40}, {130, 5}}});
  }
}

TEST_F(GdnChunk, InStepSnapshot) {
  check(Case{"snapshot at 128 of 300", {{300, 64}, {70, 0}}, 128});
  check(Case{"snapshot at 64 of 65", {{65, 0}}, 64});
}

}  // namespace
}  // namespace deltaserve::backend
