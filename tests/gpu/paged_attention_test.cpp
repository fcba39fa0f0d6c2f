// Paged attention on the CUDA backend against the CPU's (part of cuda_ops_test): the cache write
// (q / k norm, RoPE) and attention over decode rows (split-KV) and prefill sequences (the
// tensor-core kernel), on bf16 and fp8 e4m3 caches, for several page sizes.
#include <gtest/gtest.h>

#include <cmath>

#include "cuda_ops_fixture.h"

namespace deltaserve::backend {
namespace {

// Two decode tokens at long contexts (positions 1000 and 300): the split-KV path with many splits.
StepBatch long_batch(int ps) {
  return make_batch(ps, {{1, 1000, 0, range(81, 63, -1)}, {1, 300, 1, range(0, 19)}});
}

// Four decode tokens (positions 1000, 300, 130 and 5): from four rows on each split takes at
// least 256 keys, so the short rows leave splits empty.
StepBatch four_rows_batch(int ps) {
  return make_batch(ps, {{1, 1000, 0, range(81, 63, -1)},
                         {1, 300, 1, range(0, 19)},
                         {1, 130, 2, range(82, 9)},
                         {1, 5, 3, {91}}});
}

// Longer prefills across several 128-query tiles (a partial last one): 600 fresh tokens, and 200
// continuing 500 cached (not on a tile boundary), with interleaved pages, next to a decode row.
StepBatch long_prefill_batch(int ps) {
  return make_batch(
      ps, {{600, 0, 0, range(0, 38, 2)}, {200, 500, 1, range(1, 44, 2)}, {1, 40, 2, range(90, 3)}});
}

// A serving step: decode rows first (as the scheduler orders them), then a prefill of 150 tokens:
// the split-KV kernel covers only the leading rows.
StepBatch decode_first_batch(int ps) {
  return make_batch(ps, {{1, 40, 2, {1, 2, 4}}, {1, 9, 1, {0}}, {150, 0, 0, range(5, 10)}});
}

class PagedAttention : public CudaOps {
 protected:
  // Every case below with pages of ps rows: decode rows (split-KV) and prefill sequences
  // (attention_prefill.cuh), on a bf16 or (fp8) an fp8 e4m3 KV cache.
  void run_cases(int ps, bool fp8 = false);
  void run_case(int ps, bool fp8, int nh, int nkv, int hd, int rd, int kind);
};

void PagedAttention::run_cases(int ps, bool fp8) {
  SCOPED_TRACE("page size " + std::to_string(ps) + (fp8 ? ", fp8 cache" : ", bf16 cache"));
  // kind 0: mixed short prefill / decode, 1: long-context decode (split-KV), 2: long prefills
  // (the tensor-core kernel for hd 64 / 128 / 256, after cached positions), 3: longer prefills,
  // 4: decode rows before a prefill, 5: four decode rows (splits of at least 256 keys).
  for (auto [nh, nkv, hd, rd, kind] :
       {std::tuple{4, 2, 256, 64, 0}, std::tuple{4, 2, 32, 16, 0}, std::tuple{16, 4, 256, 64, 0},
        std::tuple{6, 2, 64, 32, 0}, std::tuple{16, 4, 256, 64, 1}, std::tuple{8, 8, 128, 32, 1},
        std::tuple{16, 4, 256, 64, 2}, std::tuple{8, 2, 128, 32, 2}, std::tuple{4, 4, 64, 64, 2},
        std::tuple{8, 2, 256, 64, 3}, std::tuple{4, 2, 128, 32, 3}, std::tuple{16, 4, 256, 64, 4},
        std::tuple{6, 2, 64, 32, 4}, std::tuple{16, 4, 256, 64, 5}, std::tuple{8, 8, 128, 32, 5}}) {
    if (fp8 && hd == 32) continue;  // the fp8 cache write takes head sizes 64 / 128 / 256
    run_case(ps, fp8, nh, nkv, hd, rd, kind);
  }
}

// An fp8 cache written from the same f32 values on both sides: every element within one e4m3 step
// of the CPU's (the f32 norm / RoPE of the two backends differ in the last bits, which flips a
// rounding next to a tie), and at most 1% of them different at all.
void expect_fp8_close(const std::vector<float>& got, const std::vector<float>& ref) {
  ASSERT_EQ(got.size(), ref.size());
  size_t differ = 0, beyond = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    if (got[i] == ref[i]) continue;
    ++differ;
    const float a = std::fabs(ref[i]),
                step = a < 0x1p-6f ? 0x1p-9f : std::exp2(std::floor(std::log2(a)) - 3);
    beyond += std::fabs(got[i] - ref[i]) > step;
  }
  EXPECT_EQ(beyond, 0u) << "k cache elements more than one e4m3 step off";
  EXPECT_LE(differ, got.size() / 100) << "k cache elements rounded differently";
}

void PagedAttention::run_case(int ps, bool fp8, int nh, int nkv, int hd, int rd, int kind) {
  SCOPED_TRACE("hd " + std::to_string(hd) + " kind " + std::to_string(kind));
  const StepBatch batch = kind == 1   ? long_batch(ps)
                          : kind == 2 ? prefill_batch(ps)
                          : kind == 3 ? long_prefill_batch(ps)
                          : kind == 4 ? decode_first_batch(ps)
                          : kind == 5 ? four_rows_batch(ps)
                                      : test_batch(ps);
  const int pages = kind == 1   ? 82
                    : kind == 2 ? 21
                    : kind == 3 ? 93
                    : kind == 4 ? 15
                    : kind == 5 ? 92
                                : 12;
  const int T = batch.num_tokens();
  AttnDims d{nh, nkv, hd, rd, 1e6, 1e-6f};
  auto qg = rnd(static_cast<size_t>(T) * nh * 2 * hd, 20),
       k = rnd(static_cast<size_t>(T) * nkv * hd, 21),
       v = rnd(static_cast<size_t>(T) * nkv * hd, 22), qn = rnd(hd, 23, 0.3f),
       kn = rnd(hd, 24, 0.3f);
  const size_t cache = static_cast<size_t>(pages) * ps * nkv * hd;
  // Earlier positions of sequences 1 and 2 are already in the caches (same values on both sides).
  auto kc = rnd(cache, 25), vc = rnd(cache, 26);
  const DType kv = fp8 ? DType::kFP8E4M3 : DType::kBF16;
  std::vector<uint8_t> kc8(fp8 ? cache : 0), vc8(kc8.size());  // the CPU's fp8 caches
  for (size_t i = 0; i < kc8.size(); ++i) {
    kc8[i] = f32_to_fp8e4m3(kc[i]);
    vc8[i] = f32_to_fp8e4m3(vc[i]);
  }
  auto dqg = dev(qg, DType::kBF16, {T, nh * 2 * hd}), dk = dev(k, DType::kBF16, {T, nkv, hd}),
       dv = dev(v, DType::kBF16, {T, nkv, hd}), dqn = dev(qn, DType::kF32, {hd}),
       dkn = dev(kn, DType::kF32, {hd}), dkc = dev(kc, kv, {pages, ps, nkv, hd}),
       dvc = dev(vc, kv, {pages, ps, nkv, hd});
  auto dq = gpu_->alloc(DType::kBF16, {T, nh, hd}), dgate = gpu_->alloc(DType::kBF16, {T, nh, hd}),
       dout = gpu_->alloc(DType::kBF16, {T, nh, hd});
  gpu_->attn_prep_and_cache(batch, dqg.tensor(), dk.tensor(), dv.tensor(), dqn.tensor(),
                            dkn.tensor(), d, dq.tensor(), dgate.tensor(), dkc.tensor(),
                            dvc.tensor());
  gpu_->paged_attention(batch, dq.tensor(), dgate.tensor(), dkc.tensor(), dvc.tensor(), d,
                        dout.tensor());
  // The model's form: the gates read in place from qg's second halves, the same outputs exactly.
  auto dout_qg = gpu_->alloc(DType::kBF16, {T, nh, hd});
  poison(dout_qg.tensor());
  gpu_->paged_attention(batch, dq.tensor(), dqg.tensor(), dkc.tensor(), dvc.tensor(), d,
                        dout_qg.tensor());
  expect_close(host(dout_qg.tensor()), host(dout.tensor()), 0.0f, "attention, gates in qg");
  std::vector<float> q(static_cast<size_t>(T) * nh * hd), gate(q.size()), out(q.size());
  const Tensor ckc = fp8 ? Tensor(kc8.data(), kv, {pages, ps, nkv, hd})
                         : Tensor(kc.data(), DType::kF32, {pages, ps, nkv, hd});
  const Tensor cvc = fp8 ? Tensor(vc8.data(), kv, {pages, ps, nkv, hd})
                         : Tensor(vc.data(), DType::kF32, {pages, ps, nkv, hd});
  cpu_.attn_prep_and_cache(
      batch, Tensor(qg.data(), DType::kF32, {T, nh * 2 * hd}),
      Tensor(k.data(), DType::kF32, {T, nkv, hd}), Tensor(v.data(), DType::kF32, {T, nkv, hd}),
      Tensor(qn.data(), DType::kF32, {hd}), Tensor(kn.data(), DType::kF32, {hd}), d,
      Tensor(q.data(), DType::kF32, {T, nh, hd}), Tensor(gate.data(), DType::kF32, {T, nh, hd}),
      ckc, cvc);
  std::vector<float> ref_kc(cache), ref_vc(cache), gpu_kc = host(dkc.tensor());
  convert_to_f32(fp8 ? kv : DType::kF32, ckc.data, ref_kc.data(), cache);
  convert_to_f32(fp8 ? kv : DType::kF32, cvc.data, ref_vc.data(), cache);
  // fp8: the CPU's attention reads the GPU's cache (widened exactly), so that a rounding flip
  // next to a tie in the cache write does not count twice.
  cpu_.paged_attention(batch, Tensor(q.data(), DType::kF32, {T, nh, hd}),
                       Tensor(gate.data(), DType::kF32, {T, nh, hd}),
                       fp8 ? Tensor(gpu_kc.data(), DType::kF32, {pages, ps, nkv, hd}) : ckc,
                       fp8 ? Tensor(ref_vc.data(), DType::kF32, {pages, ps, nkv, hd}) : cvc, d,
                       Tensor(out.data(), DType::kF32, {T, nh, hd}));
  expect_close(host(dq.tensor()), q, 1e-2f, "q after norm + rope");
  if (fp8)
    expect_fp8_close(gpu_kc, ref_kc);
  else
    expect_close(gpu_kc, ref_kc, 1e-2f, "k cache");
  expect_close(host(dvc.tensor()), ref_vc, 0.0f, "v cache");
  expect_close(host(dout.tensor()), out, 1e-2f, "paged attention");
}

TEST_F(PagedAttention, DecodeRowsAndPrefillSequences) { run_cases(16); }

// The prefill kernel's page lookups (by multiply-high) where a page is larger than its 64-key tiles
// and where pages neither divide nor are a multiple of 64 (a tile's rows straddle pages unevenly).
TEST_F(PagedAttention, PageSizesAroundTheKeyTile) {
  for (int ps : {128, 24}) run_cases(ps);
}

// --kv-cache-dtype fp8: the same cases on e4m3 caches (the cache write rounds on the GPU as on the
// CPU; both attention kernels widen the tiles they read).
TEST_F(PagedAttention, Fp8CacheMatchesTheCpu) {
  for (int ps : {16, 24}) run_cases(ps, true);
}

}  // namespace
}  // namespace deltaserve::backend
