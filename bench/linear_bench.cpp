// The decode projections of Qwen3.5-4B alone, grouped as the model issues them (one launch for the
// projections that share an input): us per call (median of timed rounds of calls, each weight set
// rotated over copies larger than L2, so every call streams from HBM; a 4-byte memset between
// calls, its time taken off, so that no call overlaps the one before) and the weights' GB/s, for T
// = 1 / 4 / 8 / 16 tokens by default. Weights and inputs hold uniform noise (zeros draw less power,
// so their GEMMs clock higher). Columns: ours (CudaBackend::linear_multi, as routed), ours after a
// residual add + RMSNorm instead of the memset (the norm's time taken off: what the early start of
// a programmatic dependent saves), the grouped GEMV kernel (T <= 8; 0 above), the weight-streaming
// GEMM forced (T <= 64; 0 above), cuBLASLt (one GEMM per projection), and ours in TFLOP/s (for
// prefill-sized T, up to 16,384). A last row per T sums one decode step's projections (24 GDN
// layers, 8 attention layers, 32 MLPs, the lm_head; no lm_head over 256 rows, as a prefill step
// runs it on the rows it samples only).
// With --tune 1: instead, per projection, cuBLASLt's first heuristic algorithm against the fastest
// of its first eight (CublasLtLinear::tune), us per call, re-timed after the choice (alternating
// twice, medians of rounds of 10 calls) and as timed in the tuning.
// With --mlp 1: instead, the MLP's gate / up projections and SiLU-mul at prefill-sized T: the
// prefill GEMM with the SiLU-mul in its epilogue against tuned cuBLASLt then the SiLU-mul kernel.
// Usage: linear_bench [--rows 1,4,8,16] [--rounds 5] [--only NAME-PART] [--tune 1] [--mlp 1]
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

#include "app/args.h"
#include "backend/cuda/cublaslt_linear.h"
#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/kernels/gemm_silu_mul.cuh"
#include "backend/cuda/kernels/gemv.cuh"
#include "backend/cuda/kernels/silu_mul.cuh"
#include "backend/cuda/kernels/skinny_gemm.cuh"
#include "core/error.h"
#include "cuda_timing.h"

namespace ds = deltaserve;

namespace {

using bf16 = __nv_bfloat16;
constexpr int kMaxRows = 16384, kDecodeMaxRows = 256;
// The 4B MLP: intermediate and hidden sizes (--mlp).
constexpr int64_t kMlpI = 9216, kMlpK = 2560;

// One launch's projections: output widths sharing the input width K, and how often a step runs it.
struct Group {
  std::string name;
  std::vector<int64_t> n;
  int64_t K;
  int per_step;
};

const std::vector<Group>& groups_4b() {
  static const std::vector<Group> g{{"gdn in (qkv, z, b, a)", {8192, 4096, 32, 32}, 2560, 24},
                                    {"gdn out", {2560}, 4096, 24},
                                    {"attn in (q+gate, k, v)", {8192, 1024, 1024}, 2560, 8},
                                    {"attn out", {2560}, 4096, 8},
                                    {"mlp gate, up", {9216, 9216}, 2560, 32},
                                    {"mlp down", {2560}, 9216, 32},
                                    {"lm_head", {248320}, 2560, 1}};
  return g;
}

struct Timings {
  double ours, ours_after_norm, gemv, gemm, cublaslt;  // gemv / gemm 0: not run (T past theirs)
};

class LinearBench {
 public:
  explicit LinearBench(int rounds) : be_(0), rounds_(rounds) {
    cudaDeviceGetAttribute(&sms_, cudaDevAttrMultiProcessorCount, 0);
    skinny_partials_ =
        be_.alloc(ds::DType::kF32, {static_cast<int64_t>(ds::cuda::skinny_workspace_floats(sms_))});
    std::vector<float> host(kNoiseElems);
    uint32_t state = 12345;
    for (float& v : host) {  // uniform in [-1, 1): zeros would draw less power than real data
      state = state * 1664525u + 1013904223u;
      v = static_cast<float>(state >> 8) / static_cast<float>(1u << 23) - 1.0f;
    }
    be_.upload(ds::DType::kF32, host.data(), host.size(), noise_.tensor());
  }

  Timings time(const Group& g, int64_t T) {
    int64_t bytes = 0;
    for (int64_t n : g.n) bytes += n * g.K * 2;
    const int copies = static_cast<int>(std::max(1.0, std::ceil(256e6 / bytes)));
    std::vector<std::vector<ds::Buffer>> w(static_cast<size_t>(copies));
    std::vector<ds::Buffer> y;
    for (auto& set : w)
      for (int64_t n : g.n) {
        set.push_back(be_.alloc(ds::DType::kBF16, {n, g.K}));
        fill_noise(set.back());
      }
    for (int64_t n : g.n) y.push_back(be_.alloc(ds::DType::kBF16, {T, n}));
    ds::Buffer x = be_.alloc(ds::DType::kBF16, {T, g.K});
    fill_noise(x);
    const int calls = std::max(copies * 4, 40);
    int next = 0;
    // A 4-byte memset before each call keeps it from overlapping the previous one (as in a model
    // step, where other kernels run between projections); its own time is taken off. The same with
    // a residual add + RMSNorm of the input's shape before each call instead: the kernel a
    // projection follows in a decode step, which lets a programmatic dependent start early.
    ds::Buffer res = be_.alloc(ds::DType::kBF16, {T, g.K}),
               normed = be_.alloc(ds::DType::kBF16, {T, g.K}),
               norm_w = be_.alloc(ds::DType::kF32, {g.K});
    const auto memset = [&] { cudaMemsetAsync(y[0].tensor().data, 0, 4, be_.stream()); };
    const auto norm = [&] {
      be_.add_rms_norm(res.tensor(), x.tensor(), norm_w.tensor(), 1e-6f, normed.tensor());
    };
    const auto alone = [&](auto&& before) {
      return 1e3 * ds::bench::median_ms_per_call(be_.stream(), rounds_, calls, before);
    };
    const double memset_us = alone(memset), norm_us = alone(norm);
    const auto after = [&](auto&& before, double before_us, auto&& run) {
      return 1e3 * ds::bench::median_ms_per_call(be_.stream(), rounds_, calls,
                                                 [&] {
                                                   before();
                                                   run(w[static_cast<size_t>(next++ % copies)]);
                                                 }) -
             before_us;
    };
    const auto timed = [&](auto&& run) { return after(memset, memset_us, run); };
    Timings t{};
    const auto ours = [&](const std::vector<ds::Buffer>& set) {
      std::vector<const ds::Tensor*> ws, ys;
      for (size_t i = 0; i < set.size(); ++i) {
        ws.push_back(&set[i].tensor());
        ys.push_back(&y[i].tensor());
      }
      be_.linear_multi(x.tensor(), ws, ys);
    };
    t.ours = timed(ours);
    t.ours_after_norm = after(norm, norm_us, ours);
    t.gemv = T > ds::cuda::kGemvMaxRows ? 0.0 : timed([&](const std::vector<ds::Buffer>& set) {
      ds::cuda::GemvGroups gg{};
      for (size_t i = 0; i < set.size(); ++i) {
        gg.w[i] = ptr(set[i]);
        gg.y[i] = ptr(y[i]);
        gg.n[i] = static_cast<int>(g.n[i]);
      }
      gg.count = static_cast<int>(set.size());
      ds::cuda::launch_gemv_multi_bf16(ptr(x), gg, static_cast<int>(T), static_cast<int>(g.K),
                                       be_.stream());
    });
    t.gemm = T > ds::cuda::kSkinnyMaxRows ? 0.0 : timed([&](const std::vector<ds::Buffer>& set) {
      ds::cuda::SkinnyGroup sg[ds::cuda::kSkinnyMaxGroups];
      for (size_t i = 0; i < set.size(); ++i)
        sg[i] = {ptr(set[i]), ptr(y[i]), static_cast<int>(g.n[i])};
      const cudaError_t e = ds::cuda::launch_skinny_gemm_bf16(
          ptr(x), sg, static_cast<int>(set.size()), static_cast<int>(T), static_cast<int>(g.K),
          {static_cast<float*>(skinny_partials_.tensor().data),
           static_cast<int*>(skinny_counters_.tensor().data)},
          sms_, be_.stream());
      if (e != cudaSuccess) throw ds::Error(std::string("skinny GEMM: ") + cudaGetErrorString(e));
    });
    t.cublaslt = timed([&](const std::vector<ds::Buffer>& set) {
      for (size_t i = 0; i < set.size(); ++i)
        lt_.run(ptr(x), ptr(set[i]), ptr(y[i]), T, g.K, g.n[i], be_.stream());
    });
    return t;
  }

  struct MlpTimings {
    double fused, unfused, gemm_only;  // us a call
  };
  // The MLP's gate / up projections and SiLU-mul at T tokens (the 4B shape): the prefill GEMM with
  // the SiLU-mul in its epilogue, against cuBLASLt's GEMM of the stacked weights (tuned first, as
  // the model's prefill shapes are) then the SiLU-mul kernel, and that GEMM alone; alternating
  // twice, medians of rounds of 10 calls.
  MlpTimings time_mlp(int64_t T) {
    constexpr int64_t I = kMlpI, K = kMlpK;
    ds::Buffer w = be_.alloc(ds::DType::kBF16, {2 * I, K}), x = be_.alloc(ds::DType::kBF16, {T, K}),
               gate_up = be_.alloc(ds::DType::kBF16, {T, 2 * I}),
               act = be_.alloc(ds::DType::kBF16, {T, I});
    fill_noise(w);
    fill_noise(x);
    lt_.tune(ptr(x), ptr(w), ptr(gate_up), T, K, 2 * I, be_.stream());
    const auto us = [&](auto&& run) {
      return 1e3 * ds::bench::median_ms_per_call(be_.stream(), rounds_, 10, run) / 2;
    };
    const auto gemm = [&] { lt_.run(ptr(x), ptr(w), ptr(gate_up), T, K, 2 * I, be_.stream()); };
    MlpTimings t{};
    for (int i = 0; i < 2; ++i) {
      t.fused += us([&] {
        const cudaError_t e = ds::cuda::launch_gemm_silu_mul_bf16(
            ptr(x), ptr(w), ptr(w) + I * K, ptr(act), static_cast<int>(T), static_cast<int>(K),
            static_cast<int>(I), sms_, be_.stream());
        if (e != cudaSuccess)
          throw ds::Error(std::string("GEMM + SiLU-mul: ") + cudaGetErrorString(e));
      });
      t.unfused += us([&] {
        gemm();
        ds::cuda::launch_silu_mul_halves_bf16(ptr(gate_up), T, I, ptr(act), be_.stream());
      });
      t.gemm_only += us(gemm);
    }
    return t;
  }

  struct Tuned {
    ds::cuda::CublasLtLinear::Tuning tuning;
    double heuristic_us, tuned_us;  // re-timed after the choice, alternating twice
  };
  // One projection's cuBLASLt tuning at T tokens, then cuBLASLt's first heuristic against the
  // tuned choice.
  Tuned tune(int64_t n, int64_t K, int64_t T) {
    ds::Buffer w = be_.alloc(ds::DType::kBF16, {n, K}), x = be_.alloc(ds::DType::kBF16, {T, K}),
               y = be_.alloc(ds::DType::kBF16, {T, n});
    fill_noise(w);
    fill_noise(x);
    ds::cuda::CublasLtLinear heuristic, tuned;
    Tuned r{tuned.tune(ptr(x), ptr(w), ptr(y), T, K, n, be_.stream()), 0.0, 0.0};
    const auto us = [&](ds::cuda::CublasLtLinear& lt) {
      return 1e3 * ds::bench::median_ms_per_call(be_.stream(), rounds_, 10, [&] {
               lt.run(ptr(x), ptr(w), ptr(y), T, K, n, be_.stream());
             });
    };
    for (int i = 0; i < 2; ++i) {
      r.heuristic_us += us(heuristic) / 2;
      r.tuned_us += us(tuned) / 2;
    }
    return r;
  }

 private:
  static constexpr int64_t kNoiseElems = 1 << 22;
  static bf16* ptr(const ds::Buffer& b) { return static_cast<bf16*>(b.tensor().data); }

  // b tiled with the noise values (a GEMM's power, and so its clocks, depends on its data).
  void fill_noise(const ds::Buffer& b) {
    const int64_t n = b.tensor().numel();
    for (int64_t at = 0; at < n; at += kNoiseElems)
      cudaMemcpyAsync(ptr(b) + at, ptr(noise_), std::min(kNoiseElems, n - at) * sizeof(bf16),
                      cudaMemcpyDeviceToDevice, be_.stream());
  }

  ds::backend::CudaBackend be_;
  ds::Buffer noise_ = be_.alloc(ds::DType::kBF16, {kNoiseElems});
  ds::Buffer skinny_partials_,
      skinny_counters_ = be_.alloc(ds::DType::kI32, {ds::cuda::kSkinnyMaxTiles});
  int sms_ = 0;
  ds::cuda::CublasLtLinear lt_;
  int rounds_;
};

// GB/s of `bytes` in `us` (0 for a column not run).
double gbps(double bytes, double us) { return us > 0 ? bytes / us / 1e3 : 0.0; }

// Groups whose name contains `only` (all for "").
void print_table(LinearBench& bench, const std::vector<int32_t>& rows, const std::string& only) {
  std::printf(
      "| group | T | MB | ours us | ours GB/s | ours after a norm us | GEMV us | GEMV GB/s | GEMM "
      "us | "
      "GEMM GB/s | cuBLASLt us | cuBLASLt GB/s | ours TFLOP/s |\n"
      "|---|---|---|---|---|---|---|---|---|---|---|---|---|\n");
  for (const int32_t T : rows) {
    Timings step{};
    double step_bytes = 0;
    for (const Group& g : groups_4b()) {
      if (g.name.find(only) == std::string::npos) continue;
      if (T > kDecodeMaxRows && g.name == "lm_head") continue;  // a prefill's rows skip it
      double bytes = 0;
      for (int64_t n : g.n) bytes += static_cast<double>(n * g.K * 2);
      const Timings t = bench.time(g, T);
      const double flops = static_cast<double>(T) * bytes;  // 2 T n K
      std::printf(
          "| %s | %d | %.1f | %.1f | %.0f | %.1f | %.1f | %.0f | %.1f | %.0f | %.1f | %.0f | %.0f "
          "|\n",
          g.name.c_str(), T, bytes / 1e6, t.ours, bytes / t.ours / 1e3, t.ours_after_norm, t.gemv,
          gbps(bytes, t.gemv), t.gemm, gbps(bytes, t.gemm), t.cublaslt, gbps(bytes, t.cublaslt),
          flops / t.ours / 1e6);
      step.ours += g.per_step * t.ours;
      step.ours_after_norm += g.per_step * t.ours_after_norm;
      step.gemv += g.per_step * t.gemv;
      step.gemm += g.per_step * t.gemm;
      step.cublaslt += g.per_step * t.cublaslt;
      step_bytes += g.per_step * bytes;
    }
    std::printf(
        "| **step** | %d | %.0f | %.0f | %.0f | %.0f | %.0f | %.0f | %.0f | %.0f | %.0f | %.0f | "
        "%.0f "
        "|\n",
        T, step_bytes / 1e6, step.ours, step_bytes / step.ours / 1e3, step.ours_after_norm,
        step.gemv, gbps(step_bytes, step.gemv), step.gemm, gbps(step_bytes, step.gemm),
        step.cublaslt, gbps(step_bytes, step.cublaslt),
        static_cast<double>(T) * step_bytes / step.ours / 1e6);
    std::fflush(stdout);
  }
}

void print_tuning(LinearBench& bench, const std::vector<int32_t>& rows, const std::string& only) {
  std::printf(
      "| group | n | K | T | heuristic us | tuned us | chosen of | tuned TFLOP/s | in tuning: "
      "heuristic us | tuned us |\n"
      "|---|---|---|---|---|---|---|---|---|---|\n");
  // Also the MLP's gate and up as one GEMM of stacked weights (the MLP's input projection as
  // vLLM's MergedColumnParallelLinear runs it).
  std::vector<Group> groups = groups_4b();
  groups.push_back({"mlp gate + up stacked", {2 * 9216}, 2560, 0});
  for (const int32_t T : rows)
    for (const Group& g : groups) {
      if (g.name.find(only) == std::string::npos) continue;
      for (const int64_t n : g.n) {
        const auto t = bench.tune(n, g.K, T);
        std::printf("| %s | %lld | %lld | %d | %.1f | %.1f | %d of %d | %.0f | %.1f | %.1f |\n",
                    g.name.c_str(), static_cast<long long>(n), static_cast<long long>(g.K), T,
                    t.heuristic_us, t.tuned_us, t.tuning.chosen, t.tuning.candidates,
                    2e-6 * T * n * g.K / t.tuned_us, 1e3 * t.tuning.heuristic_ms,
                    1e3 * t.tuning.best_ms);
        std::fflush(stdout);
      }
    }
}

void print_mlp(LinearBench& bench, const std::vector<int32_t>& rows) {
  std::printf(
      "| T | fused us | fused TFLOP/s | cuBLASLt + SiLU-mul us | cuBLASLt GEMM alone us | GEMM "
      "TFLOP/s |\n|---|---|---|---|---|---|\n");
  for (const int32_t T : rows) {
    const auto t = bench.time_mlp(T);
    const double flops = 2.0 * T * 2 * kMlpI * kMlpK;
    std::printf("| %d | %.1f | %.0f | %.1f | %.1f | %.0f |\n", T, t.fused, flops / t.fused / 1e6,
                t.unfused, t.gemm_only, flops / t.gemm_only / 1e6);
    std::fflush(stdout);
  }
}

}  // namespace

int main(int argc, char** argv) {
  try {
    std::vector<std::string> args(argv + 1, argv + argc);
    const ds::app::Args a(args, "linear_bench", {"rows", "rounds", "only", "tune", "mlp"});
    const std::vector<int32_t> rows = ds::app::parse_ids(a.get("rows", "1,4,8,16"), kMaxRows + 1);
    for (int32_t T : rows)
      if (T < 1) throw ds::Error("--rows: token counts start at 1");
    LinearBench bench(static_cast<int>(a.get_int("rounds", 5, 1, 1000)));
    if (a.has("mlp"))
      print_mlp(bench, rows);
    else if (a.has("tune"))
      print_tuning(bench, rows, a.get("only", ""));
    else
      print_table(bench, rows, a.get("only", ""));
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "linear_bench: %s\n", e.what());
    return 1;
  }
}
