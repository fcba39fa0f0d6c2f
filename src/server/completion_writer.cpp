#include "server/completion_writer.h"

#include <algorithm>
#include <ctime>

#include "server/reasoning_parser.h"
#include "server/tool_call_parser.h"

namespace deltaserve::server {

namespace {

std::string sse(const json& j) { return "data: " + dump_json(j) + "\n\n"; }

json error_json(const std::string& message, int code) {
  return {{"error",
           {{"message", message}, {"type", "internal_error"}, {"param", nullptr}, {"code", code}}}};
}

json bytes_of(const std::string& s) {
  json b = json::array();
  for (unsigned char c : s) b.push_back(static_cast<int>(c));
  return b;
}

class ChatWriter final : public CompletionWriter {
 public:
  ChatWriter(const CompletionRequest& req, std::string id, const std::string& model,
             const tokenizer::Tokenizer& tok)
      : CompletionWriter(req, std::move(id), model, tok),
        reasoning_(req.reasoning),
        opens_think_(req.prompt_opens_think),
        tool_calls_(req.tool_calls),
        calls_finish_(req.named_tool_choice ? "" : "tool_calls"),
        parser_(req.prompt_opens_think),
        tools_(req.tools) {}

 private:
  const char* object_name(bool chunk) const override {
    return chunk ? "chat.completion.chunk" : "chat.completion";
  }
  json take_logprobs(const engine::OutputDelta& d) override {
    json entries = json::array();
    for (const engine::TokenLogprob& lp : d.logprobs) {
      const std::string s = token_text(lp.token);
      json top = json::array();
      for (const auto& [t, v] : lp.top) {
        const std::string ts = token_text(t);
        top.push_back({{"token", ts}, {"logprob", v}, {"bytes", bytes_of(ts)}});
      }
      entries.push_back(
          {{"token", s}, {"logprob", lp.logprob}, {"bytes", bytes_of(s)}, {"top_logprobs", top}});
    }
    for (const auto& e : entries) content_.push_back(e);
    return logprobs_ ? json{{"content", entries}} : json(nullptr);
  }
  json delta_choice(const engine::OutputDelta& d, json logprobs) override {
    json delta = json::object();
    if (!first_chunk_sent_) delta["role"] = "assistant";
    ReasoningParser::Pieces p;
    if (reasoning_) {
      p = parser_.push(d.text);
      if (d.finish_reason != engine::FinishReason::kNone) {
        ReasoningParser::Pieces rest = parser_.finish();
        p.reasoning += rest.reasoning;
        p.content += rest.content;
      }
    } else {
      p.content = d.text;
    }
    json calls = json::array();
    if (tool_calls_) {
      p.content = tools_.push(p.content);
      std::vector<ToolCall> whole;
      if (d.finish_reason != engine::FinishReason::kNone) p.content += tools_.finish(whole);
      calls = tool_call_deltas_json(tools_.take());
    }
    if (!p.reasoning.empty()) delta["reasoning_content"] = p.reasoning;
    if (!p.content.empty() || (p.reasoning.empty() && calls.empty())) delta["content"] = p.content;
    if (!calls.empty()) delta["tool_calls"] = std::move(calls);
    if (streamed_call_ && d.finish_reason != engine::FinishReason::kNone && !calls_finish_.empty())
      finish_reason_ = calls_finish_;
    return {{"index", index_}, {"delta", delta}, {"logprobs", logprobs}};
  }
  std::string call_id(int32_t i) const {
    return "call_" + id_.substr(id_.find('-') + 1) + "_" + std::to_string(i);
  }
  // OpenAI's streamed form: per call, a first delta with its id, type and name, then argument
  // pieces; the pieces of one call in one chunk are joined.
  json tool_call_deltas_json(const std::vector<ToolCallDelta>& pieces) {
    json out = json::array();
    for (const ToolCallDelta& p : pieces) {
      if (!out.empty() && out.back()["index"] == p.index) {
        std::string args = out.back()["function"]["arguments"].get<std::string>() + p.arguments;
        out.back()["function"]["arguments"] = std::move(args);
        continue;
      }
      json c = {{"index", p.index}, {"function", {{"arguments", p.arguments}}}};
      if (!p.name.empty()) {
        c["id"] = call_id(p.index);
        c["type"] = "function";
        c["function"]["name"] = p.name;
        streamed_call_ = true;
      }
      out.push_back(std::move(c));
    }
    return out;
  }
  json tool_calls_json(const std::vector<ToolCall>& calls) const {
    json out = json::array();
    for (size_t i = 0; i < calls.size(); ++i)
      out.push_back({{"id", call_id(static_cast<int32_t>(i))},
                     {"type", "function"},
                     {"function", {{"name", calls[i].name}, {"arguments", calls[i].arguments}}}});
    return out;
  }
  json final_choice() override {
    json message = {{"role", "assistant"}, {"content", text_}};
    if (reasoning_) {  // the whole reply through a parser of its own
      ReasoningParser whole(opens_think_);
      ReasoningParser::Pieces p = whole.push(text_);
      ReasoningParser::Pieces rest = whole.finish();
      p.reasoning += rest.reasoning;
      p.content += rest.content;
      message["content"] =
          p.content.empty() && !p.reasoning.empty() ? json(nullptr) : json(p.content);
      message["reasoning_content"] = p.reasoning.empty() ? json(nullptr) : json(p.reasoning);
    }
    if (tool_calls_) {  // calls after the (reasoning-free) content
      ToolCallParser whole(tools_.tools());
      std::vector<ToolCall> calls;
      std::string content = whole.push(
          message["content"].is_string() ? message["content"].get<std::string>() : std::string());
      content += whole.finish(calls);
      if (!calls.empty()) {
        message["content"] = content.empty() ? json(nullptr) : json(content);
        message["tool_calls"] = tool_calls_json(calls);
        if (!calls_finish_.empty()) finish_reason_ = calls_finish_;
      }
    }
    return {{"index", index_},
            {"message", message},
            {"logprobs", logprobs_ ? json{{"content", content_}} : json(nullptr)}};
  }

  json content_ = json::array();
  bool reasoning_, opens_think_, tool_calls_;
  // The finish_reason of a reply with calls: "tool_calls", or empty (the engine's, "stop") for a
  // named tool_choice, as OpenAI's and vLLM's.
  std::string calls_finish_;
  bool streamed_call_ = false;  // a call's first delta has been sent
  ReasoningParser parser_;      // streamed deltas
  ToolCallParser tools_;        // streamed deltas
};

class TextWriter final : public CompletionWriter {
 public:
  TextWriter(const CompletionRequest& req, std::string id, const std::string& model,
             const tokenizer::Tokenizer& tok)
      : CompletionWriter(req, std::move(id), model, tok), echo_(req.echo) {}

 private:
  const char* object_name(bool) const override { return "text_completion"; }
  json take_logprobs(const engine::OutputDelta& d) override {
    json chunk = {{"tokens", json::array()},
                  {"token_logprobs", json::array()},
                  {"top_logprobs", json::array()},
                  {"text_offset", json::array()}};
    for (const engine::TokenLogprob& lp : d.logprobs) {
      json top = json::object();
      for (const auto& [t, v] : lp.top) top[token_text(t)] = v;
      chunk["tokens"].push_back(token_text(lp.token));
      chunk["token_logprobs"].push_back(lp.logprob);
      chunk["top_logprobs"].push_back(top);
      chunk["text_offset"].push_back(text_.size());
    }
    for (const char* k : {"tokens", "token_logprobs", "top_logprobs", "text_offset"})
      for (const auto& e : chunk[k]) all_[k].push_back(e);
    return logprobs_ ? chunk : json(nullptr);
  }
  json delta_choice(const engine::OutputDelta& d, json logprobs) override {
    const std::string echo = first_chunk_sent_ ? "" : echo_;
    return {{"index", index_}, {"text", echo + d.text}, {"logprobs", logprobs}};
  }
  json final_choice() override {
    return {
        {"index", index_}, {"text", echo_ + text_}, {"logprobs", logprobs_ ? all_ : json(nullptr)}};
  }

  std::string echo_;
  json all_ = {{"tokens", json::array()},
               {"token_logprobs", json::array()},
               {"top_logprobs", json::array()},
               {"text_offset", json::array()}};
};

}  // namespace

std::shared_ptr<CompletionWriter> CompletionWriter::make(const CompletionRequest& req,
                                                         const std::string& id,
                                                         const std::string& model,
                                                         const tokenizer::Tokenizer& tok,
                                                         int32_t index) {
  std::shared_ptr<CompletionWriter> w;
  if (req.chat)
    w.reset(new ChatWriter(req, "chatcmpl-" + id, model, tok));
  else
    w.reset(new TextWriter(req, "cmpl-" + id, model, tok));
  w->index_ = index;
  return w;
}

CompletionWriter::CompletionWriter(const CompletionRequest& req, std::string id,
                                   const std::string& model, const tokenizer::Tokenizer& tok)
    : tok_(tok),
      id_(std::move(id)),
      created_(std::time(nullptr)),
      model_(model),
      stream_(req.stream),
      include_usage_(req.include_usage),
      logprobs_(req.logprobs),
      return_token_ids_(req.return_token_ids) {
  if (return_token_ids_) prompt_ids_ = req.generate.prompt_ids;
}

std::string CompletionWriter::token_text(int32_t id) const {
  return tok_.decode(std::vector<int32_t>{id});
}

json CompletionWriter::envelope(bool chunk) const {
  return {{"id", id_}, {"object", object_name(chunk)}, {"created", created_}, {"model", model_}};
}

std::string CompletionWriter::on_delta(const engine::OutputDelta& d) {
  completion_tokens_ = d.completion_tokens;
  if (d.finished) cached_tokens_ = d.cached_tokens;
  if (return_token_ids_)
    token_ids_.insert(token_ids_.end(), d.token_ids.begin(), d.token_ids.end());
  json logprobs = take_logprobs(d);
  text_ += d.text;
  const bool done = d.finish_reason != engine::FinishReason::kNone;
  if (done) finish_reason_ = engine::finish_reason_name(d.finish_reason);
  if (d.finish_reason == engine::FinishReason::kError) {
    error_ = d.error.empty() ? "internal error" : d.error;
    return stream_ ? sse(error_json(error_, 500)) : "";
  }
  if (!stream_) return "";
  const bool new_ids = return_token_ids_ && !d.token_ids.empty();
  if (d.text.empty() && d.logprobs.empty() && !done && first_chunk_sent_ && !new_ids) return "";
  json choice = delta_choice(d, std::move(logprobs));
  choice["finish_reason"] = done ? json(finish_reason_) : json(nullptr);
  if (return_token_ids_) {
    if (!first_chunk_sent_) choice["prompt_token_ids"] = prompt_ids_;
    choice["token_ids"] = d.token_ids;
  }
  first_chunk_sent_ = true;
  json chunk = envelope(true);
  chunk["choices"] = json::array({choice});
  return sse(chunk);
}

json CompletionWriter::finished_choice() {
  json choice = final_choice();
  choice["finish_reason"] = finish_reason_;
  if (return_token_ids_) {
    choice["prompt_token_ids"] = prompt_ids_;
    choice["token_ids"] = token_ids_;
  }
  return choice;
}

json ReplyWriter::usage() const {
  int32_t completion = 0, cached = 0;
  for (size_t i = 0; i < choices_.size(); ++i) {
    completion += choices_[i]->completion_tokens();
    if (i % static_cast<size_t>(n_) == 0) {  // a prompt's first choice: its most cached
      int32_t most = 0;
      for (size_t k = i; k < std::min(choices_.size(), i + static_cast<size_t>(n_)); ++k)
        most = std::max(most, choices_[k]->cached_tokens());
      cached += most;
    }
  }
  return {{"prompt_tokens", prompt_tokens_},
          {"completion_tokens", completion},
          {"total_tokens", prompt_tokens_ + completion},
          {"prompt_tokens_details", {{"cached_tokens", cached}}}};
}

std::string ReplyWriter::on_finish() {
  for (const auto& c : choices_)
    if (!c->error().empty() && !stream_) return dump_json(error_json(c->error(), 500));
  if (stream_) {
    std::string out;
    if (include_usage_) {
      json chunk = choices_.front()->envelope(true);
      chunk["choices"] = json::array();
      chunk["usage"] = usage();
      out += sse(chunk);
    }
    return out + "data: [DONE]\n\n";
  }
  json j = choices_.front()->envelope(false);
  j["choices"] = json::array();
  for (const auto& c : choices_) j["choices"].push_back(c->finished_choice());
  j["usage"] = usage();
  return dump_json(j);
}

std::string ReplyWriter::on_cut(const std::string& reason) {
  const std::string body = dump_json(error_json(reason, 503));
  return stream_ ? "data: " + body + "\n\ndata: [DONE]\n\n" : body;
}

http::status ReplyWriter::final_status() const {
  for (const auto& c : choices_)
    if (!c->error().empty()) return http::status::internal_server_error;
  return http::status::ok;
}

}  // namespace deltaserve::server
