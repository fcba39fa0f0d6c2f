// The qwen3_coder tool-call parser (vLLM's `--tool-call-parser qwen3_coder`): Qwen3.5 writes a call
// as
//   <tool_call>
//   <function=NAME>
//   <parameter=ARG>
//   VALUE
//   </parameter>
//   </function>
//   </tool_call>
// This splits a reply's content into the text before the first <tool_call> (streamed as it comes;
// a tag cut across deltas is held back) and the calls after it (parsed when the reply ends; as in
// vLLM's parser, a call or parameter left open — cut by max_tokens, say — is read to the end). Each
// VALUE becomes JSON by the type its tool's schema declares (integer, number, boolean, object,
// array, else string).
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "server/json_body.h"

namespace deltaserve::server {

struct ToolCall {
  std::string name;
  std::string arguments;  // a JSON object, serialised
};

class ToolCallParser {
 public:
  // `tools`: the request's tools (null when none).
  explicit ToolCallParser(json tools) : tools_(std::move(tools)) {}
  const json& tools() const { return tools_; }

  // Content that can be streamed now (text before the first <tool_call>).
  std::string push(std::string_view text);
  // At the end of the reply: content still held back, and the calls.
  std::string finish(std::vector<ToolCall>& calls);

 private:
  json typed_value(const std::string& function, const std::string& arg, std::string value) const;
  void parse_calls(std::string_view text, std::vector<ToolCall>& calls) const;

  json tools_;
  std::string held_;   // a possible start of <tool_call>
  std::string calls_;  // everything from the first <tool_call> on
  bool in_calls_ = false;
};

}  // namespace deltaserve::server
