// What a client submits (GenerateRequest with SamplingParams), what it gets back (a stream of
// OutputDelta), and the engine's own per-request state (Request).
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "engine/json_output.h"
#include "structured/token_mask.h"
#include "tokenizer/detokenizer.h"

namespace deltaserve::engine {

struct SamplingParams {
  float temperature = 1.0f;  // < 1e-5: greedy
  int32_t top_k = 0;         // <= 0: off
  float top_p = 1.0f;
  float min_p = 0.0f;
  float repetition_penalty = 1.0f;  // HF style, over prompt and output
  float presence_penalty = 0.0f;    // OpenAI style, over output
  float frequency_penalty = 0.0f;
  std::optional<uint64_t> seed;
  int32_t max_tokens = 16;
  int32_t min_tokens = 0;
  std::vector<int32_t> stop_token_ids;                // in addition to the model's EOS set
  std::vector<std::string> stop;                      // stop strings (needs the engine's tokenizer)
  std::vector<std::pair<int32_t, float>> logit_bias;  // added to the tokens' logits, in [-100, 100]
  bool ignore_eos = false;
  bool logprobs = false;     // logprob of each chosen token
  int32_t top_logprobs = 0;  // and of the top n alternatives
  bool skip_special_tokens = true;
  // The output must start with one of these token sequences (output_constraint.h): from the first
  // output token, or right after the first `constrain_after` token when that is >= 0.
  std::vector<std::vector<int32_t>> forced_prefixes;
  int32_t constrain_after = -1;
  // The output must be a JSON document of this grammar (response_format; json_output.h), from the
  // first output token or right after the first `constrain_after` token.
  std::shared_ptr<const structured::JsonConstraint> json;

  // Empty when valid, else what is wrong (the server answers 400 with it).
  std::string validate() const;
};

struct GenerateRequest {
  std::vector<int32_t> prompt_ids;
  SamplingParams params;
  // n > 1: the id (RequestStream::id) of an earlier request with the same prompt. With prefix
  // caching this one is admitted only once that one's prefill has run, and resumes from the KV
  // pages and GDN snapshot it left (the prompt's prefill computed once, not n times).
  uint64_t prefill_leader = 0;
};

enum class FinishReason { kNone, kStop, kLength, kAbort, kError };
const char* finish_reason_name(FinishReason r);

struct TokenLogprob {
  int32_t token = 0;
  float logprob = 0;
  std::vector<std::pair<int32_t, float>> top;  // most likely first
};

struct OutputDelta {
  std::vector<int32_t> token_ids;      // new tokens
  std::vector<TokenLogprob> logprobs;  // one per new token when requested
  std::string text;                    // new text (when the engine has a tokenizer)
  bool finished = false;
  FinishReason finish_reason = FinishReason::kNone;
  std::string error;  // with kError
  int32_t prompt_tokens = 0;
  int32_t cached_tokens = 0;      // prompt tokens resumed from the prefix cache
  int32_t completion_tokens = 0;  // so far
  int32_t index = 0;  // the choice it belongs to, in a reply merged from several requests
};

// The client's end of a request: deltas in order, the last one with finished = true.
class RequestStream {
 public:
  explicit RequestStream(uint64_t id) : id_(id) {}
  uint64_t id() const { return id_; }
  // Waits up to `timeout` for the next delta; false on timeout.
  bool next(OutputDelta& out, std::chrono::milliseconds timeout);
  // Takes the next delta if one is queued (never blocks).
  bool try_next(OutputDelta& out);
  // Calls `f` after a push that finds no delta queued (on the engine thread; keep it short, e.g.
  // post to an executor), and at once if deltas are already queued: a reader that takes every
  // queued delta (try_next until false) when called misses none, with one call for the deltas
  // that arrive before it runs. For asynchronous readers.
  void set_listener(std::function<void()> f);
  // Engine side.
  void push(OutputDelta d);

 private:
  // The queued deltas, q_[head_..]; emptied back to the start once all are taken, so that a
  // stream read between steps reuses one buffer (a deque allocated and freed a node every few
  // deltas, across the engine and reader threads).
  bool empty() const { return head_ == q_.size(); }
  OutputDelta take();

  uint64_t id_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<OutputDelta> q_;
  size_t head_ = 0;
  std::shared_ptr<const std::function<void()>> listener_;  // shared: a push copies no closure
};

enum class RequestStatus { kWaiting, kRunning, kFinished };

// Engine-internal state of one request. Owned by the engine thread only.
struct Request {
  uint64_t id = 0;
  SamplingParams params;
  int32_t num_prompt = 0;
  std::vector<int32_t> tokens;  // prompt followed by the outputs so far
  int32_t num_computed = 0;     // tokens whose KV / state is in the cache
  std::vector<int32_t> pages;   // KV page table
  int32_t slot = -1;            // GDN state slot, -1 when none
  RequestStatus status = RequestStatus::kWaiting;
  int32_t num_preemptions = 0;
  uint64_t seed = 0;  // of its draws: backend::sample_uniform(seed, output index)
  std::shared_ptr<RequestStream> stream;
  std::unique_ptr<tokenizer::IncrementalDetokenizer> detok;
  std::unique_ptr<JsonOutput> json;  // with params.json
  std::string text;                  // decoded output text so far
  size_t text_emitted = 0;           // bytes of `text` already sent
  std::chrono::steady_clock::time_point arrival, last_token;
  bool has_first_token = false;
  // Prefix caching (engine thread): hashes of the full blocks of `tokens` seen so far, how many
  // of its pages are indexed, the snapshot it resumes from (pinned until its first step ran),
  // where its prefill must end a chunk to leave a snapshot, and its latest decode snapshot.
  std::vector<uint64_t> block_hashes;
  int32_t num_indexed = 0;
  uint64_t restore_block = 0;
  int32_t restore_snapshot = -1;
  std::vector<int32_t> snapshot_cuts;  // ascending
  uint64_t decode_snapshot_block = 0;
  int32_t num_cached_tokens = 0;  // at its first admission
  bool admitted_once = false;
  uint64_t prefill_leader = 0;  // GenerateRequest::prefill_leader

  int32_t num_outputs() const { return static_cast<int32_t>(tokens.size()) - num_prompt; }
};

}  // namespace deltaserve::engine
