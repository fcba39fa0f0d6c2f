// The fused GDN layer paths of CudaBackend::gdn_mixer against its three unfused GPU ops (gdn_conv,
// gated_delta_rule, gated_rms_norm) on copies of the same inputs and caches, for 1 to 4 value heads
// per key head and both state dtypes:
// - decode (one token per sequence, one of them fresh): the fused decode kernel, in its three forms
//   (a cluster of column-quarter blocks a key head for one sequence at up to two value heads a key
//   head, else two value heads a block; one for many);
// - prefill (sequences fresh and continued, shorter and longer than a chunk, a decode row among
//   them): the conv inside the chunked delta rule's prep, the conv state read for the rows before a
//   continued sequence's first step token (registered again as gdn_mixer_test_fused, with
//   DS_GDN_FUSED=1: the conv kernel into y from the first prefill row on, then the fused chunk
//   kernel);
// - a mixed step (decode rows first): those rows on the fused decode kernel, the rest chunked —
//   with few prefill sequences on quarter-head state-pass blocks, with five at 32 value heads on
//   whole-head blocks (the norm kernel after the pass, over the rows past the decode rows);
// - one prefill sequence, alone and behind decode rows (an 8k prompt's steps).
// Bounds: the output within bf16 rounding, the conv state exactly, the recurrent state within f32
// rounding (one bf16 ulp for a bf16 state).
#include <gtest/gtest.h>

#include <cstdlib>
#include <string>
#include <utility>

#include "cuda_ops_fixture.h"

namespace deltaserve::backend {
namespace {

constexpr int kPage = 16, kSlots = 10;

StepBatch decode_step() {
  return make_batch(kPage, {{1, 7, 2, {1}}, {1, 0, 0, {2}}, {1, 30, 1, {3, 4}}});
}

// Chunk edges (64, 65, 130 tokens), a continued sequence shorter than the conv window's halo (2
// tokens after 5) and one token of decode.
StepBatch prefill_step() {
  return make_batch(kPage, {{130, 0, 0, range(0, 9)},
                            {65, 37, 1, range(9, 7)},
                            {2, 5, 2, {16}},
                            {1, 40, 3, range(17, 3)},
                            {64, 0, 4, range(20, 4)}});
}

// A serving step: decode rows first (a continued one and a fresh one-token prompt: the fused
// decode kernel's), then prefill chunks and a later decode row (the chunked rule's). Its reference
// is the unfused ops on the two parts as steps of their own: the decode rows as a decode step (the
// recurrent rule, exact in f32), the rest as a prefill step.
const std::vector<SeqSpec> kMixedDecodeRows = {{1, 40, 3, range(17, 3)}, {1, 0, 1, {9}}};
const std::vector<SeqSpec> kMixedPrefill = {
    {130, 0, 0, range(0, 9)}, {2, 5, 2, {16}}, {1, 20, 4, range(20, 2)}};

class GdnMixer : public CudaOps {
 protected:
  // The unfused ops' delta rule on the prep kernel + state pass, as the fused mixer runs it (steps
  // of many sequences would otherwise take gdn_chunk_fused.cu, a different rounding of the same
  // math, checked against the CPU by gdn_chunk_test): read at the first launch. Registered again
  // with DS_GDN_FUSED=1 (left as set): then both sides take the fused chunk kernel for every
  // prefill part, the mixer with the conv kernel into y first, as steps of many sequences run.
  static void SetUpTestSuite() { setenv("DS_GDN_FUSED", "0", 0); }
  // The fused gdn_mixer on `batch` against the unfused ops on `parts` (steps of consecutive row
  // ranges of the batch, in order; the batch itself by default).
  void check_fused_against_ops(const StepBatch& batch, const std::vector<StepBatch>& parts = {},
                               int32_t slots = kSlots) {
    const int K = 4, dk = 128, dv = 128, T = batch.num_tokens();
    for (auto [nk, nv] : {std::pair{16, 32}, std::pair{2, 6}, std::pair{4, 4}, std::pair{1, 4}})
      for (DType sdt : {DType::kF32, DType::kBF16}) {
        const int C = 2 * nk * dk + nv * dv;
        const GdnDims d{nk, nv, dk, dv, K};
        const auto u = rnd(static_cast<size_t>(T) * C, 40), w = rnd(static_cast<size_t>(C) * K, 41),
                   cs = rnd(static_cast<size_t>(slots) * C * (K - 1), 42),
                   a = rnd(static_cast<size_t>(T) * nv, 43),
                   bb = rnd(static_cast<size_t>(T) * nv, 44), alog = rnd(nv, 45, 0.5f),
                   dtb = rnd(nv, 46, 0.5f), z = rnd(static_cast<size_t>(T) * nv * dv, 47),
                   nw = rnd(dv, 48), st = rnd(static_cast<size_t>(slots) * nv * dk * dv, 49, 0.1f);
        struct Run {
          Buffer u, w, cs, a, b, alog, dtb, z, nw, st, y, o;
        };
        const auto make = [&] {
          return Run{dev(u, DType::kBF16, {T, C}),
                     dev(w, DType::kBF16, {C, K}),
                     dev(cs, DType::kBF16, {slots, C, K - 1}),
                     dev(a, DType::kBF16, {T, nv}),
                     dev(bb, DType::kBF16, {T, nv}),
                     dev(alog, DType::kF32, {nv}),
                     dev(dtb, DType::kF32, {nv}),
                     dev(z, DType::kBF16, {T, nv * dv}),
                     dev(nw, DType::kF32, {dv}),
                     dev(st, sdt, {slots, nv, dk, dv}),
                     gpu_->alloc(DType::kBF16, {T, C}),
                     gpu_->alloc(DType::kBF16, {T, nv, dv})};
        };
        Run fused = make(), ops = make();
        // Rows [r0, r1) of the per-token tensors.
        const auto tensors = [](const Run& r, int64_t r0, int64_t r1) {
          return GdnMixerTensors{r.u.tensor().rows(r0, r1),
                                 r.y.tensor().rows(r0, r1),
                                 r.a.tensor().rows(r0, r1),
                                 r.b.tensor().rows(r0, r1),
                                 r.z.tensor().rows(r0, r1),
                                 r.o.tensor().rows(r0, r1),
                                 r.w.tensor(),
                                 r.alog.tensor(),
                                 r.dtb.tensor(),
                                 r.nw.tensor(),
                                 r.cs.tensor(),
                                 r.st.tensor()};
        };
        gpu_->gdn_mixer(batch, tensors(fused, 0, T), d, 1e-6f);
        int64_t row = 0;  // the three unfused ops, part by part
        for (const StepBatch& part : parts.empty() ? std::vector<StepBatch>{batch} : parts) {
          gpu_->Backend::gdn_mixer(part, tensors(ops, row, row + part.num_tokens()), d, 1e-6f);
          row += part.num_tokens();
        }
        ASSERT_EQ(row, T);
        const std::string what = "nk " + std::to_string(nk) + " nv " + std::to_string(nv) +
                                 (sdt == DType::kBF16 ? " bf16 state" : " f32 state");
        SCOPED_TRACE(what);
        const std::vector<float> want = host(ops.o.tensor());
        ASSERT_GT(deltaserve::testing::max_abs(want), 0.1f);
        expect_close(host(fused.o.tensor()), want, 2e-2f, "output");
        expect_close(host(fused.cs.tensor()), host(ops.cs.tensor()), 0.0f, "conv state");
        expect_close(host(fused.st.tensor()), host(ops.st.tensor()),
                     sdt == DType::kBF16 ? 1.0f / 128 : 1e-5f, "recurrent state");
      }
  }

  // A mixed step of `decode_rows` then `prefill` against the unfused ops on those two parts.
  void check_mixed(const std::vector<SeqSpec>& decode_rows, const std::vector<SeqSpec>& prefill) {
    std::vector<SeqSpec> all = decode_rows;
    all.insert(all.end(), prefill.begin(), prefill.end());
    check_fused_against_ops(make_batch(kPage, all),
                            {make_batch(kPage, decode_rows), make_batch(kPage, prefill)});
  }
};

// Three sequences: the cluster form at nk = 4 (an H200's 132 SMs hold 8 x 3 x 4 blocks), the
// two-heads-a-block form at the other shapes.
TEST_F(GdnMixer, FusedDecodeMatchesUnfusedOps) { check_fused_against_ops(decode_step()); }

// One sequence, fresh, then continued: the cluster form at nv <= 2 nk (16 key heads included),
// the two-heads-a-block form at nv = 3 nk and 4 nk.
TEST_F(GdnMixer, FusedDecodeOfOneSequenceMatchesUnfusedOps) {
  check_fused_against_ops(make_batch(kPage, {{1, 0, 1, {5}}}));
  check_fused_against_ops(make_batch(kPage, {{1, 30, 2, {3, 4}}}));
}

// Ten sequences x 16 key heads: a grid past an H200's 132 SMs, where the decode kernel runs a value
// head a block.
TEST_F(GdnMixer, FusedDecodeOfManySequencesMatchesUnfusedOps) {
  std::vector<SeqSpec> rows;
  for (int32_t i = 0; i < kSlots; ++i) rows.push_back({1, i, i, {i}});  // the first one fresh
  check_fused_against_ops(make_batch(kPage, rows));
}

// 72 sequences (every sixteenth fresh): grids of several waves at nk = 16 (1,152 blocks of a value
// head), 4 and 2.
TEST_F(GdnMixer, FusedDecodeOfManySequencesInWavesMatchesUnfusedOps) {
  constexpr int32_t kSeqs = 72;
  std::vector<SeqSpec> rows;
  for (int32_t i = 0; i < kSeqs; ++i) rows.push_back({1, i % 16, i, {i}});
  check_fused_against_ops(make_batch(kPage, rows), {}, kSeqs);
}

TEST_F(GdnMixer, FusedPrefillMatchesUnfusedOps) { check_fused_against_ops(prefill_step()); }

TEST_F(GdnMixer, MixedStepMatchesUnfusedOpsOnItsParts) {
  check_mixed(kMixedDecodeRows, kMixedPrefill);
}

// One prefill sequence (an 8k prompt's step), fresh and continued, across chunk edges: quarter-head
// state-pass blocks, the norm kernel after them.
TEST_F(GdnMixer, PrefillOfOneSequenceMatchesUnfusedOps) {
  check_fused_against_ops(make_batch(kPage, {{300, 0, 0, range(0, 19)}}));
  check_fused_against_ops(make_batch(kPage, {{200, 37, 1, range(19, 15)}}));
}

// A serving step's chunk of one long prompt behind decode rows: the norm's rows start past them.
TEST_F(GdnMixer, MixedStepOfOnePrefillSequenceMatchesUnfusedOpsOnItsParts) {
  check_mixed(kMixedDecodeRows, {{200, 37, 5, range(30, 15)}});
}

// Five prefill sequences x 32 value heads fill an H200's (or H100's) 132 SMs: whole-head blocks.
TEST_F(GdnMixer, MixedStepOnTheHeadPassMatchesUnfusedOps) {
  check_mixed({{1, 40, 3, range(40, 3)}, {1, 0, 1, {43}}}, {{70, 0, 0, range(0, 5)},
                                                            {65, 37, 2, range(5, 7)},
                                                            {2, 5, 4, {12}},
                                                            {64, 0, 5, range(13, 4)},
                                                            {3, 0, 6, {17}}});
}

}  // namespace
}  // namespace deltaserve::backend
