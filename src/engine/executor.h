// Executor: runs the engine's steps on the model. LocalExecutor calls one model on the engine
// thread; TpExecutor runs one model shard per rank, each on its own worker thread that owns its
// backend, communicator, weight shard and model runner (KV pages, GDN state, step buffers, graphs;
// DESIGN.md decisions 4-5). Every rank gets the same StepBatch in the same order, so collectives
// line up; rank 0's logits come back. Both fail the same way: a step that throws fails the engine.
#pragma once

#include <chrono>
#include <condition_variable>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "backend/backend.h"
#include "core/step_batch.h"
#include "dist/communicator.h"
#include "dist/parallel.h"
#include "model/qwen35.h"
#include "runtime/model_runner.h"

namespace deltaserve::engine {

class Executor {
 public:
  virtual ~Executor() = default;
  // The model's global config (the same on every rank).
  virtual const model::ModelConfig& config() const = 0;
  // The memory plan of one rank for these limits and budget (under TP, the rank that fits the
  // fewest KV pages decides).
  virtual runtime::MemoryPlan plan_memory(const runtime::PlanLimits& limits,
                                          const runtime::MemoryBudget& budget) = 0;
  // Builds every rank's model runner from `plan` (allocating its caches and step buffers).
  virtual void configure(const runtime::MemoryPlan& plan) = 0;
  // Runs one step on every rank and returns rank 0's logits of the sampled rows. Throws
  // DeviceError when any rank failed; the executor is then poisoned and every later call throws.
  virtual std::vector<float> execute(const StepBatch& batch) = 0;
  // Runs one step and samples one token per sampled row on rank 0's backend.
  virtual std::vector<backend::Sampled> execute_sample(
      const StepBatch& batch, int32_t vocab, const std::vector<backend::SampleSpec>& specs) = 0;
  // Captures decode graphs for `buckets` on every rank, in lock-step (a no-op on backends without
  // graphs); see ModelRunner::capture_decode_graphs. Returns the buckets captured.
  virtual std::vector<int32_t> capture_decode_graphs(const std::vector<int32_t>& buckets,
                                                     int32_t max_pages_per_seq) = 0;
  // Copies GDN state slot `src` to `dst` on every rank.
  virtual void copy_state(int32_t src, int32_t dst) = 0;
  // Turns graph replay off (true) or back on for the steps that follow, on every rank.
  virtual void set_eager(bool eager) = 0;
  // Free and total device memory: the minimum over ranks; false where the backends have no such
  // limit (CPU).
  virtual bool memory_info(size_t& free_bytes, size_t& total_bytes) = 0;
  // The tensor-parallel degree.
  virtual int degree() const { return 1; }
  // The TPSP settings every rank's model uses from the next step on (a no-op with one rank).
  virtual void set_tpsp(const dist::TpspConfig& tpsp) { (void)tpsp; }
  // One eager step of `tokens` padding rows on every rank, returning when all are done (the TPSP
  // startup profile times it; ModelRunner::run_padding_step).
  virtual void run_padding_step(int32_t tokens) = 0;
  // ModelRunner::tune_linears on every rank.
  virtual void tune_linears(int32_t tokens) = 0;
};

class LocalExecutor final : public Executor {
 public:
  explicit LocalExecutor(model::Qwen35Model& m) : m_(m) {}
  const model::ModelConfig& config() const override { return m_.config(); }
  runtime::MemoryPlan plan_memory(const runtime::PlanLimits& limits,
                                  const runtime::MemoryBudget& budget) override {
    return runtime::plan_for(m_, limits, budget);
  }
  void configure(const runtime::MemoryPlan& plan) override {
    runner_.reset();
    runner_ = std::make_unique<runtime::ModelRunner>(m_, plan);
  }
  std::vector<float> execute(const StepBatch& batch) override { return runner().forward(batch); }
  std::vector<backend::Sampled> execute_sample(
      const StepBatch& batch, int32_t vocab,
      const std::vector<backend::SampleSpec>& specs) override {
    return runner().forward_sample(batch, vocab, specs);
  }
  std::vector<int32_t> capture_decode_graphs(const std::vector<int32_t>& buckets,
                                             int32_t max_pages_per_seq) override {
    runner().capture_decode_graphs(buckets, max_pages_per_seq);
    return runner().graph_buckets();
  }
  void copy_state(int32_t src, int32_t dst) override { runner().copy_state(src, dst); }
  void set_eager(bool eager) override { runner().set_eager(eager); }
  bool memory_info(size_t& free_bytes, size_t& total_bytes) override {
    return m_.backend().memory_info(free_bytes, total_bytes);
  }
  void run_padding_step(int32_t tokens) override { runner().run_padding_step(tokens); }
  void tune_linears(int32_t tokens) override { runner().tune_linears(tokens); }

 private:
  runtime::ModelRunner& runner() {
    DS_CHECK(runner_ != nullptr, "configure the executor first");
    return *runner_;
  }
  model::Qwen35Model& m_;
  std::unique_ptr<runtime::ModelRunner> runner_;
};

class TpExecutor final : public Executor {
 public:
  using BackendFactory = std::function<std::unique_ptr<backend::Backend>(int rank)>;
  using ModelFactory = std::function<std::unique_ptr<model::Qwen35Model>(
      int rank, backend::Backend&, dist::Communicator*)>;
  // Makes rank `rank`'s communicator on its worker thread after its backend (e.g. NCCL on the
  // backend's stream). Without one, ranks use the in-process group (CPU ranks).
  using CommFactory =
      std::function<std::unique_ptr<dist::Communicator>(int rank, backend::Backend&)>;

  // Starts `size` workers; each makes its backend and loads its shard on its own thread. Throws the
  // first rank's error. A step that takes longer than `step_timeout` poisons the executor.
  // With `make_comm`, every rank's model all-reduces through its communicator, one rank included
  // (so TP 1 runs the NCCL path too), and a failing rank aborts every communicator.
  TpExecutor(int size, BackendFactory make_backend, ModelFactory make_model,
             std::chrono::milliseconds step_timeout = std::chrono::minutes(30),
             CommFactory make_comm = {});
  // Stops the workers; a rank blocked in a collective is released by poisoning the group.
  ~TpExecutor() override;

  const model::ModelConfig& config() const override;
  runtime::MemoryPlan plan_memory(const runtime::PlanLimits& limits,
                                  const runtime::MemoryBudget& budget) override;
  void configure(const runtime::MemoryPlan& plan) override;
  std::vector<float> execute(const StepBatch& batch) override;
  std::vector<backend::Sampled> execute_sample(
      const StepBatch& batch, int32_t vocab,
      const std::vector<backend::SampleSpec>& specs) override;
  std::vector<int32_t> capture_decode_graphs(const std::vector<int32_t>& buckets,
                                             int32_t max_pages_per_seq) override;
  void copy_state(int32_t src, int32_t dst) override;
  void set_eager(bool eager) override;
  bool memory_info(size_t& free_bytes, size_t& total_bytes) override;
  int degree() const override { return static_cast<int>(workers_.size()); }
  void set_tpsp(const dist::TpspConfig& tpsp) override;
  void run_padding_step(int32_t tokens) override;
  void tune_linears(int32_t tokens) override;

 private:
  struct Worker {
    int rank = 0;
    std::unique_ptr<backend::Backend> be;
    std::unique_ptr<dist::Communicator> comm;
    std::unique_ptr<model::Qwen35Model> model;
    std::unique_ptr<runtime::ModelRunner> runner;
    std::thread thread;
  };
  void worker_loop(Worker& w);
  // Poisons the group and aborts every rank's communicator (once).
  void fail(const std::string& why);
  void shutdown();
  // Runs `task` on every worker and waits (bounded); throws the first error.
  void run_on_all(const std::function<void(Worker&)>& task);

  dist::LocalGroup group_;
  std::chrono::milliseconds step_timeout_;
  std::vector<std::unique_ptr<Worker>> workers_;
  std::mutex mu_;
  std::condition_variable task_cv_, done_cv_;
  std::function<void(Worker&)> task_;
  uint64_t task_gen_ = 0;
  int done_ = 0;
  bool stop_ = false;
  std::string error_;   // first failure; non-empty = poisoned
  std::mutex comm_mu_;  // guards the communicators against abort during their creation
  bool aborted_ = false;
  std::vector<float> logits_;
  std::vector<backend::Sampled> sampled_;
};

}  // namespace deltaserve::engine
