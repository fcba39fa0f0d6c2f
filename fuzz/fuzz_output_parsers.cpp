// The reply parsers on arbitrary model output: the text cut into deltas at arbitrary points goes
// through the Qwen3 reasoning parser and the qwen3_coder tool-call parser; the pieces must add up
// to the whole (reasoning + content never lose or invent bytes outside the tags), every tool
// call's arguments must be a JSON object, and its streamed pieces must add up to them.
#include <string>
#include <vector>

#include "server/reasoning_parser.h"
#include "server/tool_call_parser.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace deltaserve::server;
  if (size < 2) return 0;
  const bool opens_think = data[0] & 1;
  const size_t step = 1 + data[1] % 7;
  const std::string text(reinterpret_cast<const char*>(data + 2), size - 2);
  ReasoningParser reasoning(opens_think);
  ToolCallParser tools(json::parse(R"([{"type":"function","function":{"name":"f","parameters":
      {"type":"object","properties":{"n":{"type":"integer"},"s":{"type":"string"}}}}}])"));
  std::string r, c;
  std::vector<std::string> streamed;  // each call's argument pieces, joined
  const auto take = [&] {
    for (const ToolCallDelta& d : tools.take()) {
      if (!d.name.empty()) streamed.emplace_back();
      if (streamed.size() != static_cast<size_t>(d.index) + 1) __builtin_trap();
      streamed.back() += d.arguments;
    }
  };
  for (size_t at = 0; at < text.size(); at += step) {
    const auto p = reasoning.push(std::string_view(text).substr(at, step));
    r += p.reasoning;
    c += tools.push(p.content);
    take();
  }
  const auto rest = reasoning.finish();
  r += rest.reasoning;
  c += tools.push(rest.content);
  std::vector<ToolCall> calls;
  c += tools.finish(calls);
  take();
  if (r.size() + c.size() > text.size()) __builtin_trap();  // nothing invented
  if (streamed.size() != calls.size()) __builtin_trap();
  for (size_t i = 0; i < calls.size(); ++i)
    if (!json::parse(calls[i].arguments).is_object() || streamed[i] != calls[i].arguments)
      __builtin_trap();
  // The whole text at once splits the same way as in deltas.
  ReasoningParser once(opens_think);
  auto whole = once.push(text);
  const auto tail = once.finish();
  if (whole.reasoning + tail.reasoning != r) __builtin_trap();
  return 0;
}
