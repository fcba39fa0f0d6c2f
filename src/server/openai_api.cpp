#include "server/openai_api.h"

#include <ctime>

#include "core/error.h"
#include "server/completion_request.h"
#include "server/completion_writer.h"
#include "server/error_reply.h"
#include "server/merged_stream.h"
#include "server/prometheus.h"
#include "server/request_fields.h"

namespace deltaserve::server {

namespace {

// The method a known route accepts (null for an unknown path: 404, not 405).
const char* allowed_method(const std::string& path) {
  if (path == "/health" || path == "/metrics" || path == "/v1/models" || path == "/version")
    return "GET";
  if (path == "/ping") return "GET or POST";
  if (path == "/v1/completions" || path == "/v1/chat/completions" || path == "/tokenize" ||
      path == "/detokenize")
    return "POST";
  return nullptr;
}

}  // namespace

OpenAiApi::OpenAiApi(ApiConfig cfg, engine::Engine& engine, const tokenizer::Tokenizer& tok,
                     const tokenizer::ChatTemplate* chat)
    : cfg_(std::move(cfg)), engine_(engine), tok_(tok), chat_(chat), created_(std::time(nullptr)) {}

Reply OpenAiApi::handle(const Request& req) {
  ++http_requests_;
  try {
    return route(req);
  } catch (const std::exception& e) {
    return error_response(error_reply_of(e));
  }
}

Reply OpenAiApi::route(const Request& req) {
  const std::string target(req.target());
  const std::string path = target.substr(0, target.find('?'));
  const bool get = req.method() == http::verb::get, post = req.method() == http::verb::post;
  if (path.rfind("/v1/", 0) == 0 && !cfg_.api_key.empty()) {
    const auto auth = req[http::field::authorization];
    if (std::string(auth) != "Bearer " + cfg_.api_key)
      throw HttpError(http::status::unauthorized, "Unauthorized: a valid API key is required");
  }
  if (path == "/version" && get)
    return json_response(http::status::ok, dump_json({{"version", DS_VERSION}}));
  if ((path == "/health" && get) || (path == "/ping" && (get || post))) {
    // Fail-stop: once a step failed (e.g. a tensor-parallel rank), the engine serves nothing.
    const std::string failed = engine_.failure();
    if (!failed.empty()) throw EngineFailedError("the engine failed: " + failed);
    return json_response(http::status::ok, "");
  }
  if (path == "/metrics" && get) return metrics_text();
  if (path == "/v1/models" && get) return models();
  if (path == "/v1/completions" && post) return completions(req, false);
  if (path == "/v1/chat/completions" && post) return completions(req, true);
  if (path == "/tokenize" && post) return tokenize(req);
  if (path == "/detokenize" && post) return detokenize(req);
  if (const char* allow = allowed_method(path))
    throw HttpError(http::status::method_not_allowed,
                    "Method not allowed: " + path + " accepts " + allow);
  throw NotFoundError("Not found: " + (path.size() > 200 ? path.substr(0, 200) + "..." : path));
}

Response OpenAiApi::models() const {
  json data = json::array();
  const auto add = [&](const std::string& id) {
    data.push_back({{"id", id},
                    {"object", "model"},
                    {"created", created_},
                    {"owned_by", "deltaserve"},
                    {"root", cfg_.served_model_name},
                    {"max_model_len", engine_.config().max_model_len}});
  };
  add(cfg_.served_model_name);
  for (const std::string& alias : cfg_.model_aliases) add(alias);
  return json_response(http::status::ok, dump_json(json{{"object", "list"}, {"data", data}}));
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
    if (!b["prompt"].is_string()) bad_request("'prompt' must be a string", "prompt");
    ids = tok_.encode(b["prompt"].get<std::string>());
  } else if (present(b, "messages")) {
    if (!chat_) bad_request("this model has no chat template");
    if (!b["messages"].is_array()) bad_request("'messages' must be a list", "messages");
    const bool add_gen = get_bool(b, "add_generation_prompt").value_or(true);
    const json none, no_kwargs = json::object();
    const json& kwargs = present(b, "chat_template_kwargs") ? b["chat_template_kwargs"] : no_kwargs;
    if (!kwargs.is_object())
      bad_request("'chat_template_kwargs' must be an object", "chat_template_kwargs");
    ids = tok_.encode(
        chat_->render(b["messages"], present(b, "tools") ? b["tools"] : none, add_gen, kwargs));
  } else {
    bad_request("'prompt' or 'messages' is required");
  }
  json j = {
      {"count", ids.size()}, {"max_model_len", engine_.config().max_model_len}, {"tokens", ids}};
  return json_response(http::status::ok, dump_json(j));
}

Response OpenAiApi::detokenize(const Request& req) {
  const json b = parse_body(req);
  if (!present(b, "tokens")) bad_request("'tokens' is required", "tokens");
  const std::vector<int32_t> ids = get_token_ids(b["tokens"], tok_.vocab_size(), "tokens");
  json j = {{"prompt", tok_.decode(ids)}};
  return json_response(http::status::ok, dump_json(j));
}

Reply OpenAiApi::completions(const Request& req, bool chat) {
  const RequestContext ctx{tok_,
                           chat_,
                           cfg_.served_model_name,
                           engine_.config().max_model_len,
                           cfg_.reasoning_parser,
                           cfg_.tool_call_parser,
                           cfg_.defaults,
                           cfg_.chat_template_kwargs,
                           cfg_.model_aliases};
  CompletionRequests parsed = parse_completion_requests(parse_body(req), chat, ctx);
  char idbuf[32];
  std::snprintf(idbuf, sizeof idbuf, "%016llx", static_cast<unsigned long long>(next_id_++));
  std::vector<std::shared_ptr<CompletionWriter>> choices;
  for (size_t i = 0; i < parsed.choices.size(); ++i)
    choices.push_back(CompletionWriter::make(parsed.choices[i], idbuf, cfg_.served_model_name, tok_,
                                             static_cast<int32_t>(i)));
  const CompletionRequest& first = parsed.choices.front();
  auto writer = std::make_shared<ReplyWriter>(std::move(choices), first.stream, first.include_usage,
                                              parsed.prompt_tokens, parsed.n);

  if (draining_) throw UnavailableError("the server is shutting down");
  if (const std::string failed = engine_.failure(); !failed.empty())
    throw EngineFailedError("the engine failed: " + failed);
  if (in_flight_.load() >= cfg_.max_pending)
    throw OverloadedError("the server is overloaded: too many requests in flight; retry later");
  std::vector<std::shared_ptr<engine::RequestStream>> streams;
  std::vector<uint64_t> ids;
  for (size_t i = 0; i < parsed.choices.size(); ++i) {
    // The n samples of a prompt share its prefill: the first computes it, the rest resume from
    // the cache it leaves.
    const size_t leader = i / static_cast<size_t>(parsed.n) * static_cast<size_t>(parsed.n);
    engine::GenerateRequest& g = parsed.choices[i].generate;
    if (leader != i) g.prefill_leader = ids[leader];
    streams.push_back(engine_.submit(std::move(g)));
    ids.push_back(streams.back()->id());
  }
  ++in_flight_;
  auto done = std::make_shared<std::atomic<bool>>(false);
  auto end = [this, done] {
    if (!done->exchange(true)) --in_flight_;
  };

  AsyncReply reply;
  reply.stream = streams.size() == 1 ? streams.front() : merge_streams(streams);
  reply.sse = first.stream;
  reply.on_delta = [writer](const engine::OutputDelta& d) { return writer->on_delta(d); };
  reply.final_status = [writer] { return writer->final_status(); };
  reply.on_finish = [writer, end] {
    end();
    return writer->on_finish();
  };
  reply.on_cut = [writer, end](const std::string& reason) {
    end();
    return writer->on_cut(reason);
  };
  engine::Engine& eng = engine_;
  reply.abort = [&eng, ids, end] {
    for (uint64_t rid : ids) eng.abort(rid);
    end();
  };
  return reply;
}

}  // namespace deltaserve::server
