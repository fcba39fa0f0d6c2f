// Engine: continuous batching around one model. Any thread may submit() and abort(); one engine
// thread owns all scheduling state and runs the loop: take new requests and aborts, plan a step
// (Scheduler), run it as one batched forward, sample, stream deltas, free what finished.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <thread>
#include <vector>

#include "cache/cache_manager.h"
#include "engine/executor.h"
#include "engine/metrics.h"
#include "engine/output_processor.h"
#include "engine/request.h"
#include "engine/scheduler.h"
#include "engine/tpsp_profile.h"
#include "model/qwen35.h"

namespace deltaserve::tokenizer {
class Tokenizer;
}

namespace deltaserve::engine {

// EngineConfig::max_model_len: the model's context, or less where one such request's KV pages do
// not fit the memory budget.
constexpr int32_t kFitMaxModelLen = -1;

struct EngineConfig {
  // 0: sized from the memory plan with a device budget (runtime::auto_max_num_seqs), else
  // runtime::kFallbackMaxNumSeqs.
  int32_t max_num_seqs = 16;
  int32_t max_num_batched_tokens = 1024;
  int32_t long_prefill_token_threshold = 0;  // > 0: a request's prefill chunk at most this
  // Admission keeps KV room for up to this many outputs of every request (SchedulerConfig).
  int32_t admission_reserve_tokens = 4096;
  int32_t page_size = 16;
  int32_t num_pages = 0;  // 0: room for min(max_num_seqs, 4) requests of max_model_len
  // How the memory plan sizes the KV pages; unset: `num_pages` pages.
  std::optional<runtime::MemoryBudget> budget;
  int32_t num_snapshots = 0;  // GDN state snapshot slots (more from budget->snapshot_fraction)
  // Prefix caching: shared KV pages + GDN state snapshots on a grid of mamba_block_size tokens (a
  // multiple of page_size). Needs snapshot slots; off when the plan has none.
  bool enable_prefix_caching = false;
  int32_t mamba_block_size = 64;
  // The GDN recurrent state between steps (--mamba-ssm-cache-dtype): f32 or bf16 (half the slot
  // memory; each step computes in f32 from it and rounds its result).
  DType ssm_state_dtype = DType::kF32;
  // The full-attention KV cache in fp8 e4m3 (--kv-cache-dtype fp8; scale 1) instead of the
  // activations' dtype: half the page bytes on GPUs; the attention kernels widen it exactly.
  bool kv_cache_fp8 = false;
  // 0: the model's max_position_embeddings; kFitMaxModelLen: that, lowered to the most tokens
  // the plan's KV pages hold for one request (vLLM's `--max-model-len auto`; serve's default).
  int32_t max_model_len = 0;
  // Ids >= sample_vocab are never sampled; 0: the tokenizer's (else the model's) vocabulary.
  int32_t sample_vocab = 0;
  std::vector<int32_t> eos_token_ids;  // stop ids unless ignore_eos; empty: the model config's
  // Decode graphs (CUDA): captured at startup for decode_graph_sizes() unless enforce_eager.
  bool enforce_eager = false;
  int32_t max_graph_batch = 512;  // the largest bucket (capped by max_num_seqs)
  // Test hook (serve --debug-output-script): every request's k-th generated token is script[k]
  // whatever the model samples, then EOS — a deterministic reply for end-to-end tests of output
  // parsing (reasoning, tool calls) that random weights never produce.
  std::vector<int32_t> debug_output_script;
  // Under TP: what the TPSP startup profile (tpsp_profile.h) picks before the decode graphs are
  // captured (serve --enable-tpsp without --tpsp-threshold-tokens).
  std::optional<TpspProfileRequest> profile_tpsp;
};

// The decode-graph batch sizes for a config: 1, 2, 4, 8, then steps of 8 to 64, 16 to 128, 32
// above, up to min(max_num_seqs, max_graph_batch), which is always included.
std::vector<int32_t> decode_graph_sizes(const EngineConfig& cfg);

class Engine {
 public:
  // Plans the memory (runtime::MemoryPlan, num_pages KV pages), builds every rank's model runner
  // from it and starts the engine thread. `tok` (optional) enables text output and stop strings.
  // Throws deltaserve::Error when one request of max_model_len tokens cannot fit the KV pages
  // (fail closed at startup).
  Engine(Executor& exec, EngineConfig cfg, const tokenizer::Tokenizer* tok = nullptr);
  // One model on the engine thread (a LocalExecutor).
  Engine(model::Qwen35Model& model, EngineConfig cfg, const tokenizer::Tokenizer* tok = nullptr);
  // Stops the thread; requests still in flight get a final kAbort delta.
  ~Engine();
  Engine(const Engine&) = delete;
  Engine& operator=(const Engine&) = delete;

  // Queues a request. Throws deltaserve::Error for bad parameters, an empty prompt, ids outside the
  // vocabulary, prompt + max_tokens over max_model_len, or when the engine has failed.
  std::shared_ptr<RequestStream> submit(GenerateRequest req);
  // Ends a request (client gone or cancelled): its stream gets a final kAbort delta and its pages
  // and slot are freed. Unknown or finished ids are ignored.
  void abort(uint64_t id);

  MetricsSnapshot metrics() const { return metrics_.snapshot(); }
  // Non-empty once a step failed (fail-stop): every request then in flight got one error delta,
  // and every later submit() throws.
  std::string failure() const;
  const EngineConfig& config() const { return cfg_; }
  // With profile_tpsp: what the startup profile chose and measured (empty otherwise).
  const std::string& tpsp_profile() const { return tpsp_profile_; }
  const runtime::MemoryPlan& memory_plan() const { return plan_; }

 private:
  struct Inbox {
    std::vector<std::unique_ptr<Request>> added;
    std::vector<uint64_t> aborted;
  };

  Engine(std::unique_ptr<LocalExecutor> owned, Executor* exec, EngineConfig cfg,
         const tokenizer::Tokenizer* tok);
  void loop();
  // Runs a step and hands out its tokens; returns the seconds its forward took.
  double run_step(const ScheduledStep& step);
  // Appends a request's sampled tokens of a step (its stop conditions checked, its text
  // detokenized) and returns what to send; deliver() streams that, finishing the request when a
  // stop condition held. A step delivers once every request's tokens are taken.
  ProcessedOutput take_tokens(Request& r, std::span<const SampledToken> tokens);
  void deliver(Request& r, ProcessedOutput out);
  // The token a request gets for its k-th sampled row of the step: the debug script's, if any.
  int32_t scripted(const Request& r, int32_t k, int32_t sampled) const;
  // `token` (after `earlier` tokens of this step) under the request's forced prefixes and JSON
  // grammar; the JSON state takes the token.
  int32_t constrained(Request& r, std::span<const SampledToken> earlier, int32_t token);
  // The tokens that end a request (EOS and its stop_token_ids).
  std::vector<int32_t> end_tokens(const Request& r) const;
  // The vocabulary's byte trie for JSON masks (built at the first JSON request).
  const structured::VocabTrie& vocab_trie() const;
  // What the backend needs to sample the request's next token.
  backend::SampleSpec sample_spec(const Request& r) const;
  void finish(Request& r, FinishReason why, OutputDelta d);
  // Fail-stop: ends every request with one kError delta and refuses new work.
  void fail_all(const std::string& why);
  std::vector<int32_t> banned_tokens(const Request& r) const;

  std::unique_ptr<LocalExecutor> owned_exec_;
  Executor& exec_;
  EngineConfig cfg_;
  const tokenizer::Tokenizer* tok_;
  runtime::MemoryPlan plan_;
  cache::CacheManager cache_;
  Scheduler scheduler_;
  OutputProcessor output_;
  Metrics metrics_;
  std::map<uint64_t, std::unique_ptr<Request>> requests_;      // engine thread only
  mutable std::unique_ptr<structured::VocabTrie> vocab_trie_;  // engine thread only

  mutable std::mutex mu_;
  std::condition_variable cv_;
  Inbox inbox_;
  bool stop_ = false;
  std::string failure_;  // guarded by mu_
  std::atomic<uint64_t> next_id_{1};
  std::string tpsp_profile_;
  std::thread thread_;
};

}  // namespace deltaserve::engine
