// The Jinja chat template renderer with arbitrary messages and tools: the input is a JSON object
// {"messages": ..., "tools": ..., "kwargs": ...} parsed with the server's bounded parser; any
// shape reaches the checkpoint template. Template errors are deltaserve::Error (a 400); anything
// else escaping is a bug.
#include "core/error.h"
#include "server/json_body.h"
#include "tokenizer/chat_template_source.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace deltaserve;
  static const auto chat = tokenizer::load_chat_template(DS_QWEN3_TOKENIZER);
  server::json in;
  std::string err;
  if (!server::parse_json_body({reinterpret_cast<const char*>(data), size}, in, err)) return 0;
  if (!in.is_object()) return 0;
  const server::json none;
  const server::json& messages = in.contains("messages") ? in["messages"] : none;
  const server::json& tools = in.contains("tools") ? in["tools"] : none;
  const server::json kwargs =
      in.contains("kwargs") && in["kwargs"].is_object() ? in["kwargs"] : server::json::object();
  try {
    (void)chat->render(messages, tools, size % 2 == 0, kwargs);
  } catch (const Error&) {
  }
  return 0;
}
