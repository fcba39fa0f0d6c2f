#include "server/openai_api.h"

#include <ctime>
#include <limits>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "server/json_body.h"
#include "server/prometheus.h"

namespace deltaserve::server {

namespace {

struct ApiError {
  http::status status;
  std::string message;
  std::string param;
};

const char* error_type(http::status s) {
  switch (s) {
    case http::status::unauthorized:
      return "authentication_error";
    case http::status::not_found:
      return "not_found_error";
    case http::status::payload_too_large:
      return "invalid_request_error";
    case http::status::service_unavailable:
    case http::status::too_many_requests:
      return "server_overloaded";
    default:
      return "invalid_request_error";
  }
}

Response error_response(const ApiError& e) {
  json j = {{"error",
             {{"message", e.message},
              {"type", error_type(e.status)},
              {"param", e.param.empty() ? json(nullptr) : json(e.param)},
              {"code", static_cast<int>(e.status)}}}};
  Response r = json_response(e.status, dump_json(j));
  if (e.status == http::status::service_unavailable || e.status == http::status::too_many_requests)
    r.set(http::field::retry_after, "1");
  return r;
}

[[noreturn]] void bad(const std::string& msg, const std::string& param = "") {
  throw ApiError{http::status::bad_request, msg, param};
}

bool present(const json& j, const char* k) { return j.contains(k) && !j[k].is_null(); }

std::optional<double> get_number(const json& j, const char* k) {
  if (!present(j, k)) return std::nullopt;
  if (!j[k].is_number()) bad(std::string("'") + k + "' must be a number", k);
  return j[k].get<double>();
}

// An integer that fits int64 (JSON integers above 2^63 - 1 are refused, never wrapped).
bool is_int64(const json& x) {
  return x.is_number_integer() &&
         !(x.is_number_unsigned() &&
           x.get<uint64_t>() > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()));
}

std::optional<int64_t> get_int(const json& j, const char* k) {
  if (!present(j, k)) return std::nullopt;
  if (!is_int64(j[k])) bad(std::string("'") + k + "' must be an integer (64-bit)", k);
  return j[k].get<int64_t>();
}

// A token id list: integers in [0, vocab).
std::vector<int32_t> get_token_ids(const json& list, int64_t vocab, const char* k) {
  const std::string what = std::string("'") + k + "' must be a list of token ids in [0, " +
                           std::to_string(vocab) + ")";
  if (!list.is_array()) bad(what, k);
  std::vector<int32_t> ids;
  ids.reserve(list.size());
  for (const json& x : list) {
    if (!is_int64(x) || x.get<int64_t>() < 0 || x.get<int64_t>() >= vocab) bad(what, k);
    ids.push_back(static_cast<int32_t>(x.get<int64_t>()));
  }
  return ids;
}

std::optional<bool> get_bool(const json& j, const char* k) {
  if (!present(j, k)) return std::nullopt;
  if (!j[k].is_boolean()) bad(std::string("'") + k + "' must be a boolean", k);
  return j[k].get<bool>();
}

json parse_body(const Request& req) {
  json j;
  std::string error;
  if (!parse_json_body(req.body(), j, error)) bad(error);
  if (!j.is_object()) bad("The request body must be a JSON object");
  return j;
}

// Sampling parameters common to both endpoints (max_tokens is handled by the caller).
engine::SamplingParams sampling_params(const json& b, bool chat, int64_t vocab) {
  engine::SamplingParams p;
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
  if (auto v = get_int(b, "n"); v && *v != 1) bad("only n = 1 is supported", "n");
  if (auto v = get_int(b, "best_of"); v && *v > 1) bad("best_of > 1 is not supported", "best_of");
  if (auto v = get_bool(b, "echo"); v && *v) bad("echo is not supported", "echo");
  if (present(b, "stop")) {
    const json& s = b["stop"];
    if (s.is_string()) {
      p.stop.push_back(s.get<std::string>());
    } else if (s.is_array()) {
      for (const json& x : s) {
        if (!x.is_string()) bad("'stop' must be a string or a list of strings", "stop");
        p.stop.push_back(x.get<std::string>());
      }
    } else {
      bad("'stop' must be a string or a list of strings", "stop");
    }
  }
  if (present(b, "stop_token_ids"))
    p.stop_token_ids = get_token_ids(b["stop_token_ids"], vocab, "stop_token_ids");
  if (chat) {
    if (auto v = get_bool(b, "logprobs")) p.logprobs = *v;
    if (auto v = get_int(b, "top_logprobs")) {
      p.top_logprobs = static_cast<int32_t>(*v);
      if (!p.logprobs && *v > 0) bad("top_logprobs needs logprobs = true", "top_logprobs");
    }
  } else if (auto v = get_int(b, "logprobs")) {
    p.logprobs = true;
    p.top_logprobs = static_cast<int32_t>(*v);
  }
  if (const std::string e = p.validate(); !e.empty()) bad(e);
  return p;
}

std::string sse(const json& j) { return "data: " + dump_json(j) + "\n\n"; }

// Per-request state shared by the reply callbacks.
struct Generation {
  std::string id;
  int64_t created = 0;
  std::string model;
  bool chat = false, stream = false, include_usage = false, logprobs = false;
  bool role_sent = false;
  std::string text;
  json lp_content = json::array();  // chat logprobs entries
  json lp_tokens = json::array(), lp_token_logprobs = json::array(), lp_top = json::array(),
       lp_offsets = json::array();  // completions logprobs
  std::string finish_reason;
  std::string error;  // the engine failed this request
  int32_t prompt_tokens = 0, completion_tokens = 0;
};

json error_json(const std::string& message, int code) {
  return {{"error",
           {{"message", message}, {"type", "internal_error"}, {"param", nullptr}, {"code", code}}}};
}

// The method a known route accepts (null for an unknown path: 404, not 405).
const char* allowed_method(const std::string& path) {
  if (path == "/health" || path == "/metrics" || path == "/v1/models") return "GET";
  if (path == "/v1/completions" || path == "/v1/chat/completions" || path == "/tokenize" ||
      path == "/detokenize")
    return "POST";
  return nullptr;
}

json bytes_of(const std::string& s) {
  json b = json::array();
  for (unsigned char c : s) b.push_back(static_cast<int>(c));
  return b;
}

}  // namespace

OpenAiApi::OpenAiApi(ApiConfig cfg, engine::Engine& engine, const tokenizer::Tokenizer& tok,
                     const tokenizer::ChatTemplate* chat)
    : cfg_(std::move(cfg)), engine_(engine), tok_(tok), chat_(chat), created_(std::time(nullptr)) {}

Reply OpenAiApi::handle(const Request& req) {
  ++http_requests_;
  try {
    const std::string target(req.target());
    const std::string path = target.substr(0, target.find('?'));
    const bool get = req.method() == http::verb::get, post = req.method() == http::verb::post;
    if (path.rfind("/v1/", 0) == 0 && !cfg_.api_key.empty()) {
      const auto auth = req[http::field::authorization];
      if (std::string(auth) != "Bearer " + cfg_.api_key)
        throw ApiError{http::status::unauthorized, "Unauthorized: a valid API key is required", ""};
    }
    if (path == "/health" && get) {
      // Fail-stop: once a step failed (e.g. a tensor-parallel rank), the engine serves nothing.
      const std::string failed = engine_.failure();
      if (!failed.empty())
        throw ApiError{http::status::service_unavailable, "the engine failed: " + failed, ""};
      return json_response(http::status::ok, "");
    }
    if (path == "/metrics" && get) return metrics_text();
    if (path == "/v1/models" && get) return models();
    if (path == "/v1/completions" && post) return completions(req, false);
    if (path == "/v1/chat/completions" && post) return completions(req, true);
    if (path == "/tokenize" && post) return tokenize(req);
    if (path == "/detokenize" && post) return detokenize(req);
    if (const char* allow = allowed_method(path))
      throw ApiError{http::status::method_not_allowed,
                     "Method not allowed: " + path + " accepts " + allow, ""};
    throw ApiError{http::status::not_found,
                   "Not found: " + (path.size() > 200 ? path.substr(0, 200) + "..." : path), ""};
  } catch (const ApiError& e) {
    return error_response(e);
  } catch (const Error& e) {
    return error_response({http::status::bad_request, e.what(), ""});
  } catch (const std::exception& e) {
    return error_response(
        {http::status::internal_server_error, std::string("internal error: ") + e.what(), ""});
  }
}

Response OpenAiApi::models() const {
  json j = {{"object", "list"},
            {"data",
             {{{"id", cfg_.served_model_name},
               {"object", "model"},
               {"created", created_},
               {"owned_by", "deltaserve"},
               {"root", cfg_.served_model_name},
               {"max_model_len", engine_.config().max_model_len}}}}};
  return json_response(http::status::ok, dump_json(j));
}

Response OpenAiApi::metrics_text() const {
  Response r = json_response(
      http::status::ok,
      prometheus_text(engine_.metrics(), cfg_.served_model_name, http_requests_.load()));
  r.set(http::field::content_type, "text/plain; version=0.0.4");
  return r;
}

Response OpenAiApi::tokenize(const Request& req) {
  const json b = parse_body(req);
  std::vector<int32_t> ids;
  if (present(b, "prompt")) {
    if (!b["prompt"].is_string()) bad("'prompt' must be a string", "prompt");
    ids = tok_.encode(b["prompt"].get<std::string>());
  } else if (present(b, "messages")) {
    if (!chat_) bad("this model has no chat template");
    if (!b["messages"].is_array()) bad("'messages' must be a list", "messages");
    const bool add_gen = get_bool(b, "add_generation_prompt").value_or(true);
    ids = tok_.encode(chat_->render(
        b["messages"], present(b, "tools") ? b["tools"] : json(nullptr), add_gen,
        present(b, "chat_template_kwargs") ? b["chat_template_kwargs"] : json::object()));
  } else {
    bad("'prompt' or 'messages' is required");
  }
  json j = {
      {"count", ids.size()}, {"max_model_len", engine_.config().max_model_len}, {"tokens", ids}};
  return json_response(http::status::ok, dump_json(j));
}

Response OpenAiApi::detokenize(const Request& req) {
  const json b = parse_body(req);
  if (!present(b, "tokens")) bad("'tokens' is required", "tokens");
  const std::vector<int32_t> ids = get_token_ids(b["tokens"], tok_.vocab_size(), "tokens");
  json j = {{"prompt", tok_.decode(ids)}};
  return json_response(http::status::ok, dump_json(j));
}

Reply OpenAiApi::completions(const Request& req, bool chat) {
  const json b = parse_body(req);
  if (present(b, "model")) {
    if (!b["model"].is_string()) bad("'model' must be a string", "model");
    if (b["model"].get<std::string>() != cfg_.served_model_name)
      bad("The model `" + b["model"].get<std::string>() + "` does not exist.", "model");
  }
  engine::GenerateRequest gr;
  gr.params = sampling_params(b, chat, tok_.vocab_size());

  if (chat) {
    if (!chat_) bad("this model has no chat template");
    if (!present(b, "messages") || !b["messages"].is_array() || b["messages"].empty())
      bad("'messages' must be a non-empty list", "messages");
    json messages = json::array();
    for (const json& m : b["messages"]) {
      if (!m.is_object() || !m.contains("role") || !m["role"].is_string())
        bad("each message needs a string 'role'", "messages");
      json msg = m;
      if (m.contains("content") && m["content"].is_array()) {  // text parts -> one string
        std::string text;
        for (const json& part : m["content"]) {
          if (!part.is_object() || !part.contains("type") || part["type"] != "text" ||
              !part.contains("text") || !part["text"].is_string())
            bad("only text content parts are supported", "messages");
          text += part["text"].get<std::string>();
        }
        msg["content"] = text;
      } else if (m.contains("content") && !m["content"].is_string() && !m["content"].is_null()) {
        bad("message content must be a string or a list of text parts", "messages");
      }
      if (!msg.contains("content") || msg["content"].is_null()) msg["content"] = "";
      messages.push_back(std::move(msg));
    }
    const json tools = present(b, "tools") ? b["tools"] : json(nullptr);
    if (!tools.is_null() && !tools.is_array()) bad("'tools' must be a list", "tools");
    json kwargs = json::object();
    if (present(b, "chat_template_kwargs")) {
      if (!b["chat_template_kwargs"].is_object())
        bad("'chat_template_kwargs' must be an object", "chat_template_kwargs");
      kwargs = b["chat_template_kwargs"];
    }
    const bool add_gen = get_bool(b, "add_generation_prompt").value_or(true);
    gr.prompt_ids = tok_.encode(chat_->render(messages, tools, add_gen, kwargs));
  } else {
    if (!present(b, "prompt")) bad("'prompt' is required", "prompt");
    const json& p = b["prompt"];
    if (p.is_string()) {
      gr.prompt_ids = tok_.encode(p.get<std::string>());
    } else if (p.is_array() && p.size() == 1 && p[0].is_string()) {
      gr.prompt_ids = tok_.encode(p[0].get<std::string>());
    } else if (p.is_array() && !p.empty() && p[0].is_number_integer()) {
      gr.prompt_ids = get_token_ids(p, tok_.vocab_size(), "prompt");
    } else {
      bad("'prompt' must be a string or a list of token ids (one prompt per request)", "prompt");
    }
  }
  if (gr.prompt_ids.empty()) bad("the prompt is empty", chat ? "messages" : "prompt");

  const int64_t max_len = engine_.config().max_model_len;
  const int64_t prompt_len = static_cast<int64_t>(gr.prompt_ids.size());
  std::optional<int64_t> max_tokens = get_int(b, chat ? "max_completion_tokens" : "max_tokens");
  if (!max_tokens) max_tokens = get_int(b, "max_tokens");
  if (!max_tokens) max_tokens = chat ? max_len - prompt_len : 16;
  if (*max_tokens < 1 &&
      !(chat && !present(b, "max_tokens") && !present(b, "max_completion_tokens")))
    bad("max_tokens must be at least 1", "max_tokens");
  if (std::max<int64_t>(*max_tokens, 1) > max_len - prompt_len)
    bad("This model's maximum context length is " + std::to_string(max_len) +
            " tokens. However, you requested " + std::to_string(prompt_len) + " + " +
            std::to_string(*max_tokens) + " tokens (" + std::to_string(prompt_len) + " in the " + (chat ? "messages" : "prompt") +
            ", " + std::to_string(*max_tokens) + " in the completion).",
        chat ? "messages" : "prompt");
  gr.params.max_tokens = static_cast<int32_t>(*max_tokens);
  if (gr.params.min_tokens > gr.params.max_tokens)
    bad("min_tokens must be <= max_tokens", "min_tokens");

  auto g = std::make_shared<Generation>();
  g->chat = chat;
  g->stream = get_bool(b, "stream").value_or(false);
  if (present(b, "stream_options")) {
    if (!b["stream_options"].is_object())
      bad("'stream_options' must be an object", "stream_options");
    g->include_usage = get_bool(b["stream_options"], "include_usage").value_or(false);
  }
  g->logprobs = gr.params.logprobs;
  g->model = cfg_.served_model_name;
  g->created = std::time(nullptr);
  char idbuf[32];
  std::snprintf(idbuf, sizeof idbuf, "%016llx", static_cast<unsigned long long>(next_id_++));
  g->id = (chat ? "chatcmpl-" : "cmpl-") + std::string(idbuf);
  g->prompt_tokens = static_cast<int32_t>(prompt_len);

  if (draining_)
    throw ApiError{http::status::service_unavailable, "the server is shutting down", ""};
  if (const std::string failed = engine_.failure(); !failed.empty())
    throw ApiError{http::status::service_unavailable, "the engine failed: " + failed, ""};
  if (in_flight_.load() >= cfg_.max_pending)
    throw ApiError{http::status::service_unavailable,
                   "the server is overloaded: too many requests in flight; retry later", ""};
  auto stream = engine_.submit(std::move(gr));  // throws Error -> 400
  ++in_flight_;
  auto done = std::make_shared<std::atomic<bool>>(false);
  auto end = [this, done] {
    if (!done->exchange(true)) --in_flight_;
  };

  const tokenizer::Tokenizer& tok = tok_;
  AsyncReply reply;
  reply.stream = stream;
  reply.sse = g->stream;
  reply.on_delta = [g, &tok](const engine::OutputDelta& d) -> std::string {
    g->completion_tokens = d.completion_tokens;
    json lp_chunk = json::array();
    json ctoks = json::array(), clps = json::array(), ctop = json::array(), coff = json::array();
    for (const engine::TokenLogprob& lp : d.logprobs) {
      const std::string s = tok.decode(std::vector<int32_t>{lp.token});
      if (g->chat) {
        json top = json::array();
        for (const auto& [t, v] : lp.top) {
          const std::string ts = tok.decode(std::vector<int32_t>{t});
          top.push_back({{"token", ts}, {"logprob", v}, {"bytes", bytes_of(ts)}});
        }
        lp_chunk.push_back(
            {{"token", s}, {"logprob", lp.logprob}, {"bytes", bytes_of(s)}, {"top_logprobs", top}});
      } else {
        json top = json::object();
        for (const auto& [t, v] : lp.top) top[tok.decode(std::vector<int32_t>{t})] = v;
        ctoks.push_back(s);
        clps.push_back(lp.logprob);
        ctop.push_back(top);
        coff.push_back(g->text.size());
      }
    }
    g->text += d.text;
    if (d.finished) g->finish_reason = engine::finish_reason_name(d.finish_reason);
    if (d.finish_reason == engine::FinishReason::kError) {
      g->error = d.error.empty() ? "internal error" : d.error;
      return g->stream ? sse(error_json(g->error, 500)) : "";
    }
    if (!g->stream) {
      for (auto& x : lp_chunk) g->lp_content.push_back(x);
      for (size_t i = 0; i < ctoks.size(); ++i) {
        g->lp_tokens.push_back(ctoks[i]);
        g->lp_token_logprobs.push_back(clps[i]);
        g->lp_top.push_back(ctop[i]);
        g->lp_offsets.push_back(coff[i]);
      }
      return "";
    }
    if (d.text.empty() && d.logprobs.empty() && !d.finished && g->role_sent) return "";
    json choice = {{"index", 0}};
    if (g->chat) {
      json delta = json::object();
      if (!g->role_sent) delta["role"] = "assistant";
      delta["content"] = d.text;
      choice["delta"] = delta;
      choice["logprobs"] = g->logprobs ? json{{"content", lp_chunk}} : json(nullptr);
    } else {
      choice["text"] = d.text;
      choice["logprobs"] = g->logprobs ? json{{"tokens", ctoks},
                                              {"token_logprobs", clps},
                                              {"top_logprobs", ctop},
                                              {"text_offset", coff}}
                                       : json(nullptr);
    }
    choice["finish_reason"] = d.finished ? json(g->finish_reason) : json(nullptr);
    g->role_sent = true;
    json chunk = {{"id", g->id},
                  {"object", g->chat ? "chat.completion.chunk" : "text_completion"},
                  {"created", g->created},
                  {"model", g->model},
                  {"choices", json::array({choice})}};
    return sse(chunk);
  };
  reply.final_status = [g] {
    return g->error.empty() ? http::status::ok : http::status::internal_server_error;
  };
  reply.on_finish = [g, end]() -> std::string {
    end();
    if (!g->error.empty() && !g->stream) return dump_json(error_json(g->error, 500));
    const json usage = {{"prompt_tokens", g->prompt_tokens},
                        {"completion_tokens", g->completion_tokens},
                        {"total_tokens", g->prompt_tokens + g->completion_tokens}};
    if (g->stream) {
      std::string out;
      if (g->include_usage)
        out += sse({{"id", g->id},
                    {"object", g->chat ? "chat.completion.chunk" : "text_completion"},
                    {"created", g->created},
                    {"model", g->model},
                    {"choices", json::array()},
                    {"usage", usage}});
      return out + "data: [DONE]\n\n";
    }
    json choice = {{"index", 0}};
    if (g->chat) {
      choice["message"] = {{"role", "assistant"}, {"content", g->text}};
      choice["logprobs"] = g->logprobs ? json{{"content", g->lp_content}} : json(nullptr);
    } else {
      choice["text"] = g->text;
      choice["logprobs"] = g->logprobs ? json{{"tokens", g->lp_tokens},
                                              {"token_logprobs", g->lp_token_logprobs},
                                              {"top_logprobs", g->lp_top},
                                              {"text_offset", g->lp_offsets}}
                                       : json(nullptr);
    }
    choice["finish_reason"] = g->finish_reason;
    json j = {{"id", g->id},
              {"object", g->chat ? "chat.completion" : "text_completion"},
              {"created", g->created},
              {"model", g->model},
              {"choices", json::array({choice})},
              {"usage", usage}};
    return dump_json(j);
  };
  reply.on_cut = [g, end](const std::string& reason) -> std::string {
    end();
    const std::string body = dump_json(error_json(reason, 503));
    return g->stream ? "data: " + body + "\n\ndata: [DONE]\n\n" : body;
  };
  engine::Engine& eng = engine_;
  const uint64_t rid = stream->id();
  reply.abort = [&eng, rid, end] {
    eng.abort(rid);
    end();
  };
  return reply;
}

}  // namespace deltaserve::server
