// Response side of /v1/completions and /v1/chat/completions: one writer per request turns engine
// deltas into the endpoint's OpenAI JSON — SSE chunks as they come (stream) or one body at the
// end — and owns the request's accumulated text, logprobs and usage. One subclass per endpoint.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "engine/request.h"
#include "server/completion_request.h"
#include "server/http_server.h"
#include "server/json_body.h"
#include "tokenizer/tokenizer.h"

namespace deltaserve::server {

// One choice of a reply.
class CompletionWriter {
 public:
  // `id` without its prefix; `model` the served model name; `index` the choice's index.
  static std::shared_ptr<CompletionWriter> make(const CompletionRequest& req, const std::string& id,
                                                const std::string& model,
                                                const tokenizer::Tokenizer& tok, int32_t index = 0);
  virtual ~CompletionWriter() = default;

  // SSE bytes for a streamed delta of this choice; "" when not streaming (it is accumulated).
  std::string on_delta(const engine::OutputDelta& d);
  // The whole choice of a non-streamed reply, finish_reason included.
  json finished_choice();
  json envelope(bool chunk) const;
  int32_t completion_tokens() const { return completion_tokens_; }
  int32_t cached_tokens() const { return cached_tokens_; }
  const std::string& error() const { return error_; }

 protected:
  CompletionWriter(const CompletionRequest& req, std::string id, const std::string& model,
                   const tokenizer::Tokenizer& tok);
  virtual const char* object_name(bool chunk) const = 0;
  // Records one delta's logprobs; returns the chunk's logprobs JSON (null when off).
  virtual json take_logprobs(const engine::OutputDelta& d) = 0;
  // A streamed choice for a delta and the final non-streamed choice.
  virtual json delta_choice(const engine::OutputDelta& d, json logprobs) = 0;
  virtual json final_choice() = 0;

  std::string token_text(int32_t id) const;

  const tokenizer::Tokenizer& tok_;
  std::string id_;
  int64_t created_ = 0;
  std::string model_;
  bool stream_, include_usage_, logprobs_;
  bool first_chunk_sent_ = false;
  std::string text_;
  std::string finish_reason_;  // "tool_calls" when the chat writer found calls
  std::string error_;          // the engine failed this request
  int32_t index_ = 0;
  int32_t completion_tokens_ = 0, cached_tokens_ = 0;
  // return_token_ids: the prompt's ids (sent once) and the output ids so far.
  bool return_token_ids_ = false;
  std::vector<int32_t> prompt_ids_, token_ids_;
};

// A reply of one or several choices (n > 1, a list of prompts): routes each delta to its choice's
// writer and writes the closing events or the whole JSON body (usage summed; the prompt tokens and
// cached tokens of each prompt counted once over its `n` choices).
class ReplyWriter {
 public:
  ReplyWriter(std::vector<std::shared_ptr<CompletionWriter>> choices, bool stream,
              bool include_usage, int32_t prompt_tokens, int32_t n = 1)
      : choices_(std::move(choices)),
        stream_(stream),
        include_usage_(include_usage),
        prompt_tokens_(prompt_tokens),
        n_(n) {}
  std::string on_delta(const engine::OutputDelta& d) {
    return choices_.at(static_cast<size_t>(d.index))->on_delta(d);
  }
  // The closing SSE events, or the whole JSON body.
  std::string on_finish();
  // The reply was cut (shutdown): a final error event and [DONE], or a JSON error body.
  std::string on_cut(const std::string& reason);
  // The status of a non-streamed reply (500 when the engine failed a request).
  http::status final_status() const;

 private:
  json usage() const;
  std::vector<std::shared_ptr<CompletionWriter>> choices_;
  bool stream_, include_usage_;
  int32_t prompt_tokens_, n_;
};

}  // namespace deltaserve::server
