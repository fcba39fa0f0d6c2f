// overlap_bench: how much of serving's decode work can run beside its prefill work on one GPU —
// what running a mixed step's decode rows as a sub-step of their own (on a stream of their own,
// beside the prefill's layers) could give (bench/results/host_2026-12-05.md). Two lanes, each a
// backend of its own (streams, workspaces) with a model (dummy weights) and a runner: one runs
// fresh prefills of N tokens (eager, on GEMM algorithms tuned for N), the other decode steps of B
// rows at context C (graphed, or eager with --eager-decode). Each alone, then both at once from
// two host threads: the prefills' and the decode steps' times beside each other, and the work done
// a second against running the same steps in turn (1.00: no overlap; 2.00: each hidden entirely).
// With --decode-sms S the two lanes hold SMs of their own (CUDA green contexts): the decode lane
// at least S of them, the prefill lane the rest; "alone" and the last column's "in turn" are then
// each lane alone on its own share — against the whole GPU in turn, take the rows of a run without
// --decode-sms (bench/results/h200_2026-12-05c.md: at best ~1.09x at 256 rows).
// Usage: overlap_bench --model DIR [--decode-rows 64,256] [--context 8192] [--prefill 8192]
//                      [--prefills 6] [--eager-decode] [--decode-sms S]
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "app/args.h"
#include "backend/cuda/cuda_backend.h"
#include "bench_batches.h"
#include "core/error.h"
#include "model/loader.h"
#include "runtime/model_runner.h"

namespace ds = deltaserve;
using ds::bench::median;
using clock_type = std::chrono::steady_clock;

namespace {

constexpr int32_t kPage = 16;

// A backend with its own streams and workspaces (on a share of the SMs where `sms` is given), a
// model on it and a runner of `limits`.
struct Lane {
  Lane(const std::string& dir, const ds::runtime::PlanLimits& limits, int32_t pages,
       const ds::cuda::SmPartition* sms)
      : be(0, sms),
        model(ds::model::load_model(dir, ds::model::LoadFormat::kDummy, be, true)),
        runner(*model, ds::runtime::plan_for(*model, limits, ds::bench::bench_budget(pages))),
        vocab(static_cast<int32_t>(model->config().vocab_size)) {}

  // One step, waited for (its sampled tokens back on the host); ms.
  double step(const ds::StepBatch& b) {
    const std::vector<ds::backend::SampleSpec> specs(b.sample_rows().size());
    return ds::bench::elapsed_ms([&] { runner.forward_sample(b, vocab, specs); });
  }
  double median_step(const ds::StepBatch& b, int n) {
    return ds::bench::median_ms([&] { step(b); }, n, 1);
  }

  ds::backend::CudaBackend be;
  std::unique_ptr<ds::model::Qwen35Model> model;
  ds::runtime::ModelRunner runner;
  int32_t vocab;
};

struct Beside {
  double prefill_ms, decode_ms, window_ms;
  double decode_steps;  // within the window: steps at its edges by the share of them inside it
};

// `n` prefills on this thread while another thread runs decode steps until they are done: the
// prefills' median, the median of the decode steps wholly inside the prefills' window, and how
// many decode steps the window held (those at its edges by the share of their time inside it).
Beside run_beside(Lane& prefill, const ds::StepBatch& pb, Lane& decode, const ds::StepBatch& db,
                  int n) {
  std::atomic<bool> stop{false};
  std::vector<std::pair<clock_type::time_point, clock_type::time_point>> steps;  // start, end
  std::thread t([&] {
    cudaSetDevice(0);
    while (!stop.load()) {
      const auto s0 = clock_type::now();
      decode.step(db);
      steps.emplace_back(s0, clock_type::now());
    }
  });
  prefill.step(pb);  // with the decode steps running
  std::vector<double> times;
  const auto w0 = clock_type::now();
  for (int i = 0; i < n; ++i) times.push_back(prefill.step(pb));
  const auto w1 = clock_type::now();
  stop = true;
  t.join();
  std::vector<double> inside;
  double held = 0;
  for (const auto& [s0, s1] : steps) {
    const double ms = std::chrono::duration<double, std::milli>(s1 - s0).count();
    const double in =
        std::chrono::duration<double, std::milli>(std::min(s1, w1) - std::max(s0, w0)).count();
    if (in > 0) held += in / ms;
    if (s0 >= w0 && s1 <= w1) inside.push_back(ms);
  }
  return {median(times), median(inside), std::chrono::duration<double, std::milli>(w1 - w0).count(),
          held};
}

}  // namespace

int main(int argc, char** argv) {
  try {
    std::vector<std::string> args(argv + 1, argv + argc);
    ds::app::Args a(args, "overlap_bench",
                    {"model", "decode-rows", "context", "prefill", "prefills", "decode-sms"},
                    {"eager-decode"});
    const std::string dir = a.get("model", "");
    const std::vector<int32_t> rows = ds::bench::parse_list(a.get("decode-rows", "64,256"));
    const int32_t ctx = static_cast<int32_t>(a.get_int("context", 8192, 1, 1 << 20));
    const int32_t N = static_cast<int32_t>(a.get_int("prefill", 8192, 1, 1 << 20));
    const int n = static_cast<int>(a.get_int("prefills", 6, 1, 1000));
    const bool eager_decode = a.has("eager-decode");
    const int32_t maxB = *std::max_element(rows.begin(), rows.end());
    const int32_t pps = (ctx + 1 + kPage - 1) / kPage, ppp = (N + kPage - 1) / kPage;

    std::optional<std::pair<ds::cuda::SmPartition, ds::cuda::SmPartition>> shares;
    if (a.has("decode-sms"))
      shares.emplace(ds::cuda::SmPartition::split(
          0, static_cast<int>(a.get_int("decode-sms", 32, 1, 1 << 10))));
    Lane pre(dir, ds::bench::bench_limits(kPage, 1, N, 1, ppp), 1 + ppp,
             shares ? &shares->second : nullptr);
    pre.runner.tune_linears(N);
    Lane dec(dir, ds::bench::bench_limits(kPage, maxB, maxB, pps, 1), maxB * pps,
             shares ? &shares->first : nullptr);
    dec.runner.capture_decode_graphs(rows, pps);
    dec.runner.set_eager(eager_decode);
    const ds::StepBatch pb = ds::bench::prefill_batch(N, pre.vocab, kPage, 0, 0, ppp);
    const double prefill_alone = pre.median_step(pb, n);
    const std::string sm_split = shares ? std::to_string(shares->first.sm_count()) + " / " +
                                              std::to_string(shares->second.sm_count())
                                        : "all / all";

    std::printf(
        "\n| decode rows | ctx | decode | SMs (decode / prefill) | prefill N | prefill ms alone | "
        "decode ms alone | prefill "
        "ms beside decode | decode ms beside prefill | decode steps in %d prefills | work a "
        "second vs each lane alone in turn |\n|---|---|---|---|---|---|---|---|---|---|---|\n",
        n);
    for (const int32_t B : rows) {
      const ds::StepBatch db = ds::bench::decode_batch(B, dec.vocab, ctx, kPage, pps);
      const double decode_alone = dec.median_step(db, 20);
      const Beside b = run_beside(pre, pb, dec, db, n);
      const double in_turn = n * prefill_alone + b.decode_steps * decode_alone;
      std::printf("| %d | %d | %s | %s | %d | %.2f | %.3f | %.2f | %.3f | %.1f | %.2f |\n", B, ctx,
                  eager_decode ? "eager" : "graphed", sm_split.c_str(), N, prefill_alone,
                  decode_alone, b.prefill_ms, b.decode_ms, b.decode_steps, in_turn / b.window_ms);
      std::fflush(stdout);
    }
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "overlap_bench: %s\n", e.what());
    return 1;
  }
}
