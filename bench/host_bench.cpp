// host_bench: the engine's host path alone — an Engine over an executor whose steps return at once
// (NullExecutor: no model, the tokens drawn from a seeded sequence), on a closed-loop workload of
// fixed prompt and output lengths at a concurrency, clients reading their streams as the server
// does (a stream's listener queues it, one reader drains the queued ones). So every second of it is
// the engine thread's scheduling, batch building, output processing (incremental detokenization
// with --tokenizer) and stream pushes, which a GPU step waits for. Prints steps, wall seconds and
// the host milliseconds a step, e.g. serving's 8k in / 1k out at c = 256:
//   host_bench --tokenizer DIR --concurrency 256 --num-prompts 512
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <memory>
#include <mutex>
#include <random>
#include <thread>
#include <vector>

#include "app/args.h"
#include "core/error.h"
#include "engine/engine.h"
#include "model/config.h"
#include "runtime/memory_plan.h"
#include "tokenizer/tokenizer.h"

using namespace deltaserve;

namespace {

// Steps that do no work: each sleeps `step` (a GPU step's stand-in, so that clients replace
// finished requests between steps as they do on a GPU; not counted as host time) and every
// sampled row gets the next token of a seeded sequence over [first_token, vocab), never an EOS.
class NullExecutor final : public engine::Executor {
 public:
  NullExecutor(model::ModelConfig c, int32_t first_token, int32_t vocab,
               std::chrono::microseconds step)
      : c_(std::move(c)),
        first_(first_token),
        span_(static_cast<uint32_t>(vocab - first_token)),
        step_(step) {}
  const model::ModelConfig& config() const override { return c_; }
  runtime::MemoryPlan plan_memory(const runtime::PlanLimits& limits,
                                  const runtime::MemoryBudget& budget) override {
    return runtime::plan_memory(c_, DType::kBF16, limits, budget, 0);
  }
  void configure(const runtime::MemoryPlan&) override {}
  std::vector<float> execute(const StepBatch&) override { return {}; }
  std::vector<backend::Sampled> execute_sample(
      const StepBatch&, int32_t, const std::vector<backend::SampleSpec>& specs) override {
    std::this_thread::sleep_for(step_);
    std::vector<backend::Sampled> out(specs.size());
    for (backend::Sampled& s : out) s.token = first_ + static_cast<int32_t>(g_() % span_);
    return out;
  }
  std::vector<int32_t> capture_decode_graphs(const std::vector<int32_t>&, int32_t) override {
    return {};
  }
  void copy_state(int32_t, int32_t) override {}
  void set_eager(bool) override {}
  bool memory_info(size_t&, size_t&) override { return false; }
  void run_padding_step(int32_t) override {}
  void tune_linears(int32_t) override {}

 private:
  model::ModelConfig c_;
  int32_t first_;
  uint32_t span_;
  std::chrono::microseconds step_;
  std::mt19937 g_{7};
};

// The clients: `concurrency` requests in flight until `prompts` have finished; a stream's listener
// queues its index, and this thread drains the queued streams, replacing each finished request.
class ClosedLoop {
 public:
  ClosedLoop(engine::Engine& eng, std::vector<engine::GenerateRequest> prompts)
      : eng_(eng), prompts_(std::move(prompts)) {}

  void run(int concurrency) {
    for (int i = 0; i < concurrency && next_ < prompts_.size(); ++i) start(i);
    for (size_t done = 0; done < prompts_.size();) {
      std::vector<int> ready;
      {
        std::unique_lock<std::mutex> lock(mu_);
        cv_.wait(lock, [&] { return !ready_.empty(); });
        ready.swap(ready_);
      }
      for (const int i : ready) {
        engine::OutputDelta d;
        bool finished = false;
        while (!finished && streams_[static_cast<size_t>(i)]->try_next(d)) finished = d.finished;
        if (!finished) continue;
        if (d.finish_reason == engine::FinishReason::kError) throw Error("a request failed");
        ++done;
        if (next_ < prompts_.size()) start(i);
      }
    }
  }

 private:
  void start(int i) {
    if (streams_.size() <= static_cast<size_t>(i)) streams_.resize(static_cast<size_t>(i) + 1);
    auto& s = streams_[static_cast<size_t>(i)];
    s = eng_.submit(prompts_[next_++]);
    s->set_listener([this, i] {
      std::lock_guard<std::mutex> lock(mu_);
      ready_.push_back(i);
      cv_.notify_one();
    });
  }

  engine::Engine& eng_;
  std::vector<engine::GenerateRequest> prompts_;
  size_t next_ = 0;
  std::vector<std::shared_ptr<engine::RequestStream>> streams_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<int> ready_;
};

}  // namespace

int main(int argc, char** argv) {
  try {
    const app::Args a(
        std::vector<std::string>(argv + 1, argv + argc), "host_bench",
        {"config", "tokenizer", "input-len", "output-len", "concurrency", "num-prompts",
         "max-num-seqs", "max-num-batched-tokens", "num-pages", "seed"},
        {"no-prefix-caching"});
    const model::ModelConfig mc =
        model::load_model_config(a.get("config", "bench/configs/qwen3.5-4b"));
    std::unique_ptr<tokenizer::Tokenizer> tok;
    if (a.has("tokenizer"))
      tok = tokenizer::Tokenizer::from_file(std::filesystem::path(a.get("tokenizer", "")) /
                                            "tokenizer.json");
    const int32_t vocab =
        tok ? std::min<int32_t>(tok->vocab_size(), static_cast<int32_t>(mc.vocab_size))
            : static_cast<int32_t>(mc.vocab_size);
    const int in_len = static_cast<int>(a.get_int("input-len", 8192, 1, 1 << 20));
    const int out_len = static_cast<int>(a.get_int("output-len", 1024, 1, 1 << 20));
    const int concurrency = static_cast<int>(a.get_int("concurrency", 256, 1, 1 << 16));
    const int n = static_cast<int>(a.get_int("num-prompts", 2 * concurrency, 1, 1 << 20));
    engine::EngineConfig cfg;
    cfg.max_num_seqs = static_cast<int32_t>(a.get_int("max-num-seqs", concurrency, 1, 1 << 16));
    cfg.max_num_batched_tokens =
        static_cast<int32_t>(a.get_int("max-num-batched-tokens", 8192, 1, 1 << 24));
    cfg.max_model_len = in_len + out_len;
    runtime::MemoryBudget budget;  // KV room for every request in flight by default
    budget.pages = static_cast<int32_t>(a.get_int(
        "num-pages", int64_t{cfg.max_num_seqs} * ((cfg.max_model_len + 15) / 16), 1, 1 << 30));
    cfg.budget = budget;
    cfg.enforce_eager = true;
    cfg.enable_prefix_caching = !a.has("no-prefix-caching");
    if (cfg.enable_prefix_caching) cfg.num_snapshots = 4 * cfg.max_num_seqs;
    NullExecutor exec(mc, 1000, vocab,
                      std::chrono::microseconds(a.get_int("step-us", 1000, 0, 1000000)));
    engine::Engine eng(exec, cfg, tok.get());

    std::mt19937 g(static_cast<uint32_t>(a.get_int("seed", 0, 0, 1LL << 32)));
    std::vector<engine::GenerateRequest> prompts(static_cast<size_t>(n));
    for (engine::GenerateRequest& r : prompts) {
      for (int t = 0; t < in_len; ++t)
        r.prompt_ids.push_back(static_cast<int32_t>(g() % static_cast<uint32_t>(vocab)));
      r.params.temperature = 0;
      r.params.ignore_eos = true;
      r.params.max_tokens = out_len;
    }
    const auto t0 = std::chrono::steady_clock::now();
    ClosedLoop(eng, std::move(prompts)).run(concurrency);
    const double wall =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    const engine::MetricsSnapshot m = eng.metrics();
    std::printf(
        "{\"steps\": %lld, \"wall_s\": %.3f, \"engine_host_s\": %.3f, \"engine_forward_s\": %.3f, "
        "\"host_ms_per_step\": %.4f, \"preemptions\": %lld, \"detokenized\": %s}\n",
        static_cast<long long>(m.steps), wall, m.host_seconds, m.forward_seconds,
        m.steps > 0 ? 1e3 * m.host_seconds / static_cast<double>(m.steps) : 0.0,
        static_cast<long long>(m.preemptions), tok ? "true" : "false");
  } catch (const Error& e) {
    std::fprintf(stderr, "host_bench: %s\n", e.what());
    return 1;
  }
  return 0;
}
