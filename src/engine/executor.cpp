#include "engine/executor.h"

#include <algorithm>
#include <cstdint>
#include <optional>

#include "core/error.h"

namespace deltaserve::engine {

TpExecutor::TpExecutor(int size, BackendFactory make_backend, ModelFactory make_model,
                       std::chrono::milliseconds step_timeout, CommFactory make_comm)
    : group_(size, step_timeout), step_timeout_(step_timeout) {
  DS_CHECK(size >= 1, "tensor-parallel size");
  for (int r = 0; r < size; ++r) {
    auto w = std::make_unique<Worker>();
    w->rank = r;
    workers_.push_back(std::move(w));
  }
  for (auto& w : workers_) w->thread = std::thread([this, wp = w.get()] { worker_loop(*wp); });
  try {
    run_on_all([&](Worker& w) {
      w.be = make_backend(w.rank);
      std::unique_ptr<dist::Communicator> c =
          make_comm ? make_comm(w.rank, *w.be) : group_.communicator(w.rank);
      {
        std::lock_guard<std::mutex> lock(comm_mu_);
        w.comm = std::move(c);
        if (aborted_) w.comm->abort();
      }
      w.model = make_model(w.rank, *w.be, size > 1 || make_comm ? w.comm.get() : nullptr);
    });
  } catch (...) {
    shutdown();  // join the workers: a throwing constructor runs no destructor
    throw;
  }
}

TpExecutor::~TpExecutor() { shutdown(); }

void TpExecutor::fail(const std::string& why) {
  group_.poison(why);
  std::lock_guard<std::mutex> lock(comm_mu_);
  if (aborted_) return;
  aborted_ = true;
  for (auto& w : workers_)
    if (w->comm) w->comm->abort();
}

void TpExecutor::shutdown() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (stop_) return;
    stop_ = true;
  }
  fail("the executor is shutting down");
  task_cv_.notify_all();
  for (auto& w : workers_)
    if (w->thread.joinable()) w->thread.join();
  // Graphs, runners and models of every rank first: NCCL's teardown of an (aborted) communicator
  // waits until every CUDA graph that captured one of the process's communicators is destroyed.
  for (auto& w : workers_) {
    if (w->be) w->be->drop_graphs();
    w->runner.reset();
    w->model.reset();
  }
  for (auto& w : workers_) w->comm.reset();
  for (auto& w : workers_) w->be.reset();
}

void TpExecutor::worker_loop(Worker& w) {
  uint64_t seen = 0;
  for (;;) {
    std::function<void(Worker&)> task;
    {
      std::unique_lock<std::mutex> lock(mu_);
      task_cv_.wait(lock, [&] { return stop_ || task_gen_ != seen; });
      if (stop_) return;
      seen = task_gen_;
      task = task_;
    }
    std::string err;
    try {
      task(w);
    } catch (const std::exception& e) {
      err = "rank " + std::to_string(w.rank) + ": " + e.what();
    }
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (!err.empty() && error_.empty()) error_ = err;
      ++done_;
    }
    if (!err.empty()) fail(err);  // release ranks waiting in a collective
    done_cv_.notify_all();
  }
}

void TpExecutor::run_on_all(const std::function<void(Worker&)>& task) {
  std::unique_lock<std::mutex> lock(mu_);
  if (!error_.empty()) throw DeviceError("tensor-parallel executor failed earlier: " + error_);
  task_ = task;
  done_ = 0;
  ++task_gen_;
  task_cv_.notify_all();
  const int n = static_cast<int>(workers_.size());
  if (!done_cv_.wait_for(lock, step_timeout_, [&] { return done_ == n; })) {
    if (error_.empty()) error_ = "a step did not finish within the step timeout";
    const std::string why = error_;
    lock.unlock();
    fail(why);
    lock.lock();
    done_cv_.wait_for(lock, std::chrono::seconds(10), [&] { return done_ == n; });
  }
  if (!error_.empty()) throw DeviceError("tensor-parallel executor failed: " + error_);
}

const model::ModelConfig& TpExecutor::config() const { return workers_.at(0)->model->config(); }

runtime::MemoryPlan TpExecutor::plan_memory(const runtime::PlanLimits& limits,
                                            const runtime::MemoryBudget& budget) {
  std::mutex mu;
  std::optional<runtime::MemoryPlan> fewest;
  std::optional<std::string> no_fit;  // a plan that does not fit is the caller's error, not a
                                      // rank failure (the group stays usable)
  run_on_all([&](Worker& w) {
    try {
      const runtime::MemoryPlan p = runtime::plan_for(*w.model, limits, budget);
      std::lock_guard<std::mutex> lock(mu);
      if (!fewest || p.num_pages < fewest->num_pages) fewest = p;
    } catch (const Error& e) {  // (a DeviceError is no Error: a rank failure stays one)
      std::lock_guard<std::mutex> lock(mu);
      no_fit = e.what();
    }
  });
  if (no_fit) throw Error(*no_fit);
  return *fewest;
}

void TpExecutor::configure(const runtime::MemoryPlan& plan) {
  run_on_all([&](Worker& w) {
    w.runner.reset();
    w.runner = std::make_unique<runtime::ModelRunner>(*w.model, plan);
  });
}

std::vector<float> TpExecutor::execute(const StepBatch& batch) {
  run_on_all([&](Worker& w) {
    std::vector<float> l = w.runner->forward(batch);
    if (w.rank == 0) logits_ = std::move(l);
  });
  return std::move(logits_);
}

std::vector<backend::Sampled> TpExecutor::execute_sample(
    const StepBatch& batch, int32_t vocab, const std::vector<backend::SampleSpec>& specs) {
  run_on_all([&](Worker& w) {
    if (w.rank == 0)
      sampled_ = w.runner->forward_sample(batch, vocab, specs);
    else
      w.runner->compute(batch);  // the same collectives; its logits are not needed
  });
  return std::move(sampled_);
}

void TpExecutor::set_eager(bool eager) {
  run_on_all([&](Worker& w) { w.runner->set_eager(eager); });
}

void TpExecutor::set_tpsp(const dist::TpspConfig& tpsp) {
  run_on_all([&](Worker& w) { w.model->set_tpsp(tpsp); });
}

void TpExecutor::run_padding_step(int32_t tokens) {
  run_on_all([&](Worker& w) { w.runner->run_padding_step(tokens); });
}

void TpExecutor::tune_linears(int32_t tokens) {
  run_on_all([&](Worker& w) { w.runner->tune_linears(tokens); });
}

void TpExecutor::copy_state(int32_t src, int32_t dst) {
  run_on_all([&](Worker& w) { w.runner->copy_state(src, dst); });
}

bool TpExecutor::memory_info(size_t& free_bytes, size_t& total_bytes) {
  std::mutex mu;
  bool limited = false;
  free_bytes = total_bytes = SIZE_MAX;
  run_on_all([&](Worker& w) {
    size_t f = 0, t = 0;
    if (!w.be->memory_info(f, t)) return;
    std::lock_guard<std::mutex> lock(mu);
    limited = true;
    free_bytes = std::min(free_bytes, f);
    total_bytes = std::min(total_bytes, t);
  });
  return limited;
}

std::vector<int32_t> TpExecutor::capture_decode_graphs(const std::vector<int32_t>& buckets,
                                                       int32_t max_pages_per_seq) {
  // Every rank captures every bucket in the same order, so the collectives inside line up.
  std::vector<int32_t> got;
  run_on_all([&](Worker& w) {
    w.comm->barrier();  // collectives warmed (NCCL connects lazily) before any is captured
    w.runner->capture_decode_graphs(buckets, max_pages_per_seq);
    if (w.rank == 0) got = w.runner->graph_buckets();
  });
  return got;
}

}  // namespace deltaserve::engine
