// The gated delta rule of a prefill step alone, at the Qwen3.5-4B GDN shape (16 q/k heads, 32 v
// heads, d = 128): ms per layer call (median of timed rounds of back-to-back calls on the stream),
// for one sequence of 512 / 2k / 8k / 32k tokens and varlen 8 x 1024, fresh and continuing from a
// state. The shapes are flash-linear-attention's in ../shared/peers/fla_bench.py (section a).
// Usage: gdn_bench [--rounds 7] [--calls 20] [--seqs N --len L (that shape only, fresh)]
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

double time_shape(ds::backend::CudaBackend& be, const Shape& sh, int32_t start, int rounds,
                  int calls) {
  const ds::StepBatch batch = batch_of(sh, start);
  const int64_t T = batch.num_tokens(), C = 2 * kNk * kD + kNv * kD;
  auto y = be.alloc(ds::DType::kBF16, {T, C}), a = be.alloc(ds::DType::kBF16, {T, kNv}),
       bg = be.alloc(ds::DType::kBF16, {T, kNv}), out = be.alloc(ds::DType::kBF16, {T, kNv, kD});
  auto alog = be.alloc(ds::DType::kF32, {kNv}), dtb = be.alloc(ds::DType::kF32, {kNv});
  auto state = be.alloc(ds::DType::kF32, {sh.seqs, kNv, kD, kD});
  // Deterministic moderate inputs (bf16 0x3c00 = 0.0078; A_log, dt_bias 0; the state 0).
  cudaMemset(y.tensor().data, 0x3c, y.tensor().nbytes());
  cudaMemset(a.tensor().data, 0, a.tensor().nbytes());
  cudaMemset(bg.tensor().data, 0, bg.tensor().nbytes());
  cudaMemset(alog.tensor().data, 0, alog.tensor().nbytes());
  cudaMemset(dtb.tensor().data, 0, dtb.tensor().nbytes());
  cudaMemset(state.tensor().data, 0, state.tensor().nbytes());
  const ds::backend::GdnDims d{kNk, kNv, kD, kD, 4};
  auto call = [&] {
    be.gated_delta_rule(batch, y.tensor(), a.tensor(), bg.tensor(), alog.tensor(), dtb.tensor(),
                        state.tensor(), d, out.tensor());
  };
  return ds::bench::median_ms_per_call(be.stream(), rounds, calls, call);
}

}  // namespace

int main(int argc, char** argv) {
  try {
    std::vector<std::string> args(argv + 1, argv + argc);
    ds::app::Args a(args, "gdn_bench", {"rounds", "calls", "seqs", "len"}, {});
    const int rounds = static_cast<int>(a.get_int("rounds", 7, 1, 1000));
    const int calls = static_cast<int>(a.get_int("calls", 20, 1, 1000));
    ds::backend::CudaBackend be(0);
    if (a.has("len")) {  // one shape (e.g. under a profiler)
      const Shape s{static_cast<int>(a.get_int("seqs", 1, 1, 1024)),
                    static_cast<int>(a.get_int("len", 8192, 1, 1 << 20))};
      std::printf("%d x %d: %.3f ms per layer\n", s.seqs, s.len,
                  time_shape(be, s, 0, rounds, calls));
      return 0;
    }
    std::printf("| shape | fresh ms per layer | from a state ms per layer |\n|---|---|---|\n");
    for (const Shape s :
         {Shape{1, 512}, Shape{1, 2048}, Shape{1, 8192}, Shape{8, 1024}, Shape{1, 32768}}) {
      const double fresh = time_shape(be, s, 0, rounds, calls);
      const double cont = time_shape(be, s, 100, rounds, calls);
      std::printf("| %d x %d | %.3f | %.3f |\n", s.seqs, s.len, fresh, cont);
      std::fflush(stdout);
    }
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "gdn_bench: %s\n", e.what());
    return 1;
  }
}
