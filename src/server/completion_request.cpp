#include "server/completion_request.h"

#include <algorithm>

#include "core/error.h"
#include "server/reasoning_parser.h"
#include "server/request_fields.h"
#include "server/response_format.h"
#include "server/tool_choice.h"

namespace deltaserve::server {

namespace {

void parse_stop(const json& b, engine::SamplingParams& p) {
  if (!present(b, "stop")) return;
  const json& s = b["stop"];
  const char* what = "'stop' must be a string or a list of strings";
  if (s.is_string()) {
    p.stop.push_back(s.get<std::string>());
  } else if (s.is_array()) {
    for (const json& x : s) {
      if (!x.is_string()) bad_request(what, "stop");
      p.stop.push_back(x.get<std::string>());
    }
  } else {
    bad_request(what, "stop");
  }
}

// {"token id": bias, ...} (OpenAI's shape: ids as strings).
void parse_logit_bias(const json& b, int64_t vocab, engine::SamplingParams& p) {
  if (!present(b, "logit_bias")) return;
  const json& m = b["logit_bias"];
  const char* what = "'logit_bias' must map token ids (as strings) to numbers";
  if (!m.is_object()) bad_request(what, "logit_bias");
  for (auto it = m.begin(); it != m.end(); ++it) {
    size_t used = 0;
    long long id = -1;
    try {
      id = std::stoll(it.key(), &used);
    } catch (const std::exception&) {
      used = 0;
    }
    if (used == 0 || used != it.key().size() || id < 0 || id >= vocab || !it.value().is_number())
      bad_request(what + std::string(" (token ids in [0, ") + std::to_string(vocab) + "))",
                  "logit_bias");
    p.logit_bias.emplace_back(static_cast<int32_t>(id), it.value().get<float>());
  }
}

void parse_logprobs(const json& b, bool chat, engine::SamplingParams& p) {
  if (chat) {
    if (auto v = get_bool(b, "logprobs")) p.logprobs = *v;
    if (auto v = get_int(b, "top_logprobs")) {
      p.top_logprobs = static_cast<int32_t>(*v);
      if (!p.logprobs && *v > 0) bad_request("top_logprobs needs logprobs = true", "top_logprobs");
    }
  } else if (auto v = get_int(b, "logprobs")) {
    p.logprobs = true;
    p.top_logprobs = static_cast<int32_t>(*v);
  }
}

// One message for the chat template: text content parts joined into one string.
json template_message(const json& m) {
  if (!m.is_object() || !m.contains("role") || !m["role"].is_string())
    bad_request("each message needs a string 'role'", "messages");
  json msg = m;
  if (m.contains("content") && m["content"].is_array()) {
    std::string text;
    for (const json& part : m["content"]) {
      if (!part.is_object() || !part.contains("type") || part["type"] != "text" ||
          !part.contains("text") || !part["text"].is_string())
        bad_request("only text content parts are supported", "messages");
      text += part["text"].get<std::string>();
    }
    msg["content"] = text;
  } else if (m.contains("content") && !m["content"].is_string() && !m["content"].is_null()) {
    bad_request("message content must be a string or a list of text parts", "messages");
  }
  if (!msg.contains("content") || msg["content"].is_null()) msg["content"] = "";
  return msg;
}

// The chat template's rendering of the messages (the prompt text).
std::string chat_prompt(const json& b, const RequestContext& ctx) {
  if (!ctx.chat_template) bad_request("this model has no chat template");
  if (!present(b, "messages") || !b["messages"].is_array() || b["messages"].empty())
    bad_request("'messages' must be a non-empty list", "messages");
  json messages = json::array();
  for (const json& m : b["messages"]) messages.push_back(template_message(m));
  const json tools = present(b, "tools") ? b["tools"] : json(nullptr);
  if (!tools.is_null() && !tools.is_array()) bad_request("'tools' must be a list", "tools");
  // The server's defaults (--default-chat-template-kwargs), the request's own over them.
  json kwargs = ctx.chat_template_kwargs.is_object() ? ctx.chat_template_kwargs : json::object();
  if (present(b, "chat_template_kwargs")) {
    if (!b["chat_template_kwargs"].is_object())
      bad_request("'chat_template_kwargs' must be an object", "chat_template_kwargs");
    for (const auto& [k, v] : b["chat_template_kwargs"].items()) kwargs[k] = v;
  }
  const bool add_gen = get_bool(b, "add_generation_prompt").value_or(true);
  return ctx.chat_template->render(messages, tools, add_gen, kwargs);
}

std::vector<int32_t> text_prompt(const json& b, const RequestContext& ctx) {
  if (!present(b, "prompt")) bad_request("'prompt' is required", "prompt");
  const json& p = b["prompt"];
  if (p.is_string()) return ctx.tok.encode(p.get<std::string>());
  if (p.is_array() && p.size() == 1 && p[0].is_string())
    return ctx.tok.encode(p[0].get<std::string>());
  if (p.is_array() && !p.empty() && p[0].is_number_integer())
    return get_token_ids(p, ctx.tok.vocab_size(), "prompt");
  bad_request("'prompt' must be a string or a list of token ids (one prompt per request)",
              "prompt");
}

// max_tokens (max_completion_tokens for chat); chat defaults to the rest of the context. At most
// `cap` (the generation config's max_new_tokens), as vLLM takes it.
int32_t max_tokens_of(const json& b, bool chat, int64_t prompt_len, int64_t max_len,
                      std::optional<int64_t> cap) {
  std::optional<int64_t> max_tokens = get_int(b, chat ? "max_completion_tokens" : "max_tokens");
  if (!max_tokens) max_tokens = get_int(b, "max_tokens");
  const bool defaulted = !max_tokens;
  if (!max_tokens) max_tokens = chat ? max_len - prompt_len : 16;
  if (*max_tokens < 1 && !(chat && defaulted))
    bad_request("max_tokens must be at least 1", "max_tokens");
  const char* where = chat ? "messages" : "prompt";
  if (std::max<int64_t>(*max_tokens, 1) > max_len - prompt_len)
    bad_request("This model's maximum context length is " + std::to_string(max_len) +
                    " tokens. However, you requested " + std::to_string(prompt_len) + " + " +
                    std::to_string(*max_tokens) + " tokens (" + std::to_string(prompt_len) +
                    " in the " + where + ", " + std::to_string(*max_tokens) +
                    " in the completion).",
                where);
  return static_cast<int32_t>(cap ? std::min(*max_tokens, std::max<int64_t>(*cap, 1))
                                  : *max_tokens);
}

// Fields deltaserve does not implement yet are refused with a 400 naming them, never ignored.
void refuse_unsupported(const json& b, bool chat) {
  if (!chat && present(b, "suffix")) bad_request("suffix is not supported", "suffix");
  if (present(b, "stream_options") && !get_bool(b, "stream").value_or(false))
    bad_request("stream_options can only be given when stream is true", "stream_options");
}

// The prompts of a completions body: a list of several prompts (strings or token-id lists), or
// the one prompt as it is.
std::vector<json> prompts_of(const json& b) {
  if (!present(b, "prompt") || !b["prompt"].is_array() || b["prompt"].empty()) return {b};
  const json& p = b["prompt"];
  const bool many = p[0].is_string() ? p.size() > 1 : p[0].is_array();
  if (!many) return {b};
  std::vector<json> out;
  for (const json& one : p) {
    if (!one.is_string() && !one.is_array())
      bad_request("'prompt' must be a string, a list of token ids, or a list of those", "prompt");
    json single = b;
    single["prompt"] = one;
    out.push_back(std::move(single));
  }
  return out;
}

}  // namespace

CompletionRequests parse_completion_requests(const json& b, bool chat, const RequestContext& ctx) {
  const int64_t n = get_int(b, "n").value_or(1);
  if (n < 1 || n > 128) bad_request("n must be in [1, 128]", "n");
  CompletionRequests out;
  out.n = static_cast<int32_t>(n);
  for (const json& body : chat ? std::vector<json>{b} : prompts_of(b)) {
    const CompletionRequest one = parse_completion_request(body, chat, ctx);
    out.prompt_tokens += one.prompt_tokens;
    for (int64_t i = 0; i < n; ++i) {
      CompletionRequest c = one;
      if (c.generate.params.seed) *c.generate.params.seed += static_cast<uint64_t>(i);
      out.choices.push_back(std::move(c));
    }
  }
  if (out.choices.size() > 128) bad_request("at most 128 choices (prompts x n) per request", "n");
  return out;
}

engine::SamplingParams parse_sampling_params(const json& b, bool chat, int64_t vocab,
                                             const GenerationDefaults& defaults) {
  engine::SamplingParams p;
  defaults.apply(p);
  if (auto v = get_number(b, "temperature")) p.temperature = static_cast<float>(*v);
  if (auto v = get_number(b, "top_p")) p.top_p = static_cast<float>(*v);
  if (auto v = get_int(b, "top_k")) p.top_k = static_cast<int32_t>(*v);
  if (auto v = get_number(b, "min_p")) p.min_p = static_cast<float>(*v);
  if (auto v = get_number(b, "presence_penalty")) p.presence_penalty = static_cast<float>(*v);
  if (auto v = get_number(b, "frequency_penalty")) p.frequency_penalty = static_cast<float>(*v);
  if (auto v = get_number(b, "repetition_penalty")) p.repetition_penalty = static_cast<float>(*v);
  if (auto v = get_int(b, "seed")) p.seed = static_cast<uint64_t>(*v);
  if (auto v = get_int(b, "min_tokens")) p.min_tokens = static_cast<int32_t>(*v);
  if (auto v = get_bool(b, "ignore_eos")) p.ignore_eos = *v;
  if (auto v = get_bool(b, "skip_special_tokens")) p.skip_special_tokens = *v;
  if (auto v = get_int(b, "best_of"); v && *v > 1)
    bad_request("best_of > 1 is not supported", "best_of");
  parse_stop(b, p);
  if (present(b, "stop_token_ids"))
    p.stop_token_ids = get_token_ids(b["stop_token_ids"], vocab, "stop_token_ids");
  parse_logprobs(b, chat, p);
  parse_logit_bias(b, vocab, p);
  p.json = parse_json_output(b);
  if (const std::string e = p.validate(); !e.empty()) bad_request(e);
  return p;
}

CompletionRequest parse_completion_request(const json& b, bool chat, const RequestContext& ctx) {
  if (present(b, "model")) {
    if (!b["model"].is_string()) bad_request("'model' must be a string", "model");
    const std::string& name = b["model"].get_ref<const std::string&>();
    if (name != ctx.served_model_name &&
        std::find(ctx.model_aliases.begin(), ctx.model_aliases.end(), name) ==
            ctx.model_aliases.end())
      throw NotFoundError("The model `" + b["model"].get<std::string>() + "` does not exist.",
                          "model");
  }
  refuse_unsupported(b, chat);
  CompletionRequest r;
  r.chat = chat;
  r.generate.params = parse_sampling_params(b, chat, ctx.tok.vocab_size(), ctx.defaults);
  if (chat) {
    const ToolChoice choice = parse_tool_choice(b, ctx.tool_call_parser);
    const std::string prompt = chat_prompt(b, ctx);
    r.reasoning = ctx.reasoning_parser;
    r.prompt_opens_think = ReasoningParser::prompt_opens_think(prompt);
    r.tool_calls = choice.kind != ToolChoiceKind::kNone;
    r.named_tool_choice = choice.kind == ToolChoiceKind::kNamed;
    if (r.tool_calls) r.tools = b["tools"];
    force_tool_call(choice, r.tools, ctx.tok, r.prompt_opens_think, r.generate.params);
    if (r.generate.params.json) {
      if (choice.forces_call())
        bad_request("a JSON response_format cannot be combined with a forced tool call",
                    "response_format");
      // As a forced tool call: the document starts after the reasoning the prompt opened.
      r.generate.params.constrain_after =
          r.prompt_opens_think ? ctx.tok.token_to_id("</think>") : -1;
    }
    r.generate.prompt_ids = ctx.tok.encode(prompt);
  } else {
    r.generate.prompt_ids = text_prompt(b, ctx);
    if (get_bool(b, "echo").value_or(false)) {  // the prompt's text before the completion
      if (r.generate.params.logprobs)
        bad_request("echo with logprobs (prompt logprobs) is not supported yet", "echo");
      r.echo = ctx.tok.decode(r.generate.prompt_ids);
    }
  }
  if (r.generate.prompt_ids.empty())
    bad_request("the prompt is empty", chat ? "messages" : "prompt");
  const int64_t prompt_len = static_cast<int64_t>(r.generate.prompt_ids.size());
  r.generate.params.max_tokens =
      max_tokens_of(b, chat, prompt_len, ctx.max_model_len, ctx.defaults.max_tokens);
  if (r.generate.params.min_tokens > r.generate.params.max_tokens)
    bad_request("min_tokens must be <= max_tokens", "min_tokens");
  r.stream = get_bool(b, "stream").value_or(false);
  if (present(b, "stream_options")) {
    if (!b["stream_options"].is_object())
      bad_request("'stream_options' must be an object", "stream_options");
    r.include_usage = get_bool(b["stream_options"], "include_usage").value_or(false);
  }
  r.logprobs = r.generate.params.logprobs;
  r.return_token_ids = get_bool(b, "return_token_ids").value_or(false);
  r.prompt_tokens = static_cast<int32_t>(prompt_len);
  return r;
}

}  // namespace deltaserve::server
