// Executor: runs the engine's steps on the model. LocalExecutor calls one model on the engine
// thread; TpExecutor runs one model shard per rank, each on its own worker thread that owns its
// backend, communicator, weight shard, KV pages and GDN state (DESIGN.md decisions 4-5). Every
// rank gets the same step in the same order, so collectives line up; rank 0's logits come back.
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
#include "dist/communicator.h"
#include "model/qwen35.h"

namespace deltaserve::engine {

class Executor {
 public:
  virtual ~Executor() = default;
  // Rank 0's model config (vocabulary, EOS, positions are the same on every rank).
  virtual const model::ModelConfig& config() const = 0;
  // Allocates `pages` KV pages and `slots` state slots on every rank (the minimum that every rank
  // can hold is the caller's capacity).
  virtual void allocate_cache(int32_t pages, int32_t page_size, int32_t slots) = 0;
  // Runs one step on every rank and returns rank 0's logits. Throws deltaserve::Error when any rank
  // failed; the executor is then poisoned and every later call throws at once.
  virtual std::vector<float> execute(const model::ForwardBatch& batch) = 0;
  // Runs one step and samples one token per logits row on rank 0's backend.
  virtual std::vector<backend::Sampled> execute_sample(
      const model::ForwardBatch& batch, int32_t vocab,
      const std::vector<backend::SampleSpec>& specs) = 0;
  // Captures decode graphs for `buckets` on every rank, in lock-step (a no-op on backends without
  // graphs); see Qwen35Model::capture_decode_graphs. Returns the buckets captured.
  virtual std::vector<int32_t> capture_decode_graphs(const std::vector<int32_t>& buckets,
                                                     int64_t max_tokens, int32_t max_seqs,
                                                     int32_t max_pages_per_seq) = 0;
  // Free and total device memory: the minimum over ranks; false where the backends have no such
  // limit (CPU).
  virtual bool memory_info(size_t& free_bytes, size_t& total_bytes) = 0;
};

class LocalExecutor final : public Executor {
 public:
  explicit LocalExecutor(model::Qwen35Model& m) : m_(m) {}
  const model::ModelConfig& config() const override { return m_.config(); }
  void allocate_cache(int32_t pages, int32_t page_size, int32_t slots) override {
    m_.allocate_cache(pages, page_size, slots);
  }
  std::vector<float> execute(const model::ForwardBatch& batch) override {
    return m_.forward(batch);
  }
  std::vector<backend::Sampled> execute_sample(
      const model::ForwardBatch& batch, int32_t vocab,
      const std::vector<backend::SampleSpec>& specs) override {
    return m_.forward_sample(batch, vocab, specs);
  }
  std::vector<int32_t> capture_decode_graphs(const std::vector<int32_t>& buckets,
                                             int64_t max_tokens, int32_t max_seqs,
                                             int32_t max_pages_per_seq) override {
    m_.capture_decode_graphs(buckets, max_tokens, max_seqs, max_pages_per_seq);
    return m_.graph_buckets();
  }
  bool memory_info(size_t& free_bytes, size_t& total_bytes) override {
    return m_.backend().memory_info(free_bytes, total_bytes);
  }

 private:
  model::Qwen35Model& m_;
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
  void allocate_cache(int32_t pages, int32_t page_size, int32_t slots) override;
  std::vector<float> execute(const model::ForwardBatch& batch) override;
  std::vector<backend::Sampled> execute_sample(
      const model::ForwardBatch& batch, int32_t vocab,
      const std::vector<backend::SampleSpec>& specs) override;
  std::vector<int32_t> capture_decode_graphs(const std::vector<int32_t>& buckets,
                                             int64_t max_tokens, int32_t max_seqs,
                                             int32_t max_pages_per_seq) override;
  bool memory_info(size_t& free_bytes, size_t& total_bytes) override;

 private:
  struct Worker {
    int rank = 0;
    std::unique_ptr<backend::Backend> be;
    std::unique_ptr<dist::Communicator> comm;
    std::unique_ptr<model::Qwen35Model> model;
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
