// Request side of /v1/completions and /v1/chat/completions: an OpenAI JSON body becomes an engine
// GenerateRequest plus what the response writer needs to know. Nothing here renders a response.
#pragma once

#include <string>
#include <vector>

#include "engine/request.h"
#include "server/generation_defaults.h"
#include "server/json_body.h"
#include "tokenizer/chat_template.h"
#include "tokenizer/tokenizer.h"

namespace deltaserve::server {

// What parsing needs from the server.
struct RequestContext {
  const tokenizer::Tokenizer& tok;
  const tokenizer::ChatTemplate* chat_template;  // null: chat requests are refused
  std::string served_model_name;
  int64_t max_model_len = 0;
  bool reasoning_parser = false;  // --reasoning-parser qwen3
  bool tool_call_parser = false;  // --enable-auto-tool-choice --tool-call-parser qwen3_coder
  GenerationDefaults defaults;    // for the sampling fields a request leaves out
  json chat_template_kwargs;      // --default-chat-template-kwargs (an object, or null)
  std::vector<std::string> model_aliases;  // names besides served_model_name requests may use
};

struct CompletionRequest {
  engine::GenerateRequest generate;
  bool chat = false;
  bool stream = false;
  bool include_usage = false;  // stream_options.include_usage
  bool logprobs = false;
  bool reasoning = false;           // split <think> ... </think> into reasoning_content
  bool prompt_opens_think = false;  // the rendered prompt leaves a <think> block open
  bool tool_calls = false;          // parse <tool_call> blocks into tool_calls
  bool named_tool_choice = false;   // tool_choice names a function: finish_reason stays "stop"
  json tools;                       // the request's tools (their schemas type the arguments)
  std::string echo;                 // completions with echo: the prompt's text, sent first
  bool return_token_ids = false;    // vLLM's: prompt_token_ids and token_ids in each choice
  int32_t prompt_tokens = 0;
};

// Throws Error (400) for a malformed body, NotFoundError (404) for another model's name.
CompletionRequest parse_completion_request(const json& body, bool chat, const RequestContext& ctx);

// Every choice of a request: `n` samples (seeds seed, seed + 1, ...) of each prompt of a list of
// prompts (completions), in OpenAI's order (prompt-major). The prompt tokens to report are those
// of the prompts, each counted once.
struct CompletionRequests {
  std::vector<CompletionRequest> choices;
  int32_t prompt_tokens = 0;
  int32_t n = 1;  // choices per prompt
};
CompletionRequests parse_completion_requests(const json& body, bool chat,
                                             const RequestContext& ctx);

// Sampling parameters common to both endpoints (max_tokens is decided with the prompt length):
// the body's, else `defaults`', else OpenAI's.
engine::SamplingParams parse_sampling_params(const json& body, bool chat, int64_t vocab,
                                             const GenerationDefaults& defaults = {});

}  // namespace deltaserve::server
