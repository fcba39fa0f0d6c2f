// Prefill attention alone at the Qwen3.5-4B full-attention shape (16 query heads, 4 KV heads, head
// dim 256, pages of 16): ms per layer call (cuda_timing.h) and TFLOP/s of causal attention work
// (4 * hd * nh * the query-key pairs at or before each query: S = Q K^T and O = P V), for one
// sequence of 512 / 2k / 8k / 32k tokens, varlen 8 x 1024, and a 2k chunk continuing 6k cached.
// Usage: attn_bench [--rounds 7] [--calls 10] [--seqs N --len L (that shape only, fresh)]
#include <cuda_runtime.h>

#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

#include "app/args.h"
#include "backend/cuda/cuda_backend.h"
#include "core/dtype.h"
#include "core/step_batch.h"
#include "cuda_timing.h"

namespace ds = deltaserve;

namespace {

constexpr int kNh = 16, kNkv = 4, kHd = 256, kPage = 16;

struct Shape {
  int seqs, len, start;  // start: tokens already in the cache
};

ds::StepBatch batch_of(const Shape& s) {
  ds::StepBatchBuilder b(kPage);
  const int32_t pages = (s.start + s.len + kPage - 1) / kPage;
  std::vector<int32_t> table(static_cast<size_t>(pages));
  for (int i = 0; i < s.seqs; ++i) {
    // Pages of the sequences interleaved, as a busy cache hands them out.
    for (int32_t p = 0; p < pages; ++p) table[static_cast<size_t>(p)] = p * s.seqs + i;
    b.add(0, std::vector<int32_t>(static_cast<size_t>(s.len), 1), s.start, i, table);
  }
  return b.build();
}

// Uniform values in [-2, 2) as bf16 (a fixed xorshift stream per seed).
void fill_random(const ds::Tensor& t, uint32_t seed) {
  std::vector<uint16_t> host(t.nbytes() / sizeof(uint16_t));
  uint32_t x = seed * 2654435761u + 1;
  for (auto& v : host) {
    x ^= x << 13;
    x ^= x >> 17;
    x ^= x << 5;
    v = ds::f32_to_bf16(static_cast<float>(x >> 8) / 4194304.0f - 2.0f);
  }
  cudaMemcpy(t.data, host.data(), t.nbytes(), cudaMemcpyHostToDevice);
}

// Causal attention FLOPs of the step: every query of position p sees p + 1 keys.
double causal_flops(const Shape& s) {
  const double pairs = static_cast<double>(s.len) * s.start + 0.5 * s.len * (s.len + 1.0);
  return 4.0 * kHd * kNh * pairs * s.seqs;
}

double time_shape(ds::backend::CudaBackend& be, const Shape& sh, int rounds, int calls) {
  const ds::StepBatch batch = batch_of(sh);
  const int64_t T = batch.num_tokens();
  const int64_t pages = static_cast<int64_t>(sh.seqs) * ((sh.start + sh.len + kPage - 1) / kPage);
  auto q = be.alloc(ds::DType::kBF16, {T, kNh, kHd}),
       gate = be.alloc(ds::DType::kBF16, {T, kNh, kHd}),
       out = be.alloc(ds::DType::kBF16, {T, kNh, kHd});
  auto kc = be.alloc(ds::DType::kBF16, {pages, kPage, kNkv, kHd}),
       vc = be.alloc(ds::DType::kBF16, {pages, kPage, kNkv, kHd});
  // Random inputs: constant ones never move a row's running max, so they would skip the
  // softmax's rescales that real data needs now and then (and zeros can run faster).
  uint32_t seed = 1;
  for (auto* t : {&q, &gate, &kc, &vc}) fill_random(t->tensor(), seed++);
  cudaDeviceSynchronize();  // before the backend's non-blocking stream uses them
  const ds::backend::AttnDims d{kNh, kNkv, kHd, 64, 1e7, 1e-6f};
  return ds::bench::median_ms_per_call(be.stream(), rounds, calls, [&] {
    be.paged_attention(batch, q.tensor(), gate.tensor(), kc.tensor(), vc.tensor(), d, out.tensor());
  });
}

}  // namespace

int main(int argc, char** argv) {
  try {
    std::vector<std::string> args(argv + 1, argv + argc);
    ds::app::Args a(args, "attn_bench", {"rounds", "calls", "seqs", "len"}, {});
    const int rounds = static_cast<int>(a.get_int("rounds", 7, 1, 1000));
    const int calls = static_cast<int>(a.get_int("calls", 10, 1, 1000));
    ds::backend::CudaBackend be(0);
    if (a.has("len")) {  // one shape (e.g. under a profiler)
      const Shape s{static_cast<int>(a.get_int("seqs", 1, 1, 1024)),
                    static_cast<int>(a.get_int("len", 8192, 1, 1 << 20)), 0};
      const double ms = time_shape(be, s, rounds, calls);
      std::printf("%d x %d: %.3f ms per layer, %.1f TFLOP/s\n", s.seqs, s.len, ms,
                  causal_flops(s) / ms * 1e-9);
      return 0;
    }
    std::printf(
        "| shape | cached | ms per layer | TFLOP/s |\n"
        "|---|---|---|---|\n");
    for (const Shape s : {Shape{1, 512, 0}, Shape{1, 2048, 0}, Shape{1, 8192, 0}, Shape{8, 1024, 0},
                          Shape{1, 2048, 6144}, Shape{1, 32768, 0}}) {
      std::printf("| %d x %d | %d ", s.seqs, s.len, s.start);
      const double ms = time_shape(be, s, rounds, calls);
      std::printf("| %.3f | %.1f ", ms, causal_flops(s) / ms * 1e-9);
      std::printf("|\n");
      std::fflush(stdout);
    }
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "attn_bench: %s\n", e.what());
    return 1;
  }
}
