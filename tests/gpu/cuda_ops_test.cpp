// Every implemented CUDA op against its CPU twin on random inputs (label gpu: skipped where no GPU
// is visible). Inputs are rounded to bf16 first so both backends see the same values; outputs are
// compared at bf16 resolution.
#include <cuda_runtime.h>
#include <gtest/gtest.h>
#include <stdlib.h>

#include "backend/cpu/cpu_backend.h"
#include "backend/cuda/cuda_backend.h"
#include "core/error.h"
#include "cuda_ops_fixture.h"

namespace deltaserve::backend {
namespace {

// n % 8 == 0 takes the 16-byte vector kernels, other n the scalar one; decode-sized steps (37 rows)
// the block-a-row kernels with early weights, prefill-sized ones (1030) the warp-a-row norm (n up
// to 4096) or the block-a-row kernels with late weights.
TEST_F(CudaOps, RmsNormAndAddRmsNorm) {
  for (const auto [rows, n] :
       {std::pair{37, 2560}, std::pair{37, 2555}, std::pair{1030, 2560}, std::pair{1030, 4096},
        std::pair{1030, 1000}, std::pair{1030, 5120}, std::pair{1030, 2555}}) {
    SCOPED_TRACE(std::to_string(rows) + " x " + std::to_string(n));
    auto x = rnd(rows * n, 1), r = rnd(rows * n, 2), w = rnd(n, 3, 0.3f);
    auto dx = dev(x, DType::kBF16, {rows, n}), dr = dev(r, DType::kBF16, {rows, n}),
         dw = dev(w, DType::kF32, {n});
    auto dout = gpu_->alloc(DType::kBF16, {rows, n});
    std::vector<float> ref(x.size());
    gpu_->rms_norm(dx.tensor(), dw.tensor(), 1e-6f, dout.tensor());
    cpu_.rms_norm(Tensor(x.data(), DType::kF32, {rows, n}), Tensor(w.data(), DType::kF32, {n}),
                  1e-6f, Tensor(ref.data(), DType::kF32, {rows, n}));
    expect_close(host(dout.tensor()), ref, 1e-2f, "rms_norm");
    // Fused residual add: the residual is rounded to bf16 on the GPU, so compare with that.
    gpu_->add_rms_norm(dr.tensor(), dx.tensor(), dw.tensor(), 1e-6f, dout.tensor());
    std::vector<float> res = r;
    for (size_t i = 0; i < res.size(); ++i) res[i] = bf16_to_f32(f32_to_bf16(res[i] + x[i]));
    std::vector<float> zero(x.size(), 0.0f);
    cpu_.add_rms_norm(
        Tensor(res.data(), DType::kF32, {rows, n}), Tensor(zero.data(), DType::kF32, {rows, n}),
        Tensor(w.data(), DType::kF32, {n}), 1e-6f, Tensor(ref.data(), DType::kF32, {rows, n}));
    expect_close(host(dr.tensor()), res, 0.0f, "residual");
    expect_close(host(dout.tensor()), ref, 1e-2f, "add_rms_norm");
  }
}

// K % 8 == 0 and T <= 8, or T <= 16 with n >= 48 tiles of 128 rows, takes the weight-streaming
// GEMM (tiles whole in a block and shared between blocks; K and n past a tile's edge; n % 4 != 0),
// the rest cuBLASLt (a lone projection from 17 tokens on). Each case runs twice, on a poisoned
// output: bit for bit the same result (the GEMM adds a tile's partials in a fixed order, and its
// tile counters are back to zero after a launch).
TEST_F(CudaOps, LinearGemvAndCublasLt) {
  for (auto [T, in, out] :
       {std::tuple{1, 2560, 9216},  std::tuple{3, 9216, 2560},  std::tuple{8, 2560, 32},
        std::tuple{5, 264, 77},     std::tuple{2, 100, 50},     std::tuple{9, 2560, 1000},
        std::tuple{17, 256, 384},   std::tuple{64, 9216, 2560}, std::tuple{16, 4096, 2560},
        std::tuple{33, 2560, 8192}, std::tuple{40, 2560, 32},   std::tuple{64, 2560, 40000},
        std::tuple{12, 2560, 1000}, std::tuple{20, 100, 50},    std::tuple{130, 1024, 2560},
        std::tuple{16, 264, 777},   std::tuple{13, 2600, 72},   std::tuple{16, 2560, 248320 / 16},
        std::tuple{16, 264, 6200},  std::tuple{5, 2600, 6150},  std::tuple{24, 2600, 6150},
        std::tuple{32, 2560, 9216}, std::tuple{49, 264, 6200}}) {
    auto x = rnd(static_cast<size_t>(T) * in, 4), w = rnd(static_cast<size_t>(out) * in, 5, 0.05f);
    auto dx = dev(x, DType::kBF16, {T, in}), dw = dev(w, DType::kBF16, {out, in});
    auto dy = gpu_->alloc(DType::kBF16, {T, out});
    std::vector<float> ref(static_cast<size_t>(T) * out);
    cpu_.linear(Tensor(x.data(), DType::kF32, {T, in}), Tensor(w.data(), DType::kF32, {out, in}),
                Tensor(ref.data(), DType::kF32, {T, out}));
    SCOPED_TRACE("T " + std::to_string(T) + " in " + std::to_string(in) + " out " +
                 std::to_string(out));
    std::vector<float> first;
    for (int run = 0; run < 2; ++run) {
      poison(dy.tensor());
      gpu_->linear(dx.tensor(), dw.tensor(), dy.tensor());
      const std::vector<float> got = host(dy.tensor());
      expect_close(got, ref, 1e-2f, "linear");
      if (run == 0)
        first = got;
      else
        EXPECT_EQ(got, first) << "a second run differs";
    }
  }
}

// A row-parallel projection added into the residual stream and normalised, against the CPU's
// linear + add_rms_norm in f32: up to 8 tokens (run at 1, 8) the weight-streaming GEMM summing its
// split tiles into the scratch, then the fused add + norm; from 9 to 32 tokens (16) the GEMM's
// partials summed by the add + norm kernel; above (20 tiles of 128 rows: cuBLASLt; 64, 300) the
// GEMM adding into the residual itself (beta = 1), then the norm alone. The scratch holds nothing
// the result needs.
TEST_F(CudaOps, LinearAddRmsNorm) {
  const int in = 4096, H = 2560;
  for (int T : {1, 8, 16, 64, 300}) {
    SCOPED_TRACE("T " + std::to_string(T));
    auto x = rnd(static_cast<size_t>(T) * in, 80), w = rnd(static_cast<size_t>(H) * in, 81, 0.05f),
         r = rnd(static_cast<size_t>(T) * H, 82), nw = rnd(H, 83, 0.3f);
    auto dx = dev(x, DType::kBF16, {T, in}), dw = dev(w, DType::kBF16, {H, in}),
         dr = dev(r, DType::kBF16, {T, H}), dnw = dev(nw, DType::kF32, {H});
    auto dout = gpu_->alloc(DType::kBF16, {T, H}), scratch = gpu_->alloc(DType::kBF16, {T, H});
    poison(dout.tensor());
    poison(scratch.tensor());
    gpu_->linear_add_rms_norm(dx.tensor(), dw.tensor(), dr.tensor(), dnw.tensor(), 1e-6f,
                              dout.tensor(), scratch.tensor());
    std::vector<float> y(static_cast<size_t>(T) * H), ref(y.size());
    cpu_.linear(Tensor(x.data(), DType::kF32, {T, in}), Tensor(w.data(), DType::kF32, {H, in}),
                Tensor(y.data(), DType::kF32, {T, H}));
    cpu_.add_rms_norm(Tensor(r.data(), DType::kF32, {T, H}), Tensor(y.data(), DType::kF32, {T, H}),
                      Tensor(nw.data(), DType::kF32, {H}), 1e-6f,
                      Tensor(ref.data(), DType::kF32, {T, H}));
    ASSERT_GT(deltaserve::testing::max_abs(y), 1.0f);  // the projection moves the residual
    expect_close(host(dr.tensor()), r, 1e-2f, "residual");
    expect_close(host(dout.tensor()), ref, 1e-2f, "normalised");
  }
}

// cuBLASLt's GEMMs tuned (Backend::set_linear_tuning) on a first call of each shape: that call's
// outputs are garbage (the candidates ran on them), the calls after it compute the projection as
// the CPU does — plain (the first 1,024 rows), and added into the residual stream then normalised
// (all 1,100 rows: a shape of its own, tuned adding into the residual).
TEST_F(CudaOps, TunedCublasLtGemmsMatchTheCpu) {
  if (!gpu_->tunes_linears()) GTEST_SKIP() << "GEMM tuning is off (DS_GEMM_TUNE=0)";
  const int T = 1100, kPlain = 1024, in = 4096, out = 2560;
  auto x = rnd(static_cast<size_t>(T) * in, 90), w = rnd(static_cast<size_t>(out) * in, 91, 0.05f),
       r = rnd(static_cast<size_t>(T) * out, 92), nw = rnd(out, 93, 0.3f);
  const std::vector<float> r0 = r;  // the CPU's add_rms_norm adds into r
  auto dx = dev(x, DType::kBF16, {T, in}), dw = dev(w, DType::kBF16, {out, in}),
       dr = dev(r, DType::kBF16, {T, out}), dnw = dev(nw, DType::kF32, {out});
  auto dy = gpu_->alloc(DType::kBF16, {T, out}), dout = gpu_->alloc(DType::kBF16, {T, out});
  std::vector<float> y(static_cast<size_t>(T) * out), ref(y.size());
  cpu_.linear(Tensor(x.data(), DType::kF32, {T, in}), Tensor(w.data(), DType::kF32, {out, in}),
              Tensor(y.data(), DType::kF32, {T, out}));
  const std::vector<float> plain = y;
  cpu_.add_rms_norm(Tensor(r.data(), DType::kF32, {T, out}),
                    Tensor(y.data(), DType::kF32, {T, out}), Tensor(nw.data(), DType::kF32, {out}),
                    1e-6f, Tensor(ref.data(), DType::kF32, {T, out}));
  const auto add_norm = [&] {
    gpu_->linear_add_rms_norm(dx.tensor(), dw.tensor(), dr.tensor(), dnw.tensor(), 1e-6f,
                              dout.tensor(), dy.tensor());
  };
  const auto linear = [&] {
    gpu_->linear(dx.tensor().rows(0, kPlain), dw.tensor(), dy.tensor().rows(0, kPlain));
  };
  gpu_->set_linear_tuning(backend::Backend::kMinTunedRows);
  linear();
  add_norm();
  gpu_->set_linear_tuning(0);
  poison(dy.tensor());
  linear();
  const std::vector<float> got = host(dy.tensor());
  expect_close(std::vector<float>(got.begin(), got.begin() + static_cast<size_t>(kPlain) * out),
               std::vector<float>(plain.begin(), plain.begin() + static_cast<size_t>(kPlain) * out),
               1e-2f, "tuned linear");
  gpu_->upload(DType::kF32, r0.data(), r0.size(), dr.tensor());  // the tuning call added into it
  poison(dout.tensor());
  add_norm();
  expect_close(host(dout.tensor()), ref, 1e-2f, "tuned linear + add + norm");
}

// An output the weight-streaming GEMM cannot store (not 8-byte aligned) takes the GEMV kernel.
TEST_F(CudaOps, LinearFallsBackToGemvForUnalignedOutput) {
  const int in = 2560, out = 77;
  for (int T : {1, 3, 8}) {
    auto x = rnd(static_cast<size_t>(T) * in, 70),
         w = rnd(static_cast<size_t>(out) * in, 71, 0.05f);
    auto dx = dev(x, DType::kBF16, {T, in}), dw = dev(w, DType::kBF16, {out, in});
    auto dy = gpu_->alloc(DType::kBF16, {T + 1, out});
    const Tensor y = dy.tensor().rows(1, T + 1);  // 154 bytes in
    std::vector<float> ref(static_cast<size_t>(T) * out);
    cpu_.linear(Tensor(x.data(), DType::kF32, {T, in}), Tensor(w.data(), DType::kF32, {out, in}),
                Tensor(ref.data(), DType::kF32, {T, out}));
    SCOPED_TRACE("T " + std::to_string(T));
    poison(dy.tensor());
    gpu_->linear(dx.tensor(), dw.tensor(), y);
    expect_close(host(y), ref, 1e-2f, "linear (GEMV)");
  }
}

// Projections of one input in one launch: the grouped weight-streaming GEMM (its 16-, 32- and
// 64-token forms: the group holds narrow projections) up to 64 tokens; separate GEMMs above.
TEST_F(CudaOps, LinearMulti) {
  for (int T : {1, 5, 12, 16, 17, 32, 64, 65}) {
    const int in = 2560;
    const std::vector<int> outs{8192, 1024, 32, 2600};
    auto x = rnd(static_cast<size_t>(T) * in, 60);
    auto dx = dev(x, DType::kBF16, {T, in});
    std::vector<Buffer> dw, dy;
    std::vector<std::vector<float>> w;
    std::vector<const Tensor*> ws, ys;
    for (size_t i = 0; i < outs.size(); ++i) {
      w.push_back(rnd(static_cast<size_t>(outs[i]) * in, 61 + static_cast<uint32_t>(i), 0.05f));
      dw.push_back(dev(w.back(), DType::kBF16, {outs[i], in}));
      dy.push_back(gpu_->alloc(DType::kBF16, {T, outs[i]}));
    }
    for (size_t i = 0; i < outs.size(); ++i) {
      ws.push_back(&dw[i].tensor());
      ys.push_back(&dy[i].tensor());
    }
    gpu_->linear_multi(dx.tensor(), ws, ys);
    for (size_t i = 0; i < outs.size(); ++i) {
      std::vector<float> ref(static_cast<size_t>(T) * outs[i]);
      cpu_.linear(Tensor(x.data(), DType::kF32, {T, in}),
                  Tensor(w[i].data(), DType::kF32, {outs[i], in}),
                  Tensor(ref.data(), DType::kF32, {T, outs[i]}));
      expect_close(host(dy[i].tensor()), ref, 1e-2f, "linear_multi");
    }
  }
}

// Two projections of one width whose weights share an allocation (the GDN b / a, attention k / v):
// one batched GEMM past the weight-streaming GEMM's sizes where the outputs lie in the weights'
// order (either way round), a GEMM each where they do not.
TEST_F(CudaOps, LinearMultiPairs) {
  const int in = 2560;
  for (int n : {32, 1024})
    for (int T : {17, 65, 300})
      for (int order = 0; order < 3; ++order) {
        auto x = rnd(static_cast<size_t>(T) * in, 80), w = rnd(2u * n * in, 81, 0.05f);
        auto dx = dev(x, DType::kBF16, {T, in}), dw = dev(w, DType::kBF16, {2 * n, in});
        auto dy = gpu_->alloc(DType::kBF16, {2 * T, n});
        poison(dy.tensor());
        const Tensor w0 = dw.tensor().rows(0, n), w1 = dw.tensor().rows(n, 2 * n);
        const Tensor y0 = dy.tensor().rows(0, T), y1 = dy.tensor().rows(T, 2 * T);
        // 0: in order; 1: both reversed; 2: the outputs crossed (no batch).
        const Tensor* ws[2] = {order == 1 ? &w1 : &w0, order == 1 ? &w0 : &w1};
        const Tensor* ys[2] = {order == 0 ? &y0 : &y1, order == 0 ? &y1 : &y0};
        gpu_->linear_multi(dx.tensor(), ws, ys);
        SCOPED_TRACE("n " + std::to_string(n) + " T " + std::to_string(T) + " order " +
                     std::to_string(order));
        for (int i = 0; i < 2; ++i) {
          std::vector<float> ref(static_cast<size_t>(T) * n);
          const size_t first = (ws[i] == &w0 ? 0u : 1u) * n * in;
          cpu_.linear(Tensor(x.data(), DType::kF32, {T, in}),
                      Tensor(w.data() + first, DType::kF32, {n, in}),
                      Tensor(ref.data(), DType::kF32, {T, n}));
          expect_close(host(*ys[i]), ref, 1e-2f, "linear_multi pair");
        }
      }
}

TEST_F(CudaOps, EmbeddingGatherSiluMulGatedNorm) {
  const int V = 300, H = 256, T = 9;
  auto table = rnd(V * H, 6);
  std::vector<int32_t> ids{0,   299, 5,   5, -1,
                           123, 1,   250, 42};  // -1: a zero row (vocabulary-parallel)
  auto dt = dev(table, DType::kBF16, {V, H});
  auto did = gpu_->alloc(DType::kI32, {T});
  gpu_->upload_i32(ids.data(), did.tensor());
  auto de = gpu_->alloc(DType::kBF16, {T, H});
  gpu_->embedding(did.tensor(), dt.tensor(), de.tensor());
  std::vector<float> ref(static_cast<size_t>(T) * H);
  cpu_.embedding(Tensor(ids.data(), DType::kI32, {T}), Tensor(table.data(), DType::kF32, {V, H}),
                 Tensor(ref.data(), DType::kF32, {T, H}));
  expect_close(host(de.tensor()), ref, 0.0f, "embedding");
  gpu_->gather_rows(dt.tensor(), did.tensor(), de.tensor());
  expect_close(host(de.tensor()), ref, 0.0f, "gather_rows");

  // 5000: vectors of 8 only; 5003: a scalar tail after them.
  for (const int n : {5000, 5003}) {
    auto g = rnd(n, 7, 3.0f), u = rnd(n, 8);
    auto dg = dev(g, DType::kBF16, {n}), du = dev(u, DType::kBF16, {n});
    auto dm = gpu_->alloc(DType::kBF16, {n});
    gpu_->silu_mul(dg.tensor(), du.tensor(), dm.tensor());
    std::vector<float> sm(n);
    cpu_.silu_mul(Tensor(g.data(), DType::kF32, {n}), Tensor(u.data(), DType::kF32, {n}),
                  Tensor(sm.data(), DType::kF32, {n}));
    expect_close(host(dm.tensor()), sm, 1e-2f, "silu_mul");
  }

  // dv 64 / 128 / 256: lanes per head row (rows past a block's end), 80: a block per row.
  for (const int dv : {128, 64, 256, 80}) {
    SCOPED_TRACE(dv);
    const int T = 7, nv = 4, rows = T * nv;
    auto o = rnd(static_cast<size_t>(rows) * dv, 9), z = rnd(static_cast<size_t>(rows) * dv, 10),
         w = rnd(dv, 11);
    auto dout = dev(o, DType::kBF16, {T, nv, dv}), dz = dev(z, DType::kBF16, {T, nv * dv}),
         dw = dev(w, DType::kF32, {dv});
    gpu_->gated_rms_norm(dout.tensor(), dz.tensor(), dw.tensor(), 1e-6f);
    cpu_.gated_rms_norm(Tensor(o.data(), DType::kF32, {T, nv, dv}),
                        Tensor(z.data(), DType::kF32, {T, nv * dv}),
                        Tensor(w.data(), DType::kF32, {dv}), 1e-6f);
    expect_close(host(dout.tensor()), o, 1e-2f, "gated_rms_norm");
  }
}

// A decode-only step (one token per sequence; one of them fresh): the delta rule's dv = 128 path.
StepBatch decode_batch(int ps) {
  return make_batch(ps, {{1, 7, 2, {1}}, {1, 0, 0, {2}}, {1, 30, 1, {3, 4}}});
}

TEST_F(CudaOps, GdnConvAndDeltaRule) {
  const int K = 4;
  // kind 0: mixed prefill/decode (short), 1: decode only, 2: long prefills (several chunks).
  for (auto [nk, nv, dk, dv, kind] :
       {std::tuple{2, 4, 128, 128, 0}, std::tuple{2, 4, 16, 24, 0}, std::tuple{1, 3, 256, 80, 0},
        std::tuple{16, 32, 128, 128, 0}, std::tuple{16, 32, 128, 128, 1},
        std::tuple{2, 4, 256, 128, 1}, std::tuple{2, 4, 16, 24, 1}, std::tuple{16, 32, 128, 128, 2},
        std::tuple{2, 4, 16, 24, 2}, std::tuple{1, 2, 128, 80, 2},
        std::tuple{1, 3, 12, 12, 0}}) {  // C = 60: the conv's scalar kernel
    const StepBatch batch = kind == 1   ? decode_batch(16)
                            : kind == 2 ? prefill_batch(16)
                                        : test_batch(16);
    const int T = batch.num_tokens();
    const int C = 2 * nk * dk + nv * dv, slots = 3;
    GdnDims d{nk, nv, dk, dv, K};
    auto u = rnd(static_cast<size_t>(T) * C, 30), w = rnd(static_cast<size_t>(C) * K, 31, 0.5f),
         cs = rnd(static_cast<size_t>(slots) * C * (K - 1), 32),
         a = rnd(static_cast<size_t>(T) * nv, 33), bb = rnd(static_cast<size_t>(T) * nv, 34),
         alog = rnd(nv, 35, 0.5f), dtb = rnd(nv, 36, 0.5f),
         st = deltaserve::testing::random_vec(static_cast<size_t>(slots) * nv * dk * dv, 37, 0.1f);
    auto du = dev(u, DType::kBF16, {T, C}), dw = dev(w, DType::kBF16, {C, K}),
         dcs = dev(cs, DType::kBF16, {slots, C, K - 1}), da = dev(a, DType::kBF16, {T, nv}),
         db = dev(bb, DType::kBF16, {T, nv}), dal = dev(alog, DType::kF32, {nv}),
         ddt = dev(dtb, DType::kF32, {nv}), dst = dev(st, DType::kF32, {slots, nv, dk, dv});
    auto dy = gpu_->alloc(DType::kBF16, {T, C}), dout = gpu_->alloc(DType::kBF16, {T, nv, dv});
    gpu_->gdn_conv(batch, du.tensor(), dw.tensor(), dcs.tensor(), K, dy.tensor());
    std::vector<float> y(static_cast<size_t>(T) * C), out(static_cast<size_t>(T) * nv * dv);
    cpu_.gdn_conv(batch, Tensor(u.data(), DType::kF32, {T, C}),
                  Tensor(w.data(), DType::kF32, {C, K}),
                  Tensor(cs.data(), DType::kF32, {slots, C, K - 1}), K,
                  Tensor(y.data(), DType::kF32, {T, C}));
    const std::vector<float> gy = host(dy.tensor());
    expect_close(gy, y, 1e-2f, "conv");
    expect_close(host(dcs.tensor()), cs, 0.0f, "conv state");
    // The delta rule on the same (bf16) conv output on both sides.
    auto dy2 = dev(gy, DType::kBF16, {T, C});
    gpu_->gated_delta_rule(batch, dy2.tensor(), da.tensor(), db.tensor(), dal.tensor(),
                           ddt.tensor(), dst.tensor(), d, dout.tensor());
    std::vector<float> gyc = gy;
    cpu_.gated_delta_rule(
        batch, Tensor(gyc.data(), DType::kF32, {T, C}), Tensor(a.data(), DType::kF32, {T, nv}),
        Tensor(bb.data(), DType::kF32, {T, nv}), Tensor(alog.data(), DType::kF32, {nv}),
        Tensor(dtb.data(), DType::kF32, {nv}), Tensor(st.data(), DType::kF32, {slots, nv, dk, dv}),
        d, Tensor(out.data(), DType::kF32, {T, nv, dv}));
    expect_close(host(dout.tensor()), out, 1e-2f, "delta rule output");
    // Prefill steps at dk = dv = 128 run the chunked form on bf16 operands (f32 state): its
    // state is held to gdn_chunk_test's bound for them; the f32 recurrence to 1e-4.
    const bool bf16_operands = kind != 1 && dk == 128 && dv == 128;
    expect_close(host(dst.tensor()), st, bf16_operands ? 1.0f / 128 : 1e-4f,
                 "delta rule state (f32)");
  }
}

// The sampling kernel against the host reference on the same (bf16) logits, at the real vocabulary
// size with a padded row stride: greedy picks (with penalties and bans) must be identical, draws
// with the same u must agree (the kernel's top-k / top-p cut is a refined histogram threshold, so a
// token within ~1e-5 of the cut may differ: at most 2 of 96 rows), logprobs within 2e-3.
TEST_F(CudaOps, SamplingMatchesHostReference) {
  const int V = 151936, ld = V + 64, R = 96;
  std::vector<float> l = deltaserve::testing::random_vec(static_cast<size_t>(R) * ld, 50, 4.0f);
  for (int r = 0; r < R; ++r)  // a few clear favourites per row, like a real model's
    for (int j = 0; j < 8; ++j)
      l[static_cast<size_t>(r) * ld + static_cast<size_t>((r * 7919 + j * 104729) % V)] +=
          10.0f - static_cast<float>(j);
  for (float& x : l) x = bf16_to_f32(f32_to_bf16(x));
  auto dl = dev(l, DType::kBF16, {R, ld});
  std::vector<SampleSpec> specs(R);
  for (int r = 0; r < R; ++r) {
    SampleSpec& s = specs[static_cast<size_t>(r)];
    s.seed = 1000 + static_cast<uint64_t>(r);
    s.counter = static_cast<uint64_t>(r % 5);
    switch (r % 8) {
      case 0:
        break;  // greedy
      case 1:
        s.repetition_penalty = 1.5f;
        s.presence_penalty = 0.5f;
        s.frequency_penalty = 0.25f;
        s.prompt_tokens = {(r * 7919) % V, 5, 5};
        s.output_tokens = {(r * 7919 + 104729) % V, (r * 7919 + 104729) % V, 77};
        s.banned = {(r * 7919 + 2 * 104729) % V};
        s.bias = {{(r * 31 + 7) % V, 4.0f}, {(r * 7919) % V, -2.5f}};  // logit_bias
        break;
      case 2:
        s.temperature = 1.0f;
        break;
      case 3:
        s.temperature = 0.8f;
        s.top_k = 5;
        break;
      case 4:
        s.temperature = 1.2f;
        s.top_p = 0.9f;
        break;
      case 5:
        s.temperature = 0.7f;
        s.min_p = 0.05f;
        break;
      case 6:
        s.temperature = 1.0f;
        s.top_k = 1000;
        s.top_p = 0.5f;
        s.repetition_penalty = 1.3f;
        s.output_tokens = {(r * 7919) % V};
        break;
      default:
        s.temperature = 2.0f;
        s.top_p = 0.95f;
        s.min_p = 0.01f;
        break;
    }
    if (r % 3 == 0) s.num_logprobs = r % 2 ? 5 : 0;
  }
  const std::vector<Sampled> got = gpu_->sample(dl.tensor(), V, specs);
  ASSERT_EQ(got.size(), specs.size());
  EXPECT_EQ(cudaGetLastError(), cudaSuccess);
  int differ = 0;
  for (int r = 0; r < R; ++r) {
    const SampleSpec& s = specs[static_cast<size_t>(r)];
    const Sampled ref =
        sample_row(std::span<const float>(l.data() + static_cast<size_t>(r) * ld, ld), V, s);
    const Sampled& g = got[static_cast<size_t>(r)];
    if (s.greedy()) {
      EXPECT_EQ(g.token, ref.token) << "greedy row " << r;
    } else {
      const auto kept = kept_distribution(
          std::span<const float>(l.data() + static_cast<size_t>(r) * ld, ld), V, s);
      double sum = 0, lo = -1, hi = -1;
      for (const auto& [id, pr] : kept) {
        if (id == g.token) lo = sum;
        sum += pr;
        if (id == g.token) hi = sum;
      }
      const double u = sample_uniform(s.seed, s.counter);
      EXPECT_GE(lo, 0.0) << "row " << r << ": token " << g.token << " is not in the kept set";
      EXPECT_LE(lo / sum, u + 1e-4) << "row " << r;
      EXPECT_GE(hi / sum, u - 1e-4) << "row " << r;
      differ += g.token != ref.token;
    }
    EXPECT_LT(g.token, V);
    if (s.num_logprobs >= 0) {
      const float expect =
          l[static_cast<size_t>(r) * ld + static_cast<size_t>(g.token)] -
          (l[static_cast<size_t>(r) * ld + static_cast<size_t>(ref.token)] - ref.logprob);
      EXPECT_NEAR(g.logprob, expect, 2e-3f) << "row " << r;
      ASSERT_EQ(g.top.size(), ref.top.size()) << "row " << r;
      for (size_t k = 0; k < g.top.size(); ++k) {
        EXPECT_EQ(g.top[k].first, ref.top[k].first) << "row " << r << " top " << k;
        EXPECT_NEAR(g.top[k].second, ref.top[k].second, 2e-3f) << "row " << r << " top " << k;
      }
    } else {
      EXPECT_TRUE(g.top.empty());
    }
  }
  std::printf("  sampled rows whose token differs from the host reference's: %d of %d\n", differ,
              R - R / 8);
  // Deterministic: the same specs give the same tokens.
  const std::vector<Sampled> again = gpu_->sample(dl.tensor(), V, specs);
  for (int r = 0; r < R; ++r)
    EXPECT_EQ(again[static_cast<size_t>(r)].token, got[static_cast<size_t>(r)].token);
  // A spread-out row (every token equally likely, u near 1): the draw lands near the end.
  std::vector<float> flat(static_cast<size_t>(ld), 0.0f);
  auto df = dev(flat, DType::kBF16, {1, ld});
  SampleSpec f;
  f.temperature = 1.0f;
  uint64_t c = 0;
  while (sample_uniform(9, c) < 0.999f) ++c;
  f.seed = 9;
  f.counter = c;
  const Sampled fs = gpu_->sample(df.tensor(), V, {f}).at(0);
  const Sampled fr = sample_row(flat, V, f);
  EXPECT_NEAR(fs.token, fr.token, 2);
  EXPECT_GT(fs.token, V * 0.99);
}

// Structured outputs' masks (engine/json_output.h) as the sampler gets them: +100 bias on a few
// thousand allowed tokens, or bans of tens of thousands that include each row's favourites. Every
// token drawn must be one the mask allows; greedy rows equal the host reference.
TEST_F(CudaOps, SamplingUnderJsonSizedMasksKeepsToTheMask) {
  const int V = 151936, R = 8;
  std::vector<float> l = deltaserve::testing::random_vec(static_cast<size_t>(R) * V, 51, 4.0f);
  for (float& x : l) x = bf16_to_f32(f32_to_bf16(x));
  auto dl = dev(l, DType::kBF16, {R, V});
  std::vector<SampleSpec> specs(R);
  std::vector<std::vector<uint8_t>> allowed(R, std::vector<uint8_t>(V, 1));
  for (int r = 0; r < R; ++r) {
    SampleSpec& s = specs[static_cast<size_t>(r)];
    s.temperature = r % 2 ? 1.0f : 0.0f;
    s.seed = 77 + static_cast<uint64_t>(r);
    auto& ok = allowed[static_cast<size_t>(r)];
    if (r < 4) {  // the bias form: 5,000 allowed tokens
      std::fill(ok.begin(), ok.end(), 0);
      for (int k = 0; k < 5000; ++k) ok[static_cast<size_t>((k * 30 + r) % V)] = 1;
      for (int t = 0; t < V; ++t)
        if (ok[static_cast<size_t>(t)]) s.bias.emplace_back(t, 100.0f);
    } else {  // the ban form: 40,000 banned, the row's 100 largest logits among them
      std::vector<int> order(V);
      for (int t = 0; t < V; ++t) order[static_cast<size_t>(t)] = t;
      const float* row = l.data() + static_cast<size_t>(r) * V;
      std::partial_sort(order.begin(), order.begin() + 100, order.end(),
                        [&](int a, int b) { return row[a] > row[b]; });
      for (int k = 0; k < 100; ++k) ok[static_cast<size_t>(order[static_cast<size_t>(k)])] = 0;
      for (int k = 0; k < 39900; ++k) ok[static_cast<size_t>((k * 3 + r) % V)] = 0;
      for (int t = 0; t < V; ++t)
        if (!ok[static_cast<size_t>(t)]) s.banned.push_back(t);
    }
  }
  const std::vector<Sampled> got = gpu_->sample(dl.tensor(), V, specs);
  for (int r = 0; r < R; ++r) {
    const int32_t t = got[static_cast<size_t>(r)].token;
    ASSERT_TRUE(t >= 0 && t < V);
    EXPECT_TRUE(allowed[static_cast<size_t>(r)][static_cast<size_t>(t)]) << "row " << r;
    if (specs[static_cast<size_t>(r)].greedy())
      EXPECT_EQ(t, sample_row(std::span<const float>(l.data() + static_cast<size_t>(r) * V, V), V,
                              specs[static_cast<size_t>(r)])
                       .token)
          << "row " << r;
  }
}

// The slice statistics' edges: a vocabulary that is not a multiple of eight (a slice ending in a
// partial group of eight) and rows that do not start 16-byte aligned (read a token at a time), the
// favourite in the last group, in the partial tail or banned: greedy picks equal the host
// reference's, logprobs within 2e-3.
TEST_F(CudaOps, SamplingSliceEdges) {
  const int V = 4096 + 13, ld = V + 7, R = 8;  // even rows 16-byte aligned, odd rows not
  // (random values of scale 2: the largest of a row near 8, so the favourite stands 30 above)
  std::vector<float> l = deltaserve::testing::random_vec(static_cast<size_t>(R) * ld, 51, 2.0f);
  const int favourite[R] = {V - 1, V - 6, V - 13, 4095, 0, V - 1, 4100, 17};
  for (int r = 0; r < R; ++r) l[static_cast<size_t>(r) * ld + favourite[r]] += 30.0f;
  for (float& x : l) x = bf16_to_f32(f32_to_bf16(x));
  auto dl = dev(l, DType::kBF16, {R, ld});
  std::vector<SampleSpec> specs(R);
  for (int r = 0; r < R; ++r) {
    specs[static_cast<size_t>(r)].num_logprobs = 0;
    if (r >= 5) specs[static_cast<size_t>(r)].banned = {favourite[r]};  // the runner-up wins
  }
  const std::vector<Sampled> got = gpu_->sample(dl.tensor(), V, specs);
  for (int r = 0; r < R; ++r) {
    const Sampled ref =
        sample_row(std::span<const float>(l.data() + static_cast<size_t>(r) * ld, ld), V,
                   specs[static_cast<size_t>(r)]);
    EXPECT_EQ(got[static_cast<size_t>(r)].token, ref.token) << "row " << r;
    EXPECT_NEAR(got[static_cast<size_t>(r)].logprob, ref.logprob, 2e-3f) << "row " << r;
    if (r < 5) EXPECT_EQ(ref.token, favourite[r]) << "row " << r;
  }
}

// copy_state_rows: two slots' conv (bf16 rows of 240 bytes: the byte path) and recurrent state
// (the 16-byte path) to two others in one launch, the rest untouched (as on the CPU).
TEST_F(CudaOps, CopyStateRowsMovesSlots) {
  const int slots = 4, C = 40, K = 4, nv = 2, dk = 16, dv = 24;
  auto cs = rnd(static_cast<size_t>(slots) * C * (K - 1), 60);
  auto st = rnd(static_cast<size_t>(slots) * nv * dk * dv, 61);
  auto dcs = dev(cs, DType::kBF16, {slots, C, K - 1});
  auto dst = dev(st, DType::kF32, {slots, nv, dk, dv});
  const std::vector<float> conv_before = host(dcs.tensor());
  const SlotMove moves[] = {{3, 1}, {0, 2}};
  const Tensor on_gpu[] = {dcs.tensor(), dst.tensor()};
  gpu_->copy_state_rows(on_gpu, moves);
  const Tensor on_cpu[] = {Tensor(cs.data(), DType::kF32, {slots, C, K - 1}),
                           Tensor(st.data(), DType::kF32, {slots, nv, dk, dv})};
  cpu_.copy_state_rows(on_cpu, moves);
  const std::vector<float> conv = host(dcs.tensor()), state = host(dst.tensor());
  expect_close(state, st, 0.0f, "recurrent state after copy");
  const size_t row = static_cast<size_t>(C) * (K - 1);
  for (size_t i = 0; i < row; ++i) {
    EXPECT_EQ(conv[row + i], conv_before[3 * row + i]);      // slot 1 <- slot 3
    EXPECT_EQ(conv[2 * row + i], conv_before[i]);            // slot 2 <- slot 0
    EXPECT_EQ(conv[3 * row + i], conv_before[3 * row + i]);  // sources untouched
    EXPECT_EQ(conv[i], conv_before[i]);
  }
}

TEST_F(CudaOps, MissingDeviceIsAClearError) { EXPECT_THROW(CudaBackend(99), Error); }

}  // namespace
}  // namespace deltaserve::backend
