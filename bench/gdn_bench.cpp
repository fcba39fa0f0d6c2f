// The gated delta rule of a prefill step alone, at the Qwen3.5-4B GDN shape (16 q/k heads, 32 v
// heads, d = 128): ms per layer call (median of timed rounds of back-to-back calls on the stream),
// for one sequence of 512 / 2k / 8k / 32k tokens and varlen 8 x 1024, fresh and continuing from a
// state; and the whole mixer of the layer (conv + delta rule + gated norm, from a state) on the
// fused prefill path against the three ops. The shapes are flash-linear-attention's in
// ../shared/peers/fla_bench.py (section a). Usage: gdn_bench [--rounds 7] [--calls 20] [--seqs N
// --len L (that shape only, fresh)]
#include <cuda_runtime.h>

#include <cstdio>
#include <string>
#include <vector>

#include "app/args.h"
#include "backend/cuda/cuda_backend.h"
#include "core/step_batch.h"
#include "cuda_timing.h"

namespace ds = deltaserve;

namespace {

constexpr int kNk = 16, kNv = 32, kD = 128, kPage = 64;

struct Shape {
  int seqs, len;
};

ds::StepBatch batch_of(const Shape& s, int32_t start) {
  ds::StepBatchBuilder b(kPage);
  const int32_t pages = (start + s.len + kPage - 1) / kPage;
  std::vector<int32_t> table(static_cast<size_t>(pages));
  for (int i = 0; i < s.seqs; ++i) {
    for (int32_t p = 0; p < pages; ++p) table[static_cast<size_t>(p)] = i * pages + p;
    b.add(0, std::vector<int32_t>(static_cast<size_t>(s.len), 1), start, i, table);
  }
  return b.build();
}

// Every tensor of one GDN layer's mixer at a step of `batch`, set to deterministic moderate values
// (bf16 0x3c00 = 0.0078 for u, y, z and the conv taps and state; A_log, dt_bias, the gates and the
// recurrent state 0; the norm weight 1).
struct Layer {
  ds::Buffer u, y, a, bg, z, out, conv_w, conv_state, alog, dtb, norm_w, state;
  Layer(ds::backend::CudaBackend& be, int64_t T, int64_t seqs) {
    const int64_t C = 2 * kNk * kD + kNv * kD;
    using ds::DType;
    u = be.alloc(DType::kBF16, {T, C});
    y = be.alloc(DType::kBF16, {T, C});
    a = be.alloc(DType::kBF16, {T, kNv});
    bg = be.alloc(DType::kBF16, {T, kNv});
    z = be.alloc(DType::kBF16, {T, kNv * kD});
    out = be.alloc(DType::kBF16, {T, kNv, kD});
    conv_w = be.alloc(DType::kBF16, {C, 4});
    conv_state = be.alloc(DType::kBF16, {seqs, C, 3});
    alog = be.alloc(DType::kF32, {kNv});
    dtb = be.alloc(DType::kF32, {kNv});
    norm_w = be.alloc(DType::kF32, {kD});
    state = be.alloc(DType::kF32, {seqs, kNv, kD, kD});
    for (const ds::Buffer* b : {&u, &y, &z, &conv_w, &conv_state})
      cudaMemset(b->tensor().data, 0x3c, b->tensor().nbytes());
    for (const ds::Buffer* b : {&a, &bg, &alog, &dtb, &state})
      cudaMemset(b->tensor().data, 0, b->tensor().nbytes());
    cudaDeviceSynchronize();  // the legacy stream's memsets before the backend's (non-blocking) one
    const std::vector<float> ones(kD, 1.0f);
    be.upload(DType::kF32, ones.data(), ones.size(), norm_w.tensor());
  }
  ds::backend::GdnMixerTensors mixer() const {
    return {u.tensor(),   y.tensor(),      a.tensor(),          bg.tensor(),
            z.tensor(),   out.tensor(),    conv_w.tensor(),     alog.tensor(),
            dtb.tensor(), norm_w.tensor(), conv_state.tensor(), state.tensor()};
  }
};

enum class What { kRule, kLayerFused, kLayerOps };

// ms per call of the delta rule alone, or of the layer's mixer (conv + rule + gated norm) fused or
// as the three ops.
double time_shape(ds::backend::CudaBackend& be, const Shape& sh, int32_t start, What what,
                  int rounds, int calls) {
  const ds::StepBatch batch = batch_of(sh, start);
  const Layer l(be, batch.num_tokens(), sh.seqs);
  const ds::backend::GdnDims d{kNk, kNv, kD, kD, 4};
  auto call = [&] {
    if (what == What::kRule)
      be.gated_delta_rule(batch, l.y.tensor(), l.a.tensor(), l.bg.tensor(), l.alog.tensor(),
                          l.dtb.tensor(), l.state.tensor(), d, l.out.tensor());
    else if (what == What::kLayerFused)
      be.gdn_mixer(batch, l.mixer(), d, 1e-6f);
    else
      be.Backend::gdn_mixer(batch, l.mixer(), d, 1e-6f);
  };
  return ds::bench::median_ms_per_call(be.stream(), rounds, calls, call);
}

}  // namespace

int main(int argc, char** argv) {
  try {
    std::vector<std::string> args(argv + 1, argv + argc);
    ds::app::Args a(args, "gdn_bench", {"rounds", "calls", "seqs", "len"}, {"mixer"});
    const int rounds = static_cast<int>(a.get_int("rounds", 7, 1, 1000));
    const int calls = static_cast<int>(a.get_int("calls", 20, 1, 1000));
    ds::backend::CudaBackend be(0);
    if (a.has("len")) {  // one shape (e.g. under a profiler)
      const Shape s{static_cast<int>(a.get_int("seqs", 1, 1, 1024)),
                    static_cast<int>(a.get_int("len", 8192, 1, 1 << 20))};
      const bool mixer = a.has("mixer");
      std::printf("%d x %d: %.3f ms per layer%s\n", s.seqs, s.len,
                  time_shape(be, s, 0, mixer ? What::kLayerFused : What::kRule, rounds, calls),
                  mixer ? " (the mixer, fused)" : "");
      return 0;
    }
    std::printf(
        "| shape | fresh ms per layer | from a state ms per layer | mixer fused ms | mixer as "
        "three ops ms |\n|---|---|---|---|---|\n");
    for (const Shape s :
         {Shape{1, 512}, Shape{1, 2048}, Shape{1, 8192}, Shape{8, 1024}, Shape{1, 32768}}) {
      const double fresh = time_shape(be, s, 0, What::kRule, rounds, calls);
      const double cont = time_shape(be, s, 100, What::kRule, rounds, calls);
      const double fused = time_shape(be, s, 100, What::kLayerFused, rounds, calls);
      const double ops = time_shape(be, s, 100, What::kLayerOps, rounds, calls);
      std::printf("| %d x %d | %.3f | %.3f | %.3f | %.3f |\n", s.seqs, s.len, fresh, cont, fused,
                  ops);
      std::fflush(stdout);
    }
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "gdn_bench: %s\n", e.what());
    return 1;
  }
}
