// The OpenAI routes behind a real engine for the fuzz targets: the embedded default model on the
// CPU, the Qwen3 tokenizer and chat template. max_pending = 0, so a generation request is parsed,
// converted, tokenized and rendered in full, then refused with 503 instead of running the model.
#pragma once

#include <memory>

#include "backend/cpu/cpu_backend.h"
#include "engine/engine.h"
#include "model/loader.h"
#include "server/openai_api.h"
#include "tokenizer/chat_template_source.h"

namespace deltaserve::fuzz {

struct ApiHarness {
  ApiHarness() {
    model = model::load_model("", model::LoadFormat::kDummy, backend, false);
    tok = tokenizer::Tokenizer::from_file(std::string(DS_QWEN3_TOKENIZER) + "/tokenizer.json");
    chat = tokenizer::load_chat_template(DS_QWEN3_TOKENIZER);
    engine::EngineConfig ecfg;
    ecfg.max_model_len = 4096;
    engine = std::make_unique<engine::Engine>(*model, ecfg, tok.get());
    server::ApiConfig acfg;
    acfg.max_pending = 0;
    api = std::make_unique<server::OpenAiApi>(acfg, *engine, *tok, chat.get());
  }

  static ApiHarness& get() {
    static ApiHarness h;
    return h;
  }

  backend::CpuBackend backend;
  std::unique_ptr<model::Qwen35Model> model;
  std::unique_ptr<tokenizer::Tokenizer> tok;
  std::unique_ptr<tokenizer::ChatTemplate> chat;
  std::unique_ptr<engine::Engine> engine;
  std::unique_ptr<server::OpenAiApi> api;
};

// A handler must answer every request with a response (never throw, never start generating).
inline void expect_response(const server::Reply& r) {
  if (!std::holds_alternative<server::Response>(r)) __builtin_trap();
  const int status = static_cast<int>(std::get<server::Response>(r).result());
  if (status >= 500 && status != 503) __builtin_trap();  // bad input is never a server error
}

}  // namespace deltaserve::fuzz
