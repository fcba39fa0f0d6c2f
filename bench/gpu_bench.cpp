// gpu_bench: model-level timings on one CUDA GPU for the benchmark table of bench/results/:
// decode step time at batch sizes B (every sequence at context C; eager and CUDA-graphed; greedy
// sampling on the GPU included) and prefill throughput for prompts of N tokens (one step each),
// next to the memory-bandwidth floor of a decode step and the tensor-core peak. With --profile, a
// per-op breakdown (CUDA events) of one eager decode step per B and of each prefill follows.
// Each prefill of N tokens runs on the cuBLASLt algorithms tuned for N first (as a server whose
// step budget is N tunes them at start-up; DS_GEMM_TUNE=0: cuBLASLt's first heuristic).
// Usage: gpu_bench --model DIR [--batches 1,16,64,256] [--context 1024]
//                  [--prefill 512,2048,8192] [--iters 30] [--profile]
//                  [--mamba-ssm-cache-dtype auto|float32|bfloat16]  (the GDN state: bf16 halves
//                  its bytes in the decode floor too)
//                  [--kv-cache-dtype auto|fp8]  (fp8 e4m3 KV pages: half the KV bytes)
//                  [--mixed 64,256]  (steps of serving under load, eager: B decode rows at
//                  the context and a prefill chunk filling the step to --prefill's largest)
// With --tp 1,2[,4] it prints the tensor-parallel tables instead, every degree in one run (TP N on
// NCCL ranks over GPUs 0..N-1 through the server's TpExecutor; TP 1 without collectives): per-rank
// memory, decode step time (graphed) at each B and prefill throughput, and for N > 1 the time of
// the step's all-reduces alone (the same count and sizes on the same GPUs, captured in a CUDA graph
// like the decode step) next to the rest (compute). Skips degrees above the visible GPU count.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <string>
#include <thread>
#include <vector>

#include "app/args.h"
#include "app/cache_flags.h"
#include "app/gpu_ranks.h"
#include "backend/cuda/cuda_backend.h"
#include "bench_batches.h"
#include "core/error.h"
#include "dist/nccl_communicator.h"
#include "model/loader.h"
#include "model/tp_shard.h"
#include "runtime/model_runner.h"

namespace ds = deltaserve;
using clock_type = std::chrono::steady_clock;

namespace {

using namespace ds::bench;

// Peak figures of H200.md (measured there): device copy bandwidth and bf16 GEMM throughput.
constexpr double kBandwidth = 4.25e12, kPeakFlops = 768e12;

struct Bytes {
  double weights, state_per_seq, kv_per_token;
};

// Per-rank bytes of a (rank-local) config: weights as loaded, the GDN state of one sequence (f32
// recurrent state + bf16 conv window) and the KV of one token over the full-attention layers.
Bytes rank_bytes(const ds::model::Qwen35Model& m) {
  const ds::model::ModelConfig& c = m.rank_config();
  return {static_cast<double>(m.weights().total_bytes),
          static_cast<double>(c.num_layers_of(ds::model::LayerType::kLinearAttention) *
                              (c.lin_num_v_heads * c.lin_k_dim * c.lin_v_dim * 4 +
                               c.conv_dim() * (c.conv_kernel - 1) * 2)),
          static_cast<double>(c.num_layers_of(ds::model::LayerType::kFullAttention) * 2 *
                              c.num_kv_heads * c.head_dim * 2)};
}

// Milliseconds of `calls` back-to-back bf16 all-reduces of each of `elems` elements over N NCCL
// ranks on GPUs 0..N-1, captured in one CUDA graph per size and rank and replayed (median of
// `iters`, rank 0's events).
std::vector<double> allreduce_ms(int N, const std::vector<int64_t>& elems, int calls, int iters) {
  const ncclUniqueId id = ds::dist::nccl_unique_id();
  std::vector<double> result(elems.size());
  std::vector<std::thread> ts;
  std::vector<std::string> errors(static_cast<size_t>(N));
  const int64_t most = *std::max_element(elems.begin(), elems.end());
  for (int r = 0; r < N; ++r)
    ts.emplace_back([&, r] {
      try {
        ds::backend::CudaBackend be(r);
        ds::dist::NcclCommunicator comm(id, N, r, r, [&be] { return be.stream(); });
        ds::Buffer buf = be.alloc(ds::DType::kBF16, {most});
        DS_CHECK(cudaMemsetAsync(buf.tensor().data, 0, static_cast<size_t>(most) * 2,
                                 be.stream()) == cudaSuccess,
                 "memset");
        cudaEvent_t e0, e1;
        cudaEventCreate(&e0);
        cudaEventCreate(&e1);
        for (size_t k = 0; k < elems.size(); ++k) {
          const ds::Tensor t(buf.tensor().data, ds::DType::kBF16, {elems[k]});
          comm.barrier();
          cudaGraph_t g;
          cudaGraphExec_t ge;
          DS_CHECK(
              cudaStreamBeginCapture(be.stream(), cudaStreamCaptureModeThreadLocal) == cudaSuccess,
              "capture");
          for (int i = 0; i < calls; ++i) comm.all_reduce_sum(t);
          DS_CHECK(cudaStreamEndCapture(be.stream(), &g) == cudaSuccess, "end capture");
          DS_CHECK(cudaGraphInstantiate(&ge, g, 0) == cudaSuccess, "instantiate");
          std::vector<double> times;
          for (int i = 0; i < iters + 2; ++i) {
            cudaEventRecord(e0, be.stream());
            cudaGraphLaunch(ge, be.stream());
            cudaEventRecord(e1, be.stream());
            cudaEventSynchronize(e1);
            float ms = 0;
            cudaEventElapsedTime(&ms, e0, e1);
            if (i >= 2) times.push_back(ms);
          }
          cudaGraphExecDestroy(ge);  // before the communicator goes (NCCL waits for its graphs)
          cudaGraphDestroy(g);
          if (r == 0) result[k] = median(times);
        }
        comm.barrier();
        cudaEventDestroy(e0);
        cudaEventDestroy(e1);
      } catch (const std::exception& e) {
        errors[static_cast<size_t>(r)] = e.what();
      }
    });
  for (auto& t : ts) t.join();
  for (const auto& e : errors)
    if (!e.empty()) throw ds::Error("all-reduce benchmark: " + e);
  return result;
}

int run_tp(const std::string& dir, const std::vector<int32_t>& tps,
           const std::vector<int32_t>& batches, const std::vector<int32_t>& prefills, int32_t ctx,
           int iters) {
  int gpus = 0;
  cudaGetDeviceCount(&gpus);
  const ds::model::ModelConfig gc = ds::model::load_config(dir);
  const int32_t page = 16;
  const int32_t maxB = *std::max_element(batches.begin(), batches.end());
  const int32_t maxN = prefills.empty() ? 1 : *std::max_element(prefills.begin(), prefills.end());
  const int32_t pps = (ctx + 1 + page - 1) / page, ppp = (maxN + page - 1) / page;
  // Mixer out + MLP down per layer, and the vocabulary-parallel embedding's (the lm_head's
  // all-gather of R x V / N logits is not timed here).
  const int ar_per_step = 2 * static_cast<int>(gc.num_layers) + 1;
  struct Row {
    int tp;
    std::string what;
    int64_t tokens;  // of the step
    bool time_ar;    // time its all-reduces alone (graphed decode steps and prefills)
    double ms, ar_ms;
  };
  std::vector<Row> rows;
  std::printf(
      "\n%s: H %lld, %lld layers, %lld/%lld heads, GDN %lld/%lld, I %lld; %d GPUs visible\n",
      dir.c_str(), static_cast<long long>(gc.hidden_size), static_cast<long long>(gc.num_layers),
      static_cast<long long>(gc.num_heads), static_cast<long long>(gc.num_kv_heads),
      static_cast<long long>(gc.lin_num_k_heads), static_cast<long long>(gc.lin_num_v_heads),
      static_cast<long long>(gc.intermediate_size), gpus);
  std::printf(
      "\n| TP | weights GB / rank | GDN state MiB / seq / rank | KV KiB / token / rank | free GiB "
      "(min over ranks, after cache) | load s |\n|---|---|---|---|---|---|\n");
  std::fflush(stdout);
  for (const int N : tps) {
    if (N > gpus) {
      std::printf("| %d | skipped: %d GPUs visible | | | | |\n", N, gpus);
      continue;
    }
    ds::model::validate_tp(gc, N);
    std::vector<ds::model::Qwen35Model*> models(static_cast<size_t>(N));
    const auto t0 = clock_type::now();
    const auto exp = ds::app::make_gpu_tp_executor(
        N,
        [&](int rank, ds::backend::Backend& be, ds::dist::Communicator* comm) {
          auto m = ds::model::load_model(dir, ds::model::LoadFormat::kDummy, be, false, {N, rank},
                                         N > 1 ? comm : nullptr);
          models[static_cast<size_t>(rank)] = m.get();
          return m;
        },
        std::chrono::minutes(10));
    ds::engine::TpExecutor& ex = *exp;
    const double load_s = std::chrono::duration<double>(clock_type::now() - t0).count();
    ex.configure(ex.plan_memory(bench_limits(page, maxB, std::max(maxN, maxB), pps, ppp),
                                bench_budget(maxB * pps + ppp)));
    ex.capture_decode_graphs(batches, std::max(pps, ppp));
    size_t free_b = 0, total_b = 0;
    ex.memory_info(free_b, total_b);
    const Bytes b = rank_bytes(*models[0]);
    std::printf("| %d | %.2f | %.1f | %.1f | %.1f | %.0f |\n", N, b.weights / 1e9,
                b.state_per_seq / (1 << 20), b.kv_per_token / 1024, free_b / double(1 << 30),
                load_s);
    std::fflush(stdout);
    const int32_t V = static_cast<int32_t>(gc.vocab_size);
    auto time_steps = [&](const ds::StepBatch& fb, int n, bool eager) {
      ex.set_eager(eager);
      const std::vector<ds::backend::SampleSpec> specs(fb.sample_rows().size());
      return median_ms([&] { ex.execute_sample(fb, V, specs); }, n, 2);
    };
    for (const int32_t B : batches) {
      const ds::StepBatch fb = decode_batch(B, V, ctx, page, pps);
      const double eager = time_steps(fb, iters, true);
      const double graphed = time_steps(fb, iters, false);
      rows.push_back({N, "decode B=" + std::to_string(B) + " graphed", B, true, graphed, 0});
      rows.push_back({N, "decode B=" + std::to_string(B) + " eager", B, false, eager, 0});
    }
    for (const int32_t P : prefills) {
      const ds::StepBatch fb = prefill_batch(P, V, page, maxB, maxB * pps, ppp);
      ex.tune_linears(P);
      rows.push_back({N, "prefill " + std::to_string(P), P, true,
                      time_steps(fb, std::max(3, iters / 10), true), 0});
    }
  }
  // The all-reduces alone (after the executors are gone: nothing else on the GPUs), one set of
  // communicators per degree for every step size (graphed decode steps and prefills).
  for (const int N : tps) {
    std::vector<Row*> mine;
    std::vector<int64_t> elems;
    for (Row& r : rows)
      if (r.tp == N && N > 1 && r.time_ar) {
        mine.push_back(&r);
        elems.push_back(r.tokens * gc.hidden_size);
      }
    if (mine.empty()) continue;
    const std::vector<double> ms = allreduce_ms(N, elems, ar_per_step, 10);
    for (size_t k = 0; k < mine.size(); ++k) mine[k]->ar_ms = ms[k];
  }
  std::printf(
      "\n| step | TP | ms / step | tok/s | speed-up vs TP1 | scaling efficiency | all-reduces ms "
      "(%d per step, alone) | rest (compute) ms |\n|---|---|---|---|---|---|---|---|\n",
      ar_per_step);
  for (const Row& r : rows) {
    double t1 = 0;
    for (const Row& o : rows)
      if (o.tp == 1 && o.what == r.what) t1 = o.ms;
    std::printf("| %s | %d | %.3f | %.0f | %s | %s | %s | %s |\n", r.what.c_str(), r.tp, r.ms,
                static_cast<double>(r.tokens) / r.ms * 1e3,
                t1 > 0 ? std::to_string(t1 / r.ms).substr(0, 4).c_str() : "-",
                t1 > 0 ? (std::to_string(100 * t1 / r.ms / r.tp).substr(0, 4) + "%").c_str() : "-",
                r.ar_ms > 0 ? std::to_string(r.ar_ms).substr(0, 6).c_str() : "-",
                r.ar_ms > 0 ? std::to_string(r.ms - r.ar_ms).substr(0, 6).c_str() : "-");
  }
  std::fflush(stdout);
  return 0;
}

// The single-GPU tables: decode steps and prefill steps (with --profile the per-op tables).
class SingleGpuBench {
 public:
  SingleGpuBench(const std::string& model, const std::vector<int32_t>& batches,
                 const std::vector<int32_t>& prefills, int32_t ctx, int iters, bool profile,
                 ds::DType state, bool kv_fp8)
      : be_(0),
        m_(ds::model::load_model(model, ds::model::LoadFormat::kDummy, be_, true)),
        c_(m_->config()),
        batches_(batches),
        prefills_(prefills),
        ctx_(ctx),
        iters_(iters),
        profile_(profile),
        maxB_(*std::max_element(batches.begin(), batches.end())),
        maxN_(prefills.empty() ? 1 : *std::max_element(prefills.begin(), prefills.end())),
        pps_((ctx + 1 + kPage - 1) / kPage),
        ppp_((maxN_ + kPage - 1) / kPage),
        state_(state),
        kv_fp8_(kv_fp8),
        runner_(*m_, ds::runtime::plan_for(*m_,
                                           bench_limits(kPage, maxB_, std::max(maxN_, maxB_), pps_,
                                                        ppp_, state, kv_fp8),
                                           bench_budget(maxB_ * pps_ + ppp_))) {
    runner_.capture_decode_graphs(batches, std::max(pps_, ppp_));
  }

  void decode_table();
  void prefill_table();
  void mixed_table(const std::vector<int32_t>& decode_rows);
  void print_reports() const {
    for (const std::string& r : reports_) std::printf("\n%s", r.c_str());
  }

 private:
  static constexpr int32_t kPage = 16;
  // Median ms of `n` steps (after `warmup` untimed ones).
  double time_steps(const ds::StepBatch& b, int n, int warmup);

  ds::backend::CudaBackend be_;
  std::unique_ptr<ds::model::Qwen35Model> m_;
  const ds::model::ModelConfig& c_;
  std::vector<int32_t> batches_, prefills_;
  int32_t ctx_;
  int iters_;
  bool profile_;
  int32_t maxB_, maxN_, pps_, ppp_;
  ds::DType state_;  // the GDN recurrent state's dtype (--mamba-ssm-cache-dtype)
  bool kv_fp8_;      // fp8 e4m3 KV pages (--kv-cache-dtype fp8)
  ds::runtime::ModelRunner runner_;
  std::vector<std::string> reports_;
};

double SingleGpuBench::time_steps(const ds::StepBatch& b, int n, int warmup) {
  const std::vector<ds::backend::SampleSpec> specs(b.sample_rows().size());
  const int32_t vocab = static_cast<int32_t>(c_.vocab_size);
  return median_ms([&] { runner_.forward_sample(b, vocab, specs); }, n, warmup);
}

void SingleGpuBench::decode_table() {
  // Bytes a decode step must move: every weight except the embedding rows not looked up (the
  // table is read whole by a tied lm_head), plus per sequence its GDN state (read + written)
  // and its KV of the full-attention layers.
  const ds::model::ModelConfig& c = c_;
  const int64_t embed_bytes = c.vocab_size * c.hidden_size * 2;
  const double weight_bytes =
      static_cast<double>(m_->weights().total_bytes - (c.tie_word_embeddings ? 0 : embed_bytes));
  const double state_bytes =
      static_cast<double>(c.num_layers_of(ds::model::LayerType::kLinearAttention) *
                          (c.lin_num_v_heads * c.lin_k_dim * c.lin_v_dim *
                               static_cast<int64_t>(ds::dtype_size(state_)) * 2 +
                           c.conv_dim() * (c.conv_kernel - 1) * 2 * 2));
  const double kv_bytes_per_token =
      static_cast<double>(c.num_layers_of(ds::model::LayerType::kFullAttention) * 2 *
                          c.num_kv_heads * c.head_dim * (kv_fp8_ ? 1 : 2));
  std::printf(
      "\n| decode B | ctx | eager ms/step | graphed ms/step | tok/s (graphed) | floor ms "
      "(weights) | floor ms (all bytes) | graphed / weights floor |\n|---|---|---|---|"
      "---|---|---|---|\n");
  for (const int32_t B : batches_) {
    const ds::StepBatch fb = decode_batch(B, static_cast<int32_t>(c.vocab_size), ctx_, kPage, pps_);
    runner_.set_eager(true);
    const double eager = time_steps(fb, iters_, 3);
    runner_.set_eager(false);
    const double graphed = time_steps(fb, iters_, 3);
    const double floor_w = weight_bytes / kBandwidth * 1e3;
    const double floor_all =
        (weight_bytes + B * (state_bytes + kv_bytes_per_token * (ctx_ + 1))) / kBandwidth * 1e3;
    std::printf("| %d | %d | %.3f | %.3f | %.0f | %.3f | %.3f | %.2fx |\n", B, ctx_, eager, graphed,
                B / graphed * 1e3, floor_w, floor_all, graphed / floor_w);
    std::fflush(stdout);
    if (profile_) {
      be_.set_profiling(true);
      be_.profile_report(true);
      runner_.set_eager(true);
      time_steps(fb, 5, 3);
      reports_.push_back("eager decode step, B=" + std::to_string(B) +
                         " (8 steps incl. warm-up)\n" + be_.profile_report(true));
      be_.set_profiling(false);
    }
  }
}

void SingleGpuBench::prefill_table() {
  const ds::model::ModelConfig& c = c_;
  // Linear-layer FLOPs per token (lm_head only for the one sampled row).
  double linear_params = 0;
  for (const auto& l : m_->weights().layers) {
    for (const ds::Tensor* t :
         {&l.gate_proj, &l.up_proj, &l.down_proj, &l.attn.q_proj, &l.attn.k_proj, &l.attn.v_proj,
          &l.attn.o_proj, &l.gdn.in_proj_qkv, &l.gdn.in_proj_z, &l.gdn.in_proj_a, &l.gdn.in_proj_b,
          &l.gdn.out_proj})
      if (!t->empty()) linear_params += static_cast<double>(t->numel());
  }
  std::printf(
      "\n| prefill N | ms | tok/s | linear+attention TFLOP/s | share of %.0f TFLOP/s |\n"
      "|---|---|---|---|---|\n",
      kPeakFlops / 1e12);
  runner_.set_eager(true);
  for (const int32_t N : prefills_) {
    const ds::StepBatch fb =
        prefill_batch(N, static_cast<int32_t>(c.vocab_size), kPage, maxB_, maxB_ * pps_, ppp_);
    runner_.tune_linears(N);
    const double ms = time_steps(fb, std::max(3, iters_ / 10) - 1, 1);
    if (profile_) {
      be_.set_profiling(true);
      be_.profile_report(true);
      time_steps(fb, 1, 0);
      reports_.push_back("prefill N=" + std::to_string(N) + " (one step)\n" +
                         be_.profile_report(true));
      be_.set_profiling(false);
    }
    const double flops =
        2.0 * linear_params * N +
        2.0 * 2.0 * c.num_heads * c.head_dim * (static_cast<double>(N) * (N + 1) / 2) *
            static_cast<double>(c.num_layers_of(ds::model::LayerType::kFullAttention));
    std::printf("| %d | %.2f | %.0f | %.1f | %.1f%% |\n", N, ms, N / ms * 1e3,
                flops / (ms * 1e-3) / 1e12, 100.0 * flops / (ms * 1e-3) / kPeakFlops);
    std::fflush(stdout);
  }
}

// Steps of maxN tokens: B decode rows (context ctx) and a prefill chunk of maxN - B, eager.
void SingleGpuBench::mixed_table(const std::vector<int32_t>& decode_rows) {
  std::printf(
      "\n| mixed step: decode rows | ctx | prefill tokens | ms | prefill alone ms |\n"
      "|---|---|---|---|---|\n");
  runner_.set_eager(true);
  const int32_t V = static_cast<int32_t>(c_.vocab_size);
  for (const int32_t B : decode_rows) {
    if (B >= maxN_ || B > maxB_)
      throw ds::Error("--mixed: decode rows below --prefill's largest and at most --batches'");
    const ds::StepBatch fb = mixed_batch(B, maxN_, V, ctx_, kPage, pps_, ppp_);
    const double ms = time_steps(fb, 5, 1);
    const double alone = time_steps(prefill_batch(maxN_ - B, V, kPage, B, B * pps_, ppp_), 5, 1);
    std::printf("| %d | %d | %d | %.2f | %.2f |\n", B, ctx_, maxN_ - B, ms, alone);
    std::fflush(stdout);
    if (profile_) {
      be_.set_profiling(true);
      be_.profile_report(true);
      time_steps(fb, 1, 0);
      reports_.push_back("mixed step, " + std::to_string(B) + " decode rows + " +
                         std::to_string(maxN_ - B) + " prefill tokens (one step)\n" +
                         be_.profile_report(true));
      be_.set_profiling(false);
    }
  }
}

}  // namespace

int main(int argc, char** argv) {
  try {
    std::vector<std::string> args(argv + 1, argv + argc);
    ds::app::Args a(args, "gpu_bench",
                    {"model", "batches", "context", "prefill", "iters", "tp",
                     "mamba-ssm-cache-dtype", "mixed", "kv-cache-dtype"},
                    {"profile"});
    const std::vector<int32_t> batches = parse_list(a.get("batches", "1,16,64,256"));
    const std::vector<int32_t> prefills = parse_list(a.get("prefill", "512,2048,8192"));
    const int32_t ctx = static_cast<int32_t>(a.get_int("context", 1024, 1, 1 << 20));
    const int iters = static_cast<int>(a.get_int("iters", 30, 1, 10000));
    if (a.has("tp"))
      return run_tp(a.get("model", ""), parse_list(a.get("tp", "1")), batches, prefills, ctx,
                    iters);
    SingleGpuBench bench(a.get("model", ""), batches, prefills, ctx, iters, a.has("profile"),
                         ds::app::ssm_state_dtype_flag(a), ds::app::kv_cache_fp8_flag(a));
    bench.decode_table();
    bench.prefill_table();
    if (a.has("mixed")) bench.mixed_table(parse_list(a.get("mixed", "")));
    bench.print_reports();
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "gpu_bench: %s\n", e.what());
    return 1;
  }
}
