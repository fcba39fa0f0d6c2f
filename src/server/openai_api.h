// OpenAiApi: the OpenAI-compatible routes. JSON is parsed here into engine requests and engine
// deltas are turned back into OpenAI JSON / SSE; the engine never sees JSON (DESIGN.md 10).
#pragma once

#include <atomic>
#include <string>
#include <vector>

#include "engine/engine.h"
#include "server/generation_defaults.h"
#include "server/http_server.h"
#include "tokenizer/chat_template.h"
#include "tokenizer/tokenizer.h"

namespace deltaserve::server {

struct ApiConfig {
  std::string served_model_name = "deltaserve";
  std::vector<std::string> model_aliases;  // more names requests may use (listed by /v1/models)
  std::string api_key;                     // empty: no authentication
  // Requests in flight (running or queued) before new ones get 503: a bound on what clients can
  // pile up, above the concurrency benchmarks use (SGLang's cells go to 1,024).
  int64_t max_pending = 4096;
  bool reasoning_parser = false;  // --reasoning-parser qwen3: reasoning_content in chat replies
  bool tool_call_parser = false;  // qwen3_coder: <tool_call> blocks become tool_calls
  GenerationDefaults defaults;    // --generation-config: sampling fields requests leave out
  json chat_template_kwargs;      // --default-chat-template-kwargs, under each request's own
};

class OpenAiApi {
 public:
  OpenAiApi(ApiConfig cfg, engine::Engine& engine, const tokenizer::Tokenizer& tok,
            const tokenizer::ChatTemplate* chat);

  // Routes one HTTP request. Never throws: errors become OpenAI error JSON.
  Reply handle(const Request& req);

  // Stops admitting generation requests (503) while the server drains.
  void set_draining() { draining_ = true; }
  int64_t in_flight() const { return in_flight_.load(); }

 private:
  Reply route(const Request& req);
  Reply completions(const Request& req, bool chat);
  Response tokenize(const Request& req);
  Response detokenize(const Request& req);
  Response models() const;
  Response metrics_text() const;

  ApiConfig cfg_;
  engine::Engine& engine_;
  const tokenizer::Tokenizer& tok_;
  const tokenizer::ChatTemplate* chat_;
  std::atomic<bool> draining_{false};
  std::atomic<int64_t> in_flight_{0};
  std::atomic<uint64_t> next_id_{1};
  std::atomic<int64_t> http_requests_{0};
  int64_t created_;
};

}  // namespace deltaserve::server
